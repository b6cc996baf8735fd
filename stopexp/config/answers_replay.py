"""The answers_replay stage's own schema (conf/answers_replay.yaml extends
`answers_replay_config`): an answers-only bank, the methods replayed on it and how its
branches are drawn; the stopping methods' settings are their own (stopping.<method>,
stopexp.config.stopping). Its checks need not the bank's content; those that do (n, k:
within its branch count) run once it is read (stopexp.stages.answers_replay)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING, OmegaConf

from stopexp.config.paths import PathsConfig
from stopexp.config.ranges import at_least, fail
from stopexp.config.stopping import AnswersStopping, check_stopping, methods_on, setting_keys

FORMATS = ("boxed", "numeric")        # stopexp.metrics.answers.FORMATS
SHUFFLERS = ("numpy", "python")       # stopexp.stopping.branch_draws.SHUFFLERS


def method_names() -> list[str]:
    """no_prune, random and the stopping methods that run on an answers-only bank."""
    return ["no_prune", "random", *methods_on("answers")]


@dataclass
class AnswersReplayConfig:
    stage: str = "answers_replay"
    bank: str = MISSING                 # the answers-only bank (.json; stopexp.stopping.answers_bank)
    methods: List[str] = field(default_factory=method_names)
    n: Optional[int] = None             # branches drawn per prompt; None: the bank's branch count
    k: Optional[int] = None             # random's kept branches; None: round(sqrt(n))
    check_tokens: Optional[int] = None  # random's check; None: 15% of the median branch length
    shuffles: int = 100                 # draws of n branches per prompt
    seed: int = 0
    shuffler: str = "numpy"             # numpy | python (Parallel-Probe's simulator's draws)
    format: str = "boxed"               # the answers' format: boxed | numeric
    stopping: AnswersStopping = field(default_factory=AnswersStopping)
    paths: PathsConfig = field(default_factory=PathsConfig)
    optimized_metric: Optional[str] = None


# answers_replay's keys that only some methods read: key -> the methods
READ_BY = {"k": ("random",), "check_tokens": ("random",),
           **{key: (m,) for key, m in setting_keys(AnswersStopping, "stopping")}}


def check_answers_replay(cfg) -> None:
    """Every setting that the bank's content does not bound, and no key set that the chosen
    methods do not read."""
    if OmegaConf.is_missing(cfg, "bank"):
        fail("bank", "give the answers-only bank, bank=PATH.json")
    allowed = method_names()
    if not len(cfg.methods):
        fail("methods", f"[] replays nothing; give at least one of {', '.join(allowed)} (unset: "
                        "all of them)")
    check_stopping(cfg.stopping, "stopping", "answers", cfg.methods)
    unknown = [m for m in cfg.methods if m not in allowed]
    if unknown:
        fail("methods", f"{', '.join(unknown)} unknown; allowed: {', '.join(allowed)}")
    for key, values in (("format", FORMATS), ("shuffler", SHUFFLERS)):
        if cfg[key] not in values:
            fail(key, f"{cfg[key]!r} is not allowed; allowed: {', '.join(values)}")
    at_least("shuffles", cfg.shuffles, 1)
    at_least("seed", cfg.seed, 0)
    for key in ("n", "k", "check_tokens"):
        if cfg[key] is not None:
            at_least(key, cfg[key], 1)
    for key, readers in READ_BY.items():
        if not set(readers) & set(cfg.methods) and OmegaConf.select(cfg, key) != default(key):
            fail(key, f"{OmegaConf.select(cfg, key)!r} is read only by the method "
                      f"{' or '.join(readers)}, not in methods; leave it unset (default "
                      f"{default(key)!r})")


def default(key: str):
    return OmegaConf.select(OmegaConf.structured(AnswersReplayConfig), key)


def check_unread_overrides(cfg, overrides) -> None:
    """A key set on the command line that the chosen methods do not read, even at its default."""
    for line in overrides:
        key = line.lstrip("+~").partition("=")[0]
        readers = READ_BY.get(key)
        if readers and not set(readers) & set(cfg.methods):
            fail(key, f"set by {line}, but read only by the method {' or '.join(readers)}, not in "
                      "methods; drop it")

