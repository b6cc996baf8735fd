"""A task read through a thinking model (model.thinking.enabled=true: stopexp/config/
thinking.py): the path's text is its reasoning up to the first end tag, then its answer.
Checking, answer extraction, diagnosis and the text rewards read the answer only; a path
that never closes its thinking has no answer. Reasoning steps end at the thinking's step
separator ("\\n\\n"), and each path's thinking tokens are counted (`thinking_length`)."""
from __future__ import annotations

from stopexp.core.token_text import text_of
from stopexp.tasks.task import Task


def split_thinking(text: str, end_tag: str) -> tuple[str, str | None]:
    """(the reasoning, the answer after the first `end_tag`); answer None when the text
    has no end tag (the path was still thinking when it stopped)."""
    head, tag, tail = text.partition(end_tag)
    return (head + tag, tail) if tag else (text, None)


def thinking_length(tokenizer, ids: list[int], end_tag: str) -> int:
    """How many of the path's generated tokens `ids` its thinking spans: up to and including
    the token whose text completes the first `end_tag` (all of them when none does). The
    decoded prefix holds the tag from that token on, so a bisection finds it in log(n) decodes."""
    def closed(k: int) -> bool:
        return end_tag in text_of(tokenizer, ids[:k], keep=(end_tag,))

    if not closed(len(ids)):
        return len(ids)
    lo, hi = 0, len(ids)  # closed(hi), not closed(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if closed(mid) else (mid, hi)
    return hi


def _of_task(attr: str) -> property:
    return property(lambda self: getattr(self.task, attr), doc=f"The task's own `{attr}`.")


class ThinkingTask(Task):
    """`task` with each path's answer read after the thinking's end tag and its steps ended
    by the thinking's separator; everything else (prompts, references, splits, the name,
    the other capabilities) is the task's own."""

    name = _of_task("name")
    text_level = _of_task("text_level")
    checks_steps = _of_task("checks_steps")
    wrong_value_end = _of_task("wrong_value_end")
    generated = _of_task("generated")
    formats = _of_task("formats")
    toy_chars = _of_task("toy_chars")
    answer_format = _of_task("answer_format")
    tokenize = _of_task("tokenize")
    shots = _of_task("shots")
    split_rows = _of_task("split_rows")
    mixed = _of_task("mixed")

    def __init__(self, task: Task, end_tag: str = "</think>", step_separator: str = "\n\n"):
        self.task, self.end_tag, self.step_separator = task, end_tag, step_separator

    def __getattr__(self, name):  # a task's own extras (its knobs, `render`, ...)
        if name == "task":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.task, name)

    @classmethod
    def from_config(cls, task_cfg):
        raise TypeError("a ThinkingTask wraps a built task: stopexp.tasks.build_task(task_cfg, "
                        "model.thinking)")

    def problems(self, split: str, n: int) -> list:
        return self.task.problems(split, n)

    def reference(self, problem) -> str:
        return self.task.reference(problem)

    def references(self, problem) -> list[str]:
        return self.task.references(problem)

    def size(self) -> int | None:
        return self.task.size()

    def distinct(self, split: str, n: int) -> list:
        return self.task.distinct(split, n)

    def shot_pool(self) -> list:
        return self.task.shot_pool()

    def sample(self, split: str, rng):
        return self.task.sample(split, rng)

    def training_text(self, problem, rng) -> str:
        return self.task.training_text(problem, rng)

    def answer_text(self, text: str) -> str:
        """The path's answer ("" while it has none)."""
        return split_thinking(text, self.end_tag)[1] or ""

    def grade(self, problem, text: str) -> bool:
        answer = split_thinking(text, self.end_tag)[1]
        return answer is not None and self.task.grade(problem, answer)

    def answer_of(self, text: str):
        return self.task.answer_of(self.answer_text(text))

    def answer_for(self, problem, text: str) -> str:
        return self.task.answer_for(problem, self.answer_text(text))

    def task_of(self, problem) -> str:
        return self.task.task_of(problem)

    def diagnose(self, problem, text: str) -> dict:
        return self.task.diagnose(problem, self.answer_text(text))
