"""The task group (conf/task/): what problems are posed. One schema per built-in task
(arith, qa, wordprob, datatotext) with its checks beside it; `TaskConfig`, the view, holds
every task's keys (stopexp.config.options). A task registered without a schema of its own
reads `TaskBaseConfig`'s keys and those its yaml adds; its class's capabilities
(stopexp.tasks.task.Task) are read through the registry, which imports no torch."""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from stopexp.config.machine import TOY_POSITIONS
from stopexp.config.options import Group, filled
from stopexp.config.ranges import at_least, fail
from stopexp.core.errors import ConfigError
from stopexp.core.names import BENCHMARKS, SPLITS, lookup, names

__all__ = ["TASK", "ArithTaskConfig", "DataToTextTaskConfig", "MixtureTaskConfig", "QATaskConfig",
           "TaskConfig", "WordProblemTaskConfig", "check_task", "component_section",
           "step_separator_of", "task_draws_the_prompts", "task_sections"]


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
    # 13a (scripts with spaces: Latin, Cyrillic, ...) | intl | zh (Chinese characters) |
    # char (each character: Japanese kana, Thai, Lao, Khmer, Myanmar)
    tokenize: str = "13a"


# validate draws the problems (task_draws_the_prompts); a chain of 1000 steps is a prompt of
# 2002 characters and a written solution of ~6000, beyond any search.max_new_tokens here
MAX_ARITH_STEPS = 1000


@dataclass
class ArithTaskConfig(TaskBaseConfig):
    """arith (stopexp/tasks/arith.py): chained arithmetic mod 10."""
    name: str = "arith"
    n_steps: int = 6
    operators: List[str] = field(default_factory=lambda: ["+", "-", "*"])
    multipliers: List[int] = field(default_factory=lambda: [3, 7, 9])
    styles: Dict[str, float] = field(default_factory=lambda: {"careful": 0.5, "shortcut": 0.5})
    prompt_offset: int = 0   # each split's prompts start after this many of its seeded draw

    @staticmethod
    def ranges(t) -> None:
        at_least("task.prompt_offset", t.prompt_offset, 0)
        if not 1 <= t.n_steps <= MAX_ARITH_STEPS:
            fail("task.n_steps", f"must lie in 1..{MAX_ARITH_STEPS}, got {t.n_steps}")
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


# What the generated tasks can make (stopexp/tasks/wordprob.py, datatotext.py: the tests
# compare): the solved examples are drawn from a pool of SHOT_POOL training problems
# (wordprob's shot_match=operations: OPERATIONS_POOL), less the question itself
SHOT_POOL = 64
OPERATIONS_POOL = 256
WORDPROB_OPERATIONS = ("add", "sub", "compare", "count")
WORDPROB_MAX_STEPS = 4


@dataclass
class FewShotTaskConfig(WordTaskConfig):
    """What the generated tasks posed after solved examples read."""
    shots: int = 3                       # solved examples before the question
    format: str = "fewshot"              # fewshot (plain text) | chat (one user turn)
    instruction: str = ""                # chat format: text before the examples
    # each split's prompts start after this many of its seeded draw: fresh prompts of the
    # same task, sharing no text with a bank that drew at most this many per split
    prompt_offset: int = 0

    @staticmethod
    def ranges(t) -> None:
        at_least("task.prompt_offset", t.prompt_offset, 0)
        by_operations = t.name == "wordprob" and t.shot_match == "operations"
        pool = OPERATIONS_POOL if by_operations else SHOT_POOL
        if not 0 <= t.shots <= pool - 1:
            fail("task.shots", f"must lie in 0..{pool - 1}, got {t.shots}: the solved examples "
                               f"come from a pool of {pool} training problems"
                               f"{' (shot_match=operations)' if by_operations else ''}, less the "
                               "question itself")


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

    @staticmethod
    def ranges(t) -> None:
        if not t.steps or not all(1 <= s <= WORDPROB_MAX_STEPS for s in t.steps):
            fail("task.steps", f"{list(t.steps)}: give one or more step counts, each in "
                               f"1..{WORDPROB_MAX_STEPS}")
        r = list(t.number_range)
        if len(r) != 2 or not 1 <= r[0] < r[1]:
            fail("task.number_range", f"{r}: needs [low, high] with 1 <= low < high")
        ops = dict(t.operations)
        unknown = [k for k in ops if k not in WORDPROB_OPERATIONS]
        if unknown or not all(w >= 0 for w in ops.values()) or not sum(ops.values()) > 0:
            fail("task.operations", f"{ops}: weights >= 0 over {', '.join(WORDPROB_OPERATIONS)}, "
                                    "not all zero" + (f"; unknown: {unknown}" if unknown else ""))


