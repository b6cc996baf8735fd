"""Edge inputs of the newer keys fail at validate, before any compute, naming the key and
what is allowed (each case composes and validates a config: no LM, no bank)."""
import pytest

from conftest import compose
from stopexp.config import ConfigError, validate

SMALL = ["search.n_paths=16", "evaluate.n_points=[8]", "evaluate.retention=[4]"]


@pytest.mark.parametrize("overrides,key,msg", [
    # step ends need a task with a step separator that is not a stop string
    (["task=datatotext", "tap.positions.step_ends=true"], "tap.positions.step_ends",
     "task datatotext has no step separator (a path is one sentence); allowed with tasks "
     "arith, qa, wordprob"),
    (["tap.positions.step_ends=true", "search.stop=[';']"], "tap.positions.step_ends",
     "the step separator ';' of task arith completes the stop string ';'"),
    # progressive top-K: a later check keeping as many prunes nothing
    (["search.check_at=[0.08,0.25]", "policy.keep=[4,8]"], "policy.keep",
     "[4, 8] for the checks [0.08, 0.25] of search.check_at: after keeping K paths a check "
     "sees at most K"),
    (["search.check_at=[0.08,0.25]", "policy.keep=[4,4]"], "policy.keep", "prunes nothing"),
    (["search.check_at=[0.08,0.25]", "policy.keep=4"], "policy.keep",
     "4 for the checks [0.08, 0.25] of search.check_at"),
    (["search.check_at=[0.08,0.25]", "policy=quantile", "policy.keep=[8,4]"], "policy.keep",
     "[8, 4]: only policy=topk reads K, not policy=quantile"),
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
