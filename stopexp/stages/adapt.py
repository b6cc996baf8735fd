"""Online fine-tuning of the signal predictor from pruning feedback, under a distribution shift.

    python -m stopexp.adapt +exp=toy_shift
    python -m stopexp.adapt +exp=toy_shift adapt.explore=0.2 adapt.lr=3e-3 adapt.buffer=0

The predictor learned the source config; the prompts arrive from the target, the config
with `adapt.target`'s keys in place (`{task.operators: [+, -]}`, or an LM update such as
`{task.styles: {careful: 0.8, shortcut: 0.2}, model.toy.seed: 1}`). The stream is `adapt.stream_prompts`
prompts of the target bank's `adapt.split` in a seeded order, cut into batches of
`adapt.batch_prompts`. Each batch is pruned by the current predictor with Launch-Check-
Resume (N = search.n_paths, top K = policy.keep at search.check_at); the kept paths finish
and are graded, and the predictor takes `adapt.steps` AdamW steps with the training loss
(stopexp/training/losses.py) on that feedback, plus `adapt.buffer` earlier batches of it, before the
next batch arrives. By default everything is replayed from the trace bank: a finished
path's outcome is looked up, not generated, so a run costs seconds; `evaluate.mode=online`
runs the target LM instead (stopexp/training/online.py) and gives the same curves, since
every path has its own random stream.

Only kept paths reveal their outcome, so kept-only feedback is a sample the predictor's
own decisions biased. With `adapt.explore` = epsilon each would-be-pruned live path is
finished anyway with probability epsilon; it votes like a kept path, its tokens are
counted, and its feedback is weighted by 1 / epsilon (inverse propensity; kept paths are
kept with probability 1) when `adapt.importance_weight`. The costlier second option,
Monte Carlo feedback (variant mc_feedback): after each check, `adapt.mc_prefixes` pruned
prefixes of the batch, drawn at random, are continued `adapt.mc_rollouts` times from the
check; their success rate is the prefix's soft label (the target of reward_regression and
mse; contrastive and pairwise order pairs by it), weighted by 1 / its chance of being drawn.
The rollouts' tokens are a cost (`mc_tokens`, in `tokens`); they do not vote. Replay reads
the rates from the target bank's Monte Carlo labels (`collect.mc_rollouts` in
`adapt.target`) and estimates their tokens as K x the path's own remaining length;
online forks the check's prefix (stopexp/training/online.py) and counts them.

Variants (`adapt.variants`): no_prune (every path finishes), frozen (the source
predictor), kept_only, explore and mc_feedback (online updates from the source predictor), retrained
(a predictor trained offline on the target bank's train split: the ceiling). Per batch:
within-prompt AUROC of the scores that pruned it, vote accuracy, tokens (exploration
included), estimated wall seconds (tokens x the bank's seconds per token, plus the measured
check and update time), and the within-prompt AUROC on `adapt.heldout_prompts` further
target prompts after the update (the cleaner learning curve).
"""
from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from stopexp.config import checkpoint_tokens
from stopexp.core.policies import kept_text, policy_params
from stopexp.evaluation import plots
from stopexp.evaluation.accounting import replay_paths
from stopexp.runtime.cli import Stage, stage_main
from stopexp.signals.checkpoint import load_predictor
from stopexp.stages.build import trained_on
from stopexp.stages.train import train
from stopexp.store import bank
from stopexp.store.features import require_features, spec_of
from stopexp.tasks import vote_format
from stopexp.training.online import online_decider
from stopexp.training.shift import target_config, target_overrides
from stopexp.training.stream import (ONLINE, replay_continuations, replay_decider, run_stream,
                                     stream_order, take)

log = logging.getLogger(__name__)


def load_predictors(cfg, tgt, overrides: list[str]) -> dict:
    """The source predictor (trained on the source bank) and the ceiling (trained on the
    target bank), each trained here when missing, like train would."""
    out = {}
    for name, c, ov in (("frozen", cfg, overrides), ("retrained", tgt, target_overrides(cfg, overrides))):
        if name == "retrained" and "retrained" not in cfg.adapt.variants:
            continue
        root = bank.require_bank(c, ov)
        metrics = train(c, overrides=ov, progress=False)
        out[name], _ = load_predictor(Path(metrics["checkpoint"]), spec_of(c, bank.read_meta(root)),
                                      c.predictor, trained_on(c))
    return out


