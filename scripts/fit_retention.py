"""Fit the retention guideline 1/gamma = a * C^b * L_prefix^c / L_task^d to sweep results.

    python scripts/fit_retention.py outputs/multirun/<time> [more multirun dirs] [--plot PNG]

Reads every finished job's metrics.json and config; which fields make C, L_prefix, L_task
and the chosen gamma is defined in stopexp/evaluation/retention.py. Prints the coefficients and
writes a plot of fitted against observed 1/gamma (default: retention_fit.png in the first
dir). Sweeps that fit: scripts/sweep_retention.sh with the task length varied too.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from stopexp.evaluation.plots import save_figure  # noqa: E402
from stopexp.evaluation.retention import fit_retention, guideline_points, predict_inverse_gamma  # noqa: E402
from stopexp.runtime.sweeps import dir_runs  # noqa: E402


def plot(points: list[dict], coef: dict, path: Path) -> Path:
    observed = np.array([1 / p["gamma"] for p in points])
    fitted = predict_inverse_gamma(coef, *(np.array([p[k] for p in points])
                                          for k in ("C", "L_prefix", "L_task")))
    fig, ax = plt.subplots(figsize=(4.5, 4.2))
    sc = ax.scatter(fitted, observed, c=np.log([p["C"] for p in points]), cmap="viridis", s=18)
    lim = [min(fitted.min(), observed.min()) * 0.8, max(fitted.max(), observed.max()) * 1.25]
    ax.plot(lim, lim, ":", color="gray")
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="fitted 1/gamma",
           ylabel="chosen 1/gamma (Pareto front)",
           title=f"a={coef['a']:.3g} b={coef['b']:.3f} c={coef['c']:.3f} d={coef['d']:.3f}")
    fig.colorbar(sc, ax=ax, label="log C (tokens per prompt)")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dirs", nargs="+", type=Path, help="multirun dirs")
    ap.add_argument("--plot", type=Path, help="PNG to write (default: <first dir>/retention_fit.png)")
    args = ap.parse_args(argv)
    try:
        runs = [r for d in args.sweep_dirs for r in dir_runs(d)]
        points = guideline_points(runs)
        coef = fit_retention(points)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"fit_retention: {e}")
    print(f"{len(runs)} jobs, {coef['points']} Pareto points; 1/gamma = a * C^b * L_prefix^c / L_task^d")
    for k in ("a", "b", "c", "d", "r2"):
        print(f"  {k:<3}= {coef[k]:.4g}")
    out = plot(points, coef, args.plot or args.sweep_dirs[0] / "retention_fit.png")
    print(f"plot: {out}")
    return coef


if __name__ == "__main__":
    main()
