"""The predictor, loss and train groups (conf/predictor/, conf/loss/, conf/train.yaml):
what scores a prefix, what it is trained on and how, and their checks."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List

from stopexp.config.ranges import at_least, fail, within
from stopexp.core.names import POSITION_INPUT_PREDICTORS, SIGNAL_NAMES


@dataclass
class PredictorConfig:
    name: str = "mlp"       # statistic | linear | mlp | fusion | conf_features | super_token
    hidden: int = 128
    depth: int = 1
    dropout: float = 0.0
    layer: int = -1         # which tap layer single-tap predictors read
    statistic: str = "l2"   # statistic predictor: l2 | mean | var
    n_tokens: int = 4       # super_token: [STOP] copies appended (one shared embedding)
    lora_rank: int = 8      # super_token: its LoRA adapter, active only on the [STOP] tokens
    lora_alpha: float = 16.0
    lora_targets: List[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # conf_features: signal columns read besides the confidence ones (e.g. [attn_entropy])
    signals: List[str] = field(default_factory=list)
    # linear | mlp | fusion: the position (generated tokens) as one more input of the head,
    # log-scaled (stopexp.signals.features.position_feature)
    position_input: bool = False


@dataclass
class LossConfig:
    name: str = "contrastive"  # contrastive | pairwise | reward_regression | mse
    # contrastive: relu(margin * reward gap - score gap) over pairs ordered by reward (a
    # 0/1 outcome has gap 1: the plain margin)
    margin: float = 1.0
    min_gap: float = 0.0       # contrastive / pairwise: pairs whose reward gap is <= this are skipped
    discount: float = 0.95     # mse: reward discounted by the tokens still to go
    length_reg: float = 0.0    # weight of the score<->prefix-length correlation penalty


@dataclass
class TrainConfig:
    epochs: int = 30
    batch_prompts: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.01
    patience: int = 5
    checkpoint: float = 0.08  # which tap checkpoint the predictor is trained at
    # checkpoint: at train.checkpoint only | all: at every stored position, pairs mined
    # within (prompt, position), a batch holds batch_prompts such groups, epochs selected
    # on the validation within-prompt AUROC averaged over positions (stopexp/training/per_step.py)
    positions: str = "checkpoint"
    seed: int = 0


def check_predictor(pred) -> None:
    """predictor.*: sizes, super_token's adapter and the signal columns (read by
    conf_features only: names of stopexp.core.names.SIGNAL_NAMES)."""
    at_least("predictor.hidden", pred.hidden, 1)
    at_least("predictor.depth", pred.depth, 0)
    within("predictor.dropout", pred.dropout, 0, 1, high_open=True)
    if pred.n_tokens < 1 or pred.lora_rank < 1 or not pred.lora_targets:
        fail("predictor", f"super_token needs n_tokens >= 1, lora_rank >= 1 and lora_targets; got "
                          f"n_tokens={pred.n_tokens}, lora_rank={pred.lora_rank}, "
                          f"lora_targets={list(pred.lora_targets)}")
    within("predictor.lora_alpha", pred.lora_alpha, 0, math.inf, low_open=True, high_open=True)
    names = list(pred.signals)
    if names and pred.name != "conf_features":
        fail("predictor.signals", f"only predictor=conf_features reads signal columns, not "
                                  f"{pred.name}; leave it empty")
    for name in names:
        if name not in SIGNAL_NAMES:
            fail("predictor.signals", f"{name!r} unknown; allowed: {', '.join(SIGNAL_NAMES)}")


def check_loss(loss) -> None:
    at_least("loss.margin", loss.margin, 0)
    within("loss.discount", loss.discount, 0, 1, low_open=True)
    at_least("loss.length_reg", loss.length_reg, 0)


def check_train(tr) -> None:
    for key in ("epochs", "batch_prompts", "patience"):
        at_least(f"train.{key}", tr[key], 1)
    within("train.lr", tr.lr, 0, math.inf, low_open=True, high_open=True)
    at_least("train.weight_decay", tr.weight_decay, 0)


def check_position_input(pred) -> None:
    if pred.position_input and pred.name not in POSITION_INPUT_PREDICTORS:
        why = ("reads prefix_len among its signal columns already" if pred.name == "conf_features"
               else "has no learned head to feed it")
        fail("predictor.position_input", f"predictor={pred.name} {why}; allowed with "
                                         f"{', '.join(POSITION_INPUT_PREDICTORS)}")


def check_min_gap(loss) -> None:
    at_least("loss.min_gap", loss.min_gap, 0)
    if loss.min_gap and loss.name not in ("contrastive", "pairwise"):
        fail("loss.min_gap", f"only loss=contrastive | pairwise skip pairs by it, not "
                             f"loss={loss.name}; leave it 0")
