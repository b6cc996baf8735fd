import json

import pytest

from conftest import ROOT, compose
from stopexp.config import ConfigError, validate
from stopexp.tasks import QATask, build_task
from stopexp.metrics.answers import canonical
from stopexp.metrics.answers import extract_answer as extract
from stopexp.tasks.qa import TaskFileError, read_rows

GSM8K = ROOT / "tests" / "data" / "gsm8k_sample.jsonl"
MATH = ROOT / "tests" / "data" / "math_sample.jsonl"
SPREAD = {"train": 0.5, "val": 0.25, "test": 0.25}  # the sample files are small


def gsm8k(**kw):
    return QATask(str(GSM8K), "numeric", split_fractions=SPREAD, **kw)


@pytest.mark.parametrize("fmt, a, b", [
    ("numeric", "0.5", "1/2"), ("numeric", ".5", "0.5"), ("boxed", "\\frac{1}{2}", "0.5"),
    ("boxed", "\\dfrac12", "1/2"), ("numeric", "1,000", "1000"), ("numeric", "$1,000.", "1000"),
    ("boxed", "-\\frac{3}{4}", "-0.75"), ("boxed", "180^\\circ", "180"), ("boxed", "1{,}500", "1500"),
    ("numeric", "72 apples", "72"), ("boxed", "\\text{(2, 1)}", "(2,1)"), ("boxed", "x + 1", "x+1"),
    ("numeric", "3.0", "3"), ("numeric", "+7", "7"),
])
def test_equivalent_answers_share_one_canonical_form(fmt, a, b):
    assert canonical(a, fmt) == canonical(b, fmt) != ""


@pytest.mark.parametrize("a, b", [("1/2", "0.6"), ("1,000", "100"), ("x+1", "x-1"), ("12", "1,2")])
def test_different_answers_differ(a, b):
    assert canonical(a, "boxed") != canonical(b, "boxed")


def test_extraction_takes_the_first_mark_and_the_last_box():
    # GSM8K's grader and lm-evaluation-harness' strict-match read the first mark: what a
    # model invents after its answer (a new question and its answer) does not count
    assert extract("so 3.\n#### 4\nQuestion: ...\n#### 42", "numeric") == "4"
    assert extract("\\boxed{1} then \\boxed{\\frac{1}{2}}", "boxed") == "\\frac{1}{2}"
    assert extract("no mark but \\boxed{7}", "numeric") == "7"
    assert extract("#### 9", "boxed") is None  # boxed format reads \boxed only
    assert extract("\\boxed 5$", "boxed") == "5"


@pytest.mark.parametrize("text", [
    "", "####", "#### ", "\\boxed{", "\\boxed{\\frac{1}{", "\\boxed", "\\boxed $", "\\boxed{}",
    "#### 1/0", "\\boxed{\\frac{1}{0}}", "#### " + "9" * 5000, "#### 1e999999", "}}}{{{",
    "#### \\frac{}{}", "\x00\\boxed{\udcff}",
    "#### 9^9^9^9", "\\boxed{10^{10^{10}}}", "#### " + "1+" * 2000 + "1", "\\boxed{" + "(" * 500 + "1" + ")" * 500 + "}",
])
def test_malformed_completions_are_wrong_never_a_crash(text):
    t = gsm8k()
    problem = t.problems("train", 1)[0]
    for task in (t, QATask(str(MATH), "boxed", question_key="problem", answer_key="solution",
                           split_fractions=SPREAD)):
        assert task.grade(problem, text) is False
        assert isinstance(task.answer_of(text), str)


def test_gsm8k_style_file_checks_and_references():
    t = build_task(compose("collect", ["task=gsm8k", f"task.path={GSM8K}",
                                       "task.split_fractions={train: 0.5, val: 0.25, test: 0.25}"]).task)
    problems = [p for s in ("train", "val", "test") for p in t.problems(s, len(t.split_rows[s]))]
    assert len(problems) == 16 and {p.split for p in problems} == {"train", "val", "test"}
    by_row = {p.source_row: p for p in problems}
    tom = by_row[0]
    assert tom.answer == "29" and tom.prompt.startswith("Tom has 3 boxes") and "####" in tom.prompt
    assert t.grade(tom, "36 - 7 = 29\n#### 29") and t.grade(tom, "so \\boxed{29}")
    assert t.grade(tom, "#### 29.0") and not t.grade(tom, "#### 28") and not t.grade(tom, "29")
    assert t.reference(tom).endswith("#### 29")
    assert t.diagnose(tom, "anything") == {"style": "n/a", "first_error": -1}
    assert by_row[3].answer == "900" and by_row[5].answer == "1/2" and by_row[15].answer == "81/2"
    assert t.grade(by_row[5], "#### 1/2") and t.answer_of("#### .5") == "1/2"


