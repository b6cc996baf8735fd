"""Stage 2, train: fit the signal predictor on the trace bank, the LM frozen (not loaded,
except by the super-token predictor, which runs it).

    python -m stopexp.train +exp=toy_contrastive

Reads the bank made by collect for the same upstream config (found by hash) joined with
its features (`stopexp.store.features`, extracted here from the bank when missing: the LM is
loaded only then), trains on the `train` split at checkpoint `train.checkpoint` (or, with
`train.positions=all`, at every stored position: stopexp/training/per_step.py), early-stops on the
validation within-prompt AUROC (averaged over positions), keeps the best epoch, reports
train/val/test metrics with the AUROC at every stored position (`auroc_by_prefix`,
plotted) and saves a checkpoint that evaluate finds by hash.
"""
from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from stopexp.store import bank
from stopexp.store import features as feature_bank
from stopexp.training import per_step
from stopexp.evaluation import plots
from stopexp.runtime.artifacts import config_hash, write_json
from stopexp.runtime.cli import stage_main
from stopexp.config import check_output_dirs, checkpoint_tokens, validate
from stopexp.core.errors import ConfigError, UserError
from stopexp.runtime.integrity import set_aside
from stopexp.training.losses import build_loss
from stopexp.metrics import (auprc, brier, ece, is_binary, length_correlation, nonfinite,
                             pooled_auroc, reward_ranking, within_prompt_auroc)
from stopexp.metrics.bounds import BOUND_SLACK, digits
from stopexp.signals import FeatureSpec, build_predictor
from stopexp.signals.checkpoint import (CheckpointDamaged, CheckpointMismatch, load_predictor,
                                       save_predictor)
from stopexp.runtime.threads import one_thread
from stopexp.runtime.tracking import tracked_run

log = logging.getLogger(__name__)


def predictor_dir(cfg) -> Path:
    key = config_hash(feature_bank.feature_key(cfg), cfg.predictor, cfg.loss, cfg.train)
    return Path(cfg.paths.cache_dir) / "predictors" / key


def feature_spec(meta: dict) -> FeatureSpec:
    """The spec recorded in a features meta.json (`stopexp.store.features.feature_spec`)."""
    return feature_bank.feature_spec(meta)


def split_data(root: Path, meta: dict, cfg, prefixes: bool = False,
               overrides: list[str] | None = None) -> dict[str, dict]:
    """Per split, the tensors of the paths still alive at the training checkpoint (with
    `prefixes`, also their prompts and tokens), from the bank at `root` (`meta` its
    meta.json) and its features (made when missing). The splits are the task's, which are
    disjoint by prompt, so no prompt is in two parts."""
    ckpt = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
    features = feature_bank.require_features(cfg, overrides)
    out = {}
    for split in ("train", "val", "test"):
        if not bank.split_rows(meta, split):
            continue
        ds = bank.load_bank(root, split)
        t = feature_bank.tensors_at(ds, feature_bank.load_features(features, split), ckpt)
        if prefixes:
            t.update(bank.prefix_columns(ds))
        out[split] = bank.select_rows(t, t["alive"])
    for needed in ("train", "val"):
        if needed not in out or not len(out[needed]["correct"]):
            raise NothingToLearn(_empty_split(meta, needed, ckpt, cfg))
        check_usable(needed, out.get(needed), ckpt, cfg.search.n_paths, pair_min_gap(cfg))
    return out


REGRESSION_LOSSES = ("reward_regression", "mse")


def pair_min_gap(cfg) -> float:
    """loss.min_gap where the loss mines pairs by it (contrastive, pairwise), else 0."""
    return float(cfg.loss.min_gap) if cfg.loss.name in ("contrastive", "pairwise") else 0.0


