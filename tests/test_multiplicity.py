"""Corrections for many looks (stopexp/metrics/multiplicity.py): Holm's adjusted p-values on
small families computed by hand, the bootstrap p-value that inverts the percentile interval,
and the reports that print them beside the raw intervals."""
import math

import numpy as np
import pytest

from stopexp.evaluation import scaling
from stopexp.evaluation.table import paired_lines
from stopexp.metrics import paired_difference
from stopexp.metrics.multiplicity import (bootstrap_p, correct_family, holm, holm_note, holm_text,
                                          p_floor)


def test_holm_on_a_family_of_four_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> 0.06,
    # the step-down never lowers a later p below an earlier one); NaN is no test (m = 4)
    got = holm([0.01, 0.04, 0.03, 0.005, math.nan])
    assert got[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert math.isnan(got[4])
    # capped at 1; ties keep their order; an empty family is empty
    assert holm([0.5, 0.6, 0.5]).tolist() == [1.0, 1.0, 1.0]
    assert holm([0.25, 0.0625, 0.125]).tolist() == [0.25, 0.1875, 0.25]  # binary: exact
    assert holm([]).tolist() == []


def test_a_family_of_cells_is_marked_where_it_survives():
    cells = [{"p": 0.01}, {"p": 0.04}, {"p": 0.03}, {"p": 0.005}, {"p": math.nan}, {"diff": 0.1}]
    assert correct_family(cells) == 4
    assert [c["holm"] for c in cells[:5]] == [True, False, False, True, None]
    assert cells[0]["p_holm"] == pytest.approx(0.03, rel=1e-12)
    assert "p_holm" not in cells[5]  # a record without p-values stays as it was
    assert holm_text(cells[0]) == " p 0.01, Holm 0.03 *"
    assert holm_text(cells[1]) == " p 0.04, Holm 0.06"
    assert holm_text(cells[4]) == holm_text(cells[5]) == ""


def test_the_bootstrap_p_inverts_the_percentile_interval():
    # twice the share on the far side of 0, +1 on both counts; a 0 counts on both sides
    assert bootstrap_p([-1.0, 1.0, 2.0, 3.0, 0.0]) == 1.0          # far side 2: 2 * 3 / 6
    assert bootstrap_p([1.0] * 9 + [-1.0]) == pytest.approx(4 / 11)  # far side 1: 2 * 2 / 11
    assert bootstrap_p([0.5] * 999) == p_floor(999) == 2 / 1000     # never 0
    assert bootstrap_p([math.nan, 1.0]) == 1.0 and math.isnan(bootstrap_p([math.nan]))
    # the same resamples as the interval: an interval clear of 0 has the smallest p, one
    # across 0 a large one
    rng = np.random.default_rng(0)
    b = rng.random(40)
    better = paired_difference(b + 0.05 + 0.1 * rng.random(40), b, n=1000, seed=1)
    assert better["ci"][0] > 0 and better["p"] == 2 / 1001
    noise = paired_difference(b + rng.normal(0, 0.1, 40), b, n=1000, seed=1)
    assert noise["ci"][0] < 0 < noise["ci"][1] and noise["p"] > 0.05
    assert math.isnan(paired_difference([math.nan], [0.5])["p"])


def test_the_note_says_when_the_resamples_cannot_reach_holms_first_step():
    assert holm_note(25, 1000) == ("Holm over the 25 intervals of this family (family-wise 0.05): "
                                   "p_Holm beside each, * where it survives")
    assert holm_note(96, 1000).endswith("with 1000 resamples no p falls below 0.0020 > 0.05/96: "
                                        "raise evaluate.bootstrap to at least 3840 to resolve it")
    assert "raise" not in holm_note(96, 10000) and "raise" not in holm_note(96)


def _cell(diff, lo, hi, p):
    return {"diff": diff, "ci": [lo, hi], "p": p, "auroc": 0.6, "reference_auroc": 0.6 - diff,
            "mixed_prompts": 10}


def test_the_scaling_tables_correct_each_table_as_one_family():
    shared = [_cell(0.1, 0.05, 0.15, 0.002), _cell(0.0, -0.1, 0.1, 0.9)]
    rows = [{"prompts": 150, "at": shared}, {"prompts": 300, "at": [_cell(0.05, 0.0, 0.1, 0.02),
                                                                     _cell(0.02, -0.01, 0.05, 0.2)]}]
    got, m = scaling.corrected(rows)
    assert m == 4 and "p_holm" not in shared[0]  # copies: another table's cells untouched
    # sorted 0.002 (x4), 0.02 (x3), 0.2 (x2), 0.9 (x1 -> 0.9)
    assert [a["p_holm"] for r in got for a in r["at"]] == pytest.approx([0.008, 0.9, 0.06, 0.4])
    assert [a["holm"] for r in got for a in r["at"]] == [True, False, False, False]
    table = scaling.difference_table(got, [14, 28], (0.2, 0.4), "prompts")
    assert "| 150 | +0.100 [+0.050, +0.150] p 0.002, Holm 0.008 * | +0.000 [-0.100, +0.100] p 0.9, Holm 0.9 |" \
        in table
    assert scaling.cell(got[1]["at"][0]) == "0.600 (+0.050 [+0.000, +0.100] p 0.02, Holm 0.06)"


def test_evaluates_paired_lines_print_the_correction_beside_each_interval():
    d = {"diff": 0.1, "ci": [0.05, 0.15], "p": 0.002, "p_holm": 0.006, "holm": True, "prompts": 9}
    e = {"diff": 0.02, "ci": [-0.05, 0.09], "p": 0.5, "p_holm": 1.0, "holm": False, "prompts": 9}
    paired = {"bootstrap": 1000, "seed": 0, "prompts": 10, "holm_family": 3,
              "checks": [{"tokens": 14, "k": 4, "mixed_prompts": 9, "excluded_prompts": 1,
                          "best_non_learned": "entropy",
                          "auroc_diff": {"hidden_conf": {"confidence": d, "conf_features": e}}}],
              "accuracy_best_non_learned": None,
              "accuracy_diff": {"hidden_conf": {"confidence": dict(d, p_holm=0.004)}}}
    lines = paired_lines({"paired": paired})
    assert lines[1] == "  " + holm_note(3, 1000)
    assert (f"  {'hidden_conf - confidence':<30}AUROC@14 +0.100 [+0.050,+0.150] p 0.002, Holm 0.006 *"
            "  accuracy +0.100 [+0.050,+0.150] p 0.002, Holm 0.004 *") in lines
    assert f"  {'hidden_conf - conf_features':<30}AUROC@14 +0.020 [-0.050,+0.090] p 0.5, Holm 1" in lines
