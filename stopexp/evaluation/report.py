"""The evaluate stage's figures (through stopexp/evaluation/plots.py), its per-prompt records
and its W&B sample table."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stopexp.core.names import ORACLE_METHODS
from stopexp.core.policies import policy_params
from stopexp.evaluation import figures, plots
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import keep_by_policy
from stopexp.evaluation.paired import best_non_learned
from stopexp.evaluation.table import protocol_line
from stopexp.runtime.artifacts import atomic_path
from stopexp.signals import methods as M


def protocol_record(plan: list[tuple[int, int]], n: int, policy, search, evaluate, prompts: int,
                    thresholds: dict) -> dict:
    """metrics.json's protocol of Launch-Check-Resume: N, the last check's K, where AUROC is
    read (the first check), the policy and its settings (`thresholds`: policy=risk's
    calibrated ones per method, empty otherwise), every check, the score rule, the vote and
    the evaluated prompts of evaluate.split."""
    return {"n": n, "k": plan[-1][1], "check_tokens": plan[0][0], "policy": policy.name,
            "policy_params": policy_params(policy) | ({"thresholds": thresholds} if thresholds else {}),
            "checks": [list(c) for c in plan], "score_rule": search.score_rule,
            "vote": evaluate.vote, "prompts": prompts, "split": evaluate.split}


def make_plots(paths: Paths, outcomes: dict, scores: dict, points: list, run_dir: Path,
               results: dict | None = None, metrics: dict | None = None) -> dict:
    """Write the standard figures into run_dir; returns name -> PNG path. With `results`
    (metrics.json's "methods", the analyses added) the analyses figure too, and with a
    reward and a selection other than the vote or a beam-search comparison the reward
    against tokens; with `metrics`
    (metrics.json's content) the studied methods drawn strongly (the probes, no_prune,
    random, the controls and the oracle: `figures.studied_methods`), a caption line with
    the protocol, the AUROC against prefix length and the paired differences."""
    metrics = metrics or {}
    paired = metrics.get("paired") or {}
    best = paired["checks"][0]["best_non_learned"] if paired else best_non_learned(
        {m: r["auroc"] for m, r in (results or {}).items() if "auroc" in r})
    studied = figures.studied_methods([*outcomes, *metrics.get("auroc_by_prefix", {})], best)
    caption = protocol_line(metrics) if "protocol" in metrics else None
    figs = {"pareto": plots.pareto(points, run_dir / "pareto.png", studied, caption),
            "survival": plots.survival({m: o["survival"] for m, o in outcomes.items()},
                                       run_dir / "survival.png", studied, caption),
            "prune_steps": plots.prune_steps({m: o["pruned_at"] for m, o in outcomes.items()},
                                             run_dir / "prune_steps.png", studied, caption)}
    figs["signal_histograms"] = plots.signal_histograms(
        {m: s[paths.alive] for m, s in scores.items()}, paths.correct[paths.alive],
        run_dir / "signal_histograms.png")
    learned = [m for m in scores if m not in M.non_learnable() and m not in ("random", *ORACLE_METHODS)]
    for m in learned:
        s = scores[m][paths.alive]
        figs[f"calibration_{m}"] = plots.reliability_diagram(
            1 / (1 + np.exp(-s)), paths.correct[paths.alive], run_dir / f"calibration_{m}.png", m)
    if results is not None:
        figs["analyses"] = plots.analyses(results, run_dir / "analyses.png")
    beam, select = metrics.get("beam_search"), metrics.get("select", "vote")
    if results is not None and paths.reward is not None and (select != "vote" or beam):
        figs["reward_tokens"] = plots.reward_tokens(results, run_dir / "reward_tokens.png", beam,
                                                    select, studied, caption)
    if paired:
        figs["paired"] = plots.paired_intervals(paired, run_dir / "paired.png", caption)
    if metrics.get("auroc_by_prefix"):
        figs["auroc_by_prefix"] = plots.plot_auroc_by_prefix(
            metrics["auroc_by_prefix"], run_dir / "auroc_by_prefix.png",
            "every method at every stored prefix", studied, metrics.get("paired_by_prefix"), caption)
    return figs


def sample_table(run, paths: Paths, scores: dict, policies: dict, n: int, rows: int = 32):
    """A W&B table of the first `rows` live paths: text, the first learned method's score
    (confidence when none), whether its first check's policy (`policies`: name -> one per
    check) keeps it, whether it ends right."""
    method = next((m for m in scores if m not in M.non_learnable() and m not in ("random", *ORACLE_METHODS)),
                  "confidence")
    s = scores[method]
    kept = keep_by_policy(paths, s, policies[method][0], n)
    idx = np.nonzero(paths.alive)[0][:rows]
    return run.table(["text", f"score ({method})", "kept", "correct"],
                     [[paths.text[i], float(s[i]), bool(kept[i]), bool(paths.correct[i])] for i in idx])


def record(metrics: dict, paths: Paths, outcomes: dict, scores: dict, policies: dict, n: int,
           bank_name: str, run=None, run_dir: Path | None = None) -> None:
    """The evaluate stage's figures into `run_dir` (their paths under metrics["plots"]) and,
    with a tracked `run`, the figures, the bank used, the per-method summary and the sample
    table (`n` paths per prompt, each method pruning by its `policies`)."""
    results = metrics["methods"]
    if run_dir is not None:
        figs = make_plots(paths, outcomes, scores, metrics["points"], run_dir, results, metrics)
        metrics["plots"] = {k: str(v) for k, v in figs.items()}
        write_prompt_records(run_dir / "prompts.jsonl", paths, outcomes)
        if run is not None:
            run.log({f"plots/{k}": run.image(v) for k, v in figs.items()})
    if run is not None:
        run.use_artifact(f"traces-{bank_name}", type="trace_bank")
        run.summary_update({f"{m}/{k}": v for m, r in results.items() for k, v in r.items()
                            if isinstance(v, (int, float))})
        run.log({"samples": sample_table(run, paths, scores, policies, n)})


def write_prompt_records(path: Path, paths: Paths, outcomes: dict) -> None:
    """One line per method and prompt (as lm-evaluation-harness' --log_samples records each
    document): the prompt id, the voted answer (null: no voter had one), whether it is
    correct, the tokens spent and the chosen path's text. Written whole or not at all."""
    ids = paths.prompt_ids if paths.prompt_ids is not None else np.arange(int(paths.group.max()) + 1)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for method, o in outcomes.items():
            for g, prompt_id in enumerate(ids):
                f.write(json.dumps({"method": method, "prompt_id": int(prompt_id), "answer": o["winner"][g],
                                    "correct": bool(o["correct"][g]), "tokens": int(o["tokens"][g]),
                                    "text": str(o["chosen"][g])}) + "\n")
