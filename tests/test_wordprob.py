import hashlib
import re

import pytest

from conftest import compose
from stopexp.config import validate
from stopexp.tasks import build_task
from stopexp.tasks.wordprob import (DEFAULT_OPERATIONS, MARKER, WordProblemTask, answer_of,
                                    first_wrong_equation, things)

ALL_OPS = {"add": 1, "sub": 1, "compare": 1, "count": 1}


@pytest.fixture
def task():
    return WordProblemTask(steps=(1, 2), number_range=(2, 9), operations=ALL_OPS, shots=3, seed=0)


def numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def test_same_seed_same_problems_other_seed_other_problems(task):
    again = WordProblemTask(steps=(1, 2), number_range=(2, 9), operations=ALL_OPS, shots=3, seed=0)
    other = WordProblemTask(steps=(1, 2), number_range=(2, 9), operations=ALL_OPS, shots=3, seed=1)
    assert task.problems("test", 20) == again.problems("test", 20)
    assert [p.question for p in task.problems("test", 20)] != [p.question for p in other.problems("test", 20)]
    first = task.problems("test", 5)
    assert task.problems("test", 8)[:5] == first  # a longer draw extends a shorter one


def test_pinned_example():
    t = WordProblemTask(steps=(2,), number_range=(2, 9), operations={"add": 1, "sub": 1}, shots=0)
    p = t.problems("test", 1)[0]
    assert p.prompt == f"Question: {p.question}\nAnswer:"
    assert p.question == ("Ben has 7 books. He gives 6 to Max. Then he finds 4 more. "
                          "How many books does Ben have now?")
    assert p.solution == ("Ben has 7 books and gives 6 to Max, so 7 - 6 = 1. "
                          "Then he finds 4 more, so 1 + 4 = 5. The answer is 5.")
    assert p.answer == 5 and p.kind == "sub+add"


def test_splits_are_disjoint_and_follow_the_hash(task):
    seen = {}
    for split, n in (("train", 300), ("val", 40), ("test", 40)):
        for p in task.problems(split, n):
            assert task.split_of(p.question) == split and p.split == split
            assert seen.setdefault(p.question, split) == split
    assert len(seen) == 380


def test_worked_solutions_are_right(task):
    assert {p.kind.split("+")[0] for p in task.problems("val", 60)} == set(ALL_OPS)
    for p in task.problems("val", 60):
        assert task.grade(p, p.solution) and first_wrong_equation(p.solution) is None
        assert p.solution.endswith(f"{MARKER} {p.answer}.") and p.answer >= 0
        assert task.reference(p) == p.solution
        assert task.diagnose(p, p.solution) == {"style": "marked", "first_error": -1}


def test_steps_knob_sets_the_number_of_operations():
    for steps in (1, 2, 3):
        t = WordProblemTask(steps=(steps,), operations={"add": 1, "sub": 1}, shots=0)
        for p in t.problems("train", 30):
            assert len(p.kind.split("+")) == steps
            assert p.solution.count(" = ") == steps


def test_a_step_count_listed_more_often_is_drawn_more_often():
    """steps=[2, 2, 2, 3, 4]: 3/5 of the problems have 2 steps. Over 500 seeded problems
    the share lies within 4 standard errors (0.022) of 0.6."""
    t = WordProblemTask(steps=(2, 2, 2, 3, 4), number_range=(1, 5), shots=0)
    n = [len(p.values) for p in t.problems("train", 500)]
    assert set(n) == {2, 3, 4}
    assert abs(n.count(2) / 500 - 0.6) < 4 * (0.6 * 0.4 / 500) ** 0.5
    assert abs(n.count(3) / 500 - 0.2) < 4 * (0.2 * 0.8 / 500) ** 0.5


