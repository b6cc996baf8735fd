"""Training losses for signal predictors: `build_loss(loss_cfg)` returns a callable
(scores (B,), batch) -> scalar tensor. Batch keys are described in stopexp/signals/feature_spec.py;
an optional `weight` (B,) weights paths (pairs by the product of their paths' weights).

Pairwise losses compare paths of the same prompt only: pruning chooses among the paths
of one prompt, so knowing which prompts are hard is of no use to it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from stopexp.core.names import lookup, names


def _label(batch: dict) -> torch.Tensor:
    """What pairs are ordered by and regressions aim at: the path's reward where the batch
    has one (stopexp/tasks/rewards.py; the 0/1 outcome for reward=correct), else its outcome
    (online feedback puts soft labels, Monte Carlo success rates, there)."""
    return (batch["reward"] if "reward" in batch else batch["correct"]).float()


def _gap(batch: dict) -> torch.Tensor:
    """(B, B) label[i] - label[j]."""
    label = _label(batch)
    return label[:, None] - label[None, :]


def _pair_mask(batch: dict, min_gap: float = 0.0) -> torch.Tensor:
    """(B, B) bool: i and j share a prompt and path i's label beats path j's by more than
    `min_gap` (outcomes 1 over 0; rewards and soft labels order by value)."""
    same = batch["group"][:, None] == batch["group"][None, :]
    return same & (_gap(batch) > min_gap)


def _mean_over_pairs(per_pair: torch.Tensor, mask: torch.Tensor, batch: dict) -> torch.Tensor:
    # a batch without a good/bad pair gives 0, still attached to the graph
    if "weight" not in batch:
        return (per_pair * mask).sum() / mask.sum().clamp(min=1)
    w = mask * batch["weight"][:, None] * batch["weight"][None, :]  # a pair counts w_i * w_j
    return (per_pair * w).sum() / w.sum().clamp(min=1e-12)


def _mean(per_path: torch.Tensor, batch: dict) -> torch.Tensor:
    """The mean over paths, weighted by batch["weight"] where given (importance weights of
    online feedback: stopexp/stages/adapt.py)."""
    if "weight" not in batch:
        return per_path.mean()
    return (per_path * batch["weight"]).sum() / batch["weight"].sum().clamp(min=1e-12)


def contrastive(scores, batch, loss):
    """relu(margin * (r_i - r_j) - (s_i - s_j)) over pairs of one prompt with
    r_i - r_j > loss.min_gap: the margin grows with the reward gap (a 0/1 outcome has gap 1,
    the plain margin); with batch["reward"] absent, the plain margin over outcome pairs."""
    diff = scores[:, None] - scores[None, :]
    margin = loss.margin * _gap(batch) if "reward" in batch else loss.margin
    return _mean_over_pairs(F.relu(margin - diff), _pair_mask(batch, _min_gap(loss)), batch)


def pairwise(scores, batch, loss):
    """softplus(-(s_i - s_j)) over the pairs of `contrastive` (pairwise logistic)."""
    diff = scores[:, None] - scores[None, :]
    return _mean_over_pairs(F.softplus(-diff), _pair_mask(batch, _min_gap(loss)), batch)


def _min_gap(loss) -> float:
    return float(getattr(loss, "min_gap", 0.0) or 0.0)


def reward_regression(scores, batch, loss):
    """Soft binary cross-entropy of sigmoid(score) on the Monte Carlo label (the mean reward
    of rollouts from the prefix) where there is one, else the path's reward (in [0, 1]);
    with loss.labels=reward on the path's reward only."""
    mc, label = batch["mc"], _label(batch)
    use_mc = getattr(loss, "labels", "mc") == "mc"
    target = torch.where(torch.isnan(mc), label, mc) if use_mc else label
    if "weight" not in batch:
        return F.binary_cross_entropy_with_logits(scores, target)
    return _mean(F.binary_cross_entropy_with_logits(scores, target, reduction="none"), batch)


def mse(scores, batch, loss):
    """Discounted future reward regression: (sigmoid(score) - reward * discount**remaining)^2,
    remaining = the path's tokens still to go after the prefix (the reward lies in [0, 1])."""
    target = _label(batch) * loss.discount ** batch["remaining"]
    return _mean((torch.sigmoid(scores) - target) ** 2, batch)


LOSSES = names("loss")  # each registered in stopexp.core.names as this module's function
PAIR_LOSSES = ("contrastive", "pairwise")


def loss_terms(loss_cfg, batch: dict) -> float:
    """What the loss of `batch` is a mean over: its pairs (`PAIR_LOSSES`) or its paths,
    weighted by batch["weight"] where given. Batches accumulated into one step weigh their
    losses by their share of it, so that the step's gradient is that of one batch of them
    all (stopexp.training.fit)."""
    if loss_cfg.name in PAIR_LOSSES:
        mask = _pair_mask(batch, _min_gap(loss_cfg)).float()
        if "weight" in batch:
            mask = mask * batch["weight"][:, None] * batch["weight"][None, :]
        return float(mask.sum())
    return float(batch["weight"].sum()) if "weight" in batch else float(len(batch["correct"]))


def length_correlation(scores: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
    """Pearson correlation over the batch; 0 when either side is constant."""
    s, n = scores - scores.mean(), prefix_len - prefix_len.mean()
    eps = 1e-12  # keeps sqrt differentiable when all scores are equal
    return (s * n).sum() / (torch.sqrt((s * s).sum() + eps) * torch.sqrt((n * n).sum() + eps))


def build_loss(loss_cfg):
    """The loss `loss_cfg.name`, plus length_reg * corr(score, prefix_len)^2 when
    length_reg > 0 (against the shortcut of scoring a path by its length)."""
    if loss_cfg.name not in LOSSES:
        raise ValueError(f"loss.name: {loss_cfg.name!r} unknown; allowed: {', '.join(LOSSES)}")
    base, weight = lookup("loss", loss_cfg.name), loss_cfg.length_reg

    def loss(scores: torch.Tensor, batch: dict) -> torch.Tensor:
        value = base(scores, batch, loss_cfg)
        if weight > 0:
            value = value + weight * length_correlation(scores, batch["prefix_len"]) ** 2
        return value

    return loss
