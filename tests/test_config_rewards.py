"""Reward keys fail at validate naming the key; an external or `evaluate` reward module
that fails to import, raises or returns no finite number is one line naming the module and
the path; the losses check the rewards' spread and range against what they need."""
import pytest

from conftest import compose
from stopexp.config import ConfigError, validate

SMALL = ["search.n_paths=16", "evaluate.n_points=[8]"]


@pytest.mark.parametrize("overrides,key,msg", [
    (["loss.min_gap=1"], "loss.min_gap",
     "1.0 skips every pair: reward=correct lies in [0, 1], so no reward gap exceeds it; "
     "allowed: [0, 1)"),
    (["reward=rouge_l", "loss.min_gap=1.5"], "loss.min_gap", "reward=rouge_l lies in [0, 1]"),
    (["loss=mse", "loss.min_gap=0.1"], "loss.min_gap",
     "0.1 is read only by loss=contrastive|pairwise, not under loss=mse"),
    (["reward=external", "reward.function=os:sep"], "reward.function",
     "'os:sep' is a str, not a function fn(problem, text) -> float"),
    (["reward=external", "reward.function=os:getcwd"], "reward.function",
     "'os:getcwd' cannot be called as fn(problem, text) -> float: its signature is ()"),
    (["reward=external", "reward.function=:foo"], "reward.function",
     "':foo' cannot be imported (ValueError: Empty module name); give module:function"),
    (["reward=external", "reward.function=no_such_reward_module:score"], "reward.function",
     "'no_such_reward_module:score' cannot be imported (ModuleNotFoundError: No module named "
     "'no_such_reward_module'); give module:function"),
    (["reward=external", "reward.function=os:no_such_function"], "reward.function",
     "'os:no_such_function' cannot be imported (AttributeError: module 'os' has no attribute "
     "'no_such_function'); give module:function"),
    (["reward=bertscore", "reward.bertscore_model=/no/such/model"], "reward.bertscore_model",
     "'/no/such/model' is no model directory"),
])
def test_reward_keys_fail_naming_the_key(overrides, key, msg):
    with pytest.raises(ConfigError, match=key) as e:
        validate(compose("evaluate", [*SMALL, *overrides]))
    assert msg in str(e.value)


def test_unbounded_rewards_take_any_min_gap():
    validate(compose("evaluate", [*SMALL, "reward=neg_perplexity", "loss.min_gap=2.5"]))


@pytest.mark.parametrize("name, source, raised", [
    ("edge_raises", "raise RuntimeError('no licence server')\ndef score(problem, text):\n    return 1.0\n",
     "RuntimeError: no licence server"),
    ("edge_syntax", "def score(problem, text)\n    return 1.0\n",
     "SyntaxError: expected ':' (edge_syntax.py, line 1)"),
    ("edge_lacks", "import no_such_dependency_of_the_reward\n",
     "ModuleNotFoundError: No module named 'no_such_dependency_of_the_reward'"),
])
def test_an_external_reward_module_that_fails_to_import_is_one_line_at_validate(
        name, source, raised, tmp_path, monkeypatch):
    """The user's module raises at import or does not parse: validate names the key, the
    file and what it raised (no traceback, before any compute)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        validate(compose("collect", ["reward=external", f"reward.function={name}:score"]))
    assert str(e.value) == (f"reward.function: '{name}:score': importing {name} "
                            f"({tmp_path / name}.py) raised {raised}; fix the module "
                            "(STOPEXP_DEBUG=1 shows the traceback)")


EVALUATE_MODULE = """import datasets
import evaluate


class Raising(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="", citation="", inputs_description="",
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}))

    def _compute(self, predictions, references):
        BODY
