"""Scoring methods compared by evaluate, behind one signature: `score(batch) -> (B,)`,
higher = keep. The batch is the predictor batch (see features.py) plus "seed_key" (one
string per path, naming its random stream) and, for the oracle, "correct"/"reward".

- non-learnable: confidence (mean log-prob), min_logprob (the least likely token so far),
  entropy (minus mean entropy), deepconf
  (lowest windowed group confidence), hidden_norm (the L2 norm of the current token's
  hidden state at the *deepest tapped layer*, i.e. the highest index among the resolved
  tap.layers, whatever order they are listed in; with tap=last it is the model's last
  decoder layer's output, before the final norm), hidden_mean and hidden_var (the mean
  and population variance of the same state's components; `stopexp.signals.columns`
  computes all three), attn_entropy (minus the mean entropy of the tap.attention_heads'
  attention at the current token: focused attention is kept; needs the tap), st_bon (consistency of a path's
  hidden states with its prompt's other live paths, `stopexp.signals.st_bon`);
- controls: random (a per-path seeded draw, the same in replay and online), oracle (the
  path's final reward, i.e. its outcome under reward=correct: the upper bound),
  error_oracle (whether the prefix already writes a wrong intermediate value: the ceiling
  of a check at that prefix; replay only, on tasks with intermediate values);
- learned: any trained predictor;
- external: a callable registered with `register_external`, e.g. a verifier or PRM (the
  registry lives in stopexp.core.names, so config checks a name without torch).
"""
from __future__ import annotations

from typing import Callable

import torch

from stopexp.core.names import (  # noqa: F401
    _EXTERNAL,
    BASELINE_METHODS,
    external,
    names,
    register_external,
)
from stopexp.core.seeds import stream_seed
from stopexp.runtime.threads import one_thread
from stopexp.signals.feature_spec import SIGNAL_NAMES
from stopexp.signals.st_bon import st_bon

Scorer = Callable[[dict], torch.Tensor]
def non_learnable() -> tuple[str, ...]:
    """The methods that learn nothing: the baselines and the stopping methods (those
    registered after import included)."""
    return (*BASELINE_METHODS, *names("stopping"))


def _signal(name: str, sign: float = 1.0) -> Scorer:
    col = SIGNAL_NAMES.index(name)
    return lambda batch: sign * batch["signals"][:, col]


# the baselines by name (stopexp.core.names registers each as stopexp.signals.methods:<name>)
confidence = _signal("mean_logprob")
min_logprob = _signal("min_logprob")
entropy = _signal("mean_entropy", -1.0)
deepconf = _signal("group_conf")
hidden_norm = _signal("hidden_norm")
hidden_mean = _signal("hidden_mean")
hidden_var = _signal("hidden_var")
attn_entropy = _signal("attn_entropy", -1.0)
# (st_bon is imported above)
BASELINES: dict[str, Scorer] = {name: globals()[name] for name in BASELINE_METHODS}


def random_scorer(seed: int) -> Scorer:
    def score(batch):
        # beams have no path id: a beam's stream is named by its tokens so far
        keys = batch.get("seed_key") or ["/".join(map(str, t)) for t in batch["tokens"].tolist()]
        return torch.tensor([stream_seed(seed, "random", k) / 2**63 for k in keys])
    return score


def oracle(batch) -> torch.Tensor:
    """The path's final reward (its outcome where the batch has no reward): it knows how
    every path ends, so it is the upper bound. Not the Monte Carlo label, an estimate from
    the prefix that ranks a path that will fail above one that will succeed now and then."""
    label = batch.get("reward", batch["correct"])
    return label + 1e-3 * batch["correct"]  # equal rewards: the right path first


def error_oracle(batch) -> torch.Tensor:
    """0 where the path's first wrong intermediate value is written by the prefix (the
    bank's first_wrong_value, in tokens, is at most "prefix_len"), else 1: what a check at
    that prefix could know at best about the steps written so far."""
    wrong = batch.get("first_wrong_value")
    if wrong is None:
        raise ValueError("error_oracle: these paths carry no first_wrong_value (a trace bank "
                         "of task wordprob records it); rerun collect for this config")
    return 1.0 - ((wrong >= 0) & (wrong <= batch["prefix_len"])).float()


def learned(predictor) -> Scorer:
    @torch.no_grad()
    def score(batch):
        with one_thread(predictor):  # the same scores whatever the thread count
            return predictor(batch).float()
    return score
