"""Online fine-tuning of the signal predictor from pruning feedback, under a distribution shift.

    python -m stopexp.adapt +exp=toy_shift
    python -m stopexp.adapt +exp=toy_shift adapt.explore=0.2 adapt.lr=3e-3 adapt.buffer=0

The predictor learned the source config; the prompts arrive from the target, the config
with `adapt.target`'s keys in place (`{task.operators: [+, -]}`, or an LM update such as
`{task.styles: {careful: 0.8, shortcut: 0.2}, model.toy.seed: 1}`: stopexp/stages/build.py).
The stream is `adapt.stream_prompts` prompts of the target bank's `adapt.split` in a
seeded order, cut into batches of `adapt.batch_prompts`, each pruned by the current
predictor and its feedback learned from before the next (stopexp/training/stream.py). By
default everything is replayed from the trace bank, so a run costs seconds;
`evaluate.mode=online` runs the target LM instead (stopexp/training/online_lm.py) and gives
the same curves.

Variants (`adapt.variants`): no_prune (every path finishes), frozen (the source
predictor), kept_only, explore and mc_feedback (online updates from the source predictor),
retrained (a predictor trained offline on the target bank's train split: the ceiling).
Their per-batch curves and summaries: stopexp/evaluation/learning_curves.py.
"""
from __future__ import annotations

import copy
import logging
from pathlib import Path

from omegaconf import OmegaConf

from stopexp.config import checkpoint_tokens
from stopexp.core.policies import policy_params
from stopexp.evaluation import plots
from stopexp.evaluation.accounting import replay_paths
from stopexp.evaluation.degenerate import diverged_updates
from stopexp.evaluation.learning_curves import flat_summary, summarize_variants, variants_table
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.stages.shift import target_config, target_overrides
from stopexp.stages.scorers import load_trained
from stopexp.store import bank
from stopexp.store.feature_sets import require_features, spec_of
from stopexp.tasks import vote_format
from stopexp.training.losses import build_loss
from stopexp.training.online_lm import online_decider, prompt_ids_of
from stopexp.training.stream import (predictor_scores, prompt_aurocs, replay_continuations,
                                     replay_decider, run_stream, stream_order, take)

log = logging.getLogger(__name__)


