"""Stage 3, evaluate: prune with every method under one accounting, and show it.

    python -m stopexp.evaluate +exp=toy_contrastive                    # replay (default)
    python -m stopexp.evaluate +exp=toy_contrastive evaluate.mode=online

Standard protocol (Launch-Check-Resume): N = search.n_paths paths per test prompt, check
at search.check_at, keep K = policy.keep by each method's signal, finish the kept paths,
majority vote (evaluate.vote); paths that end before the check vote directly. Under
policy=risk each method's thresholds are first calibrated on the bank's validation split
(stopexp/evaluation/risk.py), for replay and online alike. With a list
of checks the live paths are checked at each (progressive), one K per check. `replay` re-scores the
trace bank without the LM (exact, since every path has its own random stream);
`online` really runs the LM and measures wall time. Replay joins the bank with its features
(made by featurize). The learned methods are the predictors train made (the configured one
and its controls). Methods with a stopping protocol of
their own (ESC, Adaptive-Consistency, DeepConf online and its votes: stopexp/stopping/replay.py)
replay the bank in both modes (combined, which reads every check's scores, in replay); stopexp/evaluation/analyses.py adds the per-method analyses.
Every scoring method is also scored at every stored position of the bank's paths
(`auroc_by_prefix` in metrics.json and auroc_by_prefix.png: stopexp/evaluation/curves.py).
Every probe-vs-control claim has its paired bootstrap over prompts (`paired` and
`paired_by_prefix`, paired.png: stopexp/evaluation/paired.py). On a task with intermediate
values, `first_wrong_value` says where the paths' first wrong values lie
(stopexp/evaluation/first_errors.py).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from stopexp.config import check_method_names, check_plan
from stopexp.core.names import lookup, method_name, names as registered
from stopexp.core.policies import check_policies
from stopexp.core.protocol import checkpoint_tokens
from stopexp.evaluation.accounting import (account_methods, add_text_metrics, bank_paths_and_confs,
                                           pareto_points, prompts_in, replay_paths)
from stopexp.evaluation.analyses import add_analyses
from stopexp.evaluation.beam import beam_metrics, compare_with_beam
from stopexp.evaluation.curves import prefix_curves
from stopexp.evaluation.degenerate import degenerate_warnings
from stopexp.evaluation.first_errors import bank_timing
from stopexp.evaluation.online import online_paths, online_stopping
from stopexp.evaluation.paired import combined_pairs, paired_stats, scores_at_checks
from stopexp.evaluation.report import protocol_record, record
from stopexp.evaluation.risk import calibrate_methods, calibration_record, realised_risk
from stopexp.evaluation.method_names import method_names, warn_off_checkpoint
from stopexp.evaluation.select import attach_bank_columns
from stopexp.evaluation.table import print_table  # pipeline and notebooks import it from here
from stopexp.search.memory import add_memory
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.stages.scorers import build_scorers, single_checkpoint_baseline
from stopexp.stages.trained_with import predictors_for, trained_record
from stopexp.stopping.replay import stopping_outcomes, trace_methods
from stopexp.store import bank
from stopexp.store import feature_sets
from stopexp.tasks import build_task, vote_format
from stopexp.training.per_step import position_rows

log = logging.getLogger(__name__)


def evaluate(cfg, run=None, run_dir: Path | None = None, overrides: list[str] | None = None) -> dict:
    """Evaluate every method of `cfg.evaluate.methods` (and the always-run ones) on the
    trace bank's `evaluate.split` prompts; returns metrics.json's content. With run_dir the
    figures are written there, with `run` (a tracked run) the summary, figures and a sample
    table are logged. Unknown methods, a missing bank or predictor fail before compute,
    printing the command that makes it with the command line's `overrides`."""
    ev = cfg.evaluate
    check_method_names(ev.methods)  # unknown names fail before any compute (as validate does)
    feats = build.feature_set(cfg)
    # evaluate.trained_with: another bank's predictors, with the sections they were trained by
    cfg, home = predictors_for(cfg, feats, overrides)
    ev = cfg.evaluate
    root = bank.require_bank(feats.bank, overrides)
    meta = bank.read_meta(root)
    plan = check_plan(cfg.search, cfg.policy)  # (prefix tokens, K) per check; the first is where AUROC is read
    checkpoint, N, split = plan[0][0], cfg.search.n_paths, ev.split
    if cfg.search.name == "parallel" and ev.mode == "replay" and not bank.split_rows(meta, split):
        raise bank.BankMissing(f"evaluate.split: the trace bank {root} holds no {split} path: "
                               f"{bank.left_out(meta, split)}")
    checks = [c for c, _ in plan]
    names = method_names(ev.methods, cfg.predictor.name)
    if cfg.search.name == "parallel":
        warn_off_checkpoint(names, plan, checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens),
                            cfg.train.positions)
    spec = feature_sets.spec_of(cfg.tap.layers, meta)
    scorers = build_scorers(cfg, names, spec, feats, overrides, home)
    start = time.time()
    if cfg.search.name == "beam":
        n = min(prompts_in(root, split), ev.max_prompts or float("inf"))
        return beam_metrics(build.online_lm(cfg, split, n, weights=True), names, scorers,
                            root.name, start, cfg.search, cfg.tap, cfg.policy, ev, run, run_dir)
    # the threshold policies, one per check and method (policy=risk: calibrated on val first)
    features = None if ev.mode == "online" and cfg.policy.name != "risk" else \
        feature_sets.require_features(feats, overrides)
    calibrated = (calibrate_methods(cfg.policy, cfg.search, ev, scorers, checks,
                                    replay_paths(root, features, "val", checks, vote_format(cfg.task)))
                  if cfg.policy.name == "risk" else {})
    policies = {m: check_policies(cfg.policy, plan, calibrated[m].thresholds if calibrated else None)
                for m in scorers}
    # run: the paths (replayed from the bank, or online with the LM)
    views = timing = None
    stops = {}
    if ev.mode == "online":  # the same test prompts as the bank
        lm = build.online_lm(cfg, split, prompts_in(root, split))
        paths, views, timing = online_paths(lm, names, scorers, policies, plan, N)
        off_bank = attach_bank_columns(views, root, split)  # rewards and LM scores, checked text by text
        for name, n in off_bank.items():
            timing[name]["paths_off_bank"] = n
        inside = {m: s for m, s in trace_methods(names, ev.stopping).items() if s.inside}
        if inside:  # they stop paths while they run: on the engine, each its own run
            stops, more = online_stopping(lm, inside, views["no_prune"][0], N, cfg.search.group_window,
                                          dict(scorers=scorers, predictor=cfg.predictor.name,
                                               budget=build.kv_budget(cfg)))
            timing.update(more)
    else:  # replay reads the features of the bank's paths
        paths = replay_paths(root, features, split, checks, vote_format(cfg.task))
    replayed = [m for m in names if m not in stops]
    if set(replayed) & set(registered("stopping")):  # combined reads its signal's scores at every check
        signal = [scorers[method_name(ev.stopping.combined.signal, cfg.predictor.name)](b).numpy().astype(float)
                  for b in paths.checks] if "combined" in names else None
        steps = build.step_boundaries(cfg, feats, split, scorers[method_name(
            ev.stopping.step.signal, cfg.predictor.name)], overrides) if "step" in replayed else None
        stops |= stopping_outcomes(*bank_paths_and_confs(root, split, checkpoint, paths, views),
                                   replayed, N, ev.stopping, cfg.search.group_window, checks, signal,
                                   steps, build.kv_budget(cfg))
    # account, analyse
    results, outcomes, scores, points = account_methods(names, scorers, policies, paths, plan, stops,
                                                        views, timing, meta, cfg.search, cfg.policy, ev)
    for m, cal in calibrated.items():  # what policy=risk realised on the evaluated split
        results[m]["risk"] = realised_risk(paths, outcomes[m], N, cfg.policy.risk, cal,
                                           ev.bootstrap, ev.seed)
    add_analyses(results, outcomes, scores, paths, N, ev.bootstrap, ev.seed)
    add_memory(results, outcomes, meta.get("kv_bytes_per_token"))
    points += pareto_points(paths, scores, checkpoint, plan, cfg.search, cfg.policy, ev)
    ids = paths.prompt_ids if paths.prompt_ids is not None else np.arange(int(paths.group.max()) + 1)
    chosen = {name: list(o["chosen"]) for name, o in outcomes.items()}
    if ev.text_metrics:
        add_text_metrics(build_task(cfg.task, cfg.model.get("thinking")), split, ev.bertscore_model,
                         ids, chosen, results)
    beam = None
    if ev.compare_beam:  # plain beam search on the same prompts: the seed's comparison
        lm = build.online_lm(cfg, split, int(np.max(ids)) + 1, weights=True)
        beam = compare_with_beam(lm, ids, chosen, results, cfg.search, cfg.tap, cfg.reward, ev)
    metrics = {"methods": results, "points": points, "mode": ev.mode,
               "select": ev.select, **({"beam_search": beam} if beam else {}),
               "protocol": protocol_record(plan, N, cfg.policy, cfg.search, ev, int(paths.group.max()) + 1, {
                   m: calibration_record(c)["thresholds"] for m, c in calibrated.items()}),
               "bank": root.name, **({"trained_with": trained_record(home)} if ev.trained_with else {})}
    metrics["paired"] = paired_stats(paths, scores_at_checks(scorers, scores, paths), plan, N,
                                     outcomes, ev.bootstrap, ev.seed)
    metrics["paired_combined"] = combined_pairs(outcomes, ev.bootstrap, ev.seed)
    ds, rows = position_rows(feats, split, overrides)  # every stored position of the split's paths
    baseline = single_checkpoint_baseline(home, spec) if rows is not None else None
    metrics["auroc_by_prefix"], metrics["paired_by_prefix"] = prefix_curves(
        ds, rows, scorers, baseline, ev.bootstrap, ev.seed)
    if lookup("task", cfg.task.name).wrong_value_end is not None:  # where the first wrong values lie
        metrics["first_wrong_value"] = bank_timing(bank.load_bank(root, split), checks)
    metrics["warnings"] = degenerate_warnings(outcomes, scores)
    metrics["eval_wall_s"] = round(time.time() - start, 2)
    record(metrics, paths, outcomes, scores, policies, N, root.name, run, run_dir)  # plot, log
    return metrics


@stage_main("evaluate")
def main(stage: Stage) -> dict:
    metrics = evaluate(stage.cfg, stage.run, stage.run_dir, stage.overrides)
    print(print_table(metrics))
    for warning in metrics.get("warnings", []):  # under the table, where it is read
        print(f"WARNING: {warning}")
    log.info("plots and metrics.json in %s", stage.run_dir)
    return metrics
