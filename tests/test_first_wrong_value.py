"""Multi-step word problems: their intermediate values, the first-wrong-value locator (text
and tokens), where failing paths go wrong, and error_oracle with its refusals."""
import re

import pytest
import torch

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.evaluation.first_errors import error_timing, timing_lines
from stopexp.search.trace import first_wrong_value as token_of_first_wrong_value
from stopexp.search.trace import has_values, prefix_holding
from stopexp.signals.methods import error_oracle
from stopexp.tasks import build_task
from stopexp.tasks.arith import ArithTask
from stopexp.tasks.wordprob import (_EQUATION, MARKER, WordProblem, WordProblemTask,
                                    first_wrong_value)

MULTI = dict(steps=(2, 3, 4), number_range=(2, 9), operations={"add": 1, "sub": 1, "compare": 1},
             solution_style="lines")


def test_pinned_multistep_problem_and_its_values():
    p = WordProblemTask(**MULTI, shots=0).problems("test", 1)[0]
    assert p.question == ("Zoe has 4 stamps. She loses 3. Then she finds 7 more. Then she buys 3 "
                          "more. How many stamps does Zoe have now?")
    assert p.solution == ("Zoe has 4 stamps and loses 3, so 4 - 3 = 1. Now Zoe has 1 stamp.\n"
                          "Then she finds 7 more, so 1 + 7 = 8. Now Zoe has 8 stamps.\n"
                          "Then she buys 3 more, so 8 + 3 = 11. Now Zoe has 11 stamps.\n"
                          "The answer is 11.")
    assert p.values == (1, 8, 11) and p.answer == 11 and p.kind == "sub+add+add"
    inline = WordProblemTask(**{**MULTI, "solution_style": "inline"}, shots=0).problems("test", 1)[0]
    assert inline.question == p.question and inline.values == p.values  # only the text differs
    assert inline.solution == ("Zoe has 4 stamps and loses 3, so 4 - 3 = 1. Then she finds 7 more, "
                               "so 1 + 7 = 8. Then she buys 3 more, so 8 + 3 = 11. The answer is 11.")


def test_values_are_the_solutions_equation_results():
    task = WordProblemTask(**{**MULTI, "operations": {"add": 1, "sub": 1, "compare": 1, "count": 1}})
    problems = task.problems("val", 80)
    assert {len(p.values) for p in problems} == {2, 3, 4}
    assert {p.kind.split("+")[0] for p in problems} == {"add", "sub", "compare", "count"}
    for p in problems:
        assert [int(m.group(6)) for m in _EQUATION.finditer(p.solution)] == list(p.values)
        assert p.values[-1] == p.answer and p.solution.endswith(f"\n{MARKER} {p.answer}.")
        assert p.solution.count("\n") == len(p.values)  # a line per step, then the answer
        assert first_wrong_value(p, p.solution) is None and task.grade(p, p.solution)


PROBLEM = WordProblem(0, "test", "q", "q", 11, "", "sub+add+add", (1, 8, 11))


@pytest.mark.parametrize("text, end", [
    ("4 - 3 = 1. 1 + 7 = 8. 8 + 3 = 11. The answer is 11.", None),
    ("4 - 3 = 2. 2 + 7 = 9. 9 + 3 = 12. The answer is 12.", 9),     # the first value
    ("4 - 3 = 1. 1 + 7 = 9. 9 + 3 = 12. The answer is 12.", 20),    # arithmetic, second step
    ("4 - 3 = 1. 1 + 6 = 7. 7 + 3 = 10.", 20),                      # right sum, wrong operand
    ("4 - 3 = 1. 1 + 7 = 8. 8 + 3 = 11. The answer is 12.", 50),    # only the answer
    ("4 - 3 = 1. 1 + 7 = 8. 8 + 3 = 11. 11 = 11 + 0 = 11.", None),  # restated: no wrong value
    ("4 - 3 = 1. 1 + 7 = 8. 8 + 3 = 11. 11 + 1 = 12.", 45),         # beyond the steps: the answer
    ("4 - 3 = 1. 1 + 7 = 8.", None),                                 # breaks off: nothing wrong
    ("The answer is 11. Then 2 + 2 = 5.", None),                    # after the answer: not read
    ("", None),
])
def test_first_wrong_value_on_hand_written_paths(text, end):
    assert first_wrong_value(PROBLEM, text) == end
    if end is not None:  # the offset is just past the wrong number's last digit
        assert re.fullmatch(r"\d", text[end - 1]) and not text[end:end + 1].isdigit()


