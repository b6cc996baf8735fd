"""Threshold policies: which of the live paths of one prompt stay, given their signals.

Shared by both searches: Launch-Check-Resume asks `keep` once per prompt at the check;
beam search asks `keep` at every step and prunes a beam only after `patience`
consecutive refusals. A policy never empties a prompt: the best path always stays.
"""
from __future__ import annotations

import torch

from stopexp.core.names import lookup

RESOLUTION = 1e-4


def quantize(scores: torch.Tensor) -> torch.Tensor:
    """Scores rounded to RESOLUTION: paths with the same prefix get bit-different signals
    depending on batch composition; rounding turns those near-ties into exact ties, broken
    by path order, so online and replayed decisions agree. NaN becomes -inf: a path whose
    signal is NaN ranks lowest, as in `stopexp.metrics.ranking`."""
    s = scores.double()
    return torch.round(torch.where(torch.isnan(s), float("-inf"), s) / RESOLUTION) * RESOLUTION


class Policy:
    """A threshold policy. Each one is an entry of the registry (stopexp.core.names,
    "policy"): the policy.* keys it reads besides K (`reads`, metrics' protocol, in the
    order its constructor takes them, so that `from_config` builds it) and, in words, what
    a check keeps (`text`, filled with those settings by `describe`)."""
    name = "policy"
    reads: tuple[str, ...] = ()
    text = ""

    @classmethod
    def from_config(cls, policy_cfg, keep: int | None, tau: float | None) -> "Policy":
        return cls(*(policy_cfg[k] for k in cls.reads))

    @classmethod
    def describe(cls, params: dict, k, check: int) -> str:
        return cls.text.format(**params)

    def threshold(self, scores: torch.Tensor) -> float:
        raise NotImplementedError

    def keep(self, scores: torch.Tensor) -> torch.Tensor:
        """Bool mask over `scores` (one prompt's live paths) of the paths that stay."""
        if scores.numel() == 0:
            return torch.zeros(0, dtype=torch.bool)
        scores = quantize(scores)
        mask = scores >= self.threshold(scores)
        if not mask.any():
            mask[int(torch.argmax(scores))] = True
        self.observe(1 - mask.float().mean().item())
        return mask

    def observe(self, prune_rate: float) -> None:
        """Feedback after a decision (used by the adaptive controller)."""


class FixedThreshold(Policy):
    name, reads, text = "fixed", ("tau",), "score >= {tau} (policy=fixed)"

    def __init__(self, tau: float):
        self.tau = tau

    def threshold(self, scores):
        return self.tau


class RiskControlled(FixedThreshold):
    """A fixed threshold calibrated on the validation split so that pruning keeps a risk
    (policy.risk) below policy.alpha with probability 1 - policy.delta: Learn-then-Test,
    arXiv 2110.01052 (stopexp.evaluation.risk). -inf (nothing certified) prunes nothing.
    Learned predictors pick their epoch on training prompts instead (`selection_share`)."""
    name, reads = "risk", ("risk", "alpha", "delta", "selection_share")

    @classmethod
    def from_config(cls, policy_cfg, keep, tau):
        if tau is None:
            raise ValueError("policy=risk: its threshold is calibrated on the validation split "
                             "first (stopexp.evaluation.risk.calibrate_methods)")
        return cls(tau)

    @classmethod
    def describe(cls, params, k, check):
        """Each method's calibrated threshold at this check (params["thresholds"]: method
        -> one per check)."""
        taus = ", ".join(f"{m} {'none certified' if t[check] is None else f'{t[check]:.4g}'}"
                         for m, t in params.get("thresholds", {}).items())
        return (f"score >= tau ({taus}), calibrated on val for {params['risk']} risk <= "
                f"{params['alpha']} w.p. {1 - params['delta']:.3g} (policy=risk)")


class Quantile(Policy):
    """Prune below the q-quantile of the current step's live signals."""
    name, reads = "quantile", ("quantile",)
    text = "score >= the {quantile} quantile of the live paths (policy=quantile)"

    def __init__(self, q: float):
        self.q = q

    def threshold(self, scores):
        finite = scores[torch.isfinite(scores)].double()  # -inf would make the quantile NaN
        return torch.quantile(finite, self.q).item() if finite.numel() else float("-inf")


class TopK(Policy):
    """Keep the K best (retention K/N); ties go to the earlier path. K: the check's own
    (`keep`: each check of the plan, a retention sweep), else policy.keep."""
    name = "topk"

    def __init__(self, k: int):
        self.k = k

    @classmethod
    def from_config(cls, policy_cfg, keep, tau):
        return cls(keep if keep is not None else policy_cfg.keep)

    @classmethod
    def describe(cls, params, k, check):
        return str(k)

    def keep(self, scores):
        mask = torch.zeros(scores.numel(), dtype=torch.bool)
        if scores.numel():
            order = torch.sort(quantize(scores), descending=True, stable=True).indices
            mask[order[: self.k]] = True
        return mask


class Adaptive(Policy):
    """A fixed threshold that a proportional controller moves toward a target prune rate:
    after pruning more than the target, tau goes down, after pruning less, it goes up."""
    name, reads = "adaptive", ("tau", "target_prune_rate", "gain")
    text = ("score >= tau, from {tau} toward prune rate {target_prune_rate} (policy=adaptive, "
            "gain {gain})")

    def __init__(self, tau: float, target: float, gain: float):
        self.tau, self.target, self.gain = tau, target, gain

    def threshold(self, scores):
        return self.tau

    def observe(self, prune_rate):
        self.tau -= self.gain * (prune_rate - self.target)


def build_policy(policy_cfg, keep: int | None = None, tau: float | None = None) -> Policy:
    """The configured policy (policy.name's class in the registry); `keep` overrides
    policy.keep for top-K (retention sweeps); `tau` is policy=risk's calibrated threshold
    (stopexp.evaluation.risk). An unknown name: ValueError listing the policies."""
    return lookup("policy", policy_cfg.name).from_config(policy_cfg, keep, tau)


def check_policies(policy_cfg, plan: list[tuple[int, int]],
                   thresholds: list[float] | None = None) -> list[Policy]:
    """One fresh policy per check of `plan` ((prefix tokens, K) each) for one method's run;
    `thresholds`: policy=risk's calibrated one per check."""
    return [build_policy(policy_cfg, keep=k, tau=None if thresholds is None else thresholds[i])
            for i, (_, k) in enumerate(plan)]


def selection_share(policy_cfg) -> float:
    """The share of the training prompts a learned predictor picks its epoch on instead of
    the validation prompts: policy=risk's policy.selection_share (they calibrate it), else 0."""
    return float(policy_cfg.selection_share) if policy_cfg.name == "risk" else 0.0


def policy_params(policy_cfg) -> dict:
    """The settings the configured policy reads, besides K (metrics' protocol)."""
    return {k: policy_cfg[k] for k in lookup("policy", policy_cfg.name).reads}


def kept_text(name: str, params: dict, k, check: int = 0) -> str:
    """What a check (the check-th of the run) keeps, in words for a header: K under
    policy=topk, else the rule (`params`: the policy's settings, as `policy_params` and
    metrics' protocol hold them)."""
    return lookup("policy", name).describe(params, k, check)
