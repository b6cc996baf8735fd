"""Question answering from a file: GSM8K-style numeric answers (``#### 42``) and MATH-style
``\\boxed{...}`` answers, read from a benchmark shipped with the package
(`stopexp.tasks.benchmarks`: gsm8k, math500, aime24, ...), a local JSONL / JSON / Parquet
file or a `datasets` hub id (which must already be in the local cache when offline).

Answers are read and compared by `stopexp.metrics.answers` (strict or flexible extraction,
one canonical string per equivalent answer, math-verify for LaTeX). A completion without a
readable answer is wrong, never an error. A question's split is a hash of the task seed and
the question, so the split is fixed by the seed and a question never sits in two splits.

A bad task file fails at start-up with a `TaskFileError` naming the file, the line (JSON
Lines: the line; JSON: the decoder's line and column; Parquet and hub datasets: the row)
and what is expected.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from stopexp.core import jsonfile
from stopexp.core.errors import ConfigError, NotFound, UserError, error_text
from stopexp.runtime.hub import offline_unless_reachable
from stopexp.metrics.answers import FORMATS, MODES, canonical, equivalent, extract_answer
from stopexp.tasks.task import Task
from stopexp.tasks.benchmarks import BENCHMARKS, shipped_file

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
EXPECTED = ("one JSON object per line (JSON Lines), or a JSON list of objects, each with "
            "the question and answer fields")


class TaskFileError(UserError, ValueError):
    """A task file that cannot be read as questions and answers (names file and line)."""


@dataclass(frozen=True)
class QAProblem:
    prompt_id: int       # index within its split, as for the embedded task
    split: str
    prompt: str          # the question in task.prompt_template
    answer: str          # canonical reference answer
    reference: str       # the reference solution as given (for text metrics)
    source_row: int      # row in the source file


def _fail(path, where: str, what: str) -> TaskFileError:
    return TaskFileError(f"task.path: {path}{', ' + where if where else ''}: {what}")


def _decode(path: Path) -> str:
    """The file as text (UTF-8, a leading byte-order mark allowed)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _fail(path, "", f"cannot be read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _fail(path, f"line {line} column {column}",
                    f"byte 0x{data[e.start]:02x} is not UTF-8; save the file as UTF-8") from None


def _json_error(path: Path, e: json.JSONDecodeError, line_offset: int = 0) -> TaskFileError:
    return _fail(path, f"line {e.lineno + line_offset} column {e.colno}",
                 f"invalid JSON ({e.msg}); expected {EXPECTED}")


def _json_array(path: Path, text: str) -> list[tuple[str, object]]:
    """The items of a JSON list, each with the line it starts on."""
    decoder, rows = jsonfile.DECODER, []
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "]" and not rows:
            break
        try:
            item, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise _json_error(path, e) from None
        rows.append((f"line {text.count(chr(10), 0, i) + 1} (item {len(rows)})", item))
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "]":
            break
        if i >= len(text) or text[i] != ",":
            line = text.count("\n", 0, i) + 1
            column = i - (text.rfind("\n", 0, i) + 1) + 1
            raise _fail(path, f"line {line} column {column}",
                        "expected ',' or ']' after a list item (the JSON list is not closed)")
        i += 1
    if text[i + 1:].strip():
        line = text.count("\n", 0, i + 1) + 1
        raise _fail(path, f"line {line}", "text after the end of the JSON list")
    return rows


def _json_rows(path: Path) -> list[tuple[str, object]]:
    text = _decode(path)
    if not text.strip():
        raise _fail(path, "", f"the file is empty; expected {EXPECTED}")
    if text.lstrip().startswith("["):
        rows = _json_array(path, text)
        if not rows:
            raise _fail(path, "", f"the file holds no rows (an empty list); expected {EXPECTED}")
        return rows
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"line {n}", jsonfile.loads(line)))
        except json.JSONDecodeError as e:
            if e.msg.startswith("Expecting") and line.lstrip().startswith("{") and n == 1:
                raise _fail(path, f"line {n} column {e.colno}",
                            f"invalid JSON ({e.msg}); a JSON object spanning several lines is "
                            f"not a task file: expected {EXPECTED}") from None
            raise _json_error(path, e, n - 1) from None
    return rows


