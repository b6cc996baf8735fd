"""The standard figures, written as PNG files (headless matplotlib). Each function takes
plain arrays/dicts, so notebooks can call them on loaded outputs as well."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from stopexp.evaluation import figures  # noqa: E402
from stopexp.evaluation.paired import in_order, is_probe, role_label  # noqa: E402
from stopexp.metrics import reliability  # noqa: E402
from stopexp.runtime.artifacts import atomic_path  # noqa: E402


def save_figure(fig, path: Path, laid_out: bool = False) -> Path:
    """Write `fig` to `path` atomically (temporary name, then rename; the format from the
    suffix) and close it. A crash mid-write leaves the previous file, never half of one.
    `laid_out`: the figure was laid out already (`figures.layout`, labels placed after it)."""
    path = Path(path)
    try:
        if not laid_out:
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


def pareto(points: list[dict], path: Path, studied=None, caption: str | None = None) -> Path:
    """Accuracy vs total tokens: no_prune at several N, each method at several K. With
    `studied` methods among others, two panels: the studied ones alone (no_prune's and the
    probes' points labelled N>K), and every method, the studied strong on top and the rest
    faint; a log x-axis where a panel's tokens span more than 10x; `caption` under them."""
    methods = list(dict.fromkeys(p["method"] for p in points))
    split = studied is not None and not set(methods) <= set(studied)
    fig, axes = plt.subplots(1, 2 if split else 1, figsize=(11.5 if split else 8, 4.6), squeeze=False,
                             gridspec_kw={"width_ratios": [1.5, 1]} if split else None)
    style = figures.styles(methods, studied)
    shown = [[m for m in methods if m in studied], methods] if split else [methods]
    labels = []
    for ax, names in zip(axes[0], shown):
        for method in figures.order(names, studied):
            pts = sorted((p for p in points if p["method"] == method), key=lambda p: p["tokens_total"])
            x, y = [p["tokens_total"] for p in pts], [p["accuracy"] for p in pts]
            strong = style[method]["zorder"] > figures.FAINT["zorder"]
            ax.plot(x, y, "o-" if method == "no_prune" else ("s-" if strong else "s:"),
                    label=method, **style[method])
            if ax is axes[0, 0] and (method == "no_prune" or is_probe(method) or studied is None):
                labels += [(p["tokens_total"], p["accuracy"], f"N={p['n']}" if p["n"] == p["k"]
                            else f"{p['n']}>{p['k']}", style[method]["color"]) for p in pts]
        figures.log_x_if_wide(ax, [p["tokens_total"] for p in points if p["method"] in names])
        ax.grid(alpha=0.3, lw=0.5)
        ax.set_xlabel("total generated tokens")
    axes[0, 0].set_ylabel("vote accuracy")
    if split:
        axes[0, 0].set_title("the studied methods", fontsize=9)
        axes[0, 1].set_title("every method (the rest faint)", fontsize=9)
    figures.legend_beside(axes[0, -1])
    figures.layout(fig, caption)
    figures.place_labels(axes[0, 0], labels)
    return save_figure(fig, path, laid_out=True)


def plot_auroc_by_prefix(curves: dict[str, dict], path: Path, title: str = "", studied=None,
                    paired: dict | None = None, caption: str | None = None) -> Path:
    """Within-prompt AUROC against prefix length, one line per method (dashed: a predictor
    trained at one checkpoint, "<name>@<tokens>"; the `studied` ones strong, the rest
    faint). `curves`: method -> {"positions": [tokens], "auroc": [float]}
    (stopexp.metrics.ranking.auroc_by_position); positions without a mixed prompt (NaN)
    leave a gap. Dotted: chance (0.5). With `paired` (metrics.json's "paired_by_prefix") a
    second panel: each probe minus each control at every prefix, its 95% paired bootstrap
    interval shaded; where the band leaves 0 the difference is distinguishable."""
    diffs = [(p, r, roles[r]) for p, roles in (paired or {}).get("auroc_diff", {}).items()
             for r in in_order(roles)]
    fig, axes = plt.subplots(2 if diffs else 1, 1, figsize=(8.5, 6.4 if diffs else 4.2),
                             sharex=True, squeeze=False)
    ax = axes[0, 0]
    style = figures.styles(list(curves), studied)
    for method in figures.order(curves, studied):
        c = curves[method]
        ax.plot(c["positions"], c["auroc"], "o-" if "@" not in method else "s--", label=method,
                **{**style[method], "ms": style[method]["ms"] - 2})
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("within-prompt AUROC")
    ax.set_title(title, fontsize=9)
    figures.legend_beside(ax)  # beside: lines cross everywhere
    if diffs:
        low = axes[1, 0]
        x = paired["positions"]
        probes = list(dict.fromkeys(p for p, _, _ in diffs))
        for probe, role, d in diffs:
            ci = np.asarray(d["ci"], dtype=float).reshape(-1, 2)
            colour = figures.ROLE_COLOURS[role]
            label = f"{probe} - {role_label(role)}" + (" (per prefix)" if role == "best_non_learned" else "")
            low.plot(x, d["diff"], "o", ls=("-", "--", ":", "-.")[probes.index(probe) % 4], ms=2.5,
                     lw=1.4, color=colour, label=label)
            low.fill_between(x, ci[:, 0], ci[:, 1], color=colour, alpha=0.15, lw=0)
        low.axhline(0, color="black", lw=0.8)
        low.set_ylabel("AUROC difference\n(probe - control, 95% CI)")
        figures.legend_beside(low)
    axes[-1, 0].set_xlabel("prefix (generated tokens)")
    figures.log_x_if_wide(ax, [p for c in curves.values() for p in c["positions"]])
    figures.layout(fig, caption)
    return save_figure(fig, path, laid_out=True)


def paired_intervals(paired: dict, path: Path, caption: str | None = None) -> Path:
    """The paired differences of metrics.json's "paired": one row per probe and control,
    the within-prompt AUROC difference at each check (left) and the vote-accuracy
    difference of the run (right), each with its 95% bootstrap interval over prompts; an
    interval that crosses 0 (the line) is a difference these prompts cannot tell."""
    rows = [(p, r) for p, roles in paired["checks"][0]["auroc_diff"].items() for r in in_order(roles)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 1.2 + 0.45 * len(rows)), sharey=True)
    y = np.arange(len(rows))[::-1]
    n_checks = len(paired["checks"])
    for j, check in enumerate(paired["checks"]):
        shift = 0.25 * (j - (n_checks - 1) / 2)
        for yi, (probe, role) in zip(y, rows):
            d = check["auroc_diff"][probe][role]
            left.errorbar(d["diff"], yi + shift, xerr=[[d["diff"] - d["ci"][0]], [d["ci"][1] - d["diff"]]],
                          fmt="o", ms=4, capsize=3, color=f"C{j}",
                          label=f"at {check['tokens']} tokens" if yi == y[0] else None)
    for yi, (probe, role) in zip(y, rows):
        d = paired["accuracy_diff"].get(probe, {}).get(role)
        if d is not None:
            right.errorbar(d["diff"], yi, xerr=[[d["diff"] - d["ci"][0]], [d["ci"][1] - d["diff"]]],
                           fmt="s", ms=4, capsize=3, color="black")
    best = paired["checks"][0]["best_non_learned"]
    left.set_yticks(y, [f"{p} - {role_label(r)}" + (f" ({best})" if r == "best_non_learned" else "")
                        for p, r in rows], fontsize=8)
    for ax, what in ((left, "within-prompt AUROC difference"), (right, "vote accuracy difference")):
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_xlabel(what)
        ax.grid(axis="x", alpha=0.3, lw=0.5)
    left.legend(fontsize=7, loc="best")
    right.set_title(f"the run's decision, {paired['prompts']} prompts", fontsize=8)
    figures.layout(fig, caption)
    return save_figure(fig, path, laid_out=True)


