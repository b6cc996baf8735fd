"""What a task is: `Task`, the base every task derives from. A task poses problems, grades
a path's text and names its reference; the rest are capabilities with defaults that a task
overrides where it has them. The capabilities that config checks read are class
attributes, so `lookup("task", name).step_separator` answers without building the task
(task modules import no torch)."""
from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar


class Task(abc.ABC):
    """A task: prompts, references and a grader (stopexp.tasks.build_task builds one by
    name from its config section). A problem is any object with `prompt_id`, `split` and
    `prompt`."""

    name: ClassVar[str]  # its name in the registry (stopexp.core.names REGISTRY["task"])

    # -- what every task provides ------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def from_config(cls, task_cfg) -> "Task":
        """The task of a task section (cfg.task), its text decoded."""

    @abc.abstractmethod
    def problems(self, split: str, n: int) -> list:
        """The first `n` problems of `split` (train, val or test), the same on every call."""

    @abc.abstractmethod
    def grade(self, problem, completion: str) -> bool:
        """Whether a path's text answers `problem` correctly."""

    @abc.abstractmethod
    def answer_of(self, completion: str) -> str:
        """A path's answer as one canonical string ("" when it has none): equal strings vote
        as one answer."""

    @abc.abstractmethod
    def reference(self, problem) -> str:
        """The reference solution text (what text metrics compare against)."""

    def diagnose(self, problem, completion: str) -> dict:
        """Per-path diagnostics stored with the paths: the solution style and the character
        offset of the first wrong step (-1: none, or none found)."""
        return {"style": "n/a", "first_error": -1}

    # -- optional capabilities: class attributes, readable without building the task ---
    # how text metrics and rewards compare its texts: "word" (natural language) or "char"
    # (outputs without spaces)
    text_level: ClassVar[str] = "word"
    # the string that ends a reasoning step (tap.positions.step_ends); None: a path is one step
    step_separator: ClassVar[str | None] = None
    # whether `diagnose`'s first_error locates the first wrong written step of any prefix (a
    # process check), which the beam oracle reads
    checks_steps: ClassVar[bool] = False
    # fn(problem, text) -> the end offset of the first wrong intermediate value in `text`,
    # None when none is wrong; None where problems carry no intermediate values. With one,
    # the bank records first_wrong_value and error_oracle can run.
    wrong_value_end: ClassVar[Callable[[Any, str], int | None] | None] = None
    # whether its problems are drawn (generated), so that validate draws them to check
    # collect's counts (`size`, `distinct`) rather than reading a file or a hub dataset
    generated: ClassVar[bool] = False
    # the prompt formats task.format picks from (plain-text few-shot cannot take a chat
    # template); empty: the task has one format
    formats: ClassVar[tuple[str, ...]] = ()
    # the task keys the toy LM learns this task from (its cache key: other keys keep it);
    # empty: the toy LM cannot learn this task (stopexp.models.toy_lm)
    toy_keys: ClassVar[tuple[str, ...]] = ()
    # whether its prompts come from several tasks (task=mixture): the bank records each
    # path's task (`task_of`)
    mixed: ClassVar[bool] = False
    # the characters of the toy LM's tokenizer when it learns this task; None: its default
    # alphabet (stopexp.models.tokenizer.CHARS)
    toy_chars: ClassVar[str | None] = None

    # -- optional capabilities of a built task -----------------------------------------
    # the answer format whose equivalent answers vote as one (stopexp.tasks.vote_format): a
    # task that reads task.answer_format declares its default here; None: equal canonical
    # strings vote as one
    answer_format: str | None = None
    # how text metrics and rewards split words (task.tokenize; set by build_task)
    tokenize: str = "13a"
    # a thinking model's end tag (stopexp.tasks.thinking.ThinkingTask); None: no thinking
    end_tag: str | None = None
    # solved examples posed before each question (few-shot tasks)
    shots: int = 0
    # which source rows form each split, saved in the bank's meta (file-based tasks); None:
    # problems are drawn
    split_rows: dict[str, list[int]] | None = None

    def answer_for(self, problem, completion: str) -> str:
        """The answer of a path of `problem` (`answer_of`; a mixture reads it by the
        problem's task)."""
        return self.answer_of(completion)

    def task_of(self, problem) -> str:
        """The task a problem is of (the bank's task column of a mixture)."""
        return self.name

    def references(self, problem) -> list[str]:
        """Every reference for `problem` (text metrics take the best match)."""
        return [self.reference(problem)]

    def answer_text(self, text: str) -> str:
        """The part of a path's text that answers (a thinking model: after the end tag)."""
        return text

    def size(self) -> int | None:
        """How many distinct problems there are in all splits; None: unknown or unbounded."""
        return None

    def distinct(self, split: str, n: int) -> list:
        """`n` distinct problems of `split` (ValueError when it has fewer), as validate
        draws them for a generated task."""
        return self.problems(split, n)

    def shot_pool(self) -> list:
        """The solved train problems that the few-shot examples are drawn from."""
        return []

    def sample(self, split: str, rng) -> Any:
        """A random problem of `split` (may repeat): the toy LM's training data, for a task
        with `toy_keys`."""
        raise NotImplementedError(f"task {self.name}: the toy LM cannot learn it (no toy_keys)")

    def training_text(self, problem, rng) -> str:
        """A solution of `problem` for the toy LM to learn (a task with `toy_keys`)."""
        raise NotImplementedError(f"task {self.name}: the toy LM cannot learn it (no toy_keys)")