def test_number_range_and_operations_knobs():
    t = WordProblemTask(steps=(1,), number_range=(20, 40), operations={"add": 1}, shots=0)
    for p in t.problems("train", 30):
        assert p.kind == "add" and all(20 <= x <= 40 for x in numbers(p.question))
        assert 40 <= p.answer <= 80
    t = WordProblemTask(steps=(1,), operations={"compare": 1, "count": 0}, shots=0)
    problems = t.problems("train", 30)
    assert {p.kind for p in problems} == {"compare"}
    assert all("How many more" in p.question for p in problems)
    counts = WordProblemTask(steps=(1,), operations={"count": 1}, shots=0).problems("train", 10)
    assert all(len(numbers(p.question)) == 3 and "in total" in p.question for p in counts)
    # whoever gets a gift is not the person compared with
    gifts = WordProblemTask(steps=(3,), operations={"compare": 1, "sub": 1}, shots=0).problems("train", 40)
    for p in gifts:
        if "than" in p.question and " to " in p.question:
            assert p.question.split(" than ")[1].rstrip("?") not in p.question.split(" to ")[1].split(".")[0]


@pytest.mark.parametrize("kwargs, key", [({"steps": (0,)}, "task.steps"),
                                         ({"number_range": (9, 2)}, "task.number_range"),
                                         ({"number_range": (9,)}, "task.number_range"),
                                         ({"operations": {}}, "task.operations"),
                                         ({"operations": {"mul": 1}}, "task.operations"),
                                         ({"operations": {"add": 0}}, "task.operations"),
                                         ({"format": "markdown"}, "task.format"),
                                         ({"extraction": "loose"}, "task.extraction"),
                                         ({"shots": -1}, "task.shots"),
                                         ({"shot_match": "kind"}, "task.shot_match")])
def test_bad_knobs_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        WordProblemTask(**kwargs)


def test_checker_on_right_wrong_and_malformed(task):
    p = next(p for p in task.problems("test", 20) if p.answer >= 2)
    right = f" So it is {p.answer - 1} + 1 = {p.answer}. The answer is {p.answer}."
    assert task.grade(p, right)
    assert task.grade(p, f" #### {p.answer}")
    assert not task.grade(p, f" The answer is {p.answer + 1}.")
    assert not task.grade(p, f" {p.answer}")  # strict: no marker, no answer
    flexible = WordProblemTask(steps=(1, 2), number_range=(2, 9), operations=ALL_OPS, shots=3,
                               extraction="flexible")
    assert flexible.grade(p, f" she has {p.answer} now")
    assert flexible.grade(p, f" The answer is {p.answer}. Then 3 more")  # a marked answer first
    for text in ("", "The answer is", "The answer is .", "####", "\x00\xff", "1 = = 2",
                 "The answer is 99999999999999999999999.", "The answer is " + "9" * 5000, "- - -", "The answer is -"):
        assert task.grade(p, text) is False
        assert flexible.grade(p, text) in (True, False)
        task.diagnose(p, text)  # never raises


def test_answers_are_canonical():
    assert answer_of(" 3 + 4 = 7. The answer is 7.") == "7"
    assert answer_of("The answer is 1,000.") == "1000"
    assert answer_of("The answer is 12.0") == "12"
    assert answer_of("the answer is -3") == "-3"
    assert answer_of("The answer is 5. The answer is 6.") == "5"  # the first marked answer counts
    assert answer_of("no marker 5 and 6") == "" and answer_of("no marker 5 and 6", "flexible") == "6"
    assert things(1, "candies") == "1 candy" and things(1, "pens") == "1 pen" and things(2, "pens") == "2 pens"
    assert answer_of("The answer is 2.50") == "5/2"
    # a 5000-digit answer is a number (past Python's 4300-digit int conversion limit); one
    # past MAX_DIGITS (10,000) digits is none
    assert answer_of("The answer is " + "9" * 5000) == "9" * 5000
    assert answer_of("The answer is " + "9" * 10_001) == ""