@dataclass
class DataToTextTaskConfig(FewShotTaskConfig):
    """datatotext (stopexp/tasks/datatotext.py): a restaurant record into one sentence."""
    name: str = "datatotext"


COMPONENT_KEYS = ("task", "weight", "label")


@dataclass
class MixtureTaskConfig(TaskBaseConfig):
    """mixture (stopexp/tasks/mixture.py): prompts drawn from several tasks by weight, each
    component {task: <a task section>, weight: <share>, label: <its name in the bank's task
    column; default the task's name>}."""
    name: str = "mixture"
    components: List[Any] = field(default_factory=list)

    @staticmethod
    def ranges(t) -> None:
        seen = {}
        for i, c in enumerate(t.components):
            key = f"task.components.{i}"
            if not isinstance(c, DictConfig) or set(c) - set(COMPONENT_KEYS) or "task" not in c:
                fail(key, f"{_shown(c)}: give {{task: {{name: <task>, ...}}, weight: <number > 0>, "
                          "label: <optional name>}")
            w = c.get("weight")
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0 or w != w or w == float("inf"):
                fail(f"{key}.weight", f"{w!r}: a component's weight must be a finite number > 0")
            label = component_section(c["task"], f"{key}.task").name if c.get("label") is None \
                else c["label"]
            if not isinstance(label, str) or not label or label in seen:
                fail(f"{key}.label", f"{label!r}: each component needs a label of its own (a "
                                     f"non-empty string; {label!r} is also component "
                                     f"{seen.get(label)}'s); set task.components.{i}.label")
            seen[label] = i

    @staticmethod
    def needs(t) -> None:
        if len(t.components) < 2:
            fail("task.components", f"{len(t.components)} components: a mixture draws from two "
                                    "tasks or more (one task: task=<its name>)")


def _shown(value) -> str:
    return repr(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)


@dataclass
class TaskConfig(MixtureTaskConfig, DataToTextTaskConfig, WordProblemTaskConfig, QATaskConfig,
                 ArithTaskConfig):
    """Every task's keys (the view: what cfg.task holds, whichever task is chosen)."""
    name: str = "arith"


TASK = Group("task", {"arith": ArithTaskConfig, "qa": QATaskConfig,
                       "wordprob": WordProblemTaskConfig, "datatotext": DataToTextTaskConfig,
                       "mixture": MixtureTaskConfig},
              TaskConfig, base=TaskBaseConfig, registered=functools.partial(names, "task"))


def check_task(t) -> None:
    TASK.check(t)


def task_sections(t) -> list[tuple[str, DictConfig]]:
    """(key, section) of each task that poses prompts: a mixture's components, else `t`."""
    if t.name != "mixture":
        return [("task", t)]
    return [(f"task.components.{i}.task", component_section(c["task"], f"task.components.{i}.task"))
            for i, c in enumerate(t.components)]


def step_separator_of(t) -> str | None:
    """What ends a reasoning step in the prompts of the task section `t` (its class's
    `step_separator`); a mixture's components must share theirs."""
    seps = {s.name: lookup("task", s.name).step_separator for _, s in task_sections(t)}
    if len(set(seps.values())) > 1:
        fail("tap.positions.step_ends", "the components of task mixture end a step differently ("
                                        + ", ".join(f"{n}: {s!r}" for n, s in seps.items())
                                        + "); step ends need one separator shared by every "
                                        "component: use tap.positions.stride or "
                                        "tap.positions.checkpoints")
    return next(iter(seps.values()), None)


def component_section(section, key: str = "task.components.0.task") -> DictConfig:
    """A mixture component's task section (`key` names it in messages) over its task's
    schema, checked as `check_task` checks a task: a key its task does not read, a value out
    of its range or an unknown name is one line naming `key`."""
    if not isinstance(section, DictConfig) or not isinstance(section.get("name"), str):
        fail(key, f"{_shown(section)}: a task section with a name "
                  f"({', '.join(n for n in names('task') if n != 'mixture')})")
    name = section.name
    if name == "mixture" or name not in names("task"):
        fail(f"{key}.name", f"{name!r} is not allowed; allowed: "
                            f"{', '.join(n for n in names('task') if n != 'mixture')}")
    schema = TASK.options.get(name)
    try:
        out = OmegaConf.merge(OmegaConf.structured(schema), section) if schema else \
            OmegaConf.merge(OmegaConf.to_container(OmegaConf.structured(TaskBaseConfig)), section)
    except ConfigKeyError as e:
        fail(f"{key}.{e.key}", f"not a key of task {name}; its keys: "
                               f"{', '.join(f.name for f in dataclasses.fields(schema))}")
    except OmegaConfBaseException as e:  # a value of the wrong type
        fail(f"{key}.{e.key}", f"{_shown(section.get(e.key))}: {str(e).splitlines()[0]}")
    try:
        check_task(OmegaConf.merge(filled(TaskConfig), out))
    except ConfigError as e:
        raise ConfigError(str(e).replace("task.", f"{key}.", 1)) from None
    return out


