"""A stopping method added from outside the package, as docs/development.md's recipe says:
its class (tests/first_k.py: settings with defaults, checks, replays), its registry line,
and it runs in evaluate's replay and in answers_replay, and its settings join the config."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, compose
from stopexp.config import validate
from stopexp.core.errors import ConfigError
from stopexp.core.names import REGISTRY
from stopexp.store.path_table import Paths
from stopexp.stopping.answers_bank import load_answers_bank
from stopexp.stopping.branch_draws import build_methods, draws, replay
from stopexp.stopping.replay import stopping_outcomes


@pytest.fixture
def first_k(monkeypatch):
    monkeypatch.setitem(REGISTRY["stopping"], "first_k", "first_k:FirstK")


def test_evaluate_replays_a_registered_method(first_k):
    validate(compose("evaluate", ["evaluate.methods=[first_k]"]))
    # one prompt of four paths: the first two (7, 3) vote, a tie the first answer wins
    paths = Paths(group=np.zeros(4, int), path_id=np.arange(4), length=np.array([4, 8, 6, 9]),
                  correct=np.array([1, 0, 1, 1], bool), answer=np.array(["7", "3", "7", "7"], object),
                  text=np.array([f"p{i}" for i in range(4)], object), alive=np.ones(4, bool), batch={})
    o = stopping_outcomes(paths, [np.ones(1)] * 4, ["first_k", "confidence"], 4, {}, 2)
    assert list(o) == ["first_k"]
    assert o["first_k"]["spent"].tolist() == [4, 8, 0, 0] and o["first_k"]["correct"].tolist() == [True]
    o = stopping_outcomes(paths, [np.ones(1)] * 4, ["first_k"], 4, {"first_k": {"k": 3}}, 2)
    assert o["first_k"]["tokens"].tolist() == [18.0]


def test_answers_replay_runs_and_checks_a_registered_method(first_k):
    bank = load_answers_bank(ROOT / "tests" / "data" / "answers_bank.json")
    methods = build_methods(["no_prune", "first_k"], 2, 10, {"first_k": {"k": 6}})
    r = replay(bank, methods, draws(bank, 6, 3, 0))
    assert r["first_k"]["accuracy"] == r["no_prune"]["accuracy"]  # 6 of 6: no_prune itself
    with pytest.raises(ConfigError, match=r"^stopping.first_k.k: must be >= 1, got 0$"):
        build_methods(["first_k"], 2, 10, {"first_k": {"k": 0}})


def test_registered_before_the_config_its_settings_are_keys():
    code = ("from stopexp.core.names import register\n"
            "register('stopping', 'first_k', 'first_k:FirstK')\n"
            "from conftest import compose\n"
            "cfg = compose('evaluate', ['evaluate.methods=[first_k]', 'evaluate.stopping.first_k.k=3'])\n"
            "from stopexp.config import validate\n"
            "validate(cfg)\n"
            "print(dict(cfg.evaluate.stopping.first_k))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out.strip().replace("'", '"')) == {"k": 3}