def test_math_style_file_with_boxed_answers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in MATH.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "math.parquet")
    cfg = compose("collect", ["task=math", f"task.path={tmp_path / 'math.parquet'}"])
    t, from_jsonl = build_task(cfg.task), QATask(str(MATH), "boxed", question_key="problem",
                                                 answer_key="solution")
    assert t.split_rows == from_jsonl.split_rows  # Parquet and JSONL read the same rows
    answers = {p.source_row: p for s in t.split_rows for p in t.problems(s, len(t.split_rows[s]))}
    assert [answers[i].answer for i in range(10)] == [
        "1/2", "-3", "180", "15", "23", "x+1", "1500", "3/4", "(2,1)", "6"]
    assert answers[0].prompt.endswith("within \\boxed{}.")
    assert t.grade(answers[0], "so it is $\\boxed{0.5}$") and t.grade(answers[7], "\\boxed{\\frac34}")
    assert not t.grade(answers[0], "#### 0.5")


def test_split_is_fixed_by_the_seed_and_disjoint():
    a, b, other = gsm8k(seed=0), gsm8k(seed=0), gsm8k(seed=1)
    assert a.split_rows == b.split_rows and a.split_rows != other.split_rows
    rows = [r for s in a.split_rows.values() for r in s]
    assert sorted(rows) == list(range(16))  # every row in exactly one split
    first = [p.prompt for p in a.problems("train", 3)]
    assert first == [p.prompt for p in a.problems("train", 5)][:3]  # a prefix, as for arith
    with pytest.raises(ValueError, match="lower collect.prompts.val"):
        a.problems("val", 100)


def test_file_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="task.path: .*not a readable"):
        QATask(str(tmp_path / "missing.jsonl"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="nor a hub dataset available here") as e:
        QATask("nobody/not-a-dataset")
    assert "task.path=/path/to/file.jsonl" in str(e.value)


OK = json.dumps({"question": "1+1?", "answer": "#### 2"})


@pytest.mark.parametrize("name, content, message", [
    # JSON Lines: the file's line (not the line within one row) and the decoder's column
    ("a.jsonl", f"{OK}\n{OK[:-1]}\n", r"a.jsonl, line 2 column 40: invalid JSON \(Expecting ',' "
                                      r"delimiter\); expected one JSON object per line"),
    ("a.jsonl", f"{OK}\n\n{OK}\n[1, 2]\n", r"a.jsonl, line 4: a list where an object with the fields "
                                          r"'question' and 'answer' is expected"),
    ("a.jsonl", f"{OK}\n\"just text\"\n", r"line 2: a string where an object"),
    ("a.jsonl", f"{OK}\nnull\n", r"line 2: null where an object"),
    ("a.jsonl", b'{"question": "caf\xe9?", "answer": "1"}\n', r"a.jsonl, line 1 column 18: byte 0xe9 "
                                                            r"is not UTF-8; save the file as UTF-8"),
    ("a.jsonl", f"{OK}\n".encode() + b'{"question": "\xff", "answer": "1"}', r"line 2 column 15: byte 0xff"),
    ("a.jsonl", "", r"a.jsonl: the file is empty; expected one JSON object per line"),
    ("a.jsonl", "\n  \n", r"the file is empty"),
    ("a.jsonl", '{"question": null, "answer": "#### 2"}', r"line 1: field 'question' is null; "
                                                        r"expected a string \(or a number\)"),
    ("a.jsonl", '{"question": "q", "answer": ["#### 2"]}', r"line 1: field 'answer' is list"),
    ("a.jsonl", '{"question": "q", "answer": true}', r"line 1: field 'answer' is bool"),
    ("a.jsonl", '{"question": "  ", "answer": "#### 2"}', r"line 1: field 'question' is empty; "
                                                        r"expected the question"),
    ("a.jsonl", '{"q": "1+1?", "answer": "2"}', r"line 1: no field 'question' \(it has \['answer', "
                                               r"'q'\]\); set task.question_key"),
    ("a.jsonl", '{"question": "q", "answer": "#### two"}', r"line 1: field 'answer' \('#### two'\) "
                                                         r"states no number; expected a numeric"),
    # JSON: the decoder's line and column in the whole file; the item's own line
    ("a.json", f"[\n  {OK},\n  {OK[:-1]}\n]", r"a.json, line 4 column 1: invalid JSON \(Expecting ',' delimiter\)"),
    ("a.json", f"[\n  {OK},\n  7\n]", r"a.json, line 3 \(item 1\): int where an object"),
    ("a.json", f"[{OK}, {'7' * 5000}]", r"a.json, line 1 \(item 1\): int where an object"),  # past int()'s limit
    ("a.json", f"[{OK}, {OK}", r"line 1 column \d+: expected ',' or ']' after a list item"),
    ("a.json", f"[{OK}] x", r"a.json, line 1: text after the end of the JSON list"),
    ("a.json", '{\n "data": []\n}', r"a.json, line 1 column 2: invalid JSON .*a JSON object spanning "
                                   r"several lines is not a task file"),
    ("a.json", "[]", r"a.json: the file holds no rows"),
    ("a.json", f'{{"data": [{OK}]}}', r"line 1: no field 'question' \(it has \['data'\]\); set "
                                     r"task.question_key .*; the rows seem to sit under 'data'"),
    ("a.json", '"text"', r"line 1: a string where an object"),
    ("a.csv", "question,answer\n1+1?,2\n", r"a.csv: a .csv file; allowed: a .jsonl/.json/.parquet "
                                            r"file or a hub dataset id"),
    ("a.parquet", b"PAR1 not really", r"a.parquet: not a readable Parquet file .*expected a Parquet "
                                      r"table with the question and answer columns"),
])
def test_bad_task_files_name_file_line_and_expectation(tmp_path, name, content, message):
    f = tmp_path / name
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TaskFileError, match=message):
        QATask(str(f))


