"""Every option of every task fails at validate, not when the task is built, naming the key
and its limits; more problems than a task or a split holds are refused with the counts."""
import pytest

from conftest import compose
from stopexp.config import ConfigError, validate


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
