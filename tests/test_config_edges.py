"""Edge inputs of the newer keys fail at validate, before any compute, naming the key and
what is allowed (each case composes and validates a config: no LM, no bank)."""
import pytest

from conftest import compose
from stopexp.config import ConfigError, validate

SMALL = ["search.n_paths=16", "evaluate.n_points=[8]"]


@pytest.mark.parametrize("overrides,key,msg", [
    # step ends need a task with a step separator that is not a stop string
    (["task=datatotext", "tap.positions.step_ends=true"], "tap.positions.step_ends",
     "task datatotext has no step separator (a path is one sentence); allowed with tasks "
     "arith, qa, wordprob"),
    (["tap.positions.step_ends=true", "search.stop=[';']"], "tap.positions.step_ends",
     "the step separator ';' of task arith completes the stop string ';'"),
    # a stop string as Hydra delivers it (a literal backslash-n) is read decoded, as a path ends
    (["task=wordprob", "tap.positions.step_ends=true", r"search.stop=['Q:','\n']"],
     "tap.positions.step_ends", "the step separator '\\n' of task wordprob completes the stop string '\\n'"),
    # progressive top-K: a later check keeping as many prunes nothing
    (["search.check_at=[0.08,0.25]", "policy.keep=[4,8]"], "policy.keep",
     "[4, 8] for the checks [0.08, 0.25] of search.check_at: after keeping K paths a check "
     "sees at most K"),
    (["search.check_at=[0.08,0.25]", "policy.keep=[4,4]"], "policy.keep", "prunes nothing"),
    (["search.check_at=[0.08,0.25]", "policy.keep=4"], "policy.keep",
     "4 for the checks [0.08, 0.25] of search.check_at"),
    (["search.check_at=[0.08,0.25]", "policy=quantile", "policy.keep=[8,4]"], "policy.keep",
     "[8, 4] is read only by policy=topk, not under policy=quantile"),
])
def test_edge_inputs_fail_naming_the_key(overrides, key, msg):
    with pytest.raises(ConfigError, match=key) as e:
        validate(compose("evaluate", [*SMALL, *overrides]))
    assert msg in str(e.value)


@pytest.mark.parametrize("overrides", [
    ["tap.positions.step_ends=true"],
    ["task=wordprob", "tap.positions.step_ends=true"],
    ["search.check_at=[0.08,0.25]", "policy.keep=[8,4]"],
    ["search.check_at=[0.08,0.25]", "policy=quantile"],
])
def test_the_allowed_neighbours_pass(overrides):
    validate(compose("evaluate", [*SMALL, *overrides]))


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
    (["reward=bertscore", "reward.bertscore_model=/no/such/model"], "reward.bertscore_model",
     "'/no/such/model' is no model directory"),
])
def test_reward_keys_fail_naming_the_key(overrides, key, msg):
    with pytest.raises(ConfigError, match=key) as e:
        validate(compose("evaluate", [*SMALL, *overrides]))
    assert msg in str(e.value)


def test_unbounded_rewards_take_any_min_gap():
    validate(compose("evaluate", [*SMALL, "reward=neg_perplexity", "loss.min_gap=2.5"]))


def test_an_external_reward_must_be_a_finite_number():
    from stopexp.tasks.rewards import Reward, register_reward

    register_reward("edge_nan", lambda problem, text: float("nan") if "x" in text else 0.25)
    register_reward("edge_none", lambda problem, text: None)
    assert Reward("external", "edge_nan").scores(None, [None], ["ab"]).tolist() == [0.25]
    with pytest.raises(ConfigError) as e:
        Reward("external", "edge_nan").scores(None, [None, None], ["ab", "axe"])
    assert str(e.value) == ("reward.function: 'edge_nan' returned nan for the path 'axe' of the "
                            "problem 'None'; a reward must be a finite number")
    with pytest.raises(ConfigError, match="'edge_none' returned None"):
        Reward("external", "edge_none").scores(None, [None], ["ab"])


