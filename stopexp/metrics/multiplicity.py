"""Corrections for many looks: a report that prints a family of paired intervals (every
cell of a table) prints Holm's adjusted p-values beside them and marks the cells that
survive at family-wise level alpha.

The p-value of a paired difference comes from the same bootstrap resamples as its
percentile interval (`stopexp.metrics.paired_difference`), by inverting the interval: the
two-sided p is the smallest level whose percentile interval reaches 0, twice the share of
resampled means on the far side of 0 (a mean at exactly 0 counts on both sides), with the
Monte Carlo "+1" (Davison & Hinkley 1997, eq. 4.11) so that B resamples never give p = 0:

    p = min(1, 2 (1 + min(#{d* <= 0}, #{d* >= 0})) / (B + 1))

A raw 95% interval that excludes 0 therefore has p <= 0.05 up to that +1 (one resample in
B). The smallest p that B resamples can give is 2 / (B + 1) (`p_floor`): a family of m
tests needs alpha / m above it for its first Holm step to be reachable (1,000 resamples
resolve families of up to 25 at 0.05; 10,000 up to 250).

Holm's step-down (Holm 1979): sort the m finite p-values, p_(1) <= ... <= p_(m); the
adjusted p_(i) is max over j <= i of min(1, (m - j + 1) p_(j)). A test survives where its
adjusted p is at most alpha; NaN p-values (no prompt to compare) are not tests and stay
NaN. statsmodels' `multipletests(method="holm")` computes the same; it is not a
dependency of this project, so the few lines are here, tested against hand-computed values.
"""
from __future__ import annotations

import numpy as np

ALPHA = 0.05


def bootstrap_p(stats) -> float:
    """Two-sided p of "the difference is 0" from the bootstrap statistics `stats` (the
    resampled mean differences; NaN ones left out), by the inversion above; NaN without any."""
    s = np.asarray(stats, dtype=float)
    s = s[~np.isnan(s)]
    if not len(s):
        return float("nan")
    far = min(int((s <= 0).sum()), int((s >= 0).sum()))
    return float(min(1.0, 2 * (1 + far) / (len(s) + 1)))


def p_floor(n_boot: int) -> float:
    """The smallest p `bootstrap_p` gives with `n_boot` resamples."""
    return 2 / (n_boot + 1)


def holm(p_values) -> np.ndarray:
    """Holm's adjusted p-values of `p_values` (NaN stays NaN and is no test), in their order."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    steps = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(steps) if m else steps
    return out


def correct_family(cells: list[dict], alpha: float = ALPHA) -> int:
    """Holm over `cells` (paired-difference dicts with their "p"), in place: each gets
    "p_holm" and "holm" (True where it survives at family-wise `alpha`, None where it has
    no p). A cell without "p" (a record written before p-values were kept) is left as it
    is. Returns the family's size m (the cells with a finite p)."""
    cells = [c for c in cells if "p" in c]
    adjusted = holm([c["p"] for c in cells])
    for c, a in zip(cells, adjusted):
        c["p_holm"] = float(a)
        c["holm"] = None if np.isnan(a) else bool(a <= alpha)
    return int(np.isfinite(adjusted).sum())


def holm_note(m: int, n_boot: int | None = None, alpha: float = ALPHA) -> str:
    """The sentence a table prints under a family of `m` corrected cells: what the mark
    means, and where `n_boot` resamples (when known) cannot reach Holm's first step."""
    note = (f"Holm over the {m} intervals of this family (family-wise {alpha:g}): p_Holm "
            f"beside each, * where it survives")
    if m and n_boot and alpha / m < p_floor(n_boot):
        note += (f"; with {n_boot} resamples no p falls below {p_floor(n_boot):.4f} > {alpha:g}/{m}: "
                 f"raise evaluate.bootstrap to at least {int(np.ceil(2 * m / alpha))} to resolve it")
    return note


def holm_text(cell: dict) -> str:
    """` p 0.004, Holm 0.016 *` (two significant digits) for a corrected cell; "" for one without a p."""
    if cell.get("p_holm") is None or np.isnan(cell["p_holm"]):
        return ""
    return f" p {cell['p']:.2g}, Holm {cell['p_holm']:.2g}{' *' if cell['holm'] else ''}"