def test_json_list_and_bom_read_like_jsonl(tmp_path):
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=2))
    (tmp_path / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + GSM8K.read_bytes())  # a byte-order mark
    (tmp_path / "c.json").write_bytes(GSM8K.read_bytes())  # JSON Lines named .json (datasets' to_json)
    for f in ("a.json", "b.jsonl", "c.json"):
        assert QATask(str(tmp_path / f), split_fractions=SPREAD).split_rows == gsm8k().split_rows
    assert read_rows(str(tmp_path / "a.json"))[1][0] == "line 6 (item 1)"  # where the item starts


def test_an_integer_past_pythons_conversion_limit_is_an_answer_not_a_crash(tmp_path):
    huge = "9" * 5000  # more digits than int() converts (4300): json.loads raises ValueError
    rows = [f'{{"question": "q{i}", "answer": {huge if i == 0 else i}}}' for i in range(8)]
    with pytest.raises(ValueError, match="Exceeds the limit"):
        json.loads(rows[0])
    (tmp_path / "a.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "a.json").write_text("[" + ",\n".join(rows) + "]")
    for name in ("a.jsonl", "a.json"):
        task = QATask(str(tmp_path / name), split_fractions=SPREAD)
        problems = [p for s, rows_of in task.split_rows.items() for p in task.problems(s, len(rows_of))]
        first = next(p for p in problems if p.source_row == 0)
        assert first.answer == huge and first.reference == huge
        assert task.grade(first, f"so #### {huge}") and not task.grade(first, f"#### {huge[:-1]}8")


def test_qa_configs_validate():
    for name in ("gsm8k", "math"):
        cfg = validate(compose("pipeline", [f"task={name}"]))
        assert cfg.task.name == "qa"
    with pytest.raises(ConfigError, match="task.prompt_template"):
        validate(compose("collect", ["task=gsm8k", "task.prompt_template=no placeholder"]))
    with pytest.raises(ConfigError, match="task.answer_format"):
        validate(compose("collect", ["task=gsm8k", "task.answer_format=words"]))
    with pytest.raises(ConfigError, match="task.path"):
        validate(compose("collect", ["task=gsm8k", "task.path=null"]))


def test_extraction_mode_is_configured_checked_and_recorded():
    from omegaconf import OmegaConf

    with pytest.raises(ConfigError, match="task.extraction: 'loose' is not allowed; allowed: strict, flexible"):
        validate(compose("collect", ["task=gsm8k", "task.extraction=loose"]))
    cfg = validate(compose("collect", ["task=gsm8k", f"task.path={GSM8K}", "task.extraction=flexible",
                                       "task.split_fractions={train: 0.5, val: 0.25, test: 0.25}"]))
    assert OmegaConf.to_container(cfg.task)["extraction"] == "flexible"  # the bank's meta.json "task"
    flexible, strict = build_task(cfg.task), gsm8k()
    tom = flexible.problems("train", len(flexible.split_rows["train"]))
    tom = next(p for p in tom if p.source_row == 0)
    unmarked = "36 - 7 = 29 pencils are left."
    assert flexible.grade(tom, unmarked) and not strict.grade(tom, unmarked)
    assert flexible.answer_of("#### 29\nQuestion: 5 more") == strict.answer_of("#### 29") == "29"
    assert compose("collect", ["task=arith"]).task.extraction == "strict"  # the default