def test_an_external_reward_that_raises_names_the_function_and_the_path():
    from stopexp.tasks.rewards import Reward

    # a function of the standard library that cannot take this problem
    reward = Reward("external", "operator:truediv")
    with pytest.raises(ConfigError) as e:
        reward.scores(None, [1, 0], ["ab", "cd"])
    assert str(e.value) == ("reward.function: 'operator:truediv' raised TypeError: unsupported "
                            "operand type(s) for /: 'int' and 'str' on the path 'ab' of the "
                            "problem '1'; fix the function (STOPEXP_DEBUG=1 shows its traceback) "
                            "or choose another reward")
    assert isinstance(e.value.__cause__, TypeError)  # the traceback stays reachable


@pytest.mark.parametrize("overrides,key,msg", [
    (["search=beam", "policy=quantile", "search.beam_checks=[]"], "search.beam_checks",
     "[]: give the prefixes where beams are checked, or null for every step"),
    (["search.beam_checks=[0.08]"], "search.beam_checks",
     "[0.08] is read only by search=beam, not under search=parallel"),
    (["search.refill=false"], "search.refill",
     "False is read only by search=beam, not under search=parallel"),
    (["evaluate.vote_top=0.2"], "evaluate.vote_top",
     "0.2: only evaluate.vote=filtered reads it, not vote=majority"),
    (["evaluate.select=signal", "evaluate.vote=weighted"], "evaluate.vote",
     "'weighted' is not used: evaluate.select=signal selects one path instead of voting"),
])
def test_keys_the_run_would_ignore_are_refused(overrides, key, msg):
    with pytest.raises(ConfigError, match=key) as e:
        validate(compose("evaluate", [*SMALL, *overrides]))
    assert msg in str(e.value)


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


@pytest.mark.parametrize("kw,msg", [
    (dict(beam_width=0), "beam_width must be a whole number >= 1, got 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be a whole number >= 1, got 0"),
    (dict(patience=0), "patience must be a whole number >= 1, got 0"),
    (dict(check_steps=[]), "check_steps is empty"),
])
def test_beam_search_refuses_bad_arguments_as_its_docstring_says(tiny_lm, kw, msg):
    from stopexp.search.beam import beam_search_batch

    model, tok = tiny_lm
    args = dict(beam_width=2, max_new_tokens=4, eos_ids=tok.eos_token_id, pad_id=tok.pad_token_id)
    with pytest.raises(ValueError, match=f"beam_search: {msg}"):
        beam_search_batch(model, [tok("1+2=")["input_ids"]], **{**args, **kw})


def test_elect_refuses_what_its_rule_cannot_use():
    from stopexp.core.voting import elect

    nan = float("nan")
    with pytest.raises(ValueError, match=r"evaluate.vote=weighted needs one signal per voter: 3 "
                                         r"voters, signal None"):
        elect(["7", "2", "2"], None, "weighted")
    with pytest.raises(ValueError, match=r"3 voters, signal \(2,\)"):
        elect(["7", "2", "2"], [1.0, nan], "filtered")
    for top in (0, 1.5, nan):
        with pytest.raises(ValueError, match=r"evaluate.vote_top: must lie in \(0, 1\]"):
            elect(["7", "2"], [1.0, 0.0], "filtered", top)
    assert elect(["7", "2", "2"], [3.0, 1.0, 0.0], "filtered", 1 / 3) == "7"
    assert elect(["7", "2", "2"]) == "2"


@pytest.mark.parametrize("override,key,says", [
    ("evaluate.vote=weighted", "evaluate.vote", "'weighted' is not used: adapt scores every "
                                                "variant by the majority vote"),
    ("evaluate.select=signal", "evaluate.select", "'signal' is not used"),
    ("evaluate.compare_beam=true", "evaluate.compare_beam", "True is not used"),
])
def test_adapt_refuses_the_evaluate_keys_it_does_not_read(override, key, says):
    with pytest.raises(ConfigError, match=f"^{key}: ") as e:
        validate(compose("adapt", ["+exp=toy_shift", override]))
    assert says in str(e.value)


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
