"""A predictor defined outside the package: its module, its yaml and one registry line
(docs/development.md, "Adding a predictor"), registered in this process or by an installed
package's entry point, trains and evaluates through the stages like a built-in one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, compose, run_stage
from stopexp.config import ConfigError, validate
from stopexp.core.commands import shell_word
from stopexp.core.names import REGISTRY
from stopexp.stages import build
from stopexp.stages.evaluate import evaluate
from stopexp.stages.train import train_with_controls

PROBE = '''"""A low-rank probe: the tapped state projected on `predictor.rank` learned directions."""
from torch import nn

from stopexp.signals.base import OnTappedLayer


class LowRankProbe(OnTappedLayer):
    def __init__(self, predictor, spec):
        super().__init__(predictor, spec, affine_norm=False)
        self.head = nn.Sequential(nn.Linear(self.in_dim, predictor.rank), nn.Linear(predictor.rank, 1))
'''
YAML = "name: low_rank\nrank: 2\n"
FAST = ["predictor=low_rank", "train.epochs=3", "evaluate.methods=[learned]",
        "evaluate.text_metrics=false", "evaluate.bootstrap=20"]


def write_package(where: Path) -> str:
    """The probe's module and conf/predictor/low_rank.yaml under `where`; the override that
    adds its conf to Hydra's search path."""
    (where / "low_rank_probe.py").write_text(PROBE)
    (where / "conf" / "predictor").mkdir(parents=True)
    (where / "conf" / "predictor" / "low_rank.yaml").write_text(YAML)
    return f"hydra.searchpath=[file://{where / 'conf'}]"


@pytest.fixture
def low_rank(tmp_path, monkeypatch):
    searchpath = write_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY["predictor"], "low_rank", "low_rank_probe:LowRankProbe")
    return searchpath


def test_a_predictor_from_outside_the_package_trains_and_evaluates(small_bank, low_rank):
    cfg = validate(compose("evaluate", [*small_bank, low_rank, *FAST]))
    assert cfg.predictor.rank == 2  # the key its yaml adds is its own
    metrics = train_with_controls(cfg, progress=False)
    assert Path(metrics["checkpoint"]).parent.name == "predictors"
    assert np.isfinite(metrics["val"]["auroc"])
    result = evaluate(cfg)["methods"]
    assert "low_rank" in result and 0.0 <= result["low_rank"]["accuracy"] <= 1.0
    # its own key is part of the predictor's key: another rank is another predictor
    other = validate(compose("evaluate", [*small_bank, low_rank, *FAST, "predictor.rank=3"]))
    assert build.predictor_dir(other, build.feature_set(other)) != Path(metrics["checkpoint"])
    with pytest.raises(ConfigError, match=r"^predictor.hidden: 64 is read only by predictor="):
        validate(compose("evaluate", [*small_bank, low_rank, *FAST, "predictor.hidden=64"]))


def test_a_predictor_from_outside_is_scored_beside_the_configured_one(small_bank, low_rank, tmp_path):
    """As a control of evaluate.methods: train makes it from its yaml on the run's search
    path, evaluate loads it beside the configured predictor."""
    overrides = [*small_bank, low_rank, "predictor=linear", "train.epochs=3",
                 "evaluate.methods=[learned,low_rank]", "evaluate.text_metrics=false",
                 "evaluate.bootstrap=20"]
    run_stage("train", [*overrides, f"hydra.run.dir={tmp_path / 'train'}"])
    trained = json.loads((tmp_path / "train" / "metrics.json").read_text())["train"]
    assert set(trained["controls"]) == {"low_rank"}
    run_stage("evaluate", [*overrides, f"hydra.run.dir={tmp_path / 'evaluate'}"])
    methods = json.loads((tmp_path / "evaluate" / "metrics.json").read_text())["methods"]
    assert {"linear", "low_rank"} <= set(methods) and np.isfinite(methods["low_rank"]["auroc"])


def test_an_installed_package_registers_its_predictor_by_entry_point(tmp_path):
    """The entry point `stopexp.predictor` of an installed distribution (its metadata on
    sys.path) registers the probe in a fresh `python -m stopexp.train`: the config
    validates, and train asks for the trace bank, which this cache lacks."""
    searchpath = write_package(tmp_path)
    info = tmp_path / "low_rank_probe-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: low-rank-probe\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stopexp.predictor]\nlow_rank = low_rank_probe:LowRankProbe\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "stopexp.train", "predictor=low_rank", searchpath,
               f"paths.output_dir={tmp_path / 'out'}", "logger=none"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: no complete trace bank for this config"), done.stderr
    assert "make it with: python -m stopexp.collect predictor=low_rank " in done.stderr
    assert f"{shell_word(searchpath)} (or python -m stopexp.pipeline" in done.stderr  # it composes the same config
    (info / "entry_points.txt").unlink()  # not installed: refused by name
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(
        "error: predictor.name: 'low_rank' is not allowed; allowed: statistic, linear"), done.stderr


def test_a_registered_predictor_that_cannot_be_imported_is_one_line(monkeypatch):
    from stopexp.signals import build_predictor
    from stopexp.signals.feature_spec import FeatureSpec

    monkeypatch.setitem(REGISTRY["predictor"], "ghost", "no_such_package.probe:Ghost")
    cfg = compose("train", ["predictor=linear"]).predictor
    cfg.name = "ghost"
    with pytest.raises(ConfigError, match=r"^predictor.name: 'ghost' \(registered as "
                                          r"'no_such_package.probe:Ghost'\) cannot be imported "
                                          r"\(ModuleNotFoundError: No module named 'no_such_package'\); "
                                          r"install the package that registers it"):
        build_predictor(cfg, FeatureSpec("toy", 8, [0], ()))
