"""The policy group (conf/policy/): which paths a check keeps, and its checks (those on K
per check of search.check_at: stopexp.config.cross.keep_per_check)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stopexp.config.ranges import TOGETHER, at_least, fail, within
from stopexp.core.protocol import check_values


@dataclass
class PolicyConfig:
    name: str = "topk"             # fixed | quantile | topk | adaptive
    # topk: K paths kept out of N (a list: one K per search.check_at); default derived from
    # search.n_paths: round(sqrt(N)), and with several checks one K per check (derived_keep)
    keep: Any = "${stopexp_keep:${search.n_paths},${search.check_at},${policy.name}}"
    tau: float = 0.5               # fixed threshold (and the adaptive start)
    quantile: float = 0.5          # quantile: prune below this quantile of live signals
    target_prune_rate: float = 0.5
    gain: float = 0.1              # adaptive: step of the controller


def check_keep_within(pol, n_paths: int) -> None:
    """Every K of policy.keep lies in 1..N."""
    for k in check_values(pol.keep):
        if not 1 <= k <= n_paths:
            fail("policy.keep", f"retention K={k} must lie in 1..N={n_paths} (search.n_paths)"
                                f"{TOGETHER.format(key='policy.keep')}")


def check_thresholds(pol) -> None:
    """The threshold policies' knobs."""
    within("policy.quantile", pol.quantile, 0, 1, low_open=True, high_open=True)
    within("policy.target_prune_rate", pol.target_prune_rate, 0, 1, high_open=True)
    at_least("policy.gain", pol.gain, 0)