def read_rows(path: str, subset: str | None = None,
              source_split: str = "test") -> list[tuple[str, object]]:
    """(where, row) pairs of a shipped benchmark (`path` one of BENCHMARKS), a local file,
    or a hub dataset (from the local cache when offline; `subset` and `source_split` apply
    to hub datasets only). `where` names the row for messages: ``line 12`` (JSON Lines),
    ``line 40 (item 3)`` (JSON list), ``row 7`` (Parquet, hub). Raises FileNotFoundError for a
    missing file or dataset, TaskFileError for one that cannot be read."""
    p = shipped_file(path) or Path(path).expanduser()
    if p.is_file() and p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(p)
        except (pa.ArrowException, OSError) as e:
            raise _fail(p, "", f"not a readable Parquet file ({error_text(e)}); expected a Parquet table "
                               "with the question and answer columns") from None
        if not table.num_rows:
            raise _fail(p, "", "the Parquet table has no rows")
        return [(f"row {i}", r) for i, r in enumerate(table.to_pylist())]
    if p.is_file() and p.suffix in (".jsonl", ".json"):
        return _json_rows(p)
    if p.exists() and p.suffix not in FILE_SUFFIXES:
        raise _fail(p, "", f"a {p.suffix or 'suffix-less'} {'folder' if p.is_dir() else 'file'}; "
                           f"allowed: a {'/'.join(FILE_SUFFIXES)} file or a hub dataset id")
    if p.suffix in FILE_SUFFIXES or p.exists():
        raise NotFound(f"task.path: {path!r} is not a readable "
                       f"{'/'.join(FILE_SUFFIXES)} file")
    from datasets import load_dataset

    try:
        with offline_unless_reachable():  # no hub: the cache only, failing at once
            return [(f"row {i}", r) for i, r in enumerate(load_dataset(path, subset, split=source_split))]
    except Exception as e:  # offline, unknown id, missing split: all mean "not available here"
        raise NotFound(
            f"task.path: {path!r} is neither a shipped benchmark ({', '.join(BENCHMARKS)}), a "
            f"local {'/'.join(FILE_SUFFIXES)} file nor a hub dataset available here "
            f"({error_text(e)}). Without "
            f"internet, save it as JSONL or Parquet where you have internet and set "
            f"task.path=/path/to/file.jsonl") from e