def check_reward_range(cfg, data: dict) -> int:
    """The regression losses aim sigmoid(score) at the reward, so it must lie in [0, 1];
    validate refuses the unbounded built-in rewards, an external one is checked here, on
    the loaded splits (`data`: split -> tensors with "reward" and "mc", the Monte Carlo
    labels: mean rewards, NaN where none). Values within rounding of [0, 1]
    (stopexp.metrics.bounds.BOUND_SLACK, as BERTScore's 1.0000001) are clipped into it, in place;
    returns how many. ValueError naming loss.name and the range found, in full digits."""
    if cfg.loss.name not in REGRESSION_LOSSES:
        return 0
    clipped = 0
    for split, d in data.items():
        for key in ("reward", "mc"):
            r = d.get(key)
            v = r.numpy() if r is not None else np.zeros(0)
            v = v[~np.isnan(v)]
            if not len(v):
                continue
            lo, hi = v.min(), v.max()
            if not (lo >= -BOUND_SLACK and hi <= 1 + BOUND_SLACK):
                what = "rewards" if key == "reward" else "Monte Carlo labels (mean rewards)"
                raise ConfigError(f"loss.name: {cfg.loss.name} regresses a probability on the reward, "
                                  f"but the {split} paths' {what} (reward={cfg.reward.name}) span "
                                  f"[{digits(lo)}, {digits(hi)}], outside [0, 1] by more than rounding "
                                  f"({BOUND_SLACK:g}); use loss=contrastive or pairwise, or a reward "
                                  "in [0, 1]")
            clipped += int(((v < 0) | (v > 1)).sum())
            d[key] = r.clamp(0, 1)  # NaN (no label) stays NaN
    if clipped:
        log.info("clipped %d rewards / Monte Carlo labels within %g of [0, 1] into it (rounding)",
                 clipped, BOUND_SLACK)
    return clipped


class NothingToLearn(UserError, ValueError):
    """A split that cannot train or select a predictor: no prompt has both a correct and a
    wrong path alive at the training checkpoint."""


def check_usable(split: str, data: dict | None, ckpt: int, n_paths: int,
                 min_gap: float = 0.0) -> int:
    """The number of prompts of `split` with both a correct and a wrong path alive at the
    checkpoint (the pairs the losses and the within-prompt AUROC are made of; with a
    continuous reward, paths whose rewards differ by more than `min_gap`, the pair losses'
    loss.min_gap); raises NothingToLearn naming the split, its counts and the fixes when
    there is none."""
    n = len(data["correct"]) if data is not None else 0
    groups = data["group"].numpy() if n else np.zeros(0, int)
    correct = data["correct"].numpy() > 0.5 if n else np.zeros(0, bool)
    prompts = np.unique(groups)
    mixed = sum(bool(correct[groups == g].any() and (~correct[groups == g]).any()) for g in prompts)
    reward = data["reward"].numpy() if n and "reward" in data else None
    if reward is not None and not is_binary(reward):  # a continuous reward orders the pairs
        mixed = sum(bool(np.ptp(reward[groups == g]) > min_gap) for g in prompts)
        if not mixed and min_gap > 0:
            raise NothingToLearn(
                f"train: the {split} split has no pair at checkpoint {ckpt} tokens whose rewards "
                f"differ by more than loss.min_gap={min_gap} (the widest spread within a prompt "
                f"is {max((float(np.ptp(reward[groups == g])) for g in prompts), default=0.0):.4g}), "
                "so the pair losses skip every pair; lower loss.min_gap")
    if mixed:
        return mixed
    raise NothingToLearn(
        f"train: the {split} split has no usable pair at checkpoint {ckpt} tokens "
        f"(train.checkpoint): {len(prompts)} prompts with {n} paths alive there, {int(correct.sum())} "
        f"of them correct, and no prompt has both a correct and a wrong path. Training and its "
        f"epoch selection compare paths of one prompt, so nothing can be learned. Collect more "
        f"prompts (collect.prompts.{split}), give the split a larger share "
        f"(task.split_fractions), keep prompts with mixed outcomes (collect.keep_correct=[1, "
        f"{max(n_paths - 1, 1)}]), or try another task.seed or seed.")


