"""The embedded task: chained arithmetic mod 10 with a written chain of thought.

A prompt such as ``4+7*3-9?`` is solved left to right. The *careful* style writes one
operation per step (``4+7=1;1*3=3;3-9=4;#4``); the *shortcut* style folds two operations
into one step (``4+7*3=3;3-9=4;#4``), which a small model gets wrong far more often.
Every operation is a bijection of the running value (``+d``, ``-d``, ``*m`` with m coprime
to 10), so a wrong intermediate value can never heal: an early mistake dooms the path.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from stopexp.tasks.task import Task
from stopexp.tasks.splits import draw_distinct, hash_split

MOD = 10
STYLES = ("careful", "shortcut")
_ANSWER = re.compile(r"#(\d)$")
_STEP = re.compile(r"^(\d)((?:[-+*]\d)+)=(\d)$")


@dataclass(frozen=True)
class Problem:
    prompt_id: int
    split: str
    start: int
    ops: tuple[tuple[str, int], ...]

    @property
    def prompt(self) -> str:
        return f"{self.start}" + "".join(f"{o}{d}" for o, d in self.ops) + "?"

    @property
    def answer(self) -> int:
        return running_values(self.start, self.ops)[-1]


def apply(value: int, op: str, operand: int) -> int:
    if op == "+":
        return (value + operand) % MOD
    if op == "-":
        return (value - operand) % MOD
    return (value * operand) % MOD


def running_values(start: int, ops) -> list[int]:
    values = [start]
    for op, d in ops:
        values.append(apply(values[-1], op, d))
    return values


def solution(problem: Problem, style: str) -> str:
    """The written chain of thought (without prompt) in one of the `STYLES`."""
    if style not in STYLES:
        raise ValueError(f"task.styles: unknown style {style!r}; allowed: {', '.join(STYLES)}")
    per_step = 1 if style == "careful" else 2
    value, steps = problem.start, []
    for i in range(0, len(problem.ops), per_step):
        chunk = problem.ops[i : i + per_step]
        result = running_values(value, chunk)[-1]
        steps.append(f"{value}" + "".join(f"{o}{d}" for o, d in chunk) + f"={result}")
        value = result
    return ";".join(steps) + f";#{value}"


def extract_answer(text: str) -> int | None:
    """The final answer written after ``#`` at the end of a completion, else None."""
    m = _ANSWER.search(text.strip())
    return int(m.group(1)) if m else None


def first_error(problem: Problem, text: str) -> int | None:
    """Character offset in `text` of the first step whose written result is wrong, or
    whose operations do not continue the prompt; None when every written step is right.
    A completion that breaks off or is malformed errs where the malformed step starts."""
    value, op_index, offset = problem.start, 0, 0
    body, _, tail = text.partition("#")
    for step in body.split(";"):
        if step == "" and op_index == len(problem.ops):
            break
        m = _STEP.match(step)
        if not m or int(m.group(1)) != value:
            return offset
        ops = tuple((o, int(d)) for o, d in re.findall(r"([-+*])(\d)", m.group(2)))
        if problem.ops[op_index : op_index + len(ops)] != ops:
            return offset
        op_index += len(ops)
        value = running_values(value, ops)[-1]
        if int(m.group(3)) != value:
            return offset
        offset += len(step) + 1
    if op_index != len(problem.ops) or extract_answer("#" + tail) != value:
        return min(offset, len(text))
    return None