"""


def test_an_evaluate_reward_module_that_raises_is_one_line(tmp_path):
    """At load (validate) and while scoring (after generation: the shard being scored is
    not written, the ones before it stay)."""
    from stopexp.tasks.evaluate_reward import EvaluateReward

    at_import = tmp_path / "import_raising.py"
    at_import.write_text(EVALUATE_MODULE.replace("class Raising", "raise OSError('no weights')\nclass Raising")
                         .replace("BODY", "return {}"))
    with pytest.raises(ConfigError) as e:
        validate(compose("collect", ["reward=evaluate", f"reward.module={at_import}"]))
    assert str(e.value) == (f"reward.module: '{at_import}' ({at_import}) cannot be loaded: "
                            "OSError: no weights")
    at_compute = tmp_path / "raising.py"
    at_compute.write_text(EVALUATE_MODULE.replace("BODY", "raise KeyError('gold')"))
    validate(compose("collect", ["reward=evaluate", f"reward.module={at_compute}"]))  # it loads
    with pytest.raises(ConfigError) as e:
        EvaluateReward(str(at_compute)).scores(["a", "b"], [["a"], ["b"]])
    assert str(e.value) == (f"reward.module: '{at_compute}' ({at_compute}) raised KeyError: 'gold' "
                            "while scoring 2 paths; fix the module (STOPEXP_DEBUG=1 shows the "
                            "traceback) or choose another reward")
    assert isinstance(e.value.__cause__, KeyError)


def test_an_external_reward_must_be_a_finite_number():
    from stopexp.tasks.arith import ArithTask
    from stopexp.tasks.rewards import Reward, register_reward

    register_reward("edge_nan", lambda problem, text: float("nan") if "x" in text else 0.25)
    register_reward("edge_none", lambda problem, text: None)
    assert Reward("external", "edge_nan").scores(ArithTask(), [None], ["ab"]).tolist() == [0.25]
    with pytest.raises(ConfigError) as e:
        Reward("external", "edge_nan").scores(ArithTask(), [None, None], ["ab", "axe"])
    assert str(e.value) == ("reward.function: 'edge_nan' returned nan for the path 'axe' of the "
                            "problem 'None'; a reward must be a finite number")
    with pytest.raises(ConfigError, match="'edge_none' returned None"):
        Reward("external", "edge_none").scores(ArithTask(), [None], ["ab"])


def test_an_external_reward_that_raises_names_the_function_and_the_path():
    from stopexp.tasks.arith import ArithTask
    from stopexp.tasks.rewards import Reward

    # a function of the standard library that cannot take this problem
    reward = Reward("external", "operator:truediv")
    with pytest.raises(ConfigError) as e:
        reward.scores(ArithTask(), [1, 0], ["ab", "cd"])
    assert str(e.value) == ("reward.function: 'operator:truediv' raised TypeError: unsupported "
                            "operand type(s) for /: 'int' and 'str' on the path 'ab' of the "
                            "problem '1'; fix the function (STOPEXP_DEBUG=1 shows its traceback) "
                            "or choose another reward")
    assert isinstance(e.value.__cause__, TypeError)  # the traceback stays reachable


def test_per_step_usable_groups_count_reward_spreads_as_train_does():
    """train.positions=all: a (prompt, position) group is usable with both outcomes, or,
    with a continuous reward, with two different rewards (all paths failing the check)."""
    import torch

    from stopexp.training.per_step import usable_groups

    group = torch.tensor([0, 0, 1, 1, 2, 2])
    correct = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    assert usable_groups({"group": group, "correct": correct}) == 1
    reward = torch.tensor([0.2, 0.7, 0.5, 0.5, 0.9, 0.9])
    assert usable_groups({"group": group, "correct": correct, "reward": reward}) == 1  # group 0
    assert usable_groups({"group": group, "correct": correct, "reward": correct.clone()}) == 1
    assert usable_groups({"group": group[:0], "correct": correct[:0]}) == 0
    # the pair losses skip pairs within loss.min_gap: group 0's gap of 0.5 is usable at 0.4 only
    assert usable_groups({"group": group, "correct": correct, "reward": reward}, 0.4) == 1
    assert usable_groups({"group": group, "correct": correct, "reward": reward}, 0.5) == 0


def test_check_usable_says_when_loss_min_gap_leaves_no_pair():
    import torch

    from stopexp.training.data import NothingToLearn, check_usable

    data = {"group": torch.tensor([0, 0, 1, 1]), "correct": torch.tensor([0.0, 0.0, 1.0, 1.0]),
            "reward": torch.tensor([0.30, 0.32, 0.50, 0.55])}
    assert check_usable("val", data, 5, 8) == 2
    assert check_usable("val", data, 5, 8, min_gap=0.04) == 1
    with pytest.raises(NothingToLearn, match=r"train: the val split has no pair at checkpoint 5 "
                                             r"tokens whose rewards differ by more than "
                                             r"loss.min_gap=0.1 \(the widest spread within a "
                                             r"prompt is 0.05\)"):
        check_usable("val", data, 5, 8, min_gap=0.1)


def test_regression_losses_refuse_an_external_reward_outside_0_1():
    import torch

    from stopexp.training.data import check_reward_range

    cfg = compose("train", ["loss=mse", "reward=external", "reward.function=os.path:join"])
    data = {"train": {"reward": torch.tensor([0.0, 0.5, 1.0])},
            "val": {"reward": torch.tensor([0.2, 3.5])}}
    with pytest.raises(ValueError, match=r"loss.name: mse regresses a probability on the reward, "
                                         r"but the val paths' rewards \(reward=external\) span "
                                         r"\[0.2, 3.5\], outside \[0, 1\]"):
        check_reward_range(cfg.loss, cfg.reward.name, data)
    check_reward_range(cfg.loss, cfg.reward.name, {"train": data["train"]})
    cfg.loss.name = "contrastive"
    check_reward_range(cfg.loss, cfg.reward.name, data)  # orders pairs: any range
