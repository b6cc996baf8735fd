"""The training loop: epochs over prompt batches, early stopping on the validation
within-prompt AUROC (or Spearman with a continuous reward), and the metrics of a
predictor's scores."""
from __future__ import annotations

import logging
import math
import random

import numpy as np
import torch
from tqdm import tqdm

from stopexp.core.errors import UserError
from stopexp.metrics import (auprc, brier, ece, is_binary, length_correlation, nonfinite,
                             pooled_auroc, reward_ranking, within_prompt_auroc)
from stopexp.signals.centring import peer_chunks
from stopexp.store import bank
from stopexp.metrics.ranking import auroc_by_position
from stopexp.training import per_step
from stopexp.training.losses import build_loss, loss_terms

log = logging.getLogger(__name__)


@torch.no_grad()
def score(predictor, data: dict, chunk: int = 8192) -> torch.Tensor:
    """The predictor's scores of every row of `data`, `chunk` rows at a time; a predictor
    that centres on a prompt's paths gets whole groups of them (stopexp.signals.centring)."""
    predictor.eval()
    n = len(data["correct"])
    if not n:
        return torch.zeros(0)
    if not getattr(predictor, "centre_prompts", False):  # getattr: the super token is no Predictor
        return torch.cat([predictor(bank.select_rows(data, slice(i, i + chunk)))
                          for i in range(0, n, chunk)])
    out = torch.zeros(n)
    for rows in peer_chunks(data, chunk):
        out[rows] = predictor(bank.select_rows(data, rows))
    return out


def evaluate_scores(scores: torch.Tensor, data: dict) -> dict:
    """The ranking and calibration metrics of `scores` on `data` against the outcome; where
    the reward is continuous, also its within-prompt rank correlations
    (stopexp.metrics.reward_ranking). On every-position data (with "prompt_group":
    train.positions=all) "auroc" is the mean over positions of the within-prompt AUROC at
    each position, and "auroc_by_prefix" the per-position curve
    (stopexp.metrics.ranking.auroc_by_position)."""
    s, y = scores.numpy(), data["correct"].numpy()
    p = 1 / (1 + np.exp(-s))
    reward = data["reward"].numpy() if "reward" in data else y
    ranks = {} if is_binary(reward) else {
        **reward_ranking(s, reward, data["group"].numpy()),
        "mean_reward": float(reward.mean()) if len(reward) else math.nan}
    by_prefix = {}
    if "prompt_group" in data:
        curve = auroc_by_position(s, y, data["prompt_group"].numpy(), data["position"].numpy())
        by_prefix = {"auroc": per_step.mean_over_positions(curve), "auroc_by_prefix": curve}
    return {**ranks, "auroc": within_prompt_auroc(s, y, data["group"].numpy()),
            **by_prefix, "auroc_pooled": pooled_auroc(s, y), "auprc": auprc(s, y),
            "ece": ece(p, y), "brier": brier(p, y),
            "length_corr": length_correlation(s, data["length"].numpy()),
            "paths": int(len(y)), "positive_rate": float(y.mean()) if len(y) else math.nan,
            "nonfinite_scores": nonfinite(s)}  # NaN ranks lowest, +-inf at the extremes


def prompt_batches(groups: torch.Tensor, batch_prompts: int, rng: random.Random):
    """Batches of whole prompts (pairs are mined inside a prompt), shuffled per epoch."""
    ids = sorted(set(groups.tolist()))
    rng.shuffle(ids)
    for i in range(0, len(ids), batch_prompts):
        yield torch.isin(groups, torch.tensor(ids[i : i + batch_prompts])).nonzero().squeeze(-1)


def selection_value(metrics: dict) -> float:
    """What epochs are selected by: the within-prompt Spearman correlation with the reward
    where the reward is continuous, else the within-prompt AUROC of the outcome."""
    return metrics.get("spearman_within", metrics["auroc"])


def selection_name(metrics: dict) -> str:
    """The name `selection_value` is shown under: val_spearman or val_auroc."""
    return "val_spearman" if "spearman_within" in metrics else "val_auroc"


def accumulated_backward(predictor, batches: list[dict], loss_fn, loss_cfg) -> list[float]:
    """The gradient of `batches` as of one batch of them all: each batch's loss is weighed
    by its share of their loss terms (paths, or pairs: stopexp.training.losses.loss_terms)
    before its backward, so that one batch at a time is held. Returns their losses."""
    terms = [loss_terms(loss_cfg, batch) for batch in batches]
    total, losses = sum(terms), []
    for batch, n in zip(batches, terms):
        value = loss_fn(predictor(batch), batch)
        # no term anywhere (no pair in any batch): each loss is 0, still attached
        (value * (n / total if total > 0 else 1 / len(batches))).backward()
        losses.append(value.item())
    return losses


