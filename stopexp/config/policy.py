"""The policy group (conf/policy/): which paths a check keeps. One schema per policy with its
checks beside it; `PolicyConfig`, the view, holds every policy's keys (stopexp.config.options).
K per check of search.check_at: stopexp.config.cross.keep_per_check; policy=risk's data:
`check_risk_calibration`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stopexp.config.options import Group
from stopexp.config.ranges import TOGETHER, at_least, fail, within
from stopexp.core.limits import count
from stopexp.core.protocol import check_values


@dataclass
class PolicyBaseConfig:
    name: str = "topk"             # fixed | quantile | topk | adaptive | risk


@dataclass
class FixedPolicyConfig(PolicyBaseConfig):
    name: str = "fixed"
    tau: float = 0.5               # prune paths scoring below tau (adaptive: its start)


@dataclass
class QuantilePolicyConfig(PolicyBaseConfig):
    name: str = "quantile"
    quantile: float = 0.5          # prune below this quantile of live signals

    @staticmethod
    def ranges(pol) -> None:
        within("policy.quantile", pol.quantile, 0, 1, low_open=True, high_open=True)


@dataclass
class TopKPolicyConfig(PolicyBaseConfig):
    name: str = "topk"
    # K paths kept out of N (a list: one K per search.check_at); default derived from
    # search.n_paths: round(sqrt(N)), and with several checks one K per check (derived_keep)
    keep: Any = field(default="${stopexp_keep:${search.n_paths},${search.check_at},${policy.name}}",
                      metadata=count())


@dataclass
class AdaptivePolicyConfig(FixedPolicyConfig):
    """A threshold that a controller moves towards a target prune rate."""
    name: str = "adaptive"
    target_prune_rate: float = 0.5
    gain: float = 0.1              # step of the controller

    @staticmethod
    def ranges(pol) -> None:
        within("policy.target_prune_rate", pol.target_prune_rate, 0, 1, high_open=True)
        at_least("policy.gain", pol.gain, 0)


@dataclass
class RiskPolicyConfig(PolicyBaseConfig):
    """The threshold calibrated on the validation split (Learn-then-Test) so that the risk
    (voter: share of a prompt's majority voters pruned; answer: the voted answer changed)
    is <= alpha with probability >= 1 - delta (stopexp.evaluation.risk)."""
    name: str = "risk"
    risk: str = "voter"
    alpha: float = 0.1
    delta: float = 0.1
    # risk: the share of the training prompts a learned predictor picks its epoch on (and
    # is not fitted to), so that no validation prompt it calibrates on shaped the predictor;
    # 0: it picks its epoch on the validation prompts (the guarantee is then approximate)
    selection_share: float = 0.2

    @staticmethod
    def ranges(pol) -> None:
        within("policy.alpha", pol.alpha, 0, 1, low_open=True, high_open=True)
        within("policy.delta", pol.delta, 0, 1, low_open=True, high_open=True)
        within("policy.selection_share", pol.selection_share, 0, 1, high_open=True)


@dataclass
class PolicyConfig(RiskPolicyConfig, AdaptivePolicyConfig, TopKPolicyConfig, QuantilePolicyConfig):
    """Every policy's keys (the view: what cfg.policy holds)."""
    name: str = "topk"


POLICY = Group("policy", {"fixed": FixedPolicyConfig, "quantile": QuantilePolicyConfig,
                          "topk": TopKPolicyConfig, "adaptive": AdaptivePolicyConfig,
                          "risk": RiskPolicyConfig}, PolicyConfig)


def check_keep_within(pol, n_paths: int) -> None:
    """Every K of policy.keep lies in 1..N."""
    for k in check_values(pol.keep):
        if not 1 <= k <= n_paths:
            fail("policy.keep", f"retention K={k} must lie in 1..N={n_paths} (search.n_paths)"
                                f"{TOGETHER.format(key='policy.keep')}")


def check_thresholds(pol) -> None:
    """The threshold policies' knobs (every policy's ranges)."""
    POLICY.check(pol)


def check_risk_calibration(cfg) -> None:
    """policy=risk calibrates Launch-Check-Resume's thresholds on the bank's validation
    prompts, which must be there, be exchangeable with the evaluated ones and not be them."""
    if cfg.policy.name != "risk":
        return
    c = cfg.collect
    if cfg.search.name != "parallel":
        fail("policy.name", "risk calibrates Launch-Check-Resume's checks (search=parallel); "
                            f"search={cfg.search.name} prunes at every step: use fixed or quantile")
    if not c.prompts.get("val", 0) > 0:
        fail("collect.prompts.val", "policy=risk calibrates its threshold on the validation "
                                    "prompts; give the bank some (e.g. collect.prompts.val=50)")
    if cfg.evaluate.split == "val":
        fail("evaluate.split", "'val' is where policy=risk calibrates its threshold; evaluate "
                               "on another split (test)")
    if c.keep_correct is not None and "val" in c.keep_correct_splits:
        fail("collect.keep_correct_splits", f"{list(c.keep_correct_splits)} filters the validation "
                                            "prompts by difficulty, so they no longer stand for the "
                                            "evaluated ones that policy=risk calibrates for; drop 'val'")