def test_first_wrong_equation_offset():
    text = "Tom has 3 + 4 = 7 pens. Then 7 - 2 = 4. The answer is 4."
    assert first_wrong_equation(text) == text.index("7 - 2")
    assert first_wrong_equation("5 + 2 + 1 = 8") is None
    assert first_wrong_equation("no equations") is None
    assert first_wrong_equation("9" * 5000 + " + 1 = 2") is None
    assert WordProblemTask().diagnose(None, text) == {"style": "marked", "first_error": 29}
    assert WordProblemTask().diagnose(None, "8")["style"] == "unmarked"


def test_fewshot_prompt_has_k_training_examples_then_the_question(task):
    train = {p.question for p in task.problems("train", 400)}
    for p in task.problems("test", 20) + task.problems("train", 20):
        blocks = p.prompt.split("\n\n")
        assert len(blocks) == 4 and blocks[-1] == f"Question: {p.question}\nAnswer:"
        for block in blocks[:-1]:
            q, a = block.split("\nAnswer: ")
            q = q.removeprefix("Question: ")
            assert task.split_of(q) == "train" and q != p.question
            assert a.endswith(".") and MARKER in a
        # the example next to the question shows the same kind of first step
        last_q = blocks[-2].split("\nAnswer: ")[0].removeprefix("Question: ")
        assert next(s for s in task.shot_pool() if s.question == last_q).kind.split("+")[0] == \
            p.kind.split("+")[0]
    assert len(train) == 400  # the pool is drawn from the training split's own stream


def test_structure_shots_share_the_questions_first_step_and_number_of_steps():
    """shot_match=structure: every example has the question's number of steps (the pool of
    64 holds at least 3 of each), the last one also its first operation; the default
    (first_operation) keeps the pinned prompts."""
    task = WordProblemTask(steps=(2, 3, 4), solution_style="lines", shot_match="structure")
    kind = {s.question: s.kind.split("+") for s in task.shot_pool()}
    for p in task.problems("test", 30):
        ops = p.kind.split("+")
        shots = [kind[b.split("\nAnswer: ")[0].removeprefix("Question: ")]
                 for b in p.prompt.split("\n\n")[:-1]]
        assert len(shots) == 3 and all(len(s) == len(ops) for s in shots), (ops, shots)
        assert shots[-1][0] == ops[0]
    default = WordProblemTask(steps=(2, 3, 4), solution_style="lines", number_range=(1, 5))
    digest = hashlib.sha256("\0".join(p.prompt for p in default.problems("test", 50)).encode())
    assert digest.hexdigest()[:16] == "e5c9c51d72221d7c"
    alike = WordProblemTask(steps=(2, 3, 4), solution_style="lines", number_range=(1, 5),
                            shot_match="structure")
    digest = hashlib.sha256("\0".join(p.prompt for p in alike.problems("test", 50)).encode())
    assert digest.hexdigest()[:16] == "2cfbaa187de92f5a"  # the banks' prompts, pinned


def test_operations_shots_end_on_the_questions_operations():
    """shot_match=operations: the last example has the question's operations in order where
    the pool (256) holds one, which it does for all but one of 64 questions; every example
    has the question's number of steps."""
    task = WordProblemTask(steps=(2, 2, 2, 3, 4), solution_style="lines", number_range=(1, 5),
                           shot_match="operations")
    kind = {s.question: s.kind for s in task.shot_pool()}
    assert len(kind) == 256
    exact = 0
    for p in task.problems("val", 64):
        shots = [kind[b.split("\nAnswer: ")[0].removeprefix("Question: ")]
                 for b in p.prompt.split("\n\n")[:-1]]
        assert all(len(s.split("+")) == len(p.values) for s in shots), (p.kind, shots)
        in_pool = p.kind in kind.values()
        assert (shots[-1] == p.kind) == in_pool
        if not in_pool:
            assert shots[-1].split("+")[0] == p.kind.split("+")[0]
        exact += shots[-1] == p.kind
    assert exact == 63


def test_zero_shots_and_chat_format():
    t = WordProblemTask(shots=0)
    p = t.problems("test", 1)[0]
    assert p.prompt == f"Question: {p.question}\nAnswer:"
    chat = WordProblemTask(shots=2, format="chat", instruction="Solve it.")
    p = chat.problems("test", 1)[0]
    blocks = p.prompt.split("\n\n")
    assert blocks[0] == "Solve it." and len(blocks) == 4 and blocks[-1] == f"Question: {p.question}"


