"""What says an evaluation's result is degenerate, though it ran to its end: a method that
left prompts with no path to vote (every path pruned or stopped: their answer counts as
wrong), or that scored paths with NaN or infinite values (a diverged predictor, inputs
that are not finite). Each becomes one warning, logged and kept in metrics.json's
`warnings`, so that a number read from the table is never silently one of these."""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def degenerate_warnings(outcomes: dict, scores: dict) -> list[str]:
    """The warnings of every method's outcome (`outcomes`: name -> outcome dict with
    `no_path_left` per prompt) and scores at the check (`scores`: name -> (P,)), logged."""
    found = []
    for name, o in outcomes.items():
        empty, prompts = int(np.sum(o.get("no_path_left", 0))), len(o["correct"])
        if empty:
            found.append(f"{name}: every path was pruned in {empty} of {prompts} prompts, so "
                         "they have no answer to vote and count as wrong; its settings prune "
                         "too much for this run (a threshold, a budget)")
    for name, s in scores.items():
        bad = int((~np.isfinite(np.asarray(s, dtype=float))).sum())
        if bad:
            found.append(f"{name}: {bad} of {len(s)} scores at the check are NaN or infinite "
                         "(NaN ranks lowest, pruned first; +-inf at the extremes): its "
                         "predictor diverged or its inputs are not finite")
    for warning in found:
        log.warning("%s", warning)
    return found


def diverged_updates(variant: str, records: list[dict], predictor) -> list[str]:
    """A warning (logged) when an online variant's updates (adapt's stream: `records`, one
    per batch) left a non-finite loss or non-finite weights in `predictor`."""
    updated = [r for r in records if "feedback_paths" in r]  # the batches that updated it
    bad = [r["batch"] for r in updated if not np.isfinite([r["loss_first"], r["loss_last"]]).all()]
    weights = predictor is not None and not all(p.isfinite().all() for p in predictor.parameters())
    if not bad and not weights:
        return []
    where = f"from batch {bad[0]}" if bad else "by the last batch"
    warning = (f"{variant}: the online updates diverged {where} (a NaN or infinite loss or "
               "weights), so its later decisions rank paths by non-finite scores; allowed: a "
               "smaller adapt.lr")
    log.warning("%s", warning)
    return [warning]
