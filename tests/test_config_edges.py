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
    # an empty choice where one is required (evaluate.methods=[] is documented: the four
    # methods that always run)
    (["evaluate.retention=[]"], "evaluate.retention", "[] gives no Pareto point; give at least one"),
    (["evaluate.n_points=[]"], "evaluate.n_points", "[] gives no Pareto point; give at least one"),
    (["tap.layers=[]"], "tap.layers", "give at least one layer"),
    (["task=wordprob", "task.steps=[]"], "task.steps", "give one or more step counts"),
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


WORDPROB = ["task=wordprob"]
NARROW = ["task.number_range=[1,2]", "task.operations={add:1,sub:0,compare:0,count:0}"]


@pytest.mark.parametrize("overrides,key,msg", [
    # every option of every task is refused at validate, not when the task is built
    ([*WORDPROB, "task.number_range=[9,2]"], "task.number_range",
     "[9, 2]: needs [low, high] with 1 <= low < high"),
    ([*WORDPROB, "task.number_range=[0,5]"], "task.number_range", "[0, 5]: needs [low, high]"),
    ([*WORDPROB, "task.number_range=[3]"], "task.number_range", "[3]: needs [low, high]"),
    ([*WORDPROB, "task.steps=[5]"], "task.steps", "[5]: give one or more step counts, each in 1..4"),
    ([*WORDPROB, "task.steps=[]"], "task.steps", "[]: give one or more step counts"),
    ([*WORDPROB, "task.shots=-1"], "task.shots", "must lie in 0..63, got -1: the solved examples "
     "come from a pool of 64 training problems, less the question itself"),
    ([*WORDPROB, "task.shots=64"], "task.shots", "must lie in 0..63, got 64"),
    ([*WORDPROB, "task.shot_match=operations", "task.shots=256"], "task.shots",
     "must lie in 0..255, got 256: the solved examples come from a pool of 256 training problems "
     "(shot_match=operations)"),
    ([*WORDPROB, "task.operations={add:0,sub:0,compare:0,count:0}"], "task.operations",
     "weights >= 0 over add, sub, compare, count, not all zero"),
    ([*WORDPROB, "task.operations={add:-1}"], "task.operations",
     "{'add': -1.0, 'sub': 1.0, 'compare': 1.0, 'count': 0.0}: weights >= 0"),
    ([*WORDPROB, "+task.operations.mul=1"], "task.operations", "; unknown: ['mul']"),
    (["+exp=toy_datatotext", "task.shots=-2"], "task.shots", "must lie in 0..63, got -2"),
    # more problems than the task has: 10 starts x 1 operation (*1) for one step
    (["task.n_steps=1", "task.operators=[*]", "task.multipliers=[1]"], "collect.prompts.test",
     "200: task arith has 10 distinct problems in all (its splits share them); lower the count"),
    (["+exp=toy_datatotext", "collect.prompts.train=1000000000"], "collect.prompts.train",
     "1000000000: task datatotext has 3528 distinct problems in all"),
    (["task.n_steps=1000000000"], "task.n_steps", "must lie in 1..1000, got 1000000000"),
    # a split with fewer distinct problems than collect.prompts asks (numbers: seeded draws)
    (["task.n_steps=1", "collect.prompts.test=40"], "collect.prompts.test",
     "cannot draw 40 distinct test prompts with n_steps=1 (34 found in 50000 draws); lower the "
     "count or raise n_steps"),
    (["+exp=toy_datatotext", "task.split_fractions={train:0.98,val:0.01,test:0.01}"],
     "collect.prompts.test", "cannot draw 60 distinct test records of the 3528 there are (34 "
     "found in 70000 draws)"),
    ([*WORDPROB, *NARROW, "task.split_fractions={train:0.98,val:0.01,test:0.01}",
      "collect.prompts.test=20", "collect.prompts.val=0"], "collect.prompts.test",
     "cannot draw 20 distinct test word problems with number_range=[1, 2], steps=[1] (11 found "
     "in 30000 draws); lower the count or widen the range"),
    # the solved examples' pool of 64 train problems
    ([*WORDPROB, *NARROW, "task.split_fractions={train:0.01,val:0.49,test:0.5}",
      "collect.prompts.train=0"], "task.shots",
     "3 solved examples are drawn from a pool of train problems, but it cannot draw 64 distinct "
     "train word problems with number_range=[1, 2], steps=[1] (28 found in 74000 draws)"),
])
def test_task_options_fail_at_validate(overrides, key, msg):
    with pytest.raises(ConfigError, match=f"^{key}: ") as e:
        validate(compose("collect", overrides))
    assert msg in str(e.value)


@pytest.mark.parametrize("overrides", [
    [*WORDPROB, "task.shots=63"], [*WORDPROB, "task.shot_match=operations", "task.shots=255"],
    [*WORDPROB, *NARROW, "collect.prompts.test=100"], ["task.n_steps=1", "collect.prompts.test=34", "collect.prompts.val=10",
                           "collect.prompts.train=100"],
])
def test_task_options_at_their_limits_pass(overrides):
    validate(compose("collect", overrides))


