"""Figures a reader can read (stopexp/evaluation/plots.py, figures.py): the studied methods
drawn strongly over the rest, labels that never collide, a log x-axis where the tokens span
more than 10x, and the protocol's caption line; asserted on the matplotlib artists."""
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from stopexp.evaluation import figures, plots

CAPTION = "Launch-Check-Resume 64 -> 8 at 5 tokens, 200 test prompts (replay)"
STUDIED = ["no_prune", "random", "confidence", "hidden_mean", "mlp", "oracle"]
OTHERS = ["entropy", "deepconf", "st_bon", "esc", "hidden_var"]


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions make, kept open (and still written) for inspection."""
    figs, save = [], plots.save_figure

    def keep(fig, path, laid_out=False):
        figs.append(fig)
        fig.canvas.draw()
        return save(fig, path, laid_out)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figs


def points(span: float) -> list[dict]:
    """no_prune at N = 4..64 and every other method at three K, the tokens from 1000 to
    1000 * `span`."""
    tokens = lambda share: 1000 * span ** share  # noqa: E731
    pts = [{"method": "no_prune", "n": n, "k": n, "accuracy": 0.6 + n / 200,
            "tokens_total": tokens((n - 4) / 60)} for n in (4, 8, 16, 32, 64)]
    for i, m in enumerate(STUDIED[1:] + OTHERS):
        pts += [{"method": m, "n": 64, "k": k, "accuracy": 0.5 + 0.03 * i + k / 400,
                 "tokens_total": tokens(k / 32)} for k in (4, 8, 16)]
    return pts


def lines_of(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_pareto_studied_on_top_log_axis_caption_and_no_label_collides(drawn, tmp_path):
    plots.pareto(points(span=100), tmp_path / "pareto.png", STUDIED, CAPTION)
    fig = drawn[0]
    studied_ax, every_ax = fig.axes
    assert studied_ax.get_xscale() == every_ax.get_xscale() == "log"  # 1000 .. 100000 tokens
    assert [t.get_text() for t in fig.texts] == [CAPTION]
    assert set(lines_of(studied_ax)) == set(STUDIED)  # the first panel: the studied alone
    every = lines_of(every_ax)
    assert set(every) == set(STUDIED + OTHERS)
    low = min(every[m].get_zorder() for m in STUDIED)
    assert all(every[m].get_zorder() < low and every[m].get_alpha() < every["mlp"].get_alpha()
               for m in OTHERS)
    assert every["mlp"].get_zorder() > every["hidden_mean"].get_zorder()  # a tie never hides the probe
    renderer = FigureCanvasAgg(fig).get_renderer()  # closed figures lose their canvas
    labels = [t for t in studied_ax.texts if t.get_visible()]
    assert labels and {t.get_text() for t in labels} <= {"N=4", "N=8", "N=16", "N=32", "N=64",
                                                         "64>4", "64>8", "64>16"}
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    frame = studied_ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 for b in boxes)


def test_a_narrow_span_stays_linear_and_all_studied_is_one_panel(drawn, tmp_path):
    plots.pareto(points(span=5), tmp_path / "a.png", STUDIED, CAPTION)
    assert [ax.get_xscale() for ax in drawn[0].axes] == ["linear", "linear"]
    plots.pareto([p for p in points(5) if p["method"] in STUDIED], tmp_path / "b.png", STUDIED)
    assert len(drawn[1].axes) == 1 and not drawn[1].texts  # no caption given: none drawn
    assert figures.log_x_if_wide(drawn[1].axes[0], [1, 10]) is False  # exactly 10x: linear


def test_prefix_curves_draw_the_paired_intervals_and_the_studied_on_top(drawn, tmp_path):
    positions = [1, 2, 4, 8, 16, 32]
    curves = {m: {"positions": positions, "auroc": list(np.linspace(0.5, 0.5 + 0.04 * i, 6))}
              for i, m in enumerate(STUDIED[1:] + OTHERS)}
    paired = {"positions": positions, "auroc_diff": {"mlp": {
        "confidence": {"diff": [0.1] * 6, "ci": [[0.05, 0.15]] * 6},
        "best_non_learned": {"diff": [0.0] * 6, "ci": [[-0.02, 0.02]] * 6}}}}
    plots.plot_auroc_by_prefix(curves, tmp_path / "p.png", "t", STUDIED, paired, CAPTION)
    fig = drawn[0]
    top, low = fig.axes
    assert top.get_xscale() == "log"  # prefixes 1 .. 32 tokens
    assert [t.get_text() for t in fig.texts] == [CAPTION]
    drawn_lines = lines_of(top)
    assert min(drawn_lines[m].get_zorder() for m in STUDIED[1:]) > max(
        drawn_lines[m].get_zorder() for m in OTHERS)
    assert set(lines_of(low)) == {"mlp - confidence", "mlp - best non-learned (per prefix)"}
    bands = low.collections  # one shaded 95% interval per comparison
    assert len(bands) == 2
    assert lines_of(low)["mlp - confidence"].get_color() == drawn_lines["confidence"].get_color()


def test_survival_prune_steps_and_paired_intervals_read(drawn, tmp_path):
    curves = {m: list(np.linspace(1, 0.1 * i, 20)) for i, m in enumerate(STUDIED + OTHERS)}
    plots.survival(curves, tmp_path / "s.png", STUDIED, CAPTION)
    survival = lines_of(drawn[0].axes[0])
    assert survival["mlp"].get_zorder() > survival["entropy"].get_zorder()
    plots.prune_steps({"mlp": np.array([5, 5, 9]), "entropy": np.array([5])}, tmp_path / "h.png",
                      STUDIED, CAPTION)
    assert [t.get_text() for t in drawn[1].axes[0].get_legend().get_texts()] == ["mlp"]
    d = {"diff": 0.1, "ci": [0.05, 0.15]}
    paired = {"prompts": 200, "checks": [{"tokens": 5, "best_non_learned": "hidden_mean",
                                          "auroc_diff": {"mlp": {"confidence": d, "best_non_learned": d}}}],
              "accuracy_diff": {"mlp": {"confidence": d, "best_non_learned": d}}}
    plots.paired_intervals(paired, tmp_path / "i.png", CAPTION)
    left, right = drawn[2].axes
    assert [t.get_text() for t in left.get_yticklabels()] == [
        "mlp - confidence", "mlp - best non-learned (hidden_mean)"]
    assert (tmp_path / "i.png").read_bytes()[:4] == b"\x89PNG"
