"""The task group (conf/task/): what problems are posed. One schema per task (arith, qa,
wordprob, datatotext) with its checks beside it; `TaskConfig`, the view, holds every
task's keys (stopexp.config.options)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from stopexp.config.options import Group
from stopexp.config.ranges import at_least, fail
from stopexp.core.names import BENCHMARKS, SPLITS

__all__ = ["TASK", "ArithTaskConfig", "DataToTextTaskConfig", "QATaskConfig", "TaskConfig",
           "WordProblemTaskConfig", "check_task"]


@dataclass
class TaskBaseConfig:
    """What every task reads."""
    name: str = "arith"
    split_fractions: Dict[str, float] = field(
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1})
    seed: int = 0
    stop: List[str] = field(default_factory=list)  # the task's natural stop strings

    @staticmethod
    def ranges(t) -> None:
        if any(not x for x in t.stop):
            fail("task.stop", "every stop string must be non-empty")
        fr = t.split_fractions
        if (set(fr) != set(SPLITS) or not all(v > 0 for v in fr.values())
                or not abs(sum(fr.values()) - 1) <= 1e-6):
            fail("task.split_fractions", f"needs train, val, test > 0 summing to 1, got {dict(fr)}")


@dataclass
class WordTaskConfig(TaskBaseConfig):
    """What the tasks answered in words read."""
    # how BLEU / ROUGE (metrics and rewards) split a word-level task's text into words:
    # 13a (scripts with spaces: Latin, Cyrillic, ...) | intl | zh (Chinese) | char
    tokenize: str = "13a"


@dataclass
class ArithTaskConfig(TaskBaseConfig):
    """arith (stopexp/tasks/arith.py): chained arithmetic mod 10."""
    name: str = "arith"
    n_steps: int = 6
    operators: List[str] = field(default_factory=lambda: ["+", "-", "*"])
    multipliers: List[int] = field(default_factory=lambda: [3, 7, 9])
    styles: Dict[str, float] = field(default_factory=lambda: {"careful": 0.5, "shortcut": 0.5})

    @staticmethod
    def ranges(t) -> None:
        at_least("task.n_steps", t.n_steps, 1)
        bad_ops = [o for o in t.operators if o not in ("+", "-", "*")]
        if bad_ops or not t.operators:
            fail("task.operators", f"{bad_ops or 'empty'}: allowed operators are +, -, *")
        bad_mult = [x for x in t.multipliers if x not in (1, 3, 7, 9)]
        if bad_mult or ("*" in t.operators and not t.multipliers):
            fail("task.multipliers", f"{bad_mult or 'empty'}: multipliers must be coprime to 10 "
                                     "(1, 3, 7, 9) so every step is a bijection")
        bad_styles = [k for k in t.styles if k not in ("careful", "shortcut")]
        weights = list(t.styles.values())
        if bad_styles or not weights or not all(w >= 0 for w in weights) or not sum(weights) > 0:
            fail("task.styles", "weights >= 0 for careful and/or shortcut, not all zero"
                                + (f"; unknown: {bad_styles}" if bad_styles else ""))


@dataclass
class QATaskConfig(WordTaskConfig):
    """qa (stopexp/tasks/qa.py): questions and reference answers from a file or hub dataset."""
    name: str = "qa"
    # a shipped benchmark (gsm8k, math500, aime24, aime25, hmmt25, amc23; stopexp/tasks/data),
    # a .jsonl / .json / .parquet file, or a hub dataset id
    path: Optional[str] = None
    subset: Optional[str] = None         # hub dataset config name (e.g. "main" for openai/gsm8k)
    source_split: str = "test"           # which split of the hub dataset
    question_key: str = "question"
    answer_key: str = "answer"           # a bare answer or a solution ending in one
    answer_format: str = "numeric"       # numeric (#### 42, or \boxed{}) | boxed (\boxed{})
    # strict (#### / "The answer is" / \boxed{}) | flexible (else the last number)
    extraction: str = "strict"
    prompt_template: str = "{question}"

    @staticmethod
    def ranges(t) -> None:
        if "{question}" not in t.prompt_template:
            fail("task.prompt_template", f"must contain {{question}}, got {t.prompt_template!r}")

    @staticmethod
    def needs(t) -> None:
        if not t.path:
            fail("task.path", f"task qa needs a shipped benchmark ({', '.join(BENCHMARKS)}), a "
                              ".jsonl / .json / .parquet file or a hub dataset id")


@dataclass
class FewShotTaskConfig(WordTaskConfig):
    """What the generated tasks posed after solved examples read."""
    shots: int = 3                       # solved examples before the question
    format: str = "fewshot"              # fewshot (plain text) | chat (one user turn)
    instruction: str = ""                # chat format: text before the examples


@dataclass
class WordProblemTaskConfig(FewShotTaskConfig):
    """wordprob (stopexp/tasks/wordprob.py): generated word problems with numeric answers."""
    name: str = "wordprob"
    steps: List[int] = field(default_factory=lambda: [1])   # steps per problem, drawn from this list
    number_range: List[int] = field(default_factory=lambda: [2, 9])  # [low, high] of the numbers
    operations: Dict[str, float] = field(default_factory=lambda: {
        "add": 1.0, "sub": 1.0, "compare": 1.0, "count": 0.0})  # first step's operation mix
    extraction: str = "strict"           # strict ("The answer is", ####) | flexible (last number)
    solution_style: str = "inline"       # inline (one paragraph) | lines (a line per step)
    shot_match: str = "first_operation"  # first_operation | structure (same first step and steps) |
                                          # operations (the same operations, in order)


@dataclass
class DataToTextTaskConfig(FewShotTaskConfig):
    """datatotext (stopexp/tasks/datatotext.py): a restaurant record into one sentence."""
    name: str = "datatotext"


@dataclass
class TaskConfig(DataToTextTaskConfig, WordProblemTaskConfig, QATaskConfig, ArithTaskConfig):
    """Every task's keys (the view: what cfg.task holds, whichever task is chosen)."""
    name: str = "arith"


TASK = Group("task", {"arith": ArithTaskConfig, "qa": QATaskConfig,
                       "wordprob": WordProblemTaskConfig, "datatotext": DataToTextTaskConfig},
              TaskConfig)


def check_task(t) -> None:
    TASK.check(t)