def adapt(cfg, run=None, overrides: list[str] | None = None, run_dir: Path | None = None) -> dict:
    """Run every variant of `adapt.variants` over the same seeded stream; returns the
    per-batch curves and a summary per variant (see the module docstring)."""
    overrides = list(overrides or [])
    tgt = target_config(cfg)
    t_ov = target_overrides(cfg, overrides)
    root = bank.require_bank(tgt, t_ov)
    meta = bank.read_meta(root)
    checkpoint = checkpoint_tokens(cfg.search.check_at, cfg.search.max_new_tokens)
    if checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens) != checkpoint:
        log.warning("train.checkpoint differs from search.check_at: the predictor scores prefixes "
                    "of another length than it learned on")
    predictors = load_predictors(cfg, tgt, overrides)
    paths = replay_paths(root, require_features(tgt, t_ov), cfg.adapt.split, checkpoint,
                         vote_format(tgt.task))
    n_groups = int(paths.group.max()) + 1
    order, held = stream_order(n_groups, cfg.adapt.stream_prompts, cfg.adapt.heldout_prompts,
                               cfg.adapt.seed)
    heldout = take(paths, held) if len(held) else None
    sec_tok = meta.get("seconds_per_token", 0.0)
    if cfg.evaluate.mode == "online":  # the target LM in the loop, on the same prompts
        decide, continue_ = online_decider(tgt, paths, checkpoint)
    else:
        decide, continue_ = replay_decider(paths, cfg), replay_continuations(cfg)
    curves = {}
    for variant in cfg.adapt.variants:
        source = {"no_prune": None, "retrained": predictors.get("retrained")}.get(
            variant, predictors["frozen"])
        predictor = copy.deepcopy(source) if source is not None else None
        curves[variant] = run_stream(predictor, decide, order, heldout, cfg, variant=variant,
                                     checkpoint=checkpoint, seconds_per_token=sec_tok,
                                     continue_=continue_)
    summary = summarize(curves, cfg.adapt.batch_prompts)
    metrics = {"variants": summary, "curves": curves, "mode": cfg.evaluate.mode,
               "target": OmegaConf.to_container(cfg.adapt.target, resolve=True),
               "protocol": {"n": cfg.search.n_paths, "k": cfg.policy.keep, "check_tokens": checkpoint,
                            "policy": cfg.policy.name, "policy_params": policy_params(cfg.policy),
                            "stream_prompts": len(order), "heldout_prompts": len(held),
                            "batch_prompts": cfg.adapt.batch_prompts, "split": cfg.adapt.split},
               "bank": root.name}
    if run_dir is not None:
        metrics["plots"] = {"learning_curves": str(plots.learning_curves(
            curves, run_dir / "learning_curves.png"))}
    if run is not None:
        first = next(iter(curves.values()))
        for b, rec in enumerate(first):  # all variants at one step per batch: steps only rise
            run.log({f"{v}/{k}": x for v, recs in curves.items() for k, x in recs[b].items()
                     if k not in ("batch", "prompts_seen")}, step=rec["prompts_seen"])
        run.summary_update({f"{v}/{k}": x for v, s in summary.items() for k, x in s.items()
                            if isinstance(x, (int, float))})
        if run_dir is not None:
            run.log({"plots/learning_curves": run.image(metrics["plots"]["learning_curves"])})
    return metrics


def summarize(curves: dict, batch_prompts: int, last: int = 5) -> dict:
    """Per variant: accuracy and tokens over the stream, the tokens' share of no_prune's,
    the mean AUROC of the last `last` batches, the final held-out AUROC, and (for the
    online variants) the share of the frozen -> retrained held-out AUROC gap closed at the
    end and the prompts seen when half of it first was."""
    out = {}
    for v, recs in curves.items():
        w = np.asarray([r["prompts_seen"] - (recs[i - 1]["prompts_seen"] if i else 0)
                        for i, r in enumerate(recs)], float)
        out[v] = {"accuracy": float(np.average([r["accuracy"] for r in recs], weights=w)),
                  "tokens_total": float(sum(r["tokens"] for r in recs)),
                  "explore_tokens": float(sum(r["explore_tokens"] for r in recs)),
                  "mc_tokens": float(sum(r.get("mc_tokens", 0.0) for r in recs)),
                  "wall_s": float(sum(r["wall_s"] for r in recs)),
                  "update_s": float(sum(r["update_s"] for r in recs)),
                  "auroc_last": float(np.nanmean([r["auroc"] for r in recs[-last:]]))
                  if any(np.isfinite(r["auroc"]) for r in recs[-last:]) else math.nan,
                  "heldout_auroc": recs[-1].get("heldout_auroc", math.nan)}
    if "no_prune" in out:
        for s in out.values():
            s["tokens_ratio"] = s["tokens_total"] / out["no_prune"]["tokens_total"]
    if "frozen" in out and "retrained" in out:
        lo, hi = out["frozen"]["heldout_auroc"], out["retrained"]["heldout_auroc"]
        for v in ONLINE:
            if v in out and hi != lo:
                out[v]["gap_closed"] = (out[v]["heldout_auroc"] - lo) / (hi - lo)
                half = [r["prompts_seen"] for r in curves[v]
                        if (r["heldout_auroc"] - lo) / (hi - lo) >= 0.5]
                out[v]["prompts_to_half_gap"] = half[0] if half else None
    return out


def print_table(metrics: dict) -> str:
    p = metrics["protocol"]
    lines = [f"Online adaptation to {metrics['target']}: {p['stream_prompts']} prompts in batches of "
             f"{p['batch_prompts']}, {p['n']} -> "
             f"{kept_text(p.get('policy', 'topk'), p.get('policy_params', {}), p['k'])} at "
             f"{p['check_tokens']} tokens",
             f"{'variant':<12}{'accuracy':>9}{'tokens':>10}{'ratio':>7}{'explore':>9}{'MC tok':>8}"
             f"{'AUROC last':>11}{'held-out':>9}{'gap closed':>11}{'update s':>9}{'wall s':>8}"]
    for v, s in metrics["variants"].items():
        gap = f"{s['gap_closed']:.2f}" if "gap_closed" in s else "-"
        lines.append(f"{v:<12}{s['accuracy']:>9.3f}{s['tokens_total']:>10.0f}"
                     f"{s.get('tokens_ratio', math.nan):>7.2f}{s['explore_tokens']:>9.0f}"
                     f"{s.get('mc_tokens', 0.0):>8.0f}"
                     f"{s['auroc_last']:>11.3f}{s['heldout_auroc']:>9.3f}{gap:>11}{s['update_s']:>9.2f}"
                     f"{s['wall_s']:>8.1f}")
    return "\n".join(lines)


@stage_main("adapt")
def main(stage: Stage) -> dict:
    metrics = adapt(stage.cfg, stage.run, stage.overrides, stage.run_dir)
    print(print_table(metrics))
    log.info("plots and metrics.json in %s", stage.run_dir)
    return metrics