def _empty_split(meta: dict, split: str, ckpt: int, cfg) -> str:
    """Why a split the predictor needs has no path alive at the checkpoint, and the fix."""
    planned, rows = bank.planned_prompts(meta, split), bank.split_rows(meta, split)
    if not planned:
        return (f"collect.prompts.{split}: the trace bank holds no {split} prompts (0 were "
                f"collected); collect some, e.g. collect.prompts.{split}=100")
    if not rows:
        return (f"collect.keep_correct: all {planned} {split} prompts of the trace bank were "
                f"dropped by the difficulty filter {list(cfg.collect.keep_correct or [])}; "
                f"widen it or collect more {split} prompts (collect.prompts.{split})")
    return (f"train.checkpoint: none of the {rows} {split} paths of the trace bank is still "
            f"generating at checkpoint {ckpt} tokens (all ended earlier); choose an earlier "
            f"train.checkpoint (one of tap.checkpoints)")


@torch.no_grad()
def score(predictor, data: dict, chunk: int = 8192) -> torch.Tensor:
    predictor.eval()
    n = len(data["correct"])
    return torch.cat([predictor(bank.select_rows(data, slice(i, i + chunk)))
                      for i in range(0, n, chunk)]) if n else torch.zeros(0)


def evaluate_scores(scores: torch.Tensor, data: dict) -> dict:
    """The ranking and calibration metrics of `scores` on `data` against the outcome; where
    the reward is continuous, also its within-prompt rank correlations
    (stopexp.metrics.reward_ranking). On every-position data (with "prompt_group":
    train.positions=all) "auroc" is the mean over positions of the within-prompt AUROC at
    each position, and "auroc_by_prefix" the per-position curve
    (stopexp.training.per_step.auroc_by_position)."""
    s, y = scores.numpy(), data["correct"].numpy()
    p = 1 / (1 + np.exp(-s))
    reward = data["reward"].numpy() if "reward" in data else y
    ranks = {} if is_binary(reward) else {
        **reward_ranking(s, reward, data["group"].numpy()),
        "mean_reward": float(reward.mean()) if len(reward) else math.nan}
    by_prefix = {}
    if "prompt_group" in data:
        curve = per_step.auroc_by_position(s, y, data["prompt_group"].numpy(), data["position"].numpy())
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


def fit(cfg, predictor, data: dict, progress: bool = True) -> tuple[dict, list[dict]]:
    """AdamW with early stopping on validation within-prompt AUROC (Spearman's rho with the
    reward where it is continuous: `selection_value`); returns the best state and the
    per-epoch history. Only a trained epoch with a finite validation AUROC
    is ever selected; `best["init_auroc"]` is the untrained initialisation's, for
    comparison. Raises ValueError when no epoch has a finite validation AUROC."""
    loss_fn = build_loss(cfg.loss)
    params = [p for p in predictor.parameters() if p.requires_grad]
    init_auroc = selection_value(evaluate_scores(score(predictor, data["val"]), data["val"]))
    best = {"state": {k: v.clone() for k, v in predictor.state_dict().items()},
            "auroc": init_auroc, "epoch": 0, "init_auroc": init_auroc}
    history = []
    if not params:  # a statistic: nothing to fit, evaluated as is
        return best, [{"epoch": 0, "train_loss": math.nan, "val_auroc": init_auroc}]
    best["auroc"] = -math.inf
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    rng, stale = random.Random(cfg.train.seed), 0
    bar = tqdm(range(1, cfg.train.epochs + 1), desc="train", unit="epoch", disable=not progress)
    for epoch in bar:
        predictor.train()
        losses = []
        for rows in prompt_batches(data["train"]["group"], cfg.train.batch_prompts, rng):
            batch = bank.select_rows(data["train"], rows)
            loss = loss_fn(predictor(batch), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        val = evaluate_scores(score(predictor, data["val"]), data["val"])
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)),
                        **{f"val_{k}": v for k, v in val.items()
                           if k not in ("paths", "positive_rate", "auroc_by_prefix")}})
        # the value epochs are selected by, under its name (Spearman for a continuous reward)
        bar.set_postfix({"loss": f"{np.mean(losses):.4f}",
                         selection_name(val): f"{selection_value(val):.3f}"})
        # NaN never wins; a tie goes to the later epoch: a flat validation AUROC (coarse with
        # few mixed prompts) is no reason to keep an earlier, less trained state. Keeping
        # the first of tied epochs kept epoch 1, a single Adam step of lr * sign(gradient),
        # which is the same for every loss whose gradient has the same signs.
        if math.isfinite(selection_value(val)) and selection_value(val) >= best["auroc"]:
            best.update(state={k: v.clone() for k, v in predictor.state_dict().items()},
                        auroc=selection_value(val), epoch=epoch)
            stale = 0
        else:
            stale += 1
            if stale >= cfg.train.patience:
                break
    if best["epoch"] == 0:
        raise ValueError(
            f"train: the validation within-prompt AUROC was not finite after any of "
            f"{len(history)} epochs (train losses {[round(h['train_loss'], 4) for h in history]}), "
            "so no trained epoch can be selected and the untrained initialisation is not saved; "
            "the scores diverged (lower train.lr) or the validation split lacks mixed prompts")
    return best, history


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


