"""Where a predictor picks its epoch. By default on the validation split. Under policy=risk
the thresholds are calibrated on those prompts, and a calibration set must be one the
predictor never saw (split conformal prediction: fit, selection, calibration and test on
disjoint prompts). So there the predictor picks its epoch on a share of the training
prompts (policy.selection_share, `stopexp.core.policies.selection_share`), which it is
then not fitted to, and the validation prompts are left whole for calibration: the
power of Learn-then-Test grows with their number."""
from __future__ import annotations

import logging

import numpy as np

from stopexp.store.bank import select_rows
from stopexp.training.data import NothingToLearn
from stopexp.training.per_step import usable_groups

log = logging.getLogger(__name__)


def selection_prompts(prompts: np.ndarray, share: float) -> np.ndarray:
    """The prompt ids held out for epoch selection among the distinct `prompts`: k of the G
    of them, k = share * G rounded half up (at least 1), evenly spaced in sorted order (the
    j-th at position floor((j + 1/2) G / k), exact in floats: (j + 1/2) G is). Which training
    prompts they are does not bear on the guarantee (none is a validation prompt); spacing
    spreads them over the bank's prompt order (a file's may follow difficulty)."""
    ids = np.unique(prompts)
    k = max(1, int(share * len(ids) + 0.5))
    return ids[((np.arange(k) + 0.5) * len(ids) / k).astype(np.int64)]


def hold_out_for_selection(data: dict, share: float, min_gap: float = 0.0) -> dict:
    """`data` (split -> rows: `split_data` or `per_step.split_data_all`) with the training
    rows of the `selection_prompts` moved out of "train" into "val", in place of the
    validation rows, which the predictor then never sees; unchanged at share 0. Prompts
    are "prompt_group" where the rows have it (every-position data), else "group".
    NothingToLearn, naming policy.selection_share, when either part has no pair to learn
    or select from (`per_step.usable_groups`, with the pair losses' `min_gap`)."""
    if not share:
        return data
    train = data["train"]
    prompts = np.asarray(train.get("prompt_group", train["group"]))
    held = np.isin(prompts, selection_prompts(prompts, share))
    out = {**data, "train": select_rows(train, ~held), "val": select_rows(train, held)}
    counts = {"val": len(np.unique(prompts[held])), "train": len(np.unique(prompts[~held]))}
    for part, what in (("val", "held out to pick the epoch on"), ("train", "left to fit on")):
        if not usable_groups(out[part], min_gap):
            raise NothingToLearn(
                f"policy.selection_share: none of the {counts[part]} training prompts {what} "
                f"(share {share} of {len(np.unique(prompts))}) has a pair to compare (two paths of "
                "different outcomes at the checkpoint); change policy.selection_share or collect "
                "more training prompts (collect.prompts.train)")
    log.info("policy=risk: the predictor picks its epoch on %d of the %d training prompts "
             "(policy.selection_share=%s), not on the validation prompts it is calibrated on",
             counts["val"], len(np.unique(prompts)), share)
    return out
