"""policy=risk: the prune threshold of every check calibrated on the validation split with
Learn-then-Test (Angelopoulos et al., arXiv 2110.01052; stopexp.metrics.risk), so that the
risk of pruning stays <= alpha with probability >= 1 - delta over the calibration draw.

A prompt's loss (in [0, 1]; the prompts of a split are exchangeable: hash splits) is
- `voter`: the share of its majority voters that the checks prune, a majority voter being
  one of its first N paths whose answer is that of the plain majority vote of all N
  (no_prune's vote);
- `answer`: 1 if the answer its pruned run votes for (under evaluate.vote) is not that one.
The risk is the loss's mean over prompts. Candidates: one quantile level lambda of the
grid LEVELS for all checks, the threshold at check i being the lambda-quantile of the
calibration paths' scores there (one threshold per check: the scores of different checks
need not share a scale). Their p-values (Hoeffding-Bentkus; the exact binomial tail for
`answer`'s 0/1 losses) are tested in the fixed order of lambda, least pruning first; the
calibrated level is the last one rejected before the first p-value above delta. A loss
that grows with the threshold makes this grid of data quantiles the continuum limit of
the fixed grid (RCPS, Bates et al., arXiv 2101.02703); fixed-sequence testing's
validity needs no monotonicity. None certified: the threshold is -inf, nothing is pruned.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import torch

from stopexp.core.policies import FixedThreshold, quantize
from stopexp.core.voting import rule_score
from stopexp.store.path_table import Pruning, Paths
from stopexp.evaluation.accounting import decide_by_checks, prompt_vote
from stopexp.metrics import bootstrap_ci
from stopexp.metrics.risk import binomial_tail, clopper_pearson, fixed_sequence, hoeffding_bentkus

log = logging.getLogger(__name__)

RISKS = ("voter", "answer")
LEVELS = np.round(np.arange(1, 100) / 100, 2)  # the quantile levels tried, least pruning first


@dataclass
class Calibration:
    thresholds: list   # one per check (-inf: nothing certified, nothing pruned)
    level: float | None  # the certified quantile level (None: none)
    risk_hat: float    # the validation risk at these thresholds
    p_value: float | None
    prompts: int


def majority(paths: Paths, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's plain majority answer over its first n paths (no_prune's vote) and the
    (P,) mask of the paths among them that vote for it."""
    G = int(paths.group.max()) + 1
    winner, voter = np.full(G, None, dtype=object), np.zeros(len(paths.group), bool)
    for g in range(G):
        rows = np.nonzero((paths.group == g) & (paths.path_id < n))[0]
        answers, winner[g] = prompt_vote(paths, rows)
        voter[rows] = (answers == winner[g]) & (winner[g] is not None)
    return winner, voter


def prompt_losses(paths: Paths, risk: str, base: tuple, pruned: np.ndarray,
                  winner: np.ndarray | None = None) -> np.ndarray:
    """(G,) each prompt's loss (module doc) for the (P,) `pruned` paths; `base`: `majority`'s
    result; `winner`: the pruned run's voted answers (risk `answer`)."""
    if risk == "answer":
        return np.asarray([a != b for a, b in zip(winner, base[0])], float)
    G = len(base[0])
    hits = np.bincount(paths.group, weights=pruned & base[1], minlength=G)
    return hits / np.maximum(np.bincount(paths.group, weights=base[1], minlength=G), 1)


def rule_scores(paths: Paths, scores: list[np.ndarray], n: int, rule: str) -> list[np.ndarray]:
    """Per check the rounded scores (under `rule`) of the first n paths alive there when
    nothing is pruned: the values the candidate thresholds are quantiles of."""
    live = paths.alive & (paths.path_id < n)
    history = [[] for _ in live]
    out = []
    for i, s in enumerate(scores):
        if i:
            live = live & paths.checks[i]["alive"].numpy().astype(bool)
        rows = np.nonzero(live)[0]
        for r in rows:
            history[r].append(float(s[r]))
        now = torch.as_tensor([rule_score(history[r], rule) for r in rows], dtype=torch.float64)
        out.append(quantize(now).numpy())
    return out