class ArithTask(Task):
    """Prompts, references and the checker of the embedded task.

    The split of a prompt is a function of the prompt text alone (a hash), so train,
    validation and test prompts are disjoint by construction, whatever the seed.
    """

    name = "arith"
    text_level = "char"  # outputs without spaces: text metrics compare characters
    step_separator = ";"
    checks_steps = True  # first_error: the first step whose written result is wrong
    generated = True
    toy_keys = ("name", "n_steps", "operators", "multipliers", "styles", "split_fractions", "seed")

    def __init__(self, n_steps: int = 6, operators=("+", "-", "*"), multipliers=(3, 7, 9),
                 styles: dict | None = None, seed: int = 0,
                 split_fractions: dict | None = None, prompt_offset: int = 0):
        self.n_steps = n_steps
        self.operators = tuple(operators)
        self.multipliers = tuple(multipliers)
        self.styles = dict(styles or {"careful": 0.5, "shortcut": 0.5})
        self.seed, self.prompt_offset = seed, int(prompt_offset)
        self.split_fractions = dict(split_fractions or {"train": 0.8, "val": 0.1, "test": 0.1})

    @classmethod
    def from_config(cls, task_cfg) -> "ArithTask":
        """The task of a task section (task=arith), its text decoded (stopexp.tasks.build_task)."""
        return cls(n_steps=task_cfg.n_steps, operators=list(task_cfg.operators),
                   multipliers=list(task_cfg.multipliers), styles=dict(task_cfg.styles),
                   seed=task_cfg.seed, split_fractions=dict(task_cfg.split_fractions),
                   prompt_offset=task_cfg.get("prompt_offset", 0))

    def split_of(self, prompt: str) -> str:
        return hash_split(prompt, self.split_fractions)

    def _random_problem(self, rng: random.Random) -> tuple[int, tuple]:
        ops = []
        for _ in range(self.n_steps):
            op = rng.choice(self.operators)
            d = rng.choice(self.multipliers) if op == "*" else rng.randrange(MOD)
            ops.append((op, d))
        return rng.randrange(MOD), tuple(ops)

    def problems(self, split: str, n: int) -> list[Problem]:
        """The first `n` distinct problems of `split` for this task's seed (deterministic)."""
        drawn = draw_distinct(f"{self.seed}:{split}", split, n, self.split_fractions,
                              self._random_problem, lambda d: Problem(-1, split, *d).prompt,
                              f"prompts with n_steps={self.n_steps}; lower the count or raise n_steps",
                              skip=self.prompt_offset)
        return [Problem(i, split, start, ops) for i, (start, ops) in enumerate(drawn)]

    def size(self) -> int:
        """How many distinct prompts there are: 10 starts times the operations per step
        (+d and -d for 10 digits each, *m for each multiplier) to the n_steps."""
        per_step = 10 * len({"+", "-"} & set(self.operators)) + (
            len(set(self.multipliers)) if "*" in self.operators else 0)
        return MOD * per_step ** self.n_steps

    def distinct(self, split: str, n: int) -> list:
        """What `problems` draws (ValueError when `split` has fewer than `n`): checked at
        validate (stopexp.config.task.task_draws_the_prompts)."""
        return self.problems(split, n)

    def sample(self, split: str, rng: random.Random) -> Problem:
        """A random problem of `split` (for LM training data; may repeat)."""
        while True:
            start, ops = self._random_problem(rng)
            p = Problem(-1, split, start, ops)
            if self.split_of(p.prompt) == split:
                return p

    def training_text(self, problem: Problem, rng: random.Random) -> str:
        """One solution in a style drawn from the `styles` mix (the LM's training data)."""
        names, weights = zip(*self.styles.items())
        return solution(problem, rng.choices(names, weights)[0])

    def reference(self, problem: Problem) -> str:
        """The careful, fully written solution: the reference for text metrics."""
        return solution(problem, "careful")

    def grade(self, problem: Problem, completion: str) -> bool:
        return extract_answer(completion) == problem.answer

    def answer_of(self, completion: str) -> str:
        a = extract_answer(completion)
        return "" if a is None else str(a)

    def diagnose(self, problem: Problem, completion: str) -> dict:
        """Per-path diagnostics stored with the traces: solution style, first error (-1: none)."""
        err = first_error(problem, completion)
        return {"style": self.style_of(completion), "first_error": -1 if err is None else err}

    def style_of(self, completion: str) -> str:
        """Which style a completion follows, read from its first step."""
        first = completion.split(";", 1)[0].split("=", 1)[0]
        return "shortcut" if len(re.findall(r"[-+*]", first)) > 1 else "careful"
