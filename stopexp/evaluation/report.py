"""The evaluate stage's figures (through stopexp/evaluation/plots.py) and its W&B sample table."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stopexp.evaluation import plots
from stopexp.evaluation.accounting import Paths, keep_by_policy
from stopexp.signals import methods as M


def make_plots(paths: Paths, outcomes: dict, scores: dict, points: list, run_dir: Path,
               results: dict | None = None, prefix_curves: dict | None = None) -> dict:
    """Write the standard figures into run_dir; returns name -> PNG path. With `results`
    (metrics.json's "methods", the analyses added) the analyses figure too; with
    `prefix_curves` (metrics.json's "auroc_by_prefix") the AUROC against prefix length."""
    figs = {"pareto": plots.pareto(points, run_dir / "pareto.png"),
            "survival": plots.survival({m: o["survival"] for m, o in outcomes.items()},
                                       run_dir / "survival.png"),
            "prune_steps": plots.prune_steps({m: o["pruned_at"] for m, o in outcomes.items()},
                                             run_dir / "prune_steps.png")}
    figs["signal_histograms"] = plots.signal_histograms(
        {m: s[paths.alive] for m, s in scores.items()}, paths.correct[paths.alive],
        run_dir / "signal_histograms.png")
    learned = [m for m in scores if m not in M.NON_LEARNABLE and m not in ("random", "oracle")]
    for m in learned:
        s = scores[m][paths.alive]
        figs[f"calibration_{m}"] = plots.reliability_diagram(
            1 / (1 + np.exp(-s)), paths.correct[paths.alive], run_dir / f"calibration_{m}.png", m)
    if results is not None:
        figs["analyses"] = plots.analyses(results, run_dir / "analyses.png")
    if prefix_curves:
        figs["auroc_by_prefix"] = plots.auroc_by_prefix(
            prefix_curves, run_dir / "auroc_by_prefix.png", "every method at every stored prefix")
    return figs


def sample_table(run, paths: Paths, scores: dict, cfg, k: int, n: int, rows: int = 32):
    """A W&B table of the first `rows` live paths: text, the first learned method's score
    (confidence when none), whether the policy keeps it, whether it ends right."""
    method = next((m for m in scores if m not in M.NON_LEARNABLE and m not in ("random", "oracle")),
                  "confidence")
    s = scores[method]
    kept = keep_by_policy(paths, s, cfg, k, n)
    idx = np.nonzero(paths.alive)[0][:rows]
    return run.table(["text", f"score ({method})", "kept", "correct"],
                     [[paths.text[i], float(s[i]), bool(kept[i]), bool(paths.correct[i])] for i in idx])
