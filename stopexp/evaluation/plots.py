"""The standard figures, written as PNG files (headless matplotlib). Each function takes
plain arrays/dicts, so notebooks can call them on loaded outputs as well."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from stopexp.metrics import reliability  # noqa: E402
from stopexp.runtime.artifacts import atomic_path  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    """Write `fig` to `path` atomically (temporary name, then rename; the format from the
    suffix) and close it. A crash mid-write leaves the previous file, never half of one."""
    path = Path(path)
    try:
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path




def loss_curve(history: list[dict], path: Path) -> Path:
    """Training loss and validation within-prompt AUROC per epoch."""
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    epochs = [h["epoch"] for h in history]
    ax.plot(epochs, [h["train_loss"] for h in history], "o-", label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(epochs, [h["val_auroc"] for h in history], "s--", color="C1",
             label="val AUROC (within-prompt)")
    ax2.set_ylabel("AUROC")
    fig.legend(loc="upper right", fontsize=8)
    return save_figure(fig, path)


def score_histogram(scores, correct, path: Path, title: str = "") -> Path:
    """Signal distribution for paths that end right vs wrong."""
    scores, correct = np.asarray(scores, float), np.asarray(correct, bool)
    fig, ax = plt.subplots(figsize=(5, 3.3))
    bins = np.histogram_bin_edges(scores[np.isfinite(scores)], bins=40)
    ax.hist(scores[correct], bins=bins, alpha=0.6, density=True, label="ends right")
    ax.hist(scores[~correct], bins=bins, alpha=0.6, density=True, label="ends wrong")
    ax.set_xlabel("signal")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def reliability_diagram(probs, correct, path: Path, title: str = "") -> Path:
    r = reliability(np.asarray(probs, float), np.asarray(correct, float))
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.plot([0, 1], [0, 1], ":", color="gray")
    ok = np.isfinite(r["accuracy"])
    ax.plot(np.asarray(r["confidence"])[ok], np.asarray(r["accuracy"])[ok], "o-")
    ax.set_xlabel("predicted probability")
    ax.set_ylabel("observed success rate")
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


def _colour(i: int):
    """Twenty distinct colours (tab20: pairs of shades), enough for every method at once."""
    return plt.get_cmap("tab20")((2 * i) % 20 + (2 * i) // 20 % 2)


def pareto(points: list[dict], path: Path) -> Path:
    """Accuracy vs total tokens: no_prune at several N, each method at several K."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, method in enumerate(dict.fromkeys(p["method"] for p in points)):
        pts = sorted((p for p in points if p["method"] == method), key=lambda p: p["tokens_total"])
        ax.plot([p["tokens_total"] for p in pts], [p["accuracy"] for p in pts],
                "o-" if method == "no_prune" else "s:", color=_colour(i), label=method, ms=4)
        for p in pts:
            ax.annotate(f"{p['n']}>{p['k']}" if p["n"] != p["k"] else f"N={p['n']}",
                        (p["tokens_total"], p["accuracy"]), fontsize=6, alpha=0.7)
    ax.set_xlabel("total generated tokens")
    ax.set_ylabel("vote accuracy")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def auroc_by_prefix(curves: dict[str, dict], path: Path, title: str = "") -> Path:
    """Within-prompt AUROC against prefix length, one line per method (dashed: a predictor
    trained at one checkpoint, "<name>@<tokens>"). `curves`: method ->
    {"positions": [tokens], "auroc": [float]} (stopexp.training.per_step.auroc_by_position);
    positions without a mixed prompt (NaN) leave a gap. Dotted: chance (0.5)."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, (method, c) in enumerate(curves.items()):
        ax.plot(c["positions"], c["auroc"], "o-" if "@" not in method else "s--",
                color=_colour(i), label=method, ms=3, lw=1.2)
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("prefix (generated tokens)")
    ax.set_ylabel("within-prompt AUROC")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside: lines cross everywhere
    return save_figure(fig, path)


def survival(curves: dict[str, list], path: Path) -> Path:
    """Share of launched paths still generating at each step."""
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for i, (method, c) in enumerate(curves.items()):
        ax.plot(np.arange(1, len(c) + 1), c, color=f"C{i % 10}", label=method, lw=1.2)
    ax.set_xlabel("generation step")
    ax.set_ylabel("share of paths alive")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def prune_steps(pruned_at: dict[str, np.ndarray], path: Path) -> Path:
    """Histogram of the step at which paths were pruned, per method."""
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    data = {m: np.asarray(v) for m, v in pruned_at.items() if len(v)}
    if data:
        ax.hist(list(data.values()), bins=20, label=list(data), alpha=0.8)
        ax.legend(fontsize=7, ncol=2)
    ax.set_xlabel("prune step")
    ax.set_ylabel("paths")
    return save_figure(fig, path)


def signal_histograms(scores: dict[str, np.ndarray], correct, path: Path) -> Path:
    """One panel per method: the signal of paths that end right vs wrong."""
    correct = np.asarray(correct, bool)
    n = len(scores)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, (method, s) in zip(axes.flat, scores.items()):
        s = np.asarray(s, float)
        bins = np.histogram_bin_edges(s[np.isfinite(s)], bins=30)
        ax.hist(s[correct], bins=bins, alpha=0.6, density=True, label="right")
        ax.hist(s[~correct], bins=bins, alpha=0.6, density=True, label="wrong")
        ax.set_title(method, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    return save_figure(fig, path)


def learning_curves(curves: dict, path: Path) -> Path:
    """Online adaptation (stopexp/stages/adapt.py): per variant, the within-prompt AUROC of each
    stream batch (thin) and on the held-out prompts after each update (thick), and the
    vote accuracy per batch, against the prompts seen."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (name, recs) in enumerate(curves.items()):
        x = [r["prompts_seen"] for r in recs]
        if any(np.isfinite(r["auroc"]) for r in recs):
            ax.plot(x, [r["auroc"] for r in recs], "-", color=f"C{i}", alpha=0.35, lw=0.8)
        if any("heldout_auroc" in r for r in recs):
            start = [(0, recs[0]["heldout_auroc_before"])] if "heldout_auroc_before" in recs[0] else []
            hx, hy = zip(*start, *((xi, r.get("heldout_auroc", np.nan)) for xi, r in zip(x, recs)))
            ax.plot(hx, hy, "o-", color=f"C{i}", ms=3, label=name)
        ax2.plot(x, [r["accuracy"] for r in recs], "o-", color=f"C{i}", ms=3, label=name)
    ax.set_xlabel("prompts seen")
    ax.set_ylabel("within-prompt AUROC")
    ax.set_title("held-out (dots) and stream batch (thin)", fontsize=9)
    ax.legend(fontsize=8)
    ax2.set_xlabel("prompts seen")
    ax2.set_ylabel("vote accuracy per batch")
    ax2.legend(fontsize=8)
    return save_figure(fig, path)


