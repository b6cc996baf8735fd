"""The bounds of the bounded metrics (BLEU, ROUGE, BERTScore): a value that leaves its range
by floating-point rounding only is clipped into it where the metric is computed, so a
direct call respects the bound too; further out it is refused."""
from __future__ import annotations

import numpy as np

# How far outside its range, as a share of the range, rounding alone takes a bounded metric.
# BERTScore's F1 combines float32 cosine similarities of unit vectors: identical texts give
# 1 + a few float32 ulps (1.0000001 and 1.0000002 seen; an ulp above 1 is 2**-23 = 1.2e-7),
# and a dot product of d = 384..1024 terms rounds by about sqrt(d) * 2**-24 <= 2e-6;
# sacrebleu's BLEU of an identical pair is 100.00000000000004. 1e-5 covers these; a real
# violation (a score on another scale, BLEU in 0-100 read as 0-1) is orders of magnitude further.
BOUND_SLACK = 1e-5


def digits(x) -> str:
    """`x` with the fewest digits that tell it apart in its own dtype (a float32 1.0000001
    is not 1), so a value outside its range never prints as a bound."""
    return np.format_float_positional(x, unique=True, trim="-")


def clip_to_range(values, what: str, high: float = 1.0) -> tuple[np.ndarray, int]:
    """`values` (float64) with those within BOUND_SLACK of the range [0, high] clipped into
    it, and how many were; ValueError naming `what` and the first value further out (NaN
    included), in full digits."""
    v = np.asarray(values, dtype=np.float64)
    slack = BOUND_SLACK * high
    far = np.nonzero(~((v >= -slack) & (v <= high + slack)))[0]
    if len(far):
        raise ValueError(f"{what}: {len(far)} of {len(v)} scores lie outside [0, {high:g}] by more "
                         f"than rounding ({slack:g}), e.g. {digits(v[far[0]])} (position {far[0]})")
    return np.clip(v, 0.0, high), int(((v < 0) | (v > high)).sum())