MAX_DRAWN = 100_000  # validate draws at most this many problems of a split (~1 s per 10_000)
# the toy LM's tokenizer: a BOS, then one token per character (stopexp.models.tokenizer)
TOY_PROMPT_TOKENS = "a BOS and one per character"


@functools.lru_cache(maxsize=64)
def _drawn(name: str, section: str, counts: tuple, toy: bool) -> tuple:
    """(key, message) for the first count that the task of `section` (JSON) cannot draw,
    None when it draws all; with `toy`, also the longest prompt in the toy LM's tokens:
    (tokens, split, prompt id). Memoised: validate runs often on the same task."""
    task = lookup("task", name).from_config(OmegaConf.create(json.loads(section)))
    size = task.size()
    for split, n in counts:
        if size is not None and n > size:
            return (f"collect.prompts.{split}", f"{n}: task {name} has {size} distinct problems "
                                                "in all (its splits share them); lower the count"), None
        if n > MAX_DRAWN:
            continue  # too many to draw here; collect draws them
        try:
            task.distinct(split, n)
        except ValueError as e:
            return (f"collect.prompts.{split}", str(e).removeprefix("task: ")), None
    if task.shots:
        try:
            task.shot_pool()
        except ValueError as e:
            drawn = str(e).removeprefix("task: ").partition("; ")[0]
            return ("task.shots", f"{task.shots} solved examples are drawn from a pool of train "
                                  f"problems, but it {drawn}; give the task more train problems "
                                  "(task.split_fractions.train, its range), or task.shots=0"), None
    if not toy:
        return None, None
    longest = max(((len(p.prompt) + 1, split, p.prompt_id) for split, n in counts
                   for p in task.problems(split, min(n, 1000))), default=None)
    return None, longest


def task_draws_the_prompts(cfg) -> None:
    """A generated task (its class's `generated`) has as many distinct problems in each split as
    collect.prompts asks, and train problems for its solved examples and the toy LM to
    learn from: drawn here (tens of ms) rather than found short after the model loaded.
    Under the toy LM (its positions known: stopexp.config.machine.TOY_POSITIONS), each
    prompt leaves search.max_new_tokens of them (model.long_prompts=error)."""
    t, m = cfg.task, cfg.model
    cls = lookup("task", t.name)
    if not cls.generated:
        return
    counts = dict(cfg.collect.prompts)
    # the toy LM learns from train problems, and reads the prompts of a task it learns whole
    toy = m.name == "toy" and bool(cls.toy_keys)
    if toy:
        counts["train"] = max(counts.get("train", 0), 1)
    section = json.dumps(OmegaConf.to_container(t, resolve=True), sort_keys=True)
    short, longest = _drawn(t.name, section, tuple(sorted(counts.items())), toy)
    if short:
        fail(*short)
    if longest is None or m.long_prompts != "error":
        return
    n, split, prompt_id = longest
    what = f"prompt {split}/{prompt_id} of task {t.name} is {n} tokens of the toy LM ({TOY_PROMPT_TOKENS})"
    if m.max_prompt_tokens is not None and n > m.max_prompt_tokens:
        fail("model.max_prompt_tokens", f"{m.max_prompt_tokens}: {what}; shorten the task's "
                                        "prompts (task.n_steps, task.shots), or set "
                                        "model.long_prompts=skip")
    room = TOY_POSITIONS - cfg.search.max_new_tokens
    if m.max_prompt_tokens is None and 0 < room < n:  # no room at all: machine.check_positions
        fail("search.max_new_tokens", f"{cfg.search.max_new_tokens}: {what}, and the toy LM's "
                                      f"{TOY_POSITIONS} positions leave it {room}; shorten the "
                                      "task's prompts (task.n_steps, task.shots) or the paths, or "
                                      "set model.long_prompts=skip")
