"""Calibration of predicted success probabilities (equal-width bins on [0, 1]).

A NaN probability (from a NaN score) counts as 0, as NaN scores rank lowest everywhere
(see `stopexp.metrics.ranking`)."""
from __future__ import annotations

import numpy as np


def _pair(probs, labels):
    p, y = np.asarray(probs, dtype=float), np.asarray(labels, dtype=float)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"probs {p.shape} and labels {y.shape} must be equal-length 1-d")
    p = np.nan_to_num(p, nan=0.0)
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"probabilities must lie in [0, 1]; got values from {p.min()} to {p.max()}")
    return p, y


def reliability(probs, labels, n_bins: int = 10) -> dict:
    """Per-bin accuracy and mean confidence for a reliability diagram (NaN where empty)."""
    p, y = _pair(probs, labels)
    b = np.minimum((p * n_bins).astype(int), n_bins - 1)  # [k/n, (k+1)/n); p == 1 in the last
    counts = np.bincount(b, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.bincount(b, weights=y, minlength=n_bins) / counts
        confidence = np.bincount(b, weights=p, minlength=n_bins) / counts
    return {"bin_centers": (np.arange(n_bins) + 0.5) / n_bins, "accuracy": accuracy,
            "confidence": confidence, "counts": counts}


def ece(probs, labels, n_bins: int = 10) -> float:
    """Expected calibration error: |accuracy - confidence| per bin, weighted by bin size."""
    r = reliability(probs, labels, n_bins)
    filled = r["counts"] > 0
    gap = np.abs(r["accuracy"][filled] - r["confidence"][filled])
    return float((gap * r["counts"][filled]).sum() / r["counts"].sum())


def brier(probs, labels) -> float:
    """Mean squared error of the probabilities against the 0/1 outcomes."""
    p, y = _pair(probs, labels)
    return float(np.mean((p - y) ** 2))
