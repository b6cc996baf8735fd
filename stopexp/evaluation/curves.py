"""Evaluate's AUROC-by-prefix curves: every method scored at every stored position of the
bank, with, under train.positions=all, the single-checkpoint predictor beside them."""
from __future__ import annotations

import numpy as np
import torch

from stopexp.core.names import runs_the_lm
from stopexp.evaluation.paired import by_prefix
from stopexp.metrics.ranking import auroc_by_position
from stopexp.signals import methods as M
from stopexp.store import bank


def prefix_curves(ds, rows: dict | None, scorers: dict, baseline: tuple[str, object] | None,
                    n_boot: int, seed: int) -> tuple[dict, dict]:
    """Evaluate's curves: (method -> auroc_by_position over the bank split `ds` (`rows`:
    its position batch, stopexp.training.per_step.position_data), the paired differences of
    the probes and the controls at every prefix, `stopexp.evaluation.paired.by_prefix` with
    `n_boot` resamples from `seed`), for every scorer (learned, confidence, entropy,
    hidden-state statistics, random, oracle; not the super token, which would re-run the
    LM at every position) and the `baseline` (label, predictor), with train.positions=all
    the single-checkpoint predictor scored at every position (labelled
    "<predictor>@<tokens>"). ({}, {}) without stored positions."""
    if rows is None:
        return {}, {}
    use = {k: v for k, v in scorers.items() if v is not None and not runs_the_lm(k)}
    if baseline is not None:
        use[baseline[0]] = M.learned(baseline[1])
    keys = np.asarray([f"{p}/{j}" for p, j in zip(ds["prompt"][:], ds["path_id"][:])], dtype=object)
    scores = prefix_scores(use, rows, keys)
    position, correct, group = rows["position"].numpy(), rows["correct"], rows["group"].numpy()
    curves = {m: auroc_by_position(s, correct, group, position) for m, s in scores.items()}
    return curves, by_prefix(scores, correct.numpy(), group, position, n_boot, seed)


def prefix_scores(scorers: dict, rows: dict, seed_keys: np.ndarray | None = None) -> dict:
    """method -> (B,) scores of its scorer on the position batch `rows` (alive rows;
    "group" the prompt). Each position is scored on its own, so a scorer that compares a
    path with its prompt's peers (st_bon) sees only the peers at the same position.
    `seed_keys`: the bank's per-path stream names, indexed by rows["path"] (the random
    scorer's; a path keeps its draw at every position)."""
    pos = rows["position"].numpy()
    out = {}
    for name, scorer in scorers.items():
        scores = np.zeros(len(pos))
        for p in np.unique(pos):
            at = np.nonzero(pos == p)[0]
            batch = bank.select_rows(rows, torch.from_numpy(at))
            if seed_keys is not None:
                batch["seed_key"] = list(seed_keys[batch["path"].numpy()])
            scores[at] = np.asarray(scorer(batch), dtype=float)
        out[name] = scores
    return out
