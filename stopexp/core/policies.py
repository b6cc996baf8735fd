"""Threshold policies: which of the live paths of one prompt stay, given their signals.

Shared by both searches: Launch-Check-Resume asks `keep` once per prompt at the check;
beam search asks `keep` at every step and prunes a beam only after `patience`
consecutive refusals. A policy never empties a prompt: the best path always stays.
"""
from __future__ import annotations

import torch

RESOLUTION = 1e-4


def quantize(scores: torch.Tensor) -> torch.Tensor:
    """Scores rounded to RESOLUTION: paths with the same prefix get bit-different signals
    depending on batch composition; rounding turns those near-ties into exact ties, broken
    by path order, so online and replayed decisions agree. NaN becomes -inf: a path whose
    signal is NaN ranks lowest, as in `stopexp.metrics.ranking`."""
    s = scores.double()
    return torch.round(torch.where(torch.isnan(s), float("-inf"), s) / RESOLUTION) * RESOLUTION


class Policy:
    name = "policy"

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
    name = "fixed"

    def __init__(self, tau: float):
        self.tau = tau

    def threshold(self, scores):
        return self.tau


class RiskControlled(FixedThreshold):
    """A fixed threshold calibrated on the validation split so that pruning keeps a risk
    (policy.risk) below policy.alpha with probability 1 - policy.delta: Learn-then-Test,
    arXiv 2110.01052 (stopexp.evaluation.risk). -inf (nothing certified) prunes nothing.
    Learned predictors pick their epoch on training prompts instead (`selection_share`)."""
    name = "risk"


class Quantile(Policy):
    """Prune below the q-quantile of the current step's live signals."""
    name = "quantile"

    def __init__(self, q: float):
        self.q = q

    def threshold(self, scores):
        finite = scores[torch.isfinite(scores)].double()  # -inf would make the quantile NaN
        return torch.quantile(finite, self.q).item() if finite.numel() else float("-inf")


class TopK(Policy):
    """Keep the K best (retention K/N); ties go to the earlier path."""
    name = "topk"

    def __init__(self, k: int):
        self.k = k

    def keep(self, scores):
        mask = torch.zeros(scores.numel(), dtype=torch.bool)
        if scores.numel():
            order = torch.sort(quantize(scores), descending=True, stable=True).indices
            mask[order[: self.k]] = True
        return mask


class Adaptive(Policy):
    """A fixed threshold that a proportional controller moves toward a target prune rate:
    after pruning more than the target, tau goes down, after pruning less, it goes up."""
    name = "adaptive"

    def __init__(self, tau: float, target: float, gain: float):
        self.tau, self.target, self.gain = tau, target, gain

    def threshold(self, scores):
        return self.tau

    def observe(self, prune_rate):
        self.tau -= self.gain * (prune_rate - self.target)


def build_policy(policy_cfg, keep: int | None = None, tau: float | None = None) -> Policy:
    """The configured policy; `keep` overrides policy.keep for top-K (retention sweeps);
    `tau` is policy=risk's calibrated threshold (stopexp.evaluation.risk)."""
    name = policy_cfg.name
    if name == "fixed":
        return FixedThreshold(policy_cfg.tau)
    if name == "quantile":
        return Quantile(policy_cfg.quantile)
    if name == "topk":
        return TopK(keep if keep is not None else policy_cfg.keep)
    if name == "adaptive":
        return Adaptive(policy_cfg.tau, policy_cfg.target_prune_rate, policy_cfg.gain)
    if name == "risk":
        if tau is None:
            raise ValueError("policy=risk: its threshold is calibrated on the validation split "
                             "first (stopexp.evaluation.risk.calibrate_methods)")
        return RiskControlled(tau)
    raise ValueError(f"policy.name: {name!r} unknown; allowed: fixed, quantile, topk, adaptive, risk")


def check_policies(policy_cfg, plan: list[tuple[int, int]],
                   thresholds: list[float] | None = None) -> list[Policy]:
    """One fresh policy per check of `plan` ((prefix tokens, K) each) for one method's run;
    `thresholds`: policy=risk's calibrated one per check."""
    return [build_policy(policy_cfg, keep=k, tau=None if thresholds is None else thresholds[i])
            for i, (_, k) in enumerate(plan)]


# the policy.* keys each policy reads; topk's K (policy.keep) is in every check's plan
POLICY_KEYS = {"fixed": ("tau",), "quantile": ("quantile",), "topk": (),
               "adaptive": ("tau", "target_prune_rate", "gain"),
               "risk": ("risk", "alpha", "delta", "selection_share")}


def selection_share(policy_cfg) -> float:
    """The share of the training prompts a learned predictor picks its epoch on instead of
    the validation prompts: policy=risk's policy.selection_share (they calibrate it), else 0."""
    return float(policy_cfg.selection_share) if policy_cfg.name == "risk" else 0.0


def policy_params(policy_cfg) -> dict:
    """The settings the configured policy reads, besides K (metrics' protocol)."""
    return {k: policy_cfg[k] for k in POLICY_KEYS[policy_cfg.name]}


def kept_text(name: str, params: dict, k, check: int = 0) -> str:
    """What a check (the check-th of the run) keeps, in words for a header: K under
    policy=topk, else the rule; under policy=risk each method's calibrated threshold
    (params["thresholds"]: method -> one per check)."""
    if name == "risk":
        taus = ", ".join(f"{m} {'none certified' if t[check] is None else f'{t[check]:.4g}'}"
                         for m, t in params.get("thresholds", {}).items())
        return (f"score >= tau ({taus}), calibrated on val for {params['risk']} risk <= "
                f"{params['alpha']} w.p. {1 - params['delta']:.3g} (policy=risk)")
    if name == "topk":
        return str(k)
    if name == "fixed":
        return f"score >= {params['tau']} (policy=fixed)"
    if name == "quantile":
        return f"score >= the {params['quantile']} quantile of the live paths (policy=quantile)"
    return (f"score >= tau, from {params['tau']} toward prune rate {params['target_prune_rate']} "
            f"(policy=adaptive, gain {params['gain']})")