class PieceTokenizer:
    """Token i decodes to PIECES[i]: multi-character tokens, as a BPE vocabulary has."""
    PIECES = [" 4", " -", " 3", " =", " ", "1", "0", ".", " The", " answer", " is", " 1", "1"]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.PIECES[i] for i in ids)


def test_prefix_holding_counts_the_tokens_up_to_the_wrong_value():
    tok, ids = PieceTokenizer(), list(range(len(PieceTokenizer.PIECES)))
    text = tok.decode(ids)  # " 4 - 3 = 10. The answer is 11."
    assert [prefix_holding(tok, ids, e) for e in (1, 2, 3, 10, 11, len(text))] == [1, 1, 2, 6, 7, 13]
    problem = WordProblem(0, "test", "q", "q", 1, "", "sub", (1,))
    assert first_wrong_value(problem, text) == 11  # "10" ends before character 11 ...
    assert token_of_first_wrong_value(tok, WordProblemTask(), problem, ids, text) == 7  # ... token 7: "0"
    assert has_values(WordProblemTask()) and not has_values(ArithTask())  # no column without values


def test_error_oracle_scores_low_once_the_error_is_written():
    batch = {"first_wrong_value": torch.tensor([-1, 5, 20, 21, 0]),
             "prefix_len": torch.tensor([20.0, 20.0, 20.0, 20.0, 3.0])}
    assert error_oracle(batch).tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="error_oracle: these paths carry no first_wrong_value"):
        error_oracle({"prefix_len": torch.tensor([1.0])})


def test_error_timing_by_hand():
    # 6 paths: lengths 100; first wrong value at -1 (none), 10, 30, 60, 15, -1; outcomes:
    length = [100] * 6
    correct = [True, False, False, False, True, False]
    wrong = [-1, 10, 30, 60, 15, -1]
    t = error_timing(length, correct, wrong, checks=[20, 40])
    assert t["paths"] == 6 and t["failing"] == 4
    assert t["failing_with_wrong_value"] == 0.75            # 3 of the 4 failing
    assert t["failing_error_within"] == {"20%": 0.25, "50%": 0.5}
    assert t["early_error_paths"] == {"20%": 2, "50%": 3}   # 10, 15 | 10, 30, 15
    assert t["accuracy_early_error"] == {"20%": 0.5, "50%": round(1 / 3, 4)}
    assert t["accuracy_no_early_error"] == {"20%": 0.25, "50%": round(1 / 3, 4)}
    assert t["accuracy_wrong_value"] == 0.25 and t["accuracy_no_wrong_value"] == 0.5
    assert t["failing_error_by_check"] == {"20": 0.25, "40": 0.5}
    assert timing_lines(t)[0].startswith("first wrong intermediate value: 4 of 6 paths fail; "
                                         "of those, 75.0% write a wrong value, 25.0% within the "
                                         "first 20% of the path, 50.0% within the first 50%")
    none = error_timing([10], [True], [-1])
    assert none["accuracy_wrong_value"] is None and none["failing_with_wrong_value"] is None


def test_multistep_experiment_validates():
    cfg = validate(compose("pipeline", ["+exp=smollm2_multistep", "engine=hf"]))
    assert "error_oracle" in cfg.evaluate.methods and build_task(cfg.task).solution_style == "lines"


@pytest.mark.parametrize("overrides, message", [
    (["evaluate.methods=[error_oracle]"],
     "evaluate.methods: error_oracle needs paths whose intermediate values are known "
     "(tasks: wordprob); task 'arith' has none"),
    (["task=wordprob", "model.chat_template=false", "evaluate.methods=[error_oracle]",
      "evaluate.mode=online"],
     "evaluate.methods: error_oracle reads the trace bank's first_wrong_value, which only "
     "replayed paths carry"),
    (["task=wordprob", "model.chat_template=false", "task.solution_style=table"],
     "task.solution_style"),
])
def test_refusals_name_the_key(overrides, message):
    with pytest.raises((ConfigError, ValueError), match=re.escape(message)):
        validate(compose("pipeline", overrides))


def test_solution_style_is_read_only_by_wordprob():
    with pytest.raises(ConfigError, match="task.solution_style"):
        validate(compose("pipeline", ["task.solution_style=lines"]))  # task=arith
