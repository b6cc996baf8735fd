"""Question answering from a file: GSM8K-style numeric answers (``#### 42``) and MATH-style
``\\boxed{...}`` answers, read from a local JSONL / JSON / Parquet file or a `datasets` hub
id (which must already be in the local cache when offline).

Answers are compared in a canonical form: numbers exactly as fractions (``0.5``, ``.5``,
``1/2`` and ``\\frac{1}{2}`` are one answer, ``1,000`` is ``1000``), anything else as
LaTeX with spacing and decoration stripped. A completion without a readable answer is
wrong, never an error. A question's split is a hash of the task seed and the question, so
the split is fixed by the seed and a question never sits in two splits.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
_MARK = re.compile(r"####\s*([^\n]*)")
_DECIMAL = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC = re.compile(r"([-+]?)\\frac(?:\{([^{}]+)\}|(\d))(?:\{([^{}]+)\}|(\d))")
_NUMBER_IN_TEXT = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+")
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "^{\\circ}", "^\\circ", "\\%", "%", "$")


@dataclass(frozen=True)
class QAProblem:
    prompt_id: int       # index within its split, as for the embedded task
    split: str
    prompt: str          # the question in task.prompt_template
    answer: str          # canonical reference answer
    reference: str       # the reference solution as given (for text metrics)
    source_row: int      # row in the source file


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), else None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = start + len("\\boxed")
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{":  # \boxed 5
        word = text[i:].split("$")[0].split()
        return word[0] if word else None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None  # never closed: malformed


def extract(text: str, answer_format: str) -> str | None:
    """The final answer written in `text`: after the last ``####`` (numeric format) or in
    the last ``\\boxed{}``; None when there is none."""
    if answer_format == "numeric":
        marks = _MARK.findall(text)
        if marks and marks[-1].strip():
            return marks[-1].strip()
    return last_boxed(text)


def _number(s: str) -> Fraction | None:
    """`s` as an exact number (decimal, a/b, \\frac{a}{b}, 1,000), else None."""
    if len(s) > 100:  # no answer is that long; and int() refuses over 4300 digits
        return None
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if _DECIMAL.fullmatch(s):
        return Fraction(s)
    m = _FRAC.fullmatch(s)
    if m:
        sign, num, den = m.group(1), m.group(2) or m.group(3), m.group(4) or m.group(5)
    elif s.count("/") == 1:
        sign, (num, den) = "", s.split("/")
    else:
        return None
    if not (_DECIMAL.fullmatch(num) and _DECIMAL.fullmatch(den)) or Fraction(den) == 0:
        return None
    return -Fraction(num) / Fraction(den) if sign == "-" else Fraction(num) / Fraction(den)


def canonical(answer: str | None, answer_format: str) -> str:
    """One string per equivalent answer ("" when there is none): a number as ``p`` or
    ``p/q``, else the LaTeX without spaces, ``$``, ``\\left``/``\\right``, units of degrees
    and percent, or text wrappers. Numeric answers with words keep their number."""
    if not answer:
        return ""
    s = _WRAPPERS.sub(r"\1", answer)
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("{,}", ",")):
        s = s.replace(old, new)
    for token in _DROP:
        s = s.replace(token, "")
    s = re.sub(r"\s+", "", s).rstrip(".")
    value = _number(s)
    if value is None and answer_format == "numeric":
        found = _NUMBER_IN_TEXT.findall(s)  # "72apples" -> 72
        value = _number(found[0]) if found else None
    if value is None:
        return s
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def read_rows(path: str, subset: str | None = None, source_split: str = "test") -> list[dict]:
    """The rows of a local file, or of a hub dataset (from the local cache when offline)."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if p.is_file() and p.suffix in (".jsonl", ".json"):
        text = p.read_text()
        if p.suffix == ".json" and text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if p.suffix in FILE_SUFFIXES or p.exists():
        raise FileNotFoundError(f"task.path: {path!r} is not a readable "
                                f"{'/'.join(FILE_SUFFIXES)} file")
    from datasets import load_dataset

    from stopexp.hub import offline_unless_reachable

    try:
        with offline_unless_reachable():  # no hub: the cache only, failing at once
            return list(load_dataset(path, subset, split=source_split))
    except Exception as e:  # offline, unknown id, missing split: all mean "not available here"
        raise FileNotFoundError(
            f"task.path: {path!r} is neither a local {'/'.join(FILE_SUFFIXES)} file nor a hub "
            f"dataset available here ({e.__class__.__name__}: {str(e)[:200]}). Without "
            f"internet, save it as JSONL or Parquet where you have internet and set "
            f"task.path=/path/to/file.jsonl") from e


class QATask:
    """Questions and reference answers from `path`; the interface of `ArithTask`."""

    name = "qa"

    def __init__(self, path: str, answer_format: str = "numeric", prompt_template: str = "{question}",
                 question_key: str = "question", answer_key: str = "answer", subset: str | None = None,
                 source_split: str = "test", seed: int = 0, split_fractions: dict | None = None):
        self.path, self.answer_format, self.seed = path, answer_format, seed
        self.split_fractions = dict(split_fractions or {"train": 0.8, "val": 0.1, "test": 0.1})
        self._by_split: dict[str, list] = {s: [] for s in self.split_fractions}
        seen = set()
        for row_no, row in enumerate(read_rows(path, subset, source_split)):
            for key in (question_key, answer_key):
                if key not in row:
                    raise KeyError(f"task.{'question' if key == question_key else 'answer'}_key: "
                                   f"row {row_no} of {path} has no {key!r} (it has {sorted(row)})")
            question, reference = str(row[question_key]).strip(), str(row[answer_key]).strip()
            if question in seen:  # a repeated question would repeat its paths' random streams
                continue
            seen.add(question)
            answer = canonical(extract(reference, answer_format) or reference, answer_format)
            if not answer:
                raise ValueError(f"task.answer_key: row {row_no} of {path} has an empty answer")
            prompt = prompt_template.replace("{question}", question)
            self._by_split[self.split_of(question)].append(
                (self._hash(question), prompt, answer, reference, row_no))
        for rows in self._by_split.values():
            rows.sort()  # a seeded order, so the first n questions of a split are a random sample

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
            raise ValueError(f"task: split {split!r} of {self.path} holds {len(rows)} questions, "
                             f"{n} asked; lower collect.prompts.{split} (or evaluate's count)")
        return [QAProblem(i, split, prompt, answer, reference, row)
                for i, (_, prompt, answer, reference, row) in enumerate(rows[:n])]

    def answer_of(self, completion: str) -> str:
        return canonical(extract(completion, self.answer_format), self.answer_format)

    def check(self, problem: QAProblem, completion: str) -> bool:
        return self.answer_of(completion) == problem.answer

    def reference(self, problem: QAProblem) -> str:
        return problem.reference

    def diagnose(self, problem: QAProblem, completion: str) -> dict:
        """No solution styles or step checks for free-form reasoning."""
        return {"style": "n/a", "first_error": -1}
