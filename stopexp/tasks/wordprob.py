"""Natural-language word problems with numeric answers, generated offline and seeded.

A problem tells a short story about one person's objects and asks for a number::

    Question: Mia has 7 pens. She buys 5 more. Then she gives 3 to Sam. How many pens does Mia have now?
    Answer: Mia has 7 pens and buys 5 more, so 7 + 5 = 12. Then she gives 3 to Sam, so 12 - 3 = 9. The answer is 9.

The first step is one of four operations (``add``, ``sub``, ``compare``: how many more
than someone else, ``count``: the total of three groups); every further step is a gain or
a loss (``add`` / ``sub``) applied before the question. The worked solution writes its
reasoning before ``The answer is N.``, so an early prefix of a path shows the start of the
reasoning, not the answer. Difficulty knobs: the number of steps (``steps``, drawn per
problem), the number range and the operations mix. ``solution_style=lines`` writes each
step on a line of its own that ends by restating the new amount, for multi-step paths::

    Answer: Mia has 7 pens and buys 5 more, so 7 + 5 = 12. Now Mia has 12 pens.
    Then she gives 3 to Sam, so 12 - 3 = 9. Now Mia has 9 pens.
    The answer is 9.

Every problem carries its intermediate values (12, 9 above), so a path's first wrong one
can be located (`first_wrong_value`): where an error is known to have happened.

Two renderings: ``fewshot`` (plain text, ``shots`` solved training examples before the
question, then ``Answer:`` for the model to continue; use it with
``model.chat_template=false``) and ``chat`` (an instruction, the solved examples and the
question as one user turn, which the stage wraps in the tokenizer's chat template).

A problem's split is a hash of its question text, so splits are disjoint whatever the seed;
solved examples come from the training split and never repeat the question they precede.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from stopexp.metrics import answers
from stopexp.tasks.task import Task
from stopexp.tasks.splits import draw_distinct, hash_split

OPERATIONS = ("add", "sub", "compare", "count")
DEFAULT_OPERATIONS = {"add": 1.0, "sub": 1.0, "compare": 1.0, "count": 0.0}  # count: SmolLM2 ~0.1
FOLLOW_UPS = ("add", "sub")      # steps after the first change the person's amount
FORMATS = ("fewshot", "chat")
EXTRACTIONS = ("strict", "flexible")
# inline: the steps as one paragraph; lines: one line per step, each ending in the new amount
SOLUTION_STYLES = ("inline", "lines")
# which solved examples precede a question: first_operation: the last one shares its first
# operation; structure: the examples share its first operation and number of steps where
# the pool has such, nearest last (a small model copies the example's line structure);
# operations: the nearest also has its operations in order (the model copies those too)
SHOT_MATCHES = ("first_operation", "structure", "operations")
MARKER = "The answer is"
SHOT_POOL = 64                   # solved training examples the shots are drawn from
OPERATIONS_POOL = 256            # shot_match=operations: most 4-step sequences (24) appear
STOP_SEQUENCES = ("\n\n", "\nQuestion:")  # the few-shot format: a new example starts there

NAMES = (("Tom", "he"), ("Mia", "she"), ("Sam", "he"), ("Ann", "she"), ("Ben", "he"),
         ("Lily", "she"), ("Jack", "he"), ("Emma", "she"), ("Leo", "he"), ("Zoe", "she"),
         ("Max", "he"), ("Ella", "she"), ("Noah", "he"), ("Lucy", "she"), ("Owen", "he"),
         ("Ruby", "she"))
OBJECTS = ("apples", "pens", "books", "marbles", "stickers", "cookies", "shells", "cards",
           "coins", "stamps", "toy cars", "pencils", "balloons", "candies", "eggs", "rocks")
COLOURS = ("red", "blue", "green", "yellow", "white", "black")
_GAIN = ("buys {n} more", "finds {n} more", "gets {n} more")
_LOSS = ("gives {n} to {other}", "loses {n}", "eats {n}")
_SINGULAR = {"candies": "candy", "toy cars": "toy car"}
_EATABLE = {"apples", "cookies", "candies", "eggs"}
_STRICT = re.compile(r"(?:The answer is|####)\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
_EQUATION = re.compile(r"(-?\d+)\s*([-+])\s*(-?\d+)(?:\s*([-+])\s*(-?\d+))?\s*=\s*(-?\d+)")


@dataclass(frozen=True)
class WordProblem:
    prompt_id: int     # index within its split
    split: str
    question: str      # the problem alone (its split and few-shot choice hang on it)
    prompt: str        # what the model sees: the question rendered with its solved examples
    answer: int
    solution: str      # the worked solution, ending in "The answer is N."
    kind: str          # the operations, e.g. "add+sub"
    values: tuple = () # the intermediate values, in the order the solution writes them


def things(n: int, obj: str) -> str:
    """``n`` objects in words: "3 pens", "1 pen"."""
    return f"{n} {_SINGULAR.get(obj, obj[:-1]) if n == 1 else obj}"


def answer_of(completion: str, extraction: str = "strict") -> str:
    """The final answer of a completion, canonical ("" when none is written), by the
    shared rules of `stopexp.metrics.answers`: strict reads ``The answer is N`` (or
    ``#### N``); flexible also takes the last number of a completion without one."""
    return answers.answer_of(completion, "numeric", extraction)


def first_wrong_equation(completion: str) -> int | None:
    """Character offset of the first written ``a + b = c`` (or ``a - b = c``, up to two
    operations) whose arithmetic is wrong; None when all written equations are right."""
    for m in _EQUATION.finditer(completion):
        a, op1, b, op2, c, result = m.groups()
        if max(len(x or "") for x in (a, b, c, result)) > 100:
            continue  # no story has such numbers; int() refuses over 4300 digits
        value = int(a) + (int(b) if op1 == "+" else -int(b))
        if op2:
            value += int(c) if op2 == "+" else -int(c)
        if value != int(result):
            return m.start()
    return None


def first_wrong_value(problem: WordProblem, completion: str) -> int | None:
    """Where the first wrong intermediate value of `completion` ends (a character offset
    just past its last digit), or None when every value it writes is right.

    The values a completion writes are the results of its equations (``a + b = c``, as
    `first_wrong_equation` reads them) and the number after its first ``The answer is``.
    The i-th equation's result must be the problem's i-th intermediate value (any equation
    beyond those: its answer, as when a path restates it); the answer must be the answer.
    A value is wrong whether the arithmetic or the operands are; a value not written is
    no wrong value (a path that breaks off has none there)."""
    marked = _STRICT.search(completion)
    written = [(m.start(6), m.end(6), m.group(6)) for m in _EQUATION.finditer(completion)
               if not marked or m.start() < marked.start()]
    want = [str(v) for v in problem.values[: len(written)]]
    want += [str(problem.answer)] * (len(written) - len(want))
    for (_, end, got), value in zip(written, want):
        if got != value:
            return end
    if marked and answers.answer_of(marked.group(0), "numeric") != str(problem.answer):
        return marked.end(1)
    return None


class WordProblemTask(Task):
    """Prompts, references and the checker of the word-problem task, whose problems carry
    their intermediate values (`wrong_value_end`); `stop_sequences`: the strings where a
    path's answer is over.

    Raises ValueError naming the ``task.*`` key when a knob is out of range."""

    name = "wordprob"
    step_separator = "\n"
    generated = True
    formats = FORMATS
    wrong_value_end = staticmethod(first_wrong_value)  # the bank's first_wrong_value column

    def __init__(self, steps=(1,), number_range=(2, 9), operations: dict | None = None,
                 shots: int = 3, format: str = "fewshot", extraction: str = "strict",
                 instruction: str = "", stop=STOP_SEQUENCES, seed: int = 0,
                 split_fractions: dict | None = None, solution_style: str = "inline",
                 shot_match: str = "first_operation", prompt_offset: int = 0):
        if len(number_range) != 2:
            raise ValueError(f"task.number_range: needs [low, high], got {list(number_range)}")
        self.steps = tuple(int(s) for s in steps)
        self.number_range = (int(number_range[0]), int(number_range[1]))
        self.operations = dict(DEFAULT_OPERATIONS if operations is None else operations)
        self.shots, self.format, self.extraction = int(shots), format, extraction
        self.instruction = instruction
        self.solution_style = solution_style
        self.shot_match = shot_match
        self.stop_sequences = tuple(stop)
        self.seed, self.prompt_offset = seed, int(prompt_offset)
        self.split_fractions = dict(split_fractions or {"train": 0.8, "val": 0.1, "test": 0.1})
        self._check_knobs()
        self._shot_pool: list[WordProblem] | None = None

    @classmethod
    def from_config(cls, task_cfg) -> "WordProblemTask":
        """The task of a task section (task=wordprob), its text decoded (stopexp.tasks.build_task)."""
        return cls(steps=list(task_cfg.steps), number_range=list(task_cfg.number_range),
                   operations=dict(task_cfg.operations), shots=task_cfg.shots,
                   format=task_cfg.format, extraction=task_cfg.extraction,
                   instruction=task_cfg.instruction, stop=list(task_cfg.stop),
                   solution_style=task_cfg.solution_style, shot_match=task_cfg.shot_match,
                   seed=task_cfg.seed, split_fractions=dict(task_cfg.split_fractions),
                   prompt_offset=task_cfg.get("prompt_offset", 0))

    def _check_knobs(self) -> None:
        lo, hi = self.number_range
        problems = []
        if not self.steps or min(self.steps) < 1 or max(self.steps) > 4:
            problems.append(f"task.steps: {list(self.steps)}: each must lie in 1..4")
        if not 1 <= lo < hi:
            problems.append(f"task.number_range: {[lo, hi]}: needs 1 <= low < high")
        unknown = [k for k in self.operations if k not in OPERATIONS]
        if unknown or not self.operations or min(self.operations.values()) < 0 \
                or sum(self.operations.values()) <= 0:
            problems.append(f"task.operations: weights >= 0 over {', '.join(OPERATIONS)}, not "
                            f"all zero" + (f"; unknown: {unknown}" if unknown else ""))
        if self.format not in FORMATS:
            problems.append(f"task.format: {self.format!r}; allowed: {', '.join(FORMATS)}")
        if self.solution_style not in SOLUTION_STYLES:
            problems.append(f"task.solution_style: {self.solution_style!r}; allowed: "
                            f"{', '.join(SOLUTION_STYLES)}")
        if self.shot_match not in SHOT_MATCHES:
            problems.append(f"task.shot_match: {self.shot_match!r}; allowed: {', '.join(SHOT_MATCHES)}")
        if self.extraction not in EXTRACTIONS:
            problems.append(f"task.extraction: {self.extraction!r}; allowed: {', '.join(EXTRACTIONS)}")
        if self.shots < 0:
            problems.append(f"task.shots: must be >= 0, got {self.shots}")
        if problems:
            raise ValueError("; ".join(problems))

    # --- generation -------------------------------------------------------------------
    def split_of(self, question: str) -> str:
        return hash_split(question, self.split_fractions)

    def _below(self, rng: random.Random, value: int) -> int:
        """A number in the range that is smaller than `value` (>= 1; `value` >= 2)."""
        lo, hi = self.number_range
        top = min(hi, value - 1)
        return rng.randint(lo, top) if lo <= top else rng.randint(1, value - 1)

    def _draw(self, rng: random.Random) -> tuple[str, str, int, str, tuple]:
        """One random problem: (question, worked solution, answer, kind, intermediate values)."""
        lo, hi = self.number_range
        (name, pron), (other, _), (friend, _) = rng.sample(NAMES, 3)  # friend: gifts go there
        obj = rng.choice(OBJECTS)
        kinds, weights = zip(*self.operations.items())
        first = rng.choices(kinds, weights)[0]
        follow = [k for k in FOLLOW_UPS if self.operations.get(k, 0) > 0] or list(FOLLOW_UPS)
        n_steps = rng.choice(self.steps)
        done = [] if first in FOLLOW_UPS else [first]  # the operations as applied
        story, work, values = [], [], []
        if first == "count":
            a, b, c = (rng.randint(lo, hi) for _ in range(3))
            col = rng.sample(COLOURS, 3)
            value = a + b + c
            story.append(f"{name} has {things(a, col[0] + ' ' + obj)}, {things(b, col[1] + ' ' + obj)} and {things(c, col[2] + ' ' + obj)}.")
            work.append(f"{name} has {a} + {b} + {c} = {things(value, obj)}.")
            values.append(value)
        else:
            value = max(rng.randint(lo, hi), 2)
            story.append(f"{name} has {things(value, obj)}.")
        steps = [first] if first in FOLLOW_UPS else []
        steps += [rng.choice(follow) for _ in range(n_steps - 1)]
        for op in steps:
            if op == "sub" and value < 2:
                op = "add"
            done.append(op)
            b = rng.randint(lo, hi) if op == "add" else self._below(rng, value)
            new = value + b if op == "add" else value - b
            then = "Then " if len(story) > 1 else ""
            said = rng.choice(_GAIN).format(n=b) if op == "add" else self._loss(rng, obj, friend, b)
            story.append(f"{then}{pron if then else pron.capitalize()} {said}.")
            lead = f"{name} has {things(value, obj)} and " if not work else f"Then {pron} "
            work.append(f"{lead}{said}, so {value} {'+' if op == 'add' else '-'} {b} = {new}."
                        + self._restate(name, new, obj))
            value = new
            values.append(value)
        if first == "compare":
            c = self._below(rng, value) if value >= 2 else 0
            story.append(f"{other} has {things(c, obj)}.")
            question = f"How many more {obj} does {name} have than {other}?"
            lead = f"{name} has {things(value, obj)} and " if not work else ""
            work.append(f"{lead}{other} has {c}, so {value} - {c} = {value - c}.")
            value -= c
            values.append(value)
        elif first == "count" and n_steps == 1:
            question = f"How many {obj} does {name} have in total?"
        else:
            question = f"How many {obj} does {name} have now?"
        work.append(f"{MARKER} {value}.")
        joint = "\n" if self.solution_style == "lines" else " "
        return " ".join(story + [question]), joint.join(work), value, "+".join(done), tuple(values)

    def _restate(self, name: str, value: int, obj: str) -> str:
        """lines: the running amount said again after each change (the model copies it on)."""
        return f" Now {name} has {things(value, obj)}." if self.solution_style == "lines" else ""

    @staticmethod
    def _loss(rng: random.Random, obj: str, other: str, n: int) -> str:
        choices = [s for s in _LOSS if "eats" not in s or obj in _EATABLE]
        return rng.choice(choices).format(n=n, other=other)

    def _problems(self, split: str, n: int, stream: str) -> list[tuple]:
        return draw_distinct(f"{self.seed}:{stream}:{split}", split, n, self.split_fractions,
                             self._draw, lambda d: d[0],
                             f"word problems with number_range={list(self.number_range)}, "
                             f"steps={list(self.steps)}; lower the count or widen the range",
                             skip=self.prompt_offset if stream == "problems" else 0)

    @staticmethod
    def size() -> None:
        """How many distinct problems there are: not counted (names, objects, phrasings)."""
        return None

    def distinct(self, split: str, n: int) -> list[tuple]:
        """The problems `problems` renders, unrendered (ValueError when `split` has fewer
        than `n`): checked at validate (stopexp.config.task.task_draws_the_prompts)."""
        return self._problems(split, n, "problems")

    def shot_pool(self) -> list[WordProblem]:
        """The solved training examples that precede questions (fixed by the seed)."""
        if self._shot_pool is None:
            size = OPERATIONS_POOL if self.shot_match == "operations" else SHOT_POOL
            drawn = self._problems("train", size if self.shots else 0, "shots")
            self._shot_pool = [WordProblem(i, "train", q, q, a, s, k, v)
                               for i, (q, s, a, k, v) in enumerate(drawn)]
        return self._shot_pool

    def render(self, question: str, kind: str = "") -> str:
        """The prompt for `question`: `shots` solved examples and the question, in this
        task's format. The examples are drawn by a hash of the question (never the question
        itself) and chosen by `shot_match` (SHOT_MATCHES): a small model sees how that kind
        of problem is worked."""
        rng = random.Random(f"{self.seed}:shots:{question}")
        pool = [p for p in self.shot_pool() if p.question != question]
        shots = (self._same_first(pool, kind, rng) if self.shot_match == "first_operation"
                 else self._alike(pool, kind, rng))
        blocks = [f"Question: {p.question}\nAnswer: {p.solution}" for p in shots]
        if self.format == "fewshot":
            return "\n\n".join(blocks + [f"Question: {question}\nAnswer:"])
        head = [self.instruction] if self.instruction else []
        return "\n\n".join(head + blocks + [f"Question: {question}"])

    def _same_first(self, pool: list, kind: str, rng: random.Random) -> list:
        """`shots` random examples, the last one sharing the question's first operation when
        the pool has one."""
        shots = rng.sample(pool, min(self.shots, len(pool)))
        same = [p for p in pool if p.kind.split("+")[0] == kind.split("+")[0]]
        if shots and same and not any(p in same for p in shots):
            shots[-1] = rng.choice(same)
        elif shots and same:  # move one that matches to the end, next to the question
            match = next(p for p in reversed(shots) if p in same)
            shots.remove(match)
            shots.append(match)
        return shots

    def _alike(self, pool: list, kind: str, rng: random.Random) -> list:
        """`shots` examples ranked by likeness to the question, random within each rank, the
        most alike last, next to the question: (operations only) the same operations in the
        same order, then the same first operation and number of steps, then the same number
        of steps, then any."""
        ops = kind.split("+")
        exact = self.shot_match == "operations"

        def rank(p: WordProblem) -> int:
            theirs = p.kind.split("+")
            if len(theirs) != len(ops):
                return 3
            return 0 if exact and theirs == ops else 1 if theirs[0] == ops[0] else 2

        ranked = sorted(pool, key=lambda p: (rank(p), rng.random()))
        return ranked[: self.shots][::-1]

    def problems(self, split: str, n: int) -> list[WordProblem]:
        """The first `n` distinct problems of `split` for this task's seed (deterministic)."""
        return [WordProblem(i, split, q, self.render(q, k), a, s, k, v)
                for i, (q, s, a, k, v) in enumerate(self._problems(split, n, "problems"))]

    # --- checking ---------------------------------------------------------------------
    def answer_of(self, completion: str) -> str:
        return answer_of(completion, self.extraction)

    def grade(self, problem: WordProblem, completion: str) -> bool:
        return self.answer_of(completion) == str(problem.answer)

    def reference(self, problem: WordProblem) -> str:
        """The worked solution: the reference for text metrics."""
        return problem.solution

    def diagnose(self, problem: WordProblem, completion: str) -> dict:
        """Per-path diagnostics: whether the answer sentence is written (style ``marked`` /
        ``unmarked``) and the offset of the first wrong equation (-1: none)."""
        err = first_wrong_equation(completion)
        marked = bool(_STRICT.search(completion))
        return {"style": "marked" if marked else "unmarked", "first_error": -1 if err is None else err}
