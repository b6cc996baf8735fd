"""Edge inputs of the pruning protocol's keys (step ends, progressive top-K, empty
choices, keys the run would ignore) fail at validate, before any compute, naming the key and
what is allowed; beam search and the vote refuse what they cannot use."""
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
    (["search=beam", "policy=quantile", "search.beam_checks=[]"], "search.beam_checks",
     "[]: give the prefixes where beams are checked, or null for every step"),
    (["search.beam_checks=[0.08]"], "search.beam_checks",
     "[0.08] is read only by search=beam, not under search=parallel"),
    (["search.refill=false"], "search.refill",
     "false is read only by search=beam, not under search=parallel"),
    (["evaluate.vote_top=0.2"], "evaluate.vote_top",
     "0.2: only evaluate.vote=filtered reads it, not vote=majority"),
    (["evaluate.select=signal", "evaluate.vote=weighted"], "evaluate.vote",
     "'weighted' is not used: evaluate.select=signal selects one path instead of voting"),
])
def test_keys_the_run_would_ignore_are_refused(overrides, key, msg):
    with pytest.raises(ConfigError, match=key) as e:
        validate(compose("evaluate", [*SMALL, *overrides]))
    assert msg in str(e.value)


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
