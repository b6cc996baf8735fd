"""The predictor group (conf/predictor/) and train (conf/train.yaml): what scores a prefix and
how it is trained. One schema per built-in predictor with its checks beside it;
`PredictorConfig`, the view, holds every built-in predictor's keys (stopexp.config.options).
A predictor registered without a schema of its own (from another package) reads
`PredictorBaseConfig`'s keys and those its yaml adds."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

from stopexp.config.options import Group
from stopexp.config.ranges import at_least, fail, within
from stopexp.core.limits import count
from stopexp.core.names import SIGNAL_NAMES, predictor_names


@dataclass
class PredictorBaseConfig:
    """What every predictor reads."""
    name: str = "mlp"       # statistic | linear | mlp | fusion | conf_features | hidden_conf | super_token


@dataclass
class OneLayerConfig(PredictorBaseConfig):
    """What the predictors of one tapped layer's hidden state read (fusion reads every
    tapped layer, conf_features none, super_token the LM's own states)."""
    layer: int = -1         # which tap layer single-tap predictors read


@dataclass
class StatisticPredictorConfig(OneLayerConfig):
    """statistic: a statistic of the tap, evaluated as is (no weights)."""
    name: str = "statistic"
    statistic: str = "l2"   # l2 | mean | var


@dataclass
class CentringConfig(PredictorBaseConfig):
    """What the predictors with a learned head on the tapped hidden state read."""
    # subtract from each path's hidden state the mean of its prompt's live paths at the same
    # position (stopexp.signals.centring): what all paths of a prompt share is gone, so the
    # head sees only what sets a path apart from its siblings (within-prompt ranking)
    centre_prompts: bool = False


@dataclass
class PositionInputConfig(CentringConfig):
    """What the predictors whose head can take the position as an input read."""
    # the position (generated tokens) as one more input of the head, log-scaled
    # (stopexp.signals.feature_spec.position_feature)
    position_input: bool = False


@dataclass
class PCAConfig(OneLayerConfig):
    """What the predictors on one tapped layer's hidden state read."""
    # the hidden state standardised and projected onto its first k principal components,
    # whitened, in place of the LayerNorm (stopexp.signals.pca): fitted on the training rows
    # only, saved with the predictor; None = off
    pca_components: Optional[int] = field(default=None, metadata=count("width"))

    @staticmethod
    def ranges(pred) -> None:
        if pred.pca_components is not None:
            at_least("predictor.pca_components", pred.pca_components, 1)


@dataclass
class LinearPredictorConfig(PositionInputConfig, PCAConfig):
    name: str = "linear"


@dataclass
class HeadConfig(PredictorBaseConfig):
    """What the predictors with a hidden layer read."""
    hidden: int = 128
    depth: int = 1
    dropout: float = 0.0

    @staticmethod
    def ranges(pred) -> None:
        at_least("predictor.hidden", pred.hidden, 1)
        at_least("predictor.depth", pred.depth, 0)
        within("predictor.dropout", pred.dropout, 0, 1, high_open=True)


@dataclass
class MLPPredictorConfig(HeadConfig, PositionInputConfig, PCAConfig):
    name: str = "mlp"


@dataclass
class FusionPredictorConfig(HeadConfig, PositionInputConfig):
    name: str = "fusion"


@dataclass
class SignalsConfig(PredictorBaseConfig):
    """What the predictors on the confidence columns read."""
    # signal columns read besides the confidence ones (e.g. [attn_entropy])
    signals: List[str] = field(default_factory=list)

    @staticmethod
    def ranges(pred) -> None:
        for name in pred.signals:
            if name not in SIGNAL_NAMES:
                fail("predictor.signals", f"{name!r} unknown; allowed: {', '.join(SIGNAL_NAMES)}")


@dataclass
class ConfFeaturesPredictorConfig(HeadConfig, SignalsConfig):
    name: str = "conf_features"


@dataclass
class HiddenConfPredictorConfig(HeadConfig, SignalsConfig, CentringConfig, PCAConfig):
    """hidden_conf: one tapped layer's hidden state and the confidence columns of
    conf_features, each projected by its own half of the first hidden layer
    (stopexp.signals.hidden_conf)."""
    name: str = "hidden_conf"

    @staticmethod
    def needs(pred) -> None:
        at_least("predictor.depth", pred.depth, 1)  # its first hidden layer fuses the two inputs


