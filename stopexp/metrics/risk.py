"""Learn-then-Test (Angelopoulos, Bates, Candès, Jordan, Lei, arXiv 2110.01052): from n
exchangeable calibration losses in [0, 1] per candidate setting, the settings certified to
have risk <= alpha, jointly with probability >= 1 - delta. Each candidate's null "risk >
alpha" gets a valid p-value (`hoeffding_bentkus`; `binomial_tail` for 0/1 losses), and
fixed-sequence testing rejects them in a fixed order (safest first) until the first p-value
above delta, which controls the family-wise error at delta with no multiplicity penalty."""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta, binom


def _kl(a: float, b: float) -> float:
    """h1(a, b) = KL(Bernoulli(a) || Bernoulli(b)) of Hoeffding's tail bound, 0 log 0 = 0."""
    out = (1 - a) * math.log((1 - a) / (1 - b)) if a < 1 else 0.0
    return out + (a * math.log(a / b) if a > 0 else 0.0)


def hoeffding_bentkus(risk_hat: float, n: int, alpha: float) -> float:
    """LTT's p-value of H0: risk > alpha for a mean `risk_hat` of n losses in [0, 1]
    (Bates et al. 2021, Prop. 3 / LTT eq. 11): min(exp(-n h1(min(risk_hat, alpha), alpha)),
    e P(Bin(n, alpha) <= ceil(n risk_hat)))."""
    hoeffding = math.exp(-n * _kl(min(risk_hat, alpha), alpha))
    # n * risk_hat is a whole count where it should be; the rounding guard keeps it one
    bentkus = math.e * binom.cdf(math.ceil(n * risk_hat - 1e-9), n, alpha)
    return min(hoeffding, bentkus, 1.0)


def binomial_tail(failures: int, n: int, alpha: float) -> float:
    """The exact p-value of H0: risk > alpha for 0/1 losses: P(Bin(n, alpha) <= failures)."""
    return float(binom.cdf(failures, n, alpha))


def fixed_sequence(p_values, delta: float) -> int:
    """How many candidates, taken in order, fixed-sequence testing rejects at level delta:
    the index of the first p-value above delta (all of them when none is)."""
    above = np.nonzero(np.asarray(p_values, dtype=float) > delta)[0]
    return int(above[0]) if len(above) else len(p_values)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial (Clopper-Pearson) interval of a rate k/n at `level`."""
    if n == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi
