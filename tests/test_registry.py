"""The registry (stopexp.core.names): every built-in name imports; a name is taken once
(`register` refuses a second target, an installed entry point that shadows a built-in is
refused as a stage starts); a plugin of any kind whose module fails to import is one line
naming the plugin, its module and file, and the exception."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_stage
from stopexp.core.errors import ConfigError
from stopexp.core.names import REGISTRY, lookup, register

RAISING = {  # a plugin module's source -> what its import raises, as the error line quotes it
    "raise RuntimeError('no licence server')\nclass Plugin: pass\n": "RuntimeError: no licence server",
    "class Plugin(:\n    pass\n": "SyntaxError: invalid syntax (broken_{kind}.py, line 1)",
    "SCALE = 1 / 0\nclass Plugin: pass\n": "ZeroDivisionError: division by zero",
}


@pytest.mark.parametrize("kind, name", [(k, n) for k, entries in REGISTRY.items() for n in entries])
def test_every_registered_name_imports(kind, name):
    assert lookup(kind, name) is not None


@pytest.mark.parametrize("source", list(RAISING))
@pytest.mark.parametrize("kind", list(REGISTRY))
def test_a_plugin_whose_module_fails_at_import_is_one_line(kind, source, tmp_path, monkeypatch):
    module = f"broken_{kind}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY[kind], "broken", f"{module}:Plugin")
    with pytest.raises(ConfigError) as e:
        lookup(kind, "broken")
    raised = RAISING[source].format(kind=kind)
    assert str(e.value) == (f"{kind}.name: 'broken' (registered as '{module}:Plugin'): importing "
                            f"{module} ({tmp_path / module}.py) raised {raised}; fix the module "
                            "(STOPEXP_DEBUG=1 shows the traceback)")


def test_a_plugin_without_its_attribute_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "empty_plugin.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY["stopping"], "empty", "empty_plugin:Missing")
    with pytest.raises(ConfigError, match=r"^stopping.name: 'empty' \(registered as "
                       r"'empty_plugin:Missing'\) cannot be imported \(AttributeError: module "
                       r"'empty_plugin' has no attribute 'Missing'\); install the package"):
        lookup("stopping", "empty")


def test_a_name_registered_twice_is_refused(monkeypatch):
    monkeypatch.setitem(REGISTRY, "predictor", dict(REGISTRY["predictor"]))
    with pytest.raises(ConfigError) as e:
        register("predictor", "linear", "my_probe:Linear")
    assert str(e.value) == ("predictor 'linear' is already registered as "
                            "'stopexp.signals.linear:LinearPredictor'; register 'my_probe:Linear' "
                            "under another name (or pass replace=True to replace it)")
    register("predictor", "probe", "my_probe:Probe")
    register("predictor", "probe", "my_probe:Probe")  # the same target again: a cell run twice
    with pytest.raises(ConfigError, match="^predictor 'probe' is already registered as 'my_probe:Probe'"):
        register("predictor", "probe", "other:Probe")
    register("predictor", "probe", "other:Probe", replace=True)
    assert REGISTRY["predictor"]["probe"] == "other:Probe"


def write_distribution(where, entry_points: str) -> dict:
    """An installed distribution (its metadata under `where`) with `entry_points`; the
    environment that puts it on the path."""
    info = where / "plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return {**os.environ, "PYTHONPATH": str(where), "WANDB_MODE": "disabled"}


def test_an_installed_plugin_that_shadows_a_built_in_is_refused_at_start(tmp_path):
    env = write_distribution(tmp_path, "[stopexp.predictor]\nlinear = my_probe:Linear\n")
    done = subprocess.run([sys.executable, "-m", "stopexp.train", "logger=none",
                           f"paths.output_dir={tmp_path / 'out'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == ("error: entry point stopexp.predictor linear = 'my_probe:Linear' shadows "
                           "the built-in 'stopexp.signals.linear:LinearPredictor'; rename it in its "
                           "package's entry points (the names of a kind: "
                           "stopexp.core.names.names(kind))\n")


def test_a_raising_predictor_plugin_ends_train_in_one_line(small_bank, tmp_path, monkeypatch, capsys):
    """The stage itself: an entry point's module that raises at import ends train with one
    `error:` line and exit code 2, no traceback."""
    (tmp_path / "raising_probe.py").write_text("raise RuntimeError('no licence server')\n")
    (tmp_path / "conf" / "predictor").mkdir(parents=True)
    (tmp_path / "conf" / "predictor" / "raising.yaml").write_text("name: raising\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY["predictor"], "raising", "raising_probe:Probe")
    with pytest.raises(SystemExit) as e:
        run_stage("train", [*small_bank, "predictor=raising", "logger=none",
                            f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                            f"hydra.run.dir={tmp_path / 'run'}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: predictor.name: 'raising' (registered as 'raising_probe:Probe'): importing "
        f"raising_probe ({tmp_path / 'raising_probe.py'}) raised RuntimeError: no licence server; "
        "fix the module (STOPEXP_DEBUG=1 shows the traceback)")