def calibrate(paths: Paths, scores: list[np.ndarray], checks: list[int], n: int, rule: str,
              risk: str, alpha: float, delta: float, vote: str = "majority",
              vote_top: float = 0.5) -> Calibration:
    """Learn-then-Test over LEVELS (module doc) on the calibration `paths` with scores[i]
    (P,) at checks[i] tokens, N = n paths per prompt, under score rule `rule` and the
    evaluated `vote`."""
    base = majority(paths, n)
    G = len(base[0])
    values = rule_scores(paths, scores, n, rule)
    found = []
    for level in LEVELS:
        taus = [float(np.quantile(v[np.isfinite(v)], level)) if np.isfinite(v).any() else -np.inf
                for v in values]
        d = decide_by_checks(paths, scores, [FixedThreshold(t) for t in taus], checks, n, rule)
        losses = prompt_losses(paths, risk, base, d.pruned_at > 0, winners(paths, d, n, vote, vote_top)
                               if risk == "answer" else None)
        r_hat = float(losses.mean())
        p = binomial_tail(int(losses.sum()), G, alpha) if risk == "answer" else hoeffding_bentkus(r_hat, G, alpha)
        found.append((taus, r_hat, p))
        if p > delta:  # fixed-sequence testing stops at the first acceptance
            break
    ok = fixed_sequence([f[2] for f in found], delta)
    if not ok:
        return Calibration([-np.inf] * len(checks), None, 0.0, None, G)
    taus, r_hat, p = found[ok - 1]
    return Calibration(taus, float(LEVELS[ok - 1]), r_hat, p, G)


def winners(paths: Paths, d: Pruning, n: int, vote: str, vote_top: float) -> np.ndarray:
    """Each prompt's voted answer after decision `d` (the vote of stopexp.evaluation.accounting.outcome)."""
    voter = (paths.path_id < n) & (~paths.alive | d.kept)
    return np.asarray([prompt_vote(paths, np.nonzero((paths.group == g) & voter)[0], d.signal, vote,
                                   vote_top)[1] for g in range(int(paths.group.max()) + 1)], dtype=object)


def calibrate_methods(policy, search, evaluate, scorers: dict, checks: list[int],
                      val: Paths) -> dict[str, Calibration]:
    """Every scored method's `Calibration` on the validation prompts `val` (the bank's val
    split replayed at `checks`), under policy.risk / alpha / delta, search.n_paths /
    score_rule and evaluate.vote / vote_top. No learned predictor saw them: under
    policy=risk it picks its epoch on training prompts (stopexp.training.selection)."""
    out = {}
    for name, scorer in scorers.items():
        scores = [scorer(b).numpy().astype(float) for b in val.checks]
        out[name] = calibrate(val, scores, checks, search.n_paths, search.score_rule,
                              policy.risk, policy.alpha, policy.delta, evaluate.vote,
                              evaluate.vote_top)
        if out[name].level is None:
            log.warning("policy=risk: %s: no threshold is certified for %s risk <= %s at delta %s "
                        "on %d validation prompts; it prunes nothing", name, policy.risk,
                        policy.alpha, policy.delta, out[name].prompts)
    return out


def realised_risk(paths: Paths, o: dict, n: int, risk: str, cal: Calibration, n_boot: int,
                  seed: int) -> dict:
    """The risk a method's `outcome` `o` realised on the evaluated `paths` (no_prune's, as
    its run saw them online), with its 95% interval: Clopper-Pearson for `answer` (0/1 per
    prompt), a bootstrap over prompts for `voter` (a share per prompt, not a binomial count)."""
    losses = prompt_losses(paths, risk, majority(paths, n), o["stopped"], o["winner"])
    if risk == "answer":
        lo, hi = clopper_pearson(int(losses.sum()), len(losses))
    else:
        lo, hi = bootstrap_ci(losses, n=n_boot, seed=seed)
    return {"realised": float(losses.mean()), "interval": [float(lo), float(hi)],
            "prompts": len(losses), "calibration": calibration_record(cal)}


def calibration_record(cal: Calibration) -> dict:
    """`cal` for metrics.json: a threshold that prunes nothing (-inf) is null."""
    return asdict(cal) | {"thresholds": [t if np.isfinite(t) else None for t in cal.thresholds]}
