"""The benchmarks shipped in stopexp/tasks/data/: each task reads its file with no network
(task=gsm8k, math, aime24, aime25, hmmt25, amc23 with no task.path), holds the source's
number of problems with its first and last gold answers, and the grader accepts the gold
solution text; a hub id or another file replaces the shipped data."""
from __future__ import annotations

import fnmatch
import socket

import pytest

from stopexp.config.validation import validate
from stopexp.core.errors import NotFound
from stopexp.runtime.integrity import file_sha256
from stopexp.store.keys import task_content
from stopexp.tasks import build_task
from stopexp.tasks.benchmarks import BENCHMARKS, DATA, shipped_file
from stopexp.tasks.qa import read_rows
from tests.conftest import ROOT, compose

# task -> (shipped file, problems, (first id, its gold answer), (last id, its gold answer)):
# the gold answers as the task reads them (canonical: 204, 1/576, math-verify's LaTeX)
PINNED = {
    "gsm8k": ("gsm8k", 1319, ("0", "18"), ("1318", "14")),
    "math": ("math500", 500, ("test/precalculus/807.json", r"(3,\frac{\pi}{2})"),
             ("test/geometry/615.json", "106")),
    "aime24": ("aime24", 30, ("2024-I-1", "204"), ("2024-II-9", "902")),
    "aime25": ("aime25", 30, ("2025-I-1", "70"), ("2025-II-15", "240")),
    "hmmt25": ("hmmt25", 30, ("2025-feb-1", "103"), ("2025-feb-30", r"\sqrt{\frac{95}{24}}")),
    "amc23": ("amc23", 40, ("2023-12A-1", "27"), ("2023-12B-9", "8")),
}


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt, and any hub dataset load, fails the test."""
    import datasets

    def refuse(*args, **kwargs):
        raise AssertionError("a shipped benchmark reached for the network or the hub")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(datasets, "load_dataset", refuse)


def tasks():
    return {name: build_task(validate(compose("collect", [f"task={name}"])).task) for name in PINNED}


def by_row(task) -> dict:
    """Every problem of every split, by its row in the source file."""
    return {p.source_row: p for split, rows in task.split_rows.items()
            for p in task.problems(split, len(rows))}


def test_every_benchmark_task_reads_its_shipped_file_offline(no_network):
    assert sorted(f for f, *_ in PINNED.values()) == sorted(BENCHMARKS)
    for name, task in tasks().items():
        file, n, (first_id, first), (last_id, last) = PINNED[name]
        assert task.path == file
        rows = read_rows(file)
        problems = by_row(task)
        assert len(rows) == len(problems) == n, name
        assert (rows[0][1]["id"], problems[0].answer) == (first_id, first), name
        assert (rows[-1][1]["id"], problems[n - 1].answer) == (last_id, last), name
        # the bank's hash counts the shipped file's content, as for any local file
        assert task_content(compose("collect", [f"task={name}"]).task) == \
            "sha256:" + file_sha256(shipped_file(file))


def test_the_grader_accepts_the_gold_solutions(no_network):
    t = tasks()
    gsm8k, math = by_row(t["gsm8k"]), by_row(t["math"])
    # GSM8K's worked solutions end in "#### <number>"; MATH-500's in a \boxed{} answer
    for task, problems, rows in ((t["gsm8k"], gsm8k, (0, 1, 1318)), (t["math"], math, (0, 1, 499))):
        for row in rows:
            assert task.grade(problems[row], problems[row].reference)
    assert gsm8k[0].reference.endswith("#### 18") and not t["gsm8k"].grade(gsm8k[0], "#### 17")
    assert t["math"].grade(math[0], r"so it is $\boxed{(3, \pi/2)}$.")  # equivalent, not equal
    assert not t["math"].grade(math[0], r"\boxed{(3, \pi)}")
    # the competitions ship bare answers: a boxed gold answer is right, the next integer wrong
    for name in ("aime24", "aime25", "amc23"):
        problems = by_row(t[name])
        for p in problems.values():
            assert t[name].grade(p, f"Therefore the answer is $\\boxed{{{p.answer}}}$.")
            assert not t[name].grade(p, f"\\boxed{{{int(p.answer) + 1}}}")
    hmmt = by_row(t["hmmt25"])
    assert t["hmmt25"].grade(hmmt[2], r"\boxed{\dfrac{1}{576}}")
    assert hmmt[9].answer == r"\frac{-1+\sqrt{17}}{2},\frac{-1-\sqrt{17}}{2}"  # two values
    assert t["hmmt25"].grade(hmmt[9], r"\boxed{\frac{-1-\sqrt{17}}{2}, \frac{-1+\sqrt{17}}{2}}")
    assert not t["hmmt25"].grade(hmmt[9], r"\boxed{\frac{-1+\sqrt{17}}{2}}")


def test_a_hub_id_or_a_file_replaces_the_shipped_data(tmp_path):
    rows = tmp_path / "two.jsonl"
    rows.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    cfg = validate(compose("collect", ["task=gsm8k", f"task.path={rows}"]))
    assert sum(map(len, build_task(cfg.task).split_rows.values())) == 2
    # the hub: read with the subset and split the config names (offline here,
    # so the message says which names would have worked)
    cfg = validate(compose("collect", ["task=gsm8k", "task.path=openai/gsm8k"]))
    assert (cfg.task.subset, cfg.task.source_split) == ("main", "train")
    with pytest.raises(NotFound, match=r"'openai/gsm8k' is neither a shipped benchmark \(gsm8k, "
                                       r"math500, aime24, aime25, hmmt25, amc23\), a local"):
        build_task(cfg.task)


def test_the_wheel_ships_every_data_file_with_its_license():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = sorted(p.relative_to(DATA.parent.parent).as_posix() for p in DATA.iterdir())
    assert all(any(fnmatch.fnmatch(f, pat) for pat in patterns["stopexp"]) for f in files)
    readme = (DATA / "README.md").read_text()
    licenses = [p.name for p in DATA.glob("LICENSE.*")]
    assert len(licenses) == 4 and all(f"`{name}`" in readme for name in licenses)
    assert all(f"`{name}.jsonl` | {PINNED[t][1]} |" in readme
               for t, (name, *_) in PINNED.items())