def train(cfg, run=None, overrides: list[str] | None = None, run_dir: Path | None = None,
          progress: bool = True) -> dict:
    """Train (or find) the predictor of `cfg`; returns its metrics and checkpoint path."""
    root = bank.require_bank(cfg, overrides)
    meta = bank.read_meta(root)
    spec = feature_bank.spec_of(cfg, meta)
    out = predictor_dir(cfg)
    lm_based = cfg.predictor.name == "super_token"  # the one predictor that runs the LM
    if out.exists():
        # features replaced under the key (another tap, width or bank) are refused here as
        # evaluate refuses them, not passed over with the cached predictor
        feature_bank.require_features(cfg, overrides)
        try:
            if lm_based:
                from stopexp.models.super_token import checkpoint_meta
                saved = checkpoint_meta(out, spec, cfg.predictor)
            else:
                _, saved = load_predictor(out, spec, cfg.predictor)
            log.info("predictor already trained for this config: %s", out)
            return {"checkpoint": str(out), **saved["metrics"]}
        except (CheckpointDamaged, CheckpointMismatch) as e:  # ours to rebuild: never loop
            log.warning("%s\nretraining it: the old checkpoint is deleted", e)
            set_aside(out)
    start = time.time()
    every_position = cfg.train.positions == "all"
    if every_position:
        data = per_step.split_data_all(meta, cfg, overrides)
    else:
        data = split_data(root, meta, cfg, prefixes=lm_based, overrides=overrides)
    check_reward_range(cfg, data)
    torch.manual_seed(cfg.train.seed)
    if lm_based:
        from stopexp.models.super_token import build_super_token
        predictor = build_super_token(cfg)
    else:
        predictor = build_predictor(cfg.predictor, spec)
    n_params = sum(p.numel() for p in predictor.parameters())
    log.info("training %s (%d parameters) with %s on %d paths of %d prompts", cfg.predictor.name,
             n_params, cfg.loss.name, len(data["train"]["correct"]),
             len(set(data["train"]["group"].tolist())))
    with one_thread(predictor):  # the same weights whatever the machine's thread count
        best, history = fit(cfg, predictor, data, progress)
    warnings = learning_warnings(best, [p for p in predictor.parameters() if p.requires_grad],
                                 "auroc" if is_binary(data["val"].get("reward", data["val"]["correct"]).numpy())
                                 else "spearman")
    for w in warnings:
        log.warning("%s: %s", cfg.predictor.name, w)
    predictor.load_state_dict(best["state"])
    metrics = {"predictor": cfg.predictor.name, "loss": cfg.loss.name, "parameters": n_params,
               "best_epoch": best["epoch"], "epochs": len(history),
               "val_auroc_untrained": best["init_auroc"], "warnings": warnings,
               "wall_s": round(time.time() - start, 2)}
    scores = {}
    for split, d in data.items():
        with one_thread(predictor):
            scores[split] = score(predictor, d)
        metrics[split] = evaluate_scores(scores[split], d)
        if not every_position and not lm_based:  # the checkpoint's predictor at every position
            _, rows = per_step.position_data(cfg, split, overrides)
            with one_thread(predictor):
                metrics[split]["auroc_by_prefix"] = per_step.auroc_by_position(
                    score(predictor, rows), rows["correct"], rows["group"], rows["position"])
    save_predictor(out, predictor, cfg.predictor, spec, root.name, metrics,
                   {"history": history, "checkpoint_tokens": checkpoint_tokens(
                       cfg.train.checkpoint, cfg.search.max_new_tokens)})
    metrics["checkpoint"] = str(out)
    if run_dir is not None:
        figs = {"loss_curve": plots.loss_curve(history, run_dir / "loss_curve.png")}
        split = "test" if "test" in data else "val"
        s, y = scores[split].numpy(), data[split]["correct"].numpy()
        figs["score_hist"] = plots.score_histogram(
            s, y, run_dir / "score_hist.png", f"{cfg.predictor.name} ({split})")
        figs["reliability"] = plots.reliability_diagram(
            1 / (1 + np.exp(-s)), y, run_dir / "reliability.png", f"{cfg.predictor.name} ({split})")
        curves = {f"{cfg.predictor.name} ({sp})": metrics[sp]["auroc_by_prefix"]
                  for sp in ("val", "test") if "auroc_by_prefix" in metrics.get(sp, {})}
        if curves:
            figs["auroc_by_prefix"] = plots.auroc_by_prefix(
                curves, run_dir / "auroc_by_prefix.png",
                f"trained at {'every position' if every_position else 'one checkpoint'}")
        if run is not None:
            for h in history:
                run.log({"train/loss": h["train_loss"],
                         **{f"val/{k[4:]}": v for k, v in h.items() if k.startswith("val_")}},
                        step=h["epoch"])
            run.log({f"plots/{k}": run.image(v) for k, v in figs.items()})
    if run is not None:
        run.use_artifact(f"traces-{root.name}", type="trace_bank")
        run.summary_update({f"{split}/{k}": v for split in data for k, v in metrics[split].items()})
        run.log_artifact(out, name=f"predictor-{out.name}", type="predictor",
                         metadata={"bank": root.name, **{k: v for k, v in metrics.items()
                                                         if not isinstance(v, dict)}})
    return metrics