def _field(path, where: str, row, key: str, config_key: str, other: str) -> str:
    """row[key] as a stripped string; TaskFileError naming the row when the row is not an
    object, or the field is absent, null, empty or not a string or number."""
    if not isinstance(row, dict):
        kind = {list: "a list", str: "a string", type(None): "null",
                jsonfile.LongInt: "int"}.get(type(row), type(row).__name__)
        raise _fail(path, where, f"{kind} where an object with the fields {key!r} and {other!r} "
                                 "is expected")
    if key not in row:
        nested = [k for k, v in row.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
        hint = (f"; the rows seem to sit under {nested[0]!r}: save them as a JSON list or JSON "
                "Lines" if len(row) == 1 and nested else "")
        raise _fail(path, where, f"no field {key!r} (it has {sorted(row)}); set {config_key} "
                                 f"to the field that holds it{hint}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        kind = "null" if value is None else type(value).__name__
        raise _fail(path, where, f"field {key!r} is {kind}; expected a string (or a number)")
    if not str(value).strip():
        raise _fail(path, where, f"field {key!r} is empty; expected the {config_key[5:-4]}")
    return str(value).strip()


class QATask(Task):
    """Questions and reference answers from `path`; equivalent answers in `answer_format`
    vote as one.

    extraction: ``strict`` (``####`` / ``\\boxed{}``) or ``flexible`` (also the last number
    of a completion that has no marked answer); see `stopexp.metrics.answers`."""

    name = "qa"
    text_level = "word"  # text metrics compare words (natural language)
    step_separator = "\n"
    answer_format = "numeric"  # the section's task.answer_format, set by __init__

    def __init__(self, path: str, answer_format: str = "numeric", prompt_template: str = "{question}",
                 question_key: str = "question", answer_key: str = "answer", subset: str | None = None,
                 source_split: str = "test", seed: int = 0, split_fractions: dict | None = None,
                 extraction: str = "strict"):
        if answer_format not in FORMATS or extraction not in MODES:
            raise ConfigError(f"task.answer_format {answer_format!r} / task.extraction {extraction!r}: "
                              f"allowed {', '.join(FORMATS)} / {', '.join(MODES)}")
        self.path, self.answer_format, self.seed = path, answer_format, seed
        self.extraction = extraction
        self.split_fractions = dict(split_fractions or {"train": 0.8, "val": 0.1, "test": 0.1})
        self._by_split: dict[str, list] = {s: [] for s in self.split_fractions}
        seen = set()
        for row_no, (where, row) in enumerate(read_rows(path, subset, source_split)):
            question = _field(path, where, row, question_key, "task.question_key", answer_key)
            reference = _field(path, where, row, answer_key, "task.answer_key", question_key)
            if question in seen:  # a repeated question would repeat its paths' random streams
                continue
            seen.add(question)
            # the reference's marked answer (always read strictly), else the whole field
            answer = canonical(extract_answer(reference, answer_format) or reference, answer_format)
            if not answer:
                raise _fail(path, where, f"field {answer_key!r} ({reference[-60:]!r}) states no "
                                         f"{'number' if answer_format == 'numeric' else 'answer'}"
                                         f"; expected a {answer_format} answer (task.answer_format)")
            prompt = prompt_template.replace("{question}", question)
            self._by_split[self.split_of(question)].append(
                (self._hash(question), prompt, answer, reference, row_no))
        for rows in self._by_split.values():
            rows.sort()  # a seeded order, so the first n questions of a split are a random sample

    @classmethod
    def from_config(cls, task_cfg) -> "QATask":
        """The task of a task section (task=qa), its text decoded (stopexp.tasks.build_task)."""
        return cls(path=task_cfg.path, answer_format=task_cfg.answer_format,
                   prompt_template=task_cfg.prompt_template, question_key=task_cfg.question_key,
                   answer_key=task_cfg.answer_key, subset=task_cfg.subset,
                   source_split=task_cfg.source_split, extraction=task_cfg.extraction, seed=task_cfg.seed, split_fractions=dict(task_cfg.split_fractions))

    def _hash(self, question: str) -> float:
        digest = hashlib.sha256(f"{self.seed}:{question}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def split_of(self, question: str) -> str:
        h, edge = self._hash(question), 0.0
        for split, frac in self.split_fractions.items():
            edge += frac
            if h < edge:
                return split
        return list(self.split_fractions)[-1]

    @property
    def split_rows(self) -> dict[str, list[int]]:
        """Source rows of every split, in the order `problems` draws them (saved in the bank's meta)."""
        return {s: [r[-1] for r in rows] for s, rows in self._by_split.items()}

    def problems(self, split: str, n: int) -> list[QAProblem]:
        """The first `n` questions of `split` in the seeded order (deterministic)."""
        if split not in self._by_split:
            raise ValueError(f"split {split!r} unknown; allowed: {', '.join(self._by_split)}")
        rows = self._by_split[split]
        if n > len(rows):
            raise ConfigError(f"task: split {split!r} of {self.path} holds {len(rows)} questions, "
                              f"{n} asked; lower collect.prompts.{split} (or evaluate's count)")
        return [QAProblem(i, split, prompt, answer, reference, row)
                for i, (_, prompt, answer, reference, row) in enumerate(rows[:n])]

    def answer_of(self, completion: str) -> str:
        """The completion's canonical answer under task.extraction ("" when none)."""
        return canonical(extract_answer(completion, self.answer_format, self.extraction),
                         self.answer_format)

    def grade(self, problem: QAProblem, completion: str) -> bool:
        return equivalent(self.answer_of(completion), problem.answer, self.answer_format)

    def reference(self, problem: QAProblem) -> str:
        return problem.reference

    def diagnose(self, problem: QAProblem, completion: str) -> dict:
        """No solution styles or step checks for free-form reasoning."""
        return {"style": "n/a", "first_error": -1}
