"""Answers-only trace banks: published traces that keep, per branch, only the answers read
along the way, the tokens it generated and its final answer (no tokens, no hidden state).

The JSON shape of public releases (e.g. Parallel-Probe's, arXiv 2602.03845, repository
zhengkid/Parallel-Probe, evaluation/Qwen3-8B-128/*.json) is a list of prompts::

    [{"question": str, "gold_answer": str, "probe_freq": int,
      "each_branch": [[intermediate_answers: list[str], total_tokens: int, final_answer: str],
                      ...]}, ...]

where intermediate answer i of a branch was read after (i + 1) * probe_freq of its tokens
and the probe after its last one reads its final answer (as the authors' simulator,
evaluation/data_loader.py `Branch.explore`, replays it). The last intermediate answer may
fall in the branch's last, partial probe interval (the public banks probe a branch of
3,856 tokens 8 times); other keys (their `final_answers_trace`, the final answers again)
are ignored. The authors' raw release (the Hugging Face datasets
EfficientReasoning/Qwen3-*-br128-*, read by their evaluation/preprocess/data_preprocess.py)
keeps the same data as parallel lists, which are read too::

    [{"question": str, "gold_answer": str, "probe_freq": int,
      "probe_matrix_mxn": [[answer or null, ...] per branch], "branch_tokens": [int, ...],
      "final_answers_trace": [str, ...]}, ...]

where each branch's row of probe answers is padded with trailing nulls (dropped, as their
`clean_data_list` drops them; a null inside a row is an unreadable answer). Answers are compared in the canonical form of `stopexp.metrics.answers`
(``0.5``, ``1/2`` and ``\\frac{1}{2}`` are one answer); the gold answer is matched with
`equivalent`, so math-verify also accepts forms that canonicalise
differently. Every cluster of equivalent answers of a prompt (`vote_clusters` over its
answers in stored order, each branch's probes then its final answer: ``\\sqrt{2}/2`` and
``\\frac{1}{\\sqrt{2}}`` are one) gets an integer code (0 = no readable answer), its
representative in `answers`, so that every vote and consensus of a replayed method counts
equivalent answers as one and works on small integer arrays. With ``grader="exact"`` the
codes are the stored strings themselves and an answer is right only when it equals the
gold string character for character (the published evaluation's grader,
evaluation/data_loader.py `Question.solve`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from stopexp.core import jsonfile
from stopexp.core.errors import NotFound, UserError
from stopexp.metrics.answers import FORMATS, canonical, equivalent, vote_clusters


class AnswersBankError(UserError, ValueError):
    """An answers-only bank file that does not have the documented shape."""


@dataclass
class AnswersPrompt:
    """One prompt's stored branches, answers as codes into `answers` (code 0 = none).

    final: (B,) int codes of the final answers; tokens: (B,) tokens each branch generated;
    probes: (B, P) int codes, probes[b, i] read after (i + 1) * probe_freq tokens (0 past
    the branch's stored probes); correct: (A,) bool, whether answer code a is the gold one;
    n_probes: (B,) intermediate answers each branch stores (None: none stored)."""
    question: str
    gold: str
    probe_freq: int
    answers: list[str]
    final: np.ndarray
    tokens: np.ndarray
    probes: np.ndarray
    correct: np.ndarray
    n_probes: np.ndarray | None = None

    @property
    def n_branches(self) -> int:
        return len(self.final)

    @property
    def end_probe(self) -> np.ndarray:
        """(B,) the probe at which each branch ends: the one after its last stored
        intermediate answer."""
        stored = np.zeros_like(self.final) if self.n_probes is None else self.n_probes
        return stored + 1

    def answer_at(self, t: int) -> np.ndarray:
        """(B,) codes of every branch's answer at probe t >= 1 (after t * probe_freq tokens):
        its intermediate answer t while it has one, its final answer from its end probe on."""
        col = self.probes[:, t - 1] if 0 < t <= self.probes.shape[1] else np.zeros_like(self.final)
        return np.where(t >= self.end_probe, self.final, col)


@dataclass
class AnswersBank:
    prompts: list[AnswersPrompt]
    fmt: str
    source: str

    @property
    def min_branches(self) -> int:
        return min(p.n_branches for p in self.prompts)


# Token counts above this are no real branch's (and sums over millions of branches stay
# exact in int64 and float64); larger ones are corrupt data, refused before int64 overflows.
MAX_TOKENS = 2**40


GRADERS = ("equivalent", "exact")


def _fail(where: str, what: str) -> None:
    raise AnswersBankError(f"{where}: {what}. Expected a list of {{\"question\": str, "
                           "\"gold_answer\": str, \"probe_freq\": int > 0, \"each_branch\": "
                           "[[intermediate_answers: list[str], total_tokens: int > probe_freq * "
                           "(len(intermediate_answers) - 1), final_answer: str], ...]}")


def _count(value, where: str, low: int) -> int:
    """`value` as a token count in low..MAX_TOKENS; AnswersBankError naming `where` else
    (a bool, a float such as 4.0 or NaN, a negative or an overflowing number)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TOKENS:
        _fail(where, f"must be an integer in {low}..{MAX_TOKENS}, got {value!r}")
    return value


def _text(value, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            _fail(where, f"an answer must be a string (or null) or a finite number, got {value!r}")
        return str(value)
    if not isinstance(value, str):
        _fail(where, f"an answer must be a string (or null), got {type(value).__name__}")
    return value


MATRIX_KEYS = ("probe_matrix_mxn", "branch_tokens", "final_answers_trace")


def branches_of_matrix(item: dict, where: str) -> list:
    """The `each_branch` list of a prompt in the raw probe-matrix form: one
    [probe answers without the trailing nulls, tokens, final answer] per branch;
    AnswersBankError naming the key whose list is missing or of another length."""
    for key in MATRIX_KEYS:
        if not isinstance(item.get(key), list):
            raise AnswersBankError(f"{where}.{key}: the probe-matrix form needs {', '.join(MATRIX_KEYS)} "
                                   f"as lists (one entry per branch), got {type(item.get(key)).__name__}")
    rows, tokens, finals = (item[k] for k in MATRIX_KEYS)
    for key, values in zip(MATRIX_KEYS[1:], (tokens, finals)):
        if len(values) != len(rows):
            raise AnswersBankError(f"{where}.{key}: {len(values)} entries for the {len(rows)} "
                                   "branches of probe_matrix_mxn")
    branches = []
    for b, row in enumerate(rows):
        if not isinstance(row, list):
            raise AnswersBankError(f"{where}.probe_matrix_mxn[{b}]: a branch's probe answers must "
                                   f"be a list, got {type(row).__name__}")
        last = max((i + 1 for i, a in enumerate(row) if a is not None), default=0)
        branches.append([row[:last], tokens[b], finals[b]])
    return branches


def parse_prompt(item, where: str, fmt: str, grader: str = "equivalent") -> AnswersPrompt:
    """One prompt of the JSON list as an AnswersPrompt; AnswersBankError names `where`.
    grader: "equivalent" (one code per cluster of equivalent answers) or "exact" (one code
    per stored string, right only when equal to the gold string)."""
    if not isinstance(item, dict):
        _fail(where, f"a prompt must be an object, got {type(item).__name__}")
    if "each_branch" not in item and "probe_matrix_mxn" in item:
        item = {**item, "each_branch": branches_of_matrix(item, where)}
    missing = [k for k in ("question", "gold_answer", "probe_freq", "each_branch") if k not in item]
    if missing:
        _fail(where, f"missing key(s) {', '.join(missing)}")
    freq = _count(item["probe_freq"], f"{where}.probe_freq", 1)
    branches = item["each_branch"]
    if not isinstance(branches, list) or not branches:
        _fail(f"{where}.each_branch", "must be a non-empty list of branches")
    raw_gold = _text(item["gold_answer"], f"{where}.gold_answer")
    gold = canonical(raw_gold, fmt)
    if not gold:
        _fail(f"{where}.gold_answer", f"no readable answer in {item['gold_answer']!r}")
    if grader == "equivalent":
        read = partial(canonical, fmt=fmt)
        right = partial(equivalent, reference=gold, fmt=fmt)
    else:  # the stored string, when it holds a readable answer
        read = lambda text: text if canonical(text, fmt) else ""  # noqa: E731
        right = lambda answer: bool(answer) and answer == raw_gold  # noqa: E731
    final, tokens, probes = [], [], []
    for b, branch in enumerate(branches):
        w = f"{where}.each_branch[{b}]"
        if not isinstance(branch, (list, tuple)) or len(branch) != 3:
            _fail(w, "a branch must be [intermediate_answers, total_tokens, final_answer]")
        inter, total, last = branch
        if not isinstance(inter, list):
            _fail(f"{w}[0]", f"intermediate_answers must be a list, got {type(inter).__name__}")
        _count(total, f"{w}[1] (total_tokens)", 0)
        probes.append([read(_text(a, f"{w}[0][{i}]")) for i, a in enumerate(inter)])
        # answer i is read after (i + 1) * probe_freq tokens; the last may fall in the last,
        # partial interval
        if inter and (len(inter) - 1) * freq >= total:
            _fail(f"{w}[1] (total_tokens)", f"{total} tokens, but its {len(inter)} intermediate "
                                            f"answers are read every probe_freq={freq} tokens, "
                                            f"the last after {len(inter) * freq}")
        tokens.append(total)
        final.append(read(_text(last, f"{w}[2]")))
    # one code per cluster of equivalent answers, in the order read (each branch's probes, then
    # its final answer)
    seen = [a for row, last in zip(probes, final) for a in (*row, last)]
    cluster = (dict(zip(seen, vote_clusters(seen, fmt))) if grader == "equivalent"
               else {a: a for a in seen})
    codes = {"": 0}
    for a in seen:
        codes.setdefault(cluster[a], len(codes))
    final = [codes[cluster[a]] for a in final]
    probes = [[codes[cluster[a]] for a in row] for row in probes]
    grid = np.zeros((len(branches), max(map(len, probes))), np.int64)
    for b, row in enumerate(probes):
        grid[b, :len(row)] = row
    answers = list(codes)
    return AnswersPrompt(question=str(item["question"]), gold=gold, probe_freq=freq, answers=answers,
                         final=np.asarray(final, np.int64), tokens=np.asarray(tokens, np.int64),
                         probes=grid, n_probes=np.asarray([len(row) for row in probes], np.int64),
                         correct=np.asarray([right(a) for a in answers], bool))


def load_answers_bank(path: str | Path, fmt: str = "boxed",
                      grader: str = "equivalent") -> AnswersBank:
    """Read an answers-only bank (JSON, the shape in the module docstring).

    fmt: the answer format of `stopexp.metrics.answers` used to canonicalise answers
    ("boxed": LaTeX or numbers, the default for competition math; "numeric"); grader:
    "equivalent" or "exact" (`parse_prompt`).
    Raises NotFound (a FileNotFoundError) for a missing file and AnswersBankError naming the file, the
    line (for broken JSON) or the prompt / branch index and key that is wrong."""
    if fmt not in FORMATS:
        raise AnswersBankError(f"answers format {fmt!r} unknown; allowed: {', '.join(FORMATS)}")
    if grader not in GRADERS:
        raise AnswersBankError(f"grader {grader!r} unknown; allowed: {', '.join(GRADERS)}")
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"answers-only bank {path} does not exist")
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AnswersBankError(f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
    except UnicodeDecodeError as e:
        raise AnswersBankError(f"{path}: byte {e.start} (0x{e.object[e.start]:02x}) is not UTF-8; "
                               "save the file as UTF-8") from e
    if not isinstance(data, list) or not data:
        _fail(str(path), "the file must hold a non-empty list of prompts")
    prompts = [parse_prompt(item, f"{path}: prompt {i}", fmt, grader) for i, item in enumerate(data)]
    return AnswersBank(prompts=prompts, fmt=fmt, source=str(path))


def vote_codes(codes: np.ndarray) -> int:
    """Majority vote over answer codes in sampling order (0 never wins; ties go to the
    answer seen first); 0 when no code is readable."""
    codes = np.asarray(codes)
    valid = codes[codes > 0]
    if not len(valid):
        return 0
    counts = np.bincount(valid)
    best = np.nonzero(counts == counts.max())[0]
    if len(best) == 1:
        return int(best[0])
    first = {int(c): i for i, c in reversed(list(enumerate(valid)))}
    return int(min(best, key=lambda c: first[int(c)]))


@dataclass
class Decision:
    """What a stopping method did with one prompt's branches, taken in sampling order.

    answer: the voted answer code (0 = none); spent: (n,) tokens each branch of the order
    consumed before it finished or was stopped (0 for a branch never launched);
    launched: how many branches of the order were started (the first `launched`)."""
    answer: int
    spent: np.ndarray
    launched: int

    def stopped(self, tokens: np.ndarray) -> np.ndarray:
        """(n,) bool: launched branches cut before their end (`tokens`: their full lengths)."""
        return (np.arange(len(self.spent)) < self.launched) & (self.spent < tokens)
