"""adapt's config: the target config that shifts the LM or pins it, the target bank, and
bad adapt, Monte Carlo feedback and pinned-task values refused at validate."""
import pytest
from omegaconf import OmegaConf

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.stages import build
from stopexp.stages.shift import target_config, target_overrides


def test_the_target_config_shifts_the_lm_or_pins_it():
    from stopexp.models.toy_lm import toy_key

    cfg = validate(compose("adapt", ["+exp=toy_shift"]))
    tgt = target_config(cfg)
    assert toy_key(cfg.model.toy, cfg.task) == "27c2bc494cd4" != toy_key(tgt.model.toy, tgt.task)
    assert OmegaConf.to_container(tgt.task.styles) == {"careful": 0.8, "shortcut": 0.2}
    assert tgt.model.toy.seed == 1 and cfg.model.toy.seed == 0 and not tgt.adapt.target
    assert tgt.collect.mc_rollouts == 4 and cfg.collect.mc_rollouts == 0  # MC labels: target only
    assert target_overrides(cfg, ["+exp=toy_shift", "adapt.lr=0.1"]) == [
        "+exp=toy_shift", 'task.styles={careful:0.8,shortcut:0.2}', 'model.toy.seed=1',
        'collect.mc_rollouts=4']
    # a prompt shift with the LM pinned: the same LM, another bank
    pinned = compose("adapt", ["++adapt.target={task.n_steps:8}"])
    tgt = target_config(validate(pinned))
    assert tgt.task.n_steps == 8 and OmegaConf.to_container(tgt.model.toy.train_task) == {"n_steps": 6}
    assert toy_key(tgt.model.toy, tgt.task) == toy_key(pinned.model.toy, pinned.task) == "27c2bc494cd4"
    assert build.bank(tgt).key != build.bank(pinned).key
    assert target_overrides(pinned, []) == ['task.n_steps=8', '+model.toy.train_task.n_steps=6']


def test_the_target_bank_may_hold_more_prompts_than_the_source():
    cfg = validate(compose("adapt", ["adapt.stream_prompts=300", "++adapt.target={collect.prompts.test:400}"]))
    assert (target_config(cfg).collect.prompts.test, cfg.collect.prompts.test) == (400, 200)
    assert build.bank(target_config(cfg)).key != build.bank(cfg).key
    with pytest.raises(ConfigError, match=r"300 streamed \+ 50 held out \(adapt.heldout_prompts\) "
                                          r"exceed the 200 test prompts of the target bank"):
        validate(compose("adapt", ["adapt.stream_prompts=300"]))


@pytest.mark.parametrize("exp", ["toy_shift", "toy_contrastive", "toy_reward", "llama_contrastive",
                                 "smollm2_shift"])
def test_experiments_validate_for_adapt(exp):
    assert validate(compose("adapt", [f"+exp={exp}"])).stage == "adapt"


@pytest.mark.parametrize("override,match", [
    ("++adapt.target={task.n_step:8}", r"adapt.target: \['task.n_step'\] are not config keys"),
    ("++adapt.target={adapt.lr:1}", r"adapt.target: \['adapt.lr'\] are not config keys"),
    ("++adapt.target={task.multipliers:[2]}", r"adapt.target: task.multipliers: \[2\]"),
    ("adapt.lr=nan", r"adapt.lr: nan is not a finite number"),
    ("adapt.explore=0", r"adapt.explore: the explore variant needs a share"),
    ("adapt.explore=1.5", r"adapt.explore: must lie in \[0, 1\]"),
    ("adapt.stream_prompts=190", r"adapt.stream_prompts: 190 streamed \+ 50 held out"),
    ("adapt.variants=[frozen,online]", r"adapt.variants: \['online'\]"),
    ("adapt.batch_prompts=0", r"adapt.batch_prompts: must be >= 1"),
])
def test_bad_adapt_values_fail_before_compute(override, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose("adapt", [override]))


@pytest.mark.parametrize("overrides,match", [
    (["adapt.variants=[frozen,mc_feedback]"],
     r"adapt.mc_rollouts: mc_feedback replays 4 continuations .* collect.mc_rollouts=0"),
    (["adapt.variants=[frozen,mc_feedback]", "++adapt.target={collect.mc_rollouts:2}"],
     r"adapt.mc_rollouts: .* collect.mc_rollouts=2; give the target collect.mc_rollouts: 4"),
    (["adapt.variants=[mc_feedback]", "adapt.mc_prefixes=0"], r"adapt.mc_prefixes: must be >= 1"),
    (["adapt.variants=[mc_feedback]", "evaluate.mode=online", "adapt.mc_rollouts=0"],
     r"adapt.mc_rollouts: must be >= 1"),
    (["adapt.mc_prefixes=-1"], r"adapt.mc_prefixes: must be >= 0"),
    # a check at a stride position: the features hold it, the rollouts are at tap.checkpoints
    (["adapt.variants=[frozen,mc_feedback]", "++adapt.target={collect.mc_rollouts:4}",
      "tap.positions.stride=10", "search.check_at=10", "train.checkpoint=10"],
     r"search.check_at: 10 tokens: mc_feedback replays the target bank's Monte Carlo labels, "
     r"which collect rolls out at tap.checkpoints \[0.08, 0.25\] only"),
    (["++adapt.target={collect.seed:1}"], r"adapt.target: \['collect.seed'\] are not config keys"),
])
def test_bad_mc_feedback_values_fail_before_compute(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose("adapt", overrides))


def test_mc_feedback_validates_with_monte_carlo_labels_in_the_target_only():
    cfg = validate(compose("adapt", ["+exp=toy_shift", "adapt.variants=[frozen,mc_feedback]",
                                     "++adapt.target={model.toy.seed:1,collect.mc_rollouts:4}"]))
    assert cfg.collect.mc_rollouts == 0 and target_config(cfg).collect.mc_rollouts == 4
    # the command line's target replaces toy_shift's (its task.styles is gone)
    assert target_overrides(cfg, ["+exp=toy_shift", "++adapt.target={model.toy.seed:1,collect.mc_rollouts:4}",
                                  "~adapt.seed"]) == [
        "+exp=toy_shift", 'model.toy.seed=1', 'collect.mc_rollouts=4']
    online = validate(compose("adapt", ["adapt.variants=[mc_feedback]", "evaluate.mode=online"]))
    assert online.adapt.mc_rollouts == 4  # online forks the LM: no bank labels needed


@pytest.mark.parametrize("override,match", [
    ("+model.toy.train_task.n_step=6", r"model.toy.train_task: \['n_step'\] are not arith task keys"),
    ("+model.toy.train_task.multipliers=[2]", r"model.toy.train_task: task.multipliers: \[2\]"),
])
def test_a_bad_pinned_lm_task_fails_before_training_an_lm(override, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose("collect", [override]))


def test_beam_search_is_refused_by_adapt():
    with pytest.raises(ConfigError, match=r"search.name: adapt prunes with Launch-Check-Resume"):
        validate(compose("adapt", ["+exp=toy_beam"]))