def analyses(results: dict, path: Path) -> Path:
    """The per-method analyses of stopexp/evaluation/analyses.py (results: metrics.json's "methods"):
    within-prompt vs length-matched AUROC (paired bars, scored methods only), the share of
    pruned paths that would have ended right, and the prompts each method improves or
    worsens against no_prune. A missing value (no scores, nothing pruned) draws no bar."""
    names = [m for m in results if m != "no_prune"]
    x = np.arange(len(names))
    get = lambda m, k: np.nan if results[m].get(k) is None else float(results[m][k])  # noqa: E731
    fig, axes = plt.subplots(3, 1, figsize=(max(6.0, 0.45 * len(names) + 2), 8.5), sharex=True)
    ax = axes[0]
    ax.bar(x - 0.2, [get(m, "auroc") for m in names], 0.4, label="within-prompt")
    ax.bar(x + 0.2, [get(m, "auroc_length_matched") for m in names], 0.4, label="length-matched")
    ax.axhline(0.5, ls=":", color="gray", lw=0.8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("AUROC")
    ax.legend(fontsize=7)
    axes[1].bar(x, [get(m, "wrongly_pruned") for m in names], 0.6, color="C3")
    axes[1].set_ylim(0, 1)
    axes[1].set_ylabel("wrongly pruned share")
    v = [results[m].get("vs_no_prune", {}) for m in names]
    axes[2].bar(x - 0.2, [d.get("improved", 0) for d in v], 0.4, color="C2", label="improved")
    axes[2].bar(x + 0.2, [-d.get("worsened", 0) for d in v], 0.4, color="C3", label="worsened")
    axes[2].axhline(0, color="gray", lw=0.8)
    axes[2].set_ylabel("prompts vs no_prune\n(+ improved, - worsened)")
    axes[2].legend(fontsize=7)
    axes[2].set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    return save_figure(fig, path)


def reward_tokens(results: dict, path: Path, beam: dict | None = None, select: str = "vote") -> Path:
    """Mean reward of each method's chosen output against its total tokens (one point per
    method; plain beam search as a star when given): the open-ended tasks' Pareto view."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, r) in enumerate(r for r in results.items() if "mean_reward" in r[1]):
        ax.scatter(r["tokens_total"], r["mean_reward"], color=_colour(i), label=name)
    if beam is not None and "mean_reward" in beam:
        ax.scatter(beam["tokens_total"], beam["mean_reward"], marker="*", s=160, color="black",
                   label="beam search")
    ax.set_xlabel("tokens generated (all prompts)")
    ax.set_ylabel(f"mean reward of the output ({select})")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
