"""adapt's summary of the learning curves: the gap closed with its paired interval over the
held-out prompts, kept only where retraining beats the frozen predictor, as the tracker's
scalars and as the table's line."""
import numpy as np
import pytest


def test_the_gap_closed_has_a_paired_interval_over_the_held_out_prompts():
    """Prompt 0 closes half of its gap, prompt 1 0.8 of it, prompts 2 and 3 lack a value
    for one variant: the gap closed over both is 0.25 / 0.35, its resamples lie in
    [0.5, 0.8] and a quarter of them draw one prompt twice."""
    from stopexp.evaluation.learning_curves import add_gap_intervals

    nan = float("nan")
    per_prompt = {"frozen": np.array([0.5, 0.5, nan, 0.4]),
                  "retrained": np.array([0.7, 1.0, 0.6, 0.6]),
                  "explore": np.array([0.6, 0.9, 0.5, nan])}
    out = {"frozen": {}, "retrained": {}, "explore": {"gap_closed": 0.25 / 0.35}}
    add_gap_intervals(out, per_prompt, n_boot=1000, seed=0)
    assert out["explore"]["gap_closed_ci"] == pytest.approx([0.5, 0.8], abs=1e-12)
    assert out["explore"]["gap_closed_nan_resamples"] == 0
    d = out["explore"]["heldout_vs_frozen"]
    assert (d["diff"], d["prompts"], d["excluded"]) == (pytest.approx(0.25, abs=1e-12), 2, 2)
    assert "gap_closed_ci" not in out["retrained"] and out["frozen"] == {}
    gap = out["retrained"]["heldout_vs_frozen"]  # +0.2 and +0.5 on prompts 0, 1; +0.2 on 3
    assert (gap["diff"], gap["ci"]) == (pytest.approx(0.3, abs=1e-12), pytest.approx([0.2, 0.5], abs=1e-12))
    without = {"frozen": {}, "retrained": {}, "explore": {}}  # no gap_closed: no interval of it
    add_gap_intervals(without, per_prompt, n_boot=1000, seed=0)
    assert "gap_closed_ci" not in without["explore"] and "heldout_vs_frozen" in without["explore"]


@pytest.mark.parametrize("ceiling", [[0.7, 1.0, 0.6, 0.6], [0.45, 0.55, 0.6, 0.4]])
def test_a_gap_closed_is_kept_only_where_retrained_is_above_frozen(ceiling):
    """Held-out AUROCs per prompt: retrained above frozen on the three prompts both rank
    (+0.2, +0.5, +0.2: interval [0.2, 0.5]) keeps explore's gap closed and its interval;
    -0.05, +0.05, 0 (interval spanning 0) leaves no gap: no share, no interval, `no_gap`."""
    from stopexp.evaluation.learning_curves import summarize_variants

    def curve(auroc):
        return [{"prompts_seen": 10, "accuracy": 0.5, "tokens": 100.0, "explore_tokens": 0.0,
                 "wall_s": 1.0, "update_s": 0.0, "auroc": 0.6, "heldout_auroc": auroc}]

    nan = float("nan")
    per_prompt = {"frozen": [0.5, 0.5, nan, 0.4], "retrained": ceiling, "explore": [0.6, 0.9, 0.5, nan]}
    mean = {v: float(np.nanmean(x)) for v, x in per_prompt.items()}
    out = summarize_variants({v: curve(m) for v, m in mean.items()}, held_aurocs=per_prompt)
    kept = ceiling[0] > 0.5
    assert ("gap_closed" in out["explore"]) == ("gap_closed_ci" in out["explore"]) == kept
    assert ("prompts_to_half_gap" in out["explore"]) == kept
    assert out["explore"].get("no_gap", False) == (not kept)
    assert "heldout_vs_frozen" in out["explore"]  # the paired difference stays


def test_the_tracker_gets_the_intervals_as_scalars():
    from stopexp.evaluation.learning_curves import flat_summary

    s = {"accuracy": 0.5, "prompts_to_half_gap": None, "gap_closed_ci": [0.2, 0.9],
         "heldout_vs_frozen": {"diff": 0.1, "ci": [0.0, 0.2], "prompts": 7, "excluded": 1}}
    assert flat_summary(s) == {"accuracy": 0.5, "heldout_vs_frozen": 0.1, "heldout_vs_frozen_lo": 0.0,
                               "heldout_vs_frozen_hi": 0.2, "heldout_vs_frozen_prompts": 7,
                               "gap_closed_lo": 0.2, "gap_closed_hi": 0.9}


@pytest.mark.parametrize("ceiling_ci,line", [
    ([0.2, 0.5], "explore: held-out AUROC - frozen +0.250 [+0.100, +0.400] (95%, paired over 2 "
                 "prompts); gap closed 0.71 [0.50, 0.80]"),
    ([-0.1, 0.5], "explore: held-out AUROC - frozen +0.250 [+0.100, +0.400] (95%, paired over 2 "
                  "prompts); no gap to close: retrained - frozen is not above 0"),
    ([-0.5, -0.1], "explore: held-out AUROC - frozen +0.250 [+0.100, +0.400] (95%, paired over 2 "
                   "prompts); no gap to close: retrained - frozen is not above 0"),
])
def test_the_table_shows_the_gap_closed_only_when_there_is_a_gap(ceiling_ci, line):
    from stopexp.evaluation.learning_curves import variants_table

    row = {"accuracy": 0.5, "tokens_total": 10.0, "explore_tokens": 0.0, "auroc_last": 0.6,
           "heldout_auroc": 0.6, "update_s": 0.0, "wall_s": 1.0}
    paired = {"diff": 0.25, "ci": [0.1, 0.4], "prompts": 2, "excluded": 0}
    metrics = {"protocol": {"stream_prompts": 4, "batch_prompts": 2, "n": 8, "k": 4,
                            "check_tokens": 28},
               "target": {"task.steps": [3, 4]},
               "variants": {"frozen": row,
                            "retrained": {**row, "heldout_vs_frozen": {**paired, "ci": ceiling_ci}},
                            "explore": {**row, "gap_closed": 0.25 / 0.35, "heldout_vs_frozen": paired,
                                        "gap_closed_ci": [0.5, 0.8]}}}
    # the decision of summarize_variants, on the same held-out AUROCs
    if not ceiling_ci[0] > 0:
        explore = metrics["variants"]["explore"]
        for k in ("gap_closed", "gap_closed_ci"):
            explore.pop(k)
        explore["no_gap"] = True
    table = variants_table(metrics).splitlines()
    assert table[-1] == line
    assert table[4].split()[-3] == ("0.71" if ceiling_ci[0] > 0 else "-")  # the explore row's column
