"""Evaluate's AUROC-by-prefix curves: every method scored at every stored position of the
bank, with, under train.positions=all, the single-checkpoint predictor beside them."""
from __future__ import annotations

import copy

import numpy as np

from stopexp.config import checkpoint_tokens
from stopexp.evaluation.paired import by_prefix
from stopexp.signals import methods as M
from stopexp.signals.checkpoint import load_predictor
from stopexp.training.data import predictor_dir, trained_on
from stopexp.training.per_step import auroc_by_position, position_data, prefix_scores
from stopexp.training.predictor import train


def single_checkpoint_baseline(cfg, spec) -> tuple[str, object] | None:
    """With train.positions=all: (label, predictor) of the same predictor trained the
    standard way, at train.checkpoint only and without the position input (trained here
    when missing, as the controls are), to be scored at every position. None otherwise."""
    if cfg.train.positions != "all":
        return None
    sub = copy.deepcopy(cfg)
    sub.train.positions, sub.predictor.position_input = "checkpoint", False
    train(sub, progress=False)
    predictor, _ = load_predictor(predictor_dir(sub), spec, sub.predictor, trained_on(sub))
    tokens = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
    return f"{cfg.predictor.name}@{tokens}", predictor


def auroc_by_prefix(cfg, scorers: dict, split: str, spec) -> tuple[dict, dict]:
    """Evaluate's curves: (method -> auroc_by_position over the `split` paths of the bank,
    the paired differences of the probes and the controls at every prefix,
    `stopexp.evaluation.paired.by_prefix`), for every scorer (learned, confidence, entropy,
    hidden-state statistics, random, oracle; not the super token, which would re-run the
    LM at every position) and, with train.positions=all, the single-checkpoint predictor
    scored at every position (labelled "<predictor>@<tokens>"). ({}, {}) without stored
    positions."""

    ds, rows = position_data(cfg, split)
    if rows is None:
        return {}, {}
    use = {k: v for k, v in scorers.items() if v is not None and k != "super_token"}
    base = single_checkpoint_baseline(cfg, spec)
    if base is not None:
        use[base[0]] = M.learned(base[1])
    keys = np.asarray([f"{p}/{j}" for p, j in zip(ds["prompt"][:], ds["path_id"][:])], dtype=object)
    scores = prefix_scores(use, rows, keys)
    position, correct, group = rows["position"].numpy(), rows["correct"], rows["group"].numpy()
    curves = {m: auroc_by_position(s, correct, group, position) for m, s in scores.items()}
    return curves, by_prefix(scores, correct.numpy(), group, position, cfg.evaluate.bootstrap,
                             cfg.evaluate.seed)
