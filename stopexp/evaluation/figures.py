"""What keeps a figure of many methods readable (stopexp/evaluation/plots.py draws with it):
the studied methods (the probes, no_prune, random, the controls of the paired statistics
and the oracle) drawn strongly and on top, every other method faint beneath; labels placed
where they collide with no other label; a log x-axis where the values span more than 10x;
and a caption line with the protocol."""
from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from stopexp.evaluation.paired import is_probe  # noqa: E402

# the reference points every comparison is read against, studied with the probes
REFERENCES = ("no_prune", "random", "confidence", "conf_features", "oracle", "error_oracle")
STUDIED = dict(alpha=1.0, lw=1.8, ms=5, zorder=3)
FAINT = dict(alpha=0.3, lw=0.8, ms=2.5, zorder=1)
# one colour per role, the same in every figure: the references and the controls fixed,
# the best non-learned signal orange, the probes from their own cycle
ROLE_COLOURS = {"no_prune": "black", "oracle": "0.45", "error_oracle": "0.7", "random": "tab:brown",
                "confidence": "tab:blue", "conf_features": "tab:green",
                "best_non_learned": "tab:orange"}
PROBE_COLOURS = ("tab:red", "tab:purple", "tab:pink", "tab:olive", "tab:cyan")
# without roles (every series strong, e.g. a sweep's jobs): colours none of the references has
OTHER_COLOURS = ("tab:orange", "tab:red", "tab:purple", "tab:pink", "tab:olive", "tab:cyan",
                 "#ffbb78", "#ff9896", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5")
LOG_SPAN = 10.0  # a log axis once the largest value is more than this many times the smallest
CAPTION_INCHES = 0.28  # the strip under the axes that holds the caption line


def studied_methods(names, best_non_learned: str | None = None) -> list[str]:
    """The methods of `names` a reader looks for (each once): the probes (learned
    methods), no_prune, random, confidence, conf_features, the oracle and `best_non_learned`."""
    return list(dict.fromkeys(m for m in names if is_probe(m) or m in REFERENCES or m == best_non_learned))


def styles(names, studied=None) -> dict:
    """method -> plot keywords (color, alpha, lw, ms, zorder): the studied ones (all when
    `studied` is None) strong and on top, coloured by role (`ROLE_COLOURS`; a studied
    method that is neither a reference nor a probe is the best non-learned signal), the
    others faint beneath."""
    probes, others, faint = (itertools.cycle(PROBE_COLOURS), itertools.cycle(OTHER_COLOURS),
                             plt.get_cmap("tab20b"))
    out = {}
    for i, name in enumerate(names):
        if studied is None:
            out[name] = {"color": ROLE_COLOURS.get(name) or next(others), **STUDIED}
        elif name in studied:
            colour = ROLE_COLOURS.get(name) or (next(probes) if is_probe(name)
                                                else ROLE_COLOURS["best_non_learned"])
            # the probes over the other studied methods: a tie (a signal that ranks as the
            # probe does) must not hide the probe
            out[name] = {"color": colour, **STUDIED, **({"zorder": 4} if is_probe(name) else {})}
        else:
            out[name] = {"color": faint(i % 20), **FAINT}
    return out


def order(names, studied=None) -> list[str]:
    """`names` with the studied ones first (the legend reads them first)."""
    return sorted(names, key=lambda m: studied is not None and m not in studied)


def log_x_if_wide(ax, values) -> bool:
    """A log x-axis when the positive `values` span more than LOG_SPAN; whether it set one."""
    v = np.asarray([x for x in values if np.isfinite(x) and x > 0], dtype=float)
    wide = bool(len(v)) and bool(v.max() > LOG_SPAN * v.min())
    if wide:
        ax.set_xscale("log")
    return wide


def legend_beside(ax, fontsize: int = 7):
    """The legend to the right of the axes, where it hides no line."""
    return ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def layout(fig, caption: str | None) -> None:
    """Lay the figure out for good (save it with `save_figure(..., laid_out=True)`), leaving
    a strip under it for the caption line when there is one."""
    fig.tight_layout(rect=(0, min(0.2, CAPTION_INCHES / fig.get_figheight()) if caption else 0, 1, 1))
    if caption:
        fig.text(0.01, 0.012, caption, fontsize=7, ha="left", va="bottom", color="0.25")


def place_labels(ax, items, fontsize: float = 6) -> list:
    """Annotate (x, y, text, colour) items at the first of a few offsets around each point
    where the label's box overlaps no label placed before and no marker of the axes, and
    stays inside the axes; a label with no free place is left out (the legend still names
    its line). Call after `layout`, so that the boxes are where they will be drawn.
    Returns the placed labels."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    offsets = [(4, 3), (4, -9), (-4, 3), (-4, -9), (4, 12), (-4, 12), (4, -18), (-4, -18)]
    placed, boxes = [], [_marker_box(ax, line, xy) for line in ax.get_lines() if line.get_marker()
                         not in (None, "None", "") for xy in line.get_xydata()]
    for x, y, text, colour in items:
        for dx, dy in offsets:
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                            fontsize=fontsize, color=colour, ha="left" if dx > 0 else "right",
                            zorder=5)
            box = t.get_window_extent(renderer)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0
                      and box.y1 <= frame.y1)
            if inside and not any(box.overlaps(b) for b in boxes):
                placed.append(t)
                boxes.append(box)
                break
            t.remove()
    return placed


def _marker_box(ax, line, xy):
    """The display-space box of one marker of `line` at data point `xy`."""
    x, y = ax.transData.transform(xy)
    r = line.get_markersize() * ax.figure.dpi / 72 / 2
    return Bbox([[x - r, y - r], [x + r, y + r]])
