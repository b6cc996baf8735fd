"""scripts/confirm_report.py: the preregistered P1, and P2 and P3 as one family of two under
Holm, read from an evaluate run's metrics.json, with hand-computed Holm values."""
import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from confirm_report import main, primary  # noqa: E402


def metrics(p1_ci, p2, p3):
    cell = lambda d, ci, p: {"diff": d, "ci": ci, "p": p, "prompts": 300}  # noqa: E731
    return {"paired": {"checks": [{"tokens": 35, "auroc_diff": {"mlp": {"confidence": cell(0.06, p1_ci, 0.002)}}}],
                       "accuracy_diff": {"mlp": {"confidence": cell(0.05, [0.01, 0.09], p2)}}},
            "methods": {"mlp": {"tokens_total": 690, "vs_no_prune": {"accuracy_diff": cell(0.04, [0.0, 0.08], p3)}},
                        "no_prune": {"tokens_total": 1000}}}


def test_p2_and_p3_are_holm_corrected_as_a_family_of_two():
    rows = primary(metrics([0.02, 0.1], 0.01, 0.04), "mlp")
    assert [r["verdict"] for r in rows] == ["replicated", "the votes replicate", "the votes replicate"]
    # sorted p 0.01, 0.04: 2 x 0.01 = 0.02, then max(0.02, 1 x 0.04) = 0.04
    assert [r.get("p_holm") for r in rows] == [None, pytest.approx(0.02), pytest.approx(0.04)]
    rows = primary(metrics([-0.01, 0.1], 0.03, 0.2), "mlp")
    # 2 x 0.03 = 0.06 > 0.05: neither survives although P2's raw p is below 0.05
    assert [r.get("p_holm") for r in rows] == [None, pytest.approx(0.06), pytest.approx(0.2)]
    assert [r["verdict"] for r in rows] == ["not replicated"] * 3
    assert rows[2]["name"] == "P3: mlp - no_prune, vote accuracy (0.69 of its tokens)"


def test_the_table_and_the_refusals(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps(metrics([0.02, 0.1], 0.01, 0.04)))
    out = main([str(tmp_path)])
    assert "| P1: mlp - confidence, within-prompt AUROC at 35 tokens | +0.060 [+0.020, +0.100] | 0.0020 | - | replicated |" in out
    with pytest.raises(SystemExit, match=r"^error: --probe: 'linear' is no probe of this run; its probes: mlp$"):
        main([str(tmp_path), "--probe", "linear"])
    with pytest.raises(SystemExit, match=r"^error: run: .* does not exist"):
        main([str(tmp_path / "none")])
