import random

import pytest

from conftest import compose
from stopexp.tasks import build_task
from stopexp.tasks.arith import ArithTask, extract_answer, first_error, solution


@pytest.fixture
def task():
    return ArithTask(n_steps=6, seed=0)


def test_example_from_the_spec():
    from stopexp.tasks.arith import Problem
    t = ArithTask(n_steps=3)
    p = Problem(0, "train", 4, (("+", 7), ("*", 3), ("-", 9)))
    assert p.prompt == "4+7*3-9?"
    assert solution(p, "careful") == "4+7=1;1*3=3;3-9=4;#4"
    assert solution(p, "shortcut") == "4+7*3=3;3-9=4;#4"
    assert p.answer == 4 and t.grade(p, "4+7=1;1*3=3;3-9=4;#4")


def test_references_are_right_in_both_styles(task):
    for p in task.problems("val", 50):
        for style in ("careful", "shortcut"):
            text = solution(p, style)
            assert task.grade(p, text) and first_error(p, text) is None
            assert task.style_of(text) == style


@pytest.mark.parametrize("text", ["", "#", "garbage", "1+2=3;#", "#12", "#a", "4+7=1;1*3=3;3-9=4;#4#",
                                  "\x00\xff", "=;;;#", "#4 extra"])
def test_malformed_outputs_are_wrong_not_crashes(task, text):
    p = task.problems("test", 1)[0]
    assert task.grade(p, text) in (False, True)
    if text in ("", "#", "garbage", "#a", "=;;;#", "#12"):
        assert not task.grade(p, text)
    first_error(p, text)  # never raises
    extract_answer(text)


def test_first_error_locates_the_wrong_step():
    from stopexp.tasks.arith import Problem
    p = Problem(0, "test", 4, (("+", 7), ("*", 3), ("-", 9)))
    assert first_error(p, "4+7=1;1*3=3;3-9=4;#4") is None
    assert first_error(p, "4+7=1;1*3=2;2-9=3;#3") == 6
    assert first_error(p, "4+7=2;2*3=6;6-9=7;#7") == 0
    assert first_error(p, "4+7=1;1*3=3;3-9=4;#5") == 18
    assert first_error(p, "4+7=1;1*3=3") == 11  # breaks off: errs where it stops


def test_every_step_is_a_bijection(task):
    from stopexp.tasks.arith import apply
    for op, operands in (("+", range(10)), ("-", range(10)), ("*", task.multipliers)):
        for d in operands:
            assert sorted(apply(v, op, d) for v in range(10)) == list(range(10))


def test_splits_are_disjoint_and_deterministic():
    t = ArithTask(n_steps=4, seed=3)
    sets = {s: {p.prompt for p in t.problems(s, 300)} for s in ("train", "val", "test")}
    assert not (sets["train"] & sets["val"]) and not (sets["train"] & sets["test"])
    assert not (sets["val"] & sets["test"])
    assert all(t.split_of(p) == s for s, ps in sets.items() for p in ps)
    assert [p.prompt for p in t.problems("test", 20)] == [p.prompt for p in ArithTask(n_steps=4, seed=3).problems("test", 20)]
    other = ArithTask(n_steps=4, seed=4)
    assert {p.prompt for p in other.problems("val", 300)}.isdisjoint(sets["train"])
    rng = random.Random(0)
    assert all(t.split_of(t.sample("train", rng).prompt) == "train" for _ in range(200))


def test_style_mix_is_a_knob():
    t = ArithTask(n_steps=4, styles={"careful": 1.0, "shortcut": 0.0})
    rng = random.Random(0)
    assert all(t.style_of(t.training_text(t.sample("train", rng), rng)) == "careful" for _ in range(50))
    t = ArithTask(n_steps=4, styles={"careful": 0.5, "shortcut": 0.5})
    styles = [t.style_of(t.training_text(t.sample("train", rng), rng)) for _ in range(400)]
    assert 150 < styles.count("shortcut") < 250


def test_build_task_from_config():
    t = build_task(compose("collect", ["task.n_steps=5", "task.seed=2"]).task)
    assert t.n_steps == 5 and len(t.problems("test", 3)[0].ops) == 5


def test_too_many_prompts_for_a_tiny_task_is_an_error():
    with pytest.raises(ValueError, match="distinct"):
        ArithTask(n_steps=1, operators=["*"], multipliers=[3]).problems("train", 100)


def test_size_counts_every_distinct_prompt():
    import random

    from stopexp.tasks.arith import Problem
    for task, size in ((ArithTask(n_steps=1), 10 * 23), (ArithTask(n_steps=2, operators=["+", "*"],
                                                                   multipliers=[3, 3, 7]), 10 * 12 ** 2)):
        rng = random.Random(0)
        seen = {Problem(-1, "x", *task._random_problem(rng)).prompt for _ in range(50 * size)}
        assert task.size() == size == len(seen)