@stage_main("train")
def main(cfg: DictConfig) -> dict:
    validate(cfg)
    check_output_dirs(cfg)
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    with tracked_run(cfg, "train") as run:  # tracking fails safe: the outputs never depend on it
        metrics = train(cfg, run, list(hc.overrides.task), run_dir)
        write_json(run_dir / "metrics.json", {"train": metrics})
    for split in ("train", "val", "test"):
        if split in metrics:
            m = metrics[split]
            log.info("%-5s AUROC within-prompt %.3f  pooled %.3f  AUPRC %.3f  ECE %.3f  "
                     "Brier %.3f  length corr %+.3f", split, m["auroc"], m["auroc_pooled"],
                     m["auprc"], m["ece"], m["brier"], m["length_corr"])
            if "spearman_within" in m:  # a continuous reward
                log.info("%-5s reward %.4f  within-prompt Spearman %+.3f  Kendall %+.3f  AUROC above "
                         "median %.3f", split, m["mean_reward"], m["spearman_within"],
                         m["kendall_within"], m["auroc_above_median"])
    for warning in metrics.get("warnings", []):
        log.warning("%s", warning)
    plotted = sorted(p.name for p in run_dir.glob("*.png"))  # none when already trained
    log.info("metrics.json%s in %s", f" and {', '.join(plotted)}" if plotted else "", run_dir)
    return metrics


if __name__ == "__main__":
    main()