@dataclass
class SuperTokenPredictorConfig(PredictorBaseConfig):
    """super_token: [STOP] tokens + LoRA on the frozen LM + a linear head."""
    name: str = "super_token"
    n_tokens: int = 4       # [STOP] copies appended (one shared embedding)
    lora_rank: int = 8      # its LoRA adapter, active only on the [STOP] tokens
    lora_alpha: float = 16.0
    lora_targets: List[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    lora_dropout: float = 0.0  # dropout on the adapter's input while it trains

    @staticmethod
    def ranges(pred) -> None:
        within("predictor.lora_dropout", pred.lora_dropout, 0, 1, high_open=True)
        if pred.n_tokens < 1 or pred.lora_rank < 1 or not pred.lora_targets:
            fail("predictor", f"super_token needs n_tokens >= 1, lora_rank >= 1 and lora_targets; "
                              f"got n_tokens={pred.n_tokens}, lora_rank={pred.lora_rank}, "
                              f"lora_targets={list(pred.lora_targets)}")
        within("predictor.lora_alpha", pred.lora_alpha, 0, math.inf, low_open=True, high_open=True)


@dataclass
class PredictorConfig(SuperTokenPredictorConfig, HiddenConfPredictorConfig, ConfFeaturesPredictorConfig,
                      FusionPredictorConfig, MLPPredictorConfig, LinearPredictorConfig,
                      StatisticPredictorConfig):
    """Every predictor's keys (the view: what cfg.predictor holds)."""
    name: str = "mlp"


PREDICTOR = Group("predictor", {
    "statistic": StatisticPredictorConfig, "linear": LinearPredictorConfig,
    "mlp": MLPPredictorConfig, "fusion": FusionPredictorConfig,
    "conf_features": ConfFeaturesPredictorConfig, "hidden_conf": HiddenConfPredictorConfig,
    "super_token": SuperTokenPredictorConfig},
    # a predictor registered without a schema reads the keys of one on a tapped layer (as a
    # subclass of stopexp.signals.base.OnTappedLayer does)
    PredictorConfig, base=OneLayerConfig, registered=predictor_names)
# the predictors evaluated as they are, with no weights to fit (train.* and loss unread)
UNTRAINED_PREDICTORS = ("statistic",)
# the predictors whose head takes the position as an extra input (predictor.position_input)
POSITION_INPUT_PREDICTORS = tuple(PREDICTOR.readers("position_input"))
# the predictors of the hidden state, which can centre it per prompt (predictor.centre_prompts)
CENTRING_PREDICTORS = tuple(PREDICTOR.readers("centre_prompts"))
# the predictors of one tapped layer's state, which can project it (predictor.pca_components)
PCA_PREDICTORS = tuple(PREDICTOR.readers("pca_components"))


@dataclass
class TrainConfig:
    epochs: int = 30
    batch_prompts: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.01
    patience: int = 5
    # the prefix the predictor is trained at (as search.check_at)
    checkpoint: float = field(default=0.08, metadata=count("max_new_tokens", share=True, below=True))
    # checkpoint: at train.checkpoint only | all: at every stored position, pairs mined
    # within (prompt, position), a batch holds batch_prompts such groups, epochs selected
    # on the validation within-prompt AUROC averaged over positions (stopexp/training/per_step.py)
    positions: str = "checkpoint"
    seed: int = 0
    # train on the first N prompts of the bank's train split only (the N smallest prompt
    # ids: nested, so one bank serves every size); None = all of them
    max_prompts: Optional[int] = field(default=None, metadata=count("train_prompts"))
    # true: keep the epoch with the best validation AUROC and stop after `patience` epochs
    # without a better one; false: train all `epochs` and keep the last (nothing is picked
    # on the validation prompts)
    early_stopping: bool = True
    # GiB of the prefixes' keys and values predictor=super_token keeps across epochs (on the
    # LM's device; its prefixes are encoded without LoRA, so they do not change while it
    # trains): rows beyond it are encoded again every epoch; null = half the memory free
    # there once the LM has loaded; 0 = no cache. Sizes memory only, changes no result.
    prefix_cache_gb: Optional[float] = None
    # optimizer steps every `accumulate` batches of batch_prompts prompts, on their gradient
    # as one batch's (each batch's loss weighed by its share of the losses' terms: paths, or
    # pairs for a pairwise loss): an effective batch of accumulate x batch_prompts prompts
    # with one batch's memory
    accumulate: int = 1
    # true: train on the prompts whose training paths have mixed outcomes only (some end
    # correct, some not: the prompts a within-prompt ranking can learn from); validation
    # and test keep every prompt
    mixed_only: bool = False


def check_predictor(pred) -> None:
    """predictor.*: a registered predictor (those of other packages included:
    stopexp.core.names), every predictor's ranges, then what the chosen one needs."""
    PREDICTOR.check(pred)


def check_train(tr) -> None:
    for key in ("epochs", "batch_prompts", "patience", "accumulate"):
        at_least(f"train.{key}", tr[key], 1)
    within("train.lr", tr.lr, 0, math.inf, low_open=True, high_open=True)
    at_least("train.weight_decay", tr.weight_decay, 0)
    if tr.prefix_cache_gb is not None:
        at_least("train.prefix_cache_gb", tr.prefix_cache_gb, 0)
    if tr.max_prompts is not None:
        at_least("train.max_prompts", tr.max_prompts, 1)


def check_position_input(pred) -> None:
    if pred.position_input and pred.name not in POSITION_INPUT_PREDICTORS:
        why = ("reads prefix_len among its signal columns already"
               if pred.name in ("conf_features", "hidden_conf") else "has no learned head to feed it")
        fail("predictor.position_input", f"predictor={pred.name} {why}; allowed with "
                                         f"{', '.join(POSITION_INPUT_PREDICTORS)}")


def check_pca_components(pred) -> None:
    if pred.pca_components is not None and pred.name not in PCA_PREDICTORS:
        why = {"fusion": "reads every tapped layer (its own projection of each)",
               "conf_features": "reads no hidden state"}.get(
                   pred.name, "has no learned head on one tapped layer's state")
        fail("predictor.pca_components", f"predictor={pred.name} {why}; allowed with "
                                         f"{', '.join(PCA_PREDICTORS)}")


def check_centre_prompts(pred) -> None:
    if pred.centre_prompts and pred.name not in CENTRING_PREDICTORS:
        fail("predictor.centre_prompts", f"predictor={pred.name} has no learned head on the "
                                         "tapped hidden state to centre it for; allowed with "
                                         f"{', '.join(CENTRING_PREDICTORS)}")