def adapt(cfg, run=None, overrides: list[str] | None = None, run_dir: Path | None = None) -> dict:
    """Run every variant of `adapt.variants` over the same seeded stream; returns the
    per-batch curves and a summary per variant (see the module docstring)."""
    a, overrides = cfg.adapt, list(overrides or [])
    tgt, t_ov = target_config(cfg), target_overrides(cfg, overrides)
    src_feats, tgt_feats = build.feature_set(cfg), build.feature_set(tgt)
    root = bank.require_bank(tgt_feats.bank, t_ov)
    meta = bank.read_meta(root)
    checkpoint = check_tokens(cfg.search, cfg.train.checkpoint)
    predictors = load_predictors(a.variants, (cfg, overrides, src_feats), (tgt, t_ov, tgt_feats))
    paths = replay_paths(root, require_features(tgt_feats, t_ov), a.split, checkpoint, vote_format(tgt.task))
    order, held = stream_order(int(paths.group.max()) + 1, a.stream_prompts, a.heldout_prompts, a.seed)
    heldout = take(paths, held) if len(held) else None
    if cfg.evaluate.mode == "online":  # the target LM in the loop, on the same prompts
        lm = build.online_lm(tgt, a.split, int(prompt_ids_of(paths).max()) + 1, progress=False)
        decide, continue_ = online_decider(lm, paths, checkpoint, search=tgt.search, tap=tgt.tap,
                                           policy=tgt.policy, seed=tgt.seed,
                                           mc_rollouts=tgt.adapt.mc_rollouts)
    else:
        decide, continue_ = replay_decider(paths, cfg.policy, cfg.search.n_paths), \
            replay_continuations(a.mc_rollouts)
    loss = build_loss(cfg.loss)
    curves, held_aurocs, warnings = {}, {}, []  # held_aurocs: variant -> each held-out prompt's final AUROC
    for variant in a.variants:
        source = {"no_prune": None, "retrained": predictors.get("retrained")}.get(
            variant, predictors["frozen"])
        predictor = copy.deepcopy(source) if source is not None else None
        curves[variant] = run_stream(predictor, decide, order, heldout, a, loss, variant=variant,
                                     n_paths=cfg.search.n_paths, checkpoint=checkpoint,
                                     seconds_per_token=meta.get("seconds_per_token", 0.0),
                                     continue_=continue_)
        warnings += diverged_updates(variant, curves[variant], predictor)
        if heldout is not None and predictor is not None:
            scores = predictor_scores(predictor, heldout.batch)
            held_aurocs[variant] = prompt_aurocs(heldout, scores, cfg.search.n_paths)
    summary = summarize_variants(curves, held_aurocs=held_aurocs,
                                 n_boot=cfg.evaluate.bootstrap, seed=cfg.evaluate.seed)
    metrics = {"variants": summary, "curves": curves, "mode": cfg.evaluate.mode,
               "heldout_auroc_per_prompt": held_aurocs,  # in the order of heldout_prompt_ids
               "heldout_prompt_ids": prompt_ids_of(heldout).tolist() if heldout is not None else [],
               "target": OmegaConf.to_container(a.target, resolve=True),
               "protocol": {"n": cfg.search.n_paths, "k": cfg.policy.keep, "check_tokens": checkpoint,
                            "policy": cfg.policy.name, "policy_params": policy_params(cfg.policy),
                            "stream_prompts": len(order), "heldout_prompts": len(held),
                            "batch_prompts": a.batch_prompts, "split": a.split},
               "bank": root.name, "warnings": warnings}
    if run_dir is not None:
        metrics["plots"] = {"learning_curves": str(plots.learning_curves(
            curves, run_dir / "learning_curves.png"))}
    if run is not None:
        log_curves(run, curves, summary, metrics.get("plots", {}).get("learning_curves"))
    return metrics


def check_tokens(search, trained_at) -> int:
    """The check's prefix length in tokens (search.check_at), warning when the predictor
    learned on prefixes of another length (`trained_at`: train.checkpoint)."""
    checkpoint = checkpoint_tokens(search.check_at, search.max_new_tokens)
    if checkpoint_tokens(trained_at, search.max_new_tokens) != checkpoint:
        log.warning("train.checkpoint differs from search.check_at: the predictor scores prefixes "
                    "of another length than it learned on")
    return checkpoint


def load_predictors(variants, source: tuple, target: tuple) -> dict:
    """The source predictor ("frozen": trained on the source bank) and, when `variants`
    (adapt.variants) hold it, the ceiling ("retrained": trained on the target bank), as
    train saved them (a missing one names the train command that makes it). `source`,
    `target`: (config, the overrides that compose it, its features)."""
    out = {}
    for name, (c, ov, feats) in (("frozen", source), ("retrained", target)):
        if name == "retrained" and "retrained" not in variants:
            continue
        root = bank.require_bank(feats.bank, ov)
        out[name] = load_trained(c, spec_of(c.tap.layers, bank.read_meta(root)), feats, ov)
    return out


def log_curves(run, curves: dict, summary: dict, plot: str | None) -> None:
    """Every variant's curves to the tracked run at one step per batch (all variants at
    once: the steps only rise), the summaries, and the plot."""
    first = next(iter(curves.values()))
    for b, rec in enumerate(first):
        run.log({f"{v}/{k}": x for v, recs in curves.items() for k, x in recs[b].items()
                 if k not in ("batch", "prompts_seen")}, step=rec["prompts_seen"])
    run.summary_update({f"{v}/{k}": x for v, s in summary.items() for k, x in flat_summary(s).items()})
    if plot is not None:
        run.log({"plots/learning_curves": run.image(plot)})


@stage_main("adapt")
def main(stage: Stage) -> dict:
    metrics = adapt(stage.cfg, stage.run, stage.overrides, stage.run_dir)
    print(variants_table(metrics))
    log.info("plots and metrics.json in %s", stage.run_dir)
    return metrics