@pytest.mark.parametrize("device,cuda,mps,msg", [
    ("cuda", 0, False, "'cuda': this machine has no CUDA device (torch sees none); use "
                       "model.device=auto or cpu"),
    ("cuda:0", 0, False, "'cuda:0': this machine has no CUDA device"),
    ("cuda:7", 2, False, "'cuda:7': this machine has 2 CUDA devices (cuda:0..cuda:1)"),
    ("cuda:1", 1, False, "'cuda:1': this machine has 1 CUDA device (cuda:0..cuda:0)"),
    ("mps", 0, False, "'mps': this machine has no MPS device (Apple silicon)"),
    ("cdua", 0, False, "'cdua' is not a device; allowed: auto, cpu, mps, cuda, cuda:N"),
    ("cuda:", 1, False, "'cuda:' is not a device"),
])
def test_a_device_this_machine_lacks_fails_at_validate(monkeypatch, device, cuda, mps, msg):
    from stopexp.config import machine
    monkeypatch.setattr(machine, "cuda_devices", lambda: cuda)
    monkeypatch.setattr(machine, "mps_available", lambda: mps)
    with pytest.raises(ConfigError, match="^model.device: ") as e:
        validate(compose("collect", [f"model.device={device}"]))
    assert msg in str(e.value)


def test_a_device_this_machine_has_passes(monkeypatch):
    from stopexp.config import machine
    monkeypatch.setattr(machine, "cuda_devices", lambda: 2)
    monkeypatch.setattr(machine, "mps_available", lambda: True)
    for device in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        validate(compose("collect", [f"model.device={device}"]))


def test_max_new_tokens_beyond_the_models_positions_fails_before_it_loads(tmp_path):
    # the toy LM has 256 positions; SmolLM2 8192 (its GGUF header); a local directory's
    # config.json (no weights needed)
    with pytest.raises(ConfigError, match=r"^search.max_new_tokens: 256 leaves no room for a "
                                          r"prompt in the 256 positions of model 'toy' \(model.toy\); "
                                          r"allowed: < 256$"):
        validate(compose("collect", ["search.max_new_tokens=256"]))
    # the arith prompts of 6 steps are 15 tokens of the toy LM: 256 - 15 = 241 new tokens fit
    validate(compose("collect", ["search.max_new_tokens=241"]))
    with pytest.raises(ConfigError, match=r"^search.max_new_tokens: 242: prompt val/49 of task "
                                          r"arith is 15 tokens of the toy LM \(a BOS and one per "
                                          r"character\), and the toy LM's 256 positions leave it 14; "):
        validate(compose("collect", ["search.max_new_tokens=242"]))
    smol = ["model=smollm2", "task=wordprob", "model.chat_template=false"]
    with pytest.raises(ConfigError, match=r"^search.max_new_tokens: 100000 leaves no room for a "
                                          r"prompt in the 8192 positions of model 'smollm2-135m-instruct' \(.*"
                                          r"SmolLM2-135M-Instruct.Q4_1.gguf\); allowed: < 8192$"):
        validate(compose("collect", [*smol, "search.max_new_tokens=100000"]))
    # with model.max_prompt_tokens set, the user chose the prompt's room
    validate(compose("collect", [*smol, "search.max_new_tokens=100000", "model.max_prompt_tokens=64"]))
    (tmp_path / "config.json").write_text(
        '{"max_position_embeddings": 512, "num_hidden_layers": 2, "num_attention_heads": 4, '
        '"hidden_size": 32}')
    local = ["model=llama", f"model.path={tmp_path}", "model.num_layers=2"]
    with pytest.raises(ConfigError, match=f"^search.max_new_tokens: 512 leaves no room for a "
                                          f"prompt in the 512 positions of model '.*' "
                                          f"\\({tmp_path}/config.json\\); allowed: < 512$"):
        validate(compose("collect", [*local, "search.max_new_tokens=512"]))
    validate(compose("collect", [*local, "search.max_new_tokens=511"]))


def test_extreme_sizes_fail_naming_the_key(monkeypatch):
    from stopexp.config import machine
    monkeypatch.setattr(machine, "memory_gib", lambda: 16.0)
    # 3 x (4 x 1e6^2 + 3 x 1e6 x 288) = 1.2e13 parameters, 16 bytes each in training
    with pytest.raises(ConfigError, match=r"^model.toy: 3 layers of hidden_size 1000000 and "
                                          r"intermediate_size 288 are 1.2e\+13 parameters: training "
                                          r"them takes 1.79e\+05 GiB or more, and this machine has "
                                          r"16.0 GiB$"):
        validate(compose("collect", ["model.toy.hidden_size=1000000"]))
    # a negative N derives policy.keep from N = 1 so that N itself is named (it was a math
    # domain error in resolving policy.keep)
    with pytest.raises(ConfigError, match=r"^search.n_paths: N must be >= 1, got -1$"):
        validate(compose("evaluate", ["search.n_paths=-1"]))
    with pytest.raises(ConfigError, match=r"^task.n_steps: must lie in 1..1000, got 1000000000$"):
        validate(compose("collect", ["task.n_steps=1000000000"]))


def test_flash_attention_without_its_package_fails_at_validate(monkeypatch):
    import importlib.util

    from stopexp.config import machine
    smol = ["model=smollm2", "task=wordprob", "model.chat_template=false"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^model.attn_implementation: 'flash_attention_2' needs "
                                          r"the package flash_attn, which is not installed; use sdpa "
                                          r"or eager$"):
        validate(compose("collect", [*smol, "model.attn_implementation=flash_attention_2"]))
    validate(compose("collect", [*smol, "model.attn_implementation=sdpa"]))
    monkeypatch.setattr(machine, "cuda_devices", lambda: 0)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^model.attn_implementation: 'flash_attention_2' runs on "
                                          r"CUDA only, and this machine has no CUDA device"):
        validate(compose("collect", [*smol, "model.attn_implementation=flash_attention_2"]))