def fit(predictor, data: dict, train, loss, progress: bool = True) -> tuple[dict, list[dict]]:
    """AdamW (the `train` section's settings, the `loss` section's loss; a step every
    train.accumulate batches, `accumulated_backward`) with early stopping on validation within-prompt AUROC (Spearman's rho with the
    reward where it is continuous: `selection_value`); returns the best state and the
    per-epoch history. Only a trained epoch with a finite validation AUROC
    is ever selected; `best["init_auroc"]` is the untrained initialisation's, for
    comparison. An epoch whose loss, validation scores or weights are not finite is never
    kept (training stops once the weights are); NoEpochKept when no epoch can be kept.
    With train.early_stopping=false every epoch runs and the last finite one is kept,
    whatever its validation AUROC (recorded, never used)."""
    loss_fn = build_loss(loss)
    params = [p for p in predictor.parameters() if p.requires_grad]
    init_auroc = selection_value(evaluate_scores(score(predictor, data["val"]), data["val"]))
    best = {"state": {k: v.clone() for k, v in predictor.state_dict().items()},
            "auroc": init_auroc, "epoch": 0, "init_auroc": init_auroc}
    history = []
    if not params:  # a statistic: nothing to fit, evaluated as is
        return best, [{"epoch": 0, "train_loss": math.nan, "val_auroc": init_auroc}]
    best["auroc"] = -math.inf
    opt = torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)
    rng, stale = random.Random(train.seed), 0
    early = bool(getattr(train, "early_stopping", True))  # a section saved without the key: on
    accumulate = int(getattr(train, "accumulate", 1))
    bar = tqdm(range(1, train.epochs + 1), desc="train", unit="epoch", disable=not progress)
    for epoch in bar:
        predictor.train()
        losses = []
        batches = list(prompt_batches(data["train"]["group"], train.batch_prompts, rng))
        for i in range(0, len(batches), accumulate):  # one optimizer step per `accumulate` batches
            opt.zero_grad(set_to_none=True)
            losses += accumulated_backward(predictor, [bank.select_rows(data["train"], rows)
                                                       for rows in batches[i:i + accumulate]],
                                           loss_fn, loss)
            opt.step()
        val = evaluate_scores(score(predictor, data["val"]), data["val"])
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)),
                        **{f"val_{k}": v for k, v in val.items()
                           if k not in ("paths", "positive_rate", "auroc_by_prefix")}})
        # the value epochs are selected by, under its name (Spearman for a continuous reward)
        bar.set_postfix({"loss": f"{np.mean(losses):.4f}",
                         selection_name(val): f"{selection_value(val):.3f}"})
        # A diverged epoch never wins (a NaN loss or NaN scores: NaN scores all tie, whose
        # AUROC is a finite 0.5). A tie goes to the later epoch: a flat validation AUROC
        # (coarse with few mixed prompts) is no reason to keep an earlier, less trained
        # state. Keeping the first of tied epochs kept epoch 1, a single Adam step of
        # lr * sign(gradient), which is the same for every loss whose gradient has the same signs.
        finite = finite_epoch(history[-1], params)
        better = finite and math.isfinite(selection_value(val)) and selection_value(val) >= best["auroc"]
        if better or (finite and not early):  # without early stopping: the last finite epoch
            best.update(state={k: v.clone() for k, v in predictor.state_dict().items()},
                        auroc=selection_value(val), epoch=epoch)
        stale = 0 if better else stale + 1
        if (early and stale >= train.patience) or not all(p.isfinite().all() for p in params):
            break  # NaN weights stay NaN: no later epoch recovers
    if best["epoch"] == 0:
        raise NoEpochKept(no_epoch_message(history, train.lr))
    return best, history


class NoEpochKept(UserError, ValueError):
    """No trained epoch can be kept: each diverged (a non-finite loss or validation
    score) or ranked the validation paths by no finite value."""


def finite_epoch(record: dict, params: list) -> bool:
    """Whether an epoch (its history `record`, the weights it left) is finite: its mean
    training loss, every validation score and every weight."""
    return (math.isfinite(record["train_loss"]) and not record.get("val_nonfinite_scores")
            and all(p.isfinite().all() for p in params))


def no_epoch_message(history: list[dict], lr: float) -> str:
    losses = [round(h["train_loss"], 4) for h in history]
    if any(not math.isfinite(h["train_loss"]) or h.get("val_nonfinite_scores") for h in history):
        return (f"train.lr: {lr:g} diverged: no epoch of {len(history)} ended with a finite "
                f"training loss and finite validation scores (train losses {losses}), so no "
                "predictor is saved; allowed: a smaller train.lr")
    return (f"train: the validation within-prompt AUROC was not finite after any of "
            f"{len(history)} epochs (train losses {losses}), so no trained epoch can be "
            "selected and the untrained initialisation is not saved; the validation split "
            "lacks mixed prompts (more collect.prompts.val)")


def learning_warnings(best: dict, params: list, metric: str = "auroc") -> list[str]:
    """What says the fit learned nothing visible: the selected epoch ranks the validation
    paths no better than the untrained initialisation did."""
    if not params or not best["auroc"] <= best["init_auroc"]:
        return []
    what = "within-prompt AUROC" if metric == "auroc" else "within-prompt Spearman rho with the reward"
    return [f"the selected epoch {best['epoch']} ranks validation paths no better than the "
            f"untrained initialisation ({what} {best['auroc']:.4f} vs "
            f"{best['init_auroc']:.4f} before training): its ranking comes from the random "
            "initial weights, not from the loss. Train longer or faster (train.epochs, train.lr) "
            "or on more prompts (collect.prompts.train)"]