def test_config_composes_validates_and_builds():
    cfg = validate(compose("pipeline", ["task=wordprob"]))
    task = build_task(cfg.task)
    assert isinstance(task, WordProblemTask)
    assert task.operations == DEFAULT_OPERATIONS and task.steps == (1,) and task.shots == 3
    assert {p.kind for p in task.problems("val", 30)} == {"add", "sub", "compare"}
    assert task.stop_sequences == ("\n\n", "\nQuestion:") and list(cfg.task.stop) == list(task.stop_sequences)
    assert task.shots == cfg.task.shots and task.number_range == tuple(cfg.task.number_range)
    p = task.problems("test", 1)[0]
    assert task.grade(p, " " + p.solution)
    cfg = validate(compose("pipeline", ["task=wordprob", "task.steps=[1,2]", "task.format=chat",
                                        "task.extraction=flexible"]))
    assert build_task(cfg.task).steps == (1, 2)
    with pytest.raises(ValueError, match="task.format"):
        validate(compose("pipeline", ["task=wordprob", "task.format=markdown"]))


def test_gsm8k_config_builds_a_qa_task(tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text('{"question": "1+1?", "answer": "1+1=2\\n#### 2"}\n' * 1)
    cfg = validate(compose("pipeline", ["task=gsm8k", f"task.path={data}"]))
    t = build_task(cfg.task)
    assert t.name == "qa"


def test_both_extraction_modes_on_saved_smollm2_paths():
    """48 completions SmolLM2-135M-Instruct wrote for this task (few-shot and chat format,
    temperature 0.7 and 1.0), saved by scripts/tune_wordprob.py."""
    import json
    from pathlib import Path

    paths = json.loads((Path(__file__).parent / "data" / "smollm2_wordprob_paths.json").read_text())
    strict = [answer_of(p["text"], "strict") for p in paths]
    flexible = [answer_of(p["text"], "flexible") for p in paths]
    assert len(paths) == 48 and sum(a != "" for a in strict) == 36
    assert sum(a == str(p["answer"]) for a, p in zip(strict, paths)) == 19
    assert sum(a == str(p["answer"]) for a, p in zip(flexible, paths)) == 23
    ends_marked = [re.search(r"The answer is \d+\.?$", p["text"]) is not None for p in paths]
    assert sum(ends_marked) == 33  # the usual ending: then both modes read the same number
    assert all(s == f for s, f, e in zip(strict, flexible, ends_marked) if e)
    text = next(p["text"] for p in paths if "the answer is not a number" in p["text"])
    assert answer_of(text, "strict") == "" and answer_of(text, "flexible") == "6"


def test_the_config_allows_what_the_task_knows():
    """The validator's lists (checked before any compute) are the task's own."""
    from stopexp.config.reads import ALLOWED
    from stopexp.tasks import wordprob
    assert ALLOWED["task.shot_match"] == wordprob.SHOT_MATCHES
    assert ALLOWED["task.solution_style"] == wordprob.SOLUTION_STYLES
    assert ALLOWED["task.extraction"] == wordprob.EXTRACTIONS
    # the ranges the schemas check are what the tasks can make
    from stopexp.config import task as schema
    from stopexp.tasks import datatotext
    assert schema.WORDPROB_OPERATIONS == wordprob.OPERATIONS
    assert (schema.SHOT_POOL, schema.OPERATIONS_POOL) == (wordprob.SHOT_POOL, wordprob.OPERATIONS_POOL)
    assert schema.SHOT_POOL == datatotext.SHOT_POOL
    WordProblemTask(steps=(schema.WORDPROB_MAX_STEPS,))
    with pytest.raises(ValueError, match="task.steps"):
        WordProblemTask(steps=(schema.WORDPROB_MAX_STEPS + 1,))
