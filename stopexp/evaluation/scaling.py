"""Does the hidden state add anything with more data? The pieces of
scripts/scaling_report.py that need no training: where along a typical path the predictors
are compared (`grid_positions`, `share_positions`), the within-prompt AUROC of a score and
its paired difference from confidence there (`versus`), the markdown tables and the figure.

A predictor's cell at a position: its within-prompt AUROC on the test paths alive there
(the mean over the prompts with both outcomes among them) and the paired bootstrap over
those prompts of its difference from confidence's (`stopexp.metrics.paired_difference`,
the statistics evaluate's paired comparisons use). Both rank the same live paths, so the
same prompts have an AUROC for both.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stopexp.core.errors import ConfigError
from stopexp.evaluation import figures, plots
from stopexp.metrics import paired_difference, per_group_auroc
from stopexp.metrics.multiplicity import ALPHA, correct_family, holm_text
from stopexp.metrics.ranking import auroc_by_position

SHARES = (0.2, 0.4, 0.6, 0.8)
SIZES = (150, 300, 600, 1200)


def grid_positions(positions: dict, max_new_tokens: int) -> list[int]:
    """The positions where every path still generating has features (a features'
    `positions` record: its checkpoints and every `stride` tokens below `max_new_tokens`),
    ascending. Step ends are left out: they differ from path to path, so few paths share
    one."""
    out = set(int(c) for c in positions.get("checkpoints") or [])
    stride = positions.get("stride")
    if stride:
        out.update(range(int(stride), int(max_new_tokens), int(stride)))
    return sorted(out)


def share_positions(median_length: float, grid, shares=SHARES) -> list[int]:
    """Per share, the position of `grid` nearest to share x `median_length` (the typical
    path's length in tokens); of two equally near, the earlier. ValueError when `grid` is
    empty or the median is not positive."""
    grid = np.asarray(sorted(grid), dtype=float)
    if not len(grid) or not median_length > 0:
        raise ValueError(f"positions at shares of a path need stored positions and a positive "
                         f"median length; got {len(grid)} positions, median {median_length}")
    return [int(grid[np.argmin(np.abs(grid - s * median_length))]) for s in shares]


def clip_sizes(sizes, held: int) -> list[int]:
    """The training sizes a bank of `held` train prompts can give: each size, one above
    `held` lowered to it, ascending, without repeats. ConfigError naming --sizes for a size
    below 1."""
    bad = [s for s in sizes if not s >= 1]
    if bad or not len(sizes):
        raise ConfigError(f"--sizes: give training prompt counts >= 1, e.g. --sizes="
                          f"{','.join(map(str, SIZES))}; got {list(sizes)}")
    return sorted({min(int(s), held) for s in sizes})


def parse_sizes(text: str) -> list[int]:
    """`--sizes=150,300` -> [150, 300]; ConfigError naming the option otherwise."""
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"--sizes: {text!r} is not a comma-separated list of prompt counts, "
                          f"e.g. --sizes={','.join(map(str, SIZES))}") from None


def versus(scores, reference, correct, group, n_boot: int = 1000, seed: int = 0) -> dict:
    """`scores` against `reference` (confidence) on the same paths (`correct`, `group` the
    prompt; all (B,)): {"auroc", "reference_auroc"} each the mean over the prompts with
    both outcomes of the per-prompt AUROC, "diff" and "ci" the paired bootstrap of their
    difference over those prompts and "p" its bootstrap p-value, "mixed_prompts" their
    number."""
    _, a = per_group_auroc(scores, correct, group)
    _, b = per_group_auroc(reference, correct, group)
    d = paired_difference(a, b, n_boot, seed)
    mean = (lambda v: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan"))
    return {"auroc": mean(a), "reference_auroc": mean(b), "diff": d["diff"], "ci": d["ci"],
            "p": d["p"], "mixed_prompts": d["prompts"]}


def mean_auroc(scores, correct, group, position) -> float:
    """The within-prompt AUROC at each position (`auroc_by_position`), averaged over the
    positions with a mixed prompt; NaN without one."""
    values = [a for a in auroc_by_position(scores, correct, group, position)["auroc"] if np.isfinite(a)]
    return float(np.mean(values)) if values else float("nan")


def corrected(rows: list[dict], alpha: float = ALPHA) -> tuple[list[dict], int]:
    """(copies of `rows` whose "at" cells carry Holm's correction over every cell of the
    rows: one table, one family; `correct_family`, the family's size). Copies: rows of
    different tables share their cells."""
    out = [{**r, "at": [dict(a) for a in r["at"]]} for r in rows]
    return out, correct_family([a for r in out for a in r["at"]], alpha)


def differences(first: dict, second: dict, positions: list[int], correct, group, position,
                n_boot: int, seed: int) -> list[dict]:
    """Per position, `versus` of the `first` scores against the `second` on the same test
    rows (`correct`, `group`, `position` theirs): e.g. hidden_conf - conf_features, the
    hidden state's share of the fusion."""
    return [versus(first[position == p], second[position == p], correct[position == p],
                   group[position == p], n_boot, seed) for p in positions]


# ---- the report ------------------------------------------------------------------------
def cell(at: dict) -> str:
    """`0.561 (+0.012 [-0.030, +0.055] p 0.41, Holm 1)`: AUROC, paired difference from
    confidence, 95% CI, and where corrected its p-value and Holm's (* where it survives)."""
    lo, hi = at["ci"]
    return f"{at['auroc']:.3f} ({at['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]{holm_text(at)})"


def header(positions: list[int], shares) -> list[str]:
    return [f"{round(100 * s)}% ({p} tok)" for s, p in zip(shares, positions)]


def markdown_table(rows: list[dict], positions: list[int], shares, first: tuple[str, ...],
                   reference: list[dict] | None = None) -> str:
    """One row per entry of `rows` (dicts with the `first` columns' values under their
    names, "train_auroc", "val_auroc", "test_auroc" and "at": one `versus` dict per
    position), the cells `cell`; `reference` (confidence's AUROC and the mixed prompts per
    position) closes it."""
    cols = [*first, "train / val / test", *header(positions, shares)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        fit = f"{r['train_auroc']:.3f} / {r['val_auroc']:.3f} / {r['test_auroc']:.3f}"
        lines.append("| " + " | ".join([*(str(r[c]) for c in first), fit,
                                        *(cell(a) for a in r["at"])]) + " |")
    if reference:
        pad = [""] * (len(first) - 1)
        lines.append("| " + " | ".join(["confidence", *pad, "",
                                        *(f"{a['reference_auroc']:.3f}" for a in reference)]) + " |")
        lines.append("| " + " | ".join(["mixed prompts", *pad, "",
                                        *(str(a["mixed_prompts"]) for a in reference)]) + " |")
    return "\n".join(lines)


def difference_table(rows: list[dict], positions: list[int], shares, first: str) -> str:
    """One row per entry of `rows` (its `first` column and "at": `differences` per
    position), the cells the paired difference, its interval and its correction."""
    cols = [first, *header(positions, shares)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{a['diff']:+.3f} [{a['ci'][0]:+.3f}, {a['ci'][1]:+.3f}]{holm_text(a)}" for a in r["at"]]
        lines.append("| " + " | ".join([str(r[first]), *cells]) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], positions: list[int], shares, path: Path, caption: str) -> Path:
    """Per position (a column of panels): on top each predictor's within-prompt AUROC
    against its training prompts (log x) with confidence's dashed, beneath its paired
    difference from confidence with the 95% interval as a band and 0 dotted."""
    fig, axes = plots.plt.subplots(2, len(positions), figsize=(3.2 * len(positions) + 1.6, 5.6),
                                   sharex=True, squeeze=False)
    names = list(dict.fromkeys(r["predictor"] for r in rows))
    for j, (p, s) in enumerate(zip(positions, shares)):
        top, bottom = axes[0, j], axes[1, j]
        for i, name in enumerate(names):
            mine = sorted((r for r in rows if r["predictor"] == name), key=lambda r: r["size"])
            x = [r["size"] for r in mine]
            at = [r["at"][j] for r in mine]
            colour = figures.ROLE_COLOURS.get(name) or figures.PROBE_COLOURS[i % len(figures.PROBE_COLOURS)]
            top.plot(x, [a["auroc"] for a in at], "o-", color=colour, ms=4, label=name)
            bottom.plot(x, [a["diff"] for a in at], "o-", color=colour, ms=4, label=name)
            bottom.fill_between(x, [a["ci"][0] for a in at], [a["ci"][1] for a in at],
                                color=colour, alpha=0.15, lw=0)
        reference = rows[0]["at"][j]["reference_auroc"]
        top.axhline(reference, color=figures.ROLE_COLOURS["confidence"], ls="--", lw=1,
                    label="confidence")
        bottom.axhline(0, color="0.3", ls=":", lw=1)
        top.set_title(f"{round(100 * s)}% of a typical path ({p} tokens)", fontsize=9)
        bottom.set_xlabel("training prompts")
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.set_xticks(sorted({r["size"] for r in rows}))
            ax.set_xticklabels([str(v) for v in sorted({r["size"] for r in rows})], fontsize=7)
            ax.minorticks_off()
    axes[0, 0].set_ylabel("within-prompt AUROC (test)")
    axes[1, 0].set_ylabel("minus confidence (95% band)")
    figures.legend_beside(axes[0, -1])
    figures.layout(fig, caption)
    return plots.save_figure(fig, path, laid_out=True)
