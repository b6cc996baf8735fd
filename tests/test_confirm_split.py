"""The confirmatory test split (+exp=smollm2_confirm): the task mix of +exp=smollm2_scaling,
on test prompts that share no problem text with any split of any shipped exp of the same
task (its adapt target's bank included), and task.prompt_offset itself: a split starts
after its first prompt_offset prompts, disjoint from them by construction."""
import pytest

from conftest import CONF, compose
from stopexp.config import validate
from stopexp.config.adapt import shifted_config
from stopexp.tasks import build_task

CONFIRM = "smollm2_confirm"


def splits_of(cfg) -> dict[str, set[str]]:
    """split -> the question texts of the bank of `cfg` (collect.prompts of each split)."""
    task = build_task(cfg.task)
    return {split: {p.question for p in task.problems(split, n)}
            for split, n in cfg.collect.prompts.items() if n}


def shipped_banks(task_name: str) -> dict[str, object]:
    """name -> the collect config of every shipped exp of `task_name`, and of its adapt target."""
    out = {}
    for path in sorted((CONF / "exp").glob("*.yaml")):
        if path.stem == CONFIRM:
            continue
        cfg = compose("collect", [f"+exp={path.stem}"])
        if cfg.task.name != task_name:
            continue
        out[path.stem] = cfg
        if cfg.get("adapt") and cfg.adapt.target:
            out[f"{path.stem} (adapt target)"] = shifted_config(cfg)
    return out


def test_the_confirmatory_split_shares_no_problem_with_any_shipped_split():
    confirm = validate(compose("collect", [f"+exp={CONFIRM}"]))
    scaling = compose("collect", ["+exp=smollm2_scaling"])
    # the same task mix and sampling as the scaling bank: only where the prompts start differs
    assert {**confirm.task, "prompt_offset": 0} == dict(scaling.task)
    assert confirm.search == scaling.search and confirm.tap == scaling.tap
    fresh = splits_of(confirm)
    assert set(fresh) == {"test"} and len(fresh["test"]) == confirm.collect.prompts.test >= 500
    banks = shipped_banks("wordprob")
    assert {"smollm2_scaling", "smollm2_multistep", "smollm2_shift (adapt target)"} <= set(banks)
    for name, cfg in banks.items():
        for split, questions in splits_of(cfg).items():
            assert not fresh["test"] & questions, f"{name}'s {split} split"


def test_a_prompt_offset_starts_each_split_after_that_many_prompts():
    cfg = compose("collect", ["task=wordprob", "task.steps=[2,3]"])
    task = build_task(cfg.task)
    first = task.problems("test", 30)
    cfg.task.prompt_offset = 20
    later = build_task(cfg.task).problems("test", 15)
    # the same seeded draw, renumbered from 0: its 21st prompt is the offset split's first
    assert [p.question for p in later[:10]] == [p.question for p in first[20:30]]
    assert [p.prompt_id for p in later] == list(range(15))
    assert not {p.question for p in later} & {p.question for p in first[:20]}
    # the solved examples before each question do not move
    assert later[0].prompt == first[20].prompt


@pytest.mark.parametrize("task", ["arith", "datatotext"])
def test_every_generated_task_reads_the_offset(task):
    cfg = compose("collect", [f"task={task}"])
    first = build_task(cfg.task).problems("val", 6)
    cfg.task.prompt_offset = 4
    assert build_task(cfg.task).problems("val", 2) == [
        type(p)(**{**vars(p), "prompt_id": i}) for i, p in enumerate(first[4:])]