def survival(curves: dict[str, list], path: Path, studied=None, caption: str | None = None) -> Path:
    """Share of launched paths still generating at each step (the `studied` methods
    strong, the rest faint)."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    style = figures.styles(list(curves), studied)
    for method in figures.order(curves, studied):
        c = curves[method]
        st = {k: v for k, v in style[method].items() if k != "ms"}
        ax.plot(np.arange(1, len(c) + 1), c, label=method, **st)
    ax.set_xlabel("generation step")
    ax.set_ylabel("share of paths alive")
    figures.legend_beside(ax)
    figures.layout(fig, caption)
    return save_figure(fig, path, laid_out=True)


def prune_steps(pruned_at: dict[str, np.ndarray], path: Path, studied=None,
                caption: str | None = None) -> Path:
    """How many paths each method pruned at each step: the `studied` methods only when
    given (the others' are in metrics.json). Checks at a few prefixes (the usual case)
    give side-by-side bars per step, any other spread histogram outlines."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    data = {m: np.asarray(v) for m, v in pruned_at.items() if len(v) and (studied is None or m in studied)}
    if data:
        style = figures.styles(list(data), studied)
        steps = np.unique(np.concatenate(list(data.values())))
        if len(steps) <= 12:
            width = 0.8 / len(data)
            for i, (m, v) in enumerate(data.items()):
                counts = [(v == step).sum() for step in steps]
                ax.bar(np.arange(len(steps)) + (i - (len(data) - 1) / 2) * width, counts, width,
                       color=style[m]["color"], label=m)
            ax.set_xticks(np.arange(len(steps)), [str(int(step)) for step in steps])
        else:
            bins = np.histogram_bin_edges(steps, bins=20)
            for m, v in data.items():
                ax.hist(v, bins=bins, histtype="step", lw=1.5, color=style[m]["color"], label=m)
        figures.legend_beside(ax)
    ax.set_xlabel("prune step (prefix tokens)")
    ax.set_ylabel("paths pruned")
    figures.layout(fig, caption)
    return save_figure(fig, path, laid_out=True)


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


def reward_tokens(results: dict, path: Path, beam: dict | None = None, select: str = "vote",
                  studied=None, caption: str | None = None) -> Path:
    """Mean reward of each method's chosen output against its total tokens (one point per
    method, the `studied` ones strong; plain beam search as a star when given): the
    open-ended tasks' Pareto view."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    rewarded = {m: r for m, r in results.items() if "mean_reward" in r}
    style = figures.styles(list(rewarded), studied)
    for name in figures.order(rewarded, studied):
        st = style[name]
        ax.scatter(rewarded[name]["tokens_total"], rewarded[name]["mean_reward"], color=st["color"],
                   alpha=st["alpha"], zorder=st["zorder"], s=8 * st["ms"] ** 2 / 4, label=name)
    tokens = [r["tokens_total"] for r in rewarded.values()]
    if beam is not None and "mean_reward" in beam:
        ax.scatter(beam["tokens_total"], beam["mean_reward"], marker="*", s=160, color="black",
                   label="beam search", zorder=4)
        tokens.append(beam["tokens_total"])
    figures.log_x_if_wide(ax, tokens)
    ax.set_xlabel("tokens generated (all prompts)")
    ax.set_ylabel(f"mean reward of the output ({select})")
    figures.legend_beside(ax)
    figures.layout(fig, caption)
    return save_figure(fig, path, laid_out=True)
