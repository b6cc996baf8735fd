"""What a predictor is fed: the names of the non-learnable signal columns, the feature spec
recorded with every trace bank and checkpoint, and helpers that read a batch against it.

A batch is a dict of float32 tensors for B path checkpoints: "hidden" (B, n_tap_layers, H)
in `FeatureSpec.tap_layers` order, "signals" (B, S) with columns `signal_names`, "group"
(B,) int64 prompt id, "correct" (B,) 0/1, "reward" (B,) the path's reward
(stopexp/tasks/rewards.py; = correct for reward=correct), "mc" (B,) Monte Carlo mean reward or NaN,
"prefix_len" and "remaining" (B,) in tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stopexp.core.names import SIGNAL_NAMES  # noqa: F401  (the columns, in order: signals.columns)


@dataclass
class FeatureSpec:
    model_name: str
    hidden_size: int
    tap_layers: list[int]  # resolved model layer indices (non-negative), order of "hidden"
    signal_names: tuple = SIGNAL_NAMES


def tap_index(layer: int, spec: FeatureSpec) -> int:
    """Position on the tap axis of `predictor.layer`: a tapped layer as is, or a negative
    index counted from the deepest tapped layer (-1 = deepest, -2 = the one before, ...).

    The spec does not know the model's depth, so -1 means the last *model* layer only
    when that layer is tapped (as in conf/tap/last.yaml and multi.yaml)."""
    if layer in spec.tap_layers:
        return spec.tap_layers.index(layer)
    deepest_first = sorted(spec.tap_layers, reverse=True)
    if -len(deepest_first) <= layer < 0:
        return spec.tap_layers.index(deepest_first[-layer - 1])
    raise ValueError(f"predictor.layer: {layer} is not a tapped layer; allowed: "
                     f"{sorted(spec.tap_layers)} (tap.layers) or -1..-{len(spec.tap_layers)} "
                     "counted from the deepest tapped layer")


def hidden_of(batch: dict, spec: FeatureSpec) -> torch.Tensor:
    """batch["hidden"], checked against the spec the predictor was built for."""
    hidden = batch["hidden"]
    expected = (len(spec.tap_layers), spec.hidden_size)
    if hidden.dim() != 3 or tuple(hidden.shape[1:]) != expected:
        raise ValueError(f"batch['hidden'] has shape {tuple(hidden.shape)}, but the predictor "
                         f"was built for (B, {expected[0]}, {expected[1]}): {spec}")
    return hidden


def signal_columns(names, spec: FeatureSpec) -> list[int]:
    """Column indices of `names` in batch["signals"]."""
    missing = [n for n in names if n not in spec.signal_names]
    if missing:
        raise ValueError(f"signals {missing} are not in the feature spec's signal_names "
                         f"{tuple(spec.signal_names)}")
    return [list(spec.signal_names).index(n) for n in names]


# positions are log-scaled against this many tokens: 1 token -> 0.08, 64 -> 0.50, 4096 -> 1.0
POSITION_SCALE = 4096


def position_feature(batch: dict) -> torch.Tensor:
    """(B, 1) float32: the prefix length in generated tokens, batch["prefix_len"] (every
    batch has it: training rows, replay, online checks, beams), as log1p(t) /
    log1p(POSITION_SCALE). Predictors with `predictor.position_input` concatenate it to their
    head's input. The log keeps short prefixes apart, and a fixed scale means a checkpoint
    carries no statistic of its training data."""
    t = torch.as_tensor(batch["prefix_len"], dtype=torch.float32)
    return (torch.log1p(t.clamp(min=0)) / math.log1p(POSITION_SCALE)).unsqueeze(-1)
