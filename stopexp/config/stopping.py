"""The stopping methods' settings in the config: one subtree per registered stopping method
(stopexp.core.names REGISTRY["stopping"]: a `stopexp.stopping.method.StoppingMethod`, the
dataclass of its settings) with the fields it reads on a trace bank (evaluate.stopping.<name>)
or on an answers-only bank (answers_replay's stopping.<name>). The schema is built from the
methods' own dataclasses, so each default lives in one place; a method without settings
has no subtree. Looking the methods up imports their modules, which need numpy only."""
from __future__ import annotations

import dataclasses
import typing

from stopexp.config.ranges import fail
from stopexp.core.commands import override, shell_word
from stopexp.core.names import lookup, names


def methods_on(bank: str) -> tuple[str, ...]:
    """The registered stopping methods that run on `bank` ("traces" or "answers")."""
    return tuple(m for m in names("stopping") if bank in lookup("stopping", m).banks)


def settings_schema(bank: str) -> type:
    """A dataclass with a field per method of `methods_on(bank)` that reads settings there:
    a dataclass of those settings, with the method's defaults."""
    fields = []
    for name in methods_on(bank):
        cls = lookup("stopping", name)
        hints = typing.get_type_hints(cls)
        own = [(f.name, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata))
               for f in cls.settings(bank)]
        if own:
            node = dataclasses.make_dataclass(f"{cls.__name__}Settings", own)
            fields.append((name, node, dataclasses.field(default_factory=node)))
    return dataclasses.make_dataclass(f"Stopping{bank.title()}", fields)


def setting_keys(schema: type, prefix: str) -> list[tuple[str, str]]:
    """(key, method) of every setting of a `settings_schema` under `prefix`."""
    return [(f"{prefix}.{m.name}.{k.name}", m.name) for m in dataclasses.fields(schema)
            for k in dataclasses.fields(m.type)]


TracesStopping = settings_schema("traces")
AnswersStopping = settings_schema("answers")


def check_stopping(node, where: str, bank: str, methods, n: int | None = None) -> None:
    """The settings of every method under `node` (`where`: its key) in range, and those of
    `methods` (the ones that run) against `n`, the paths of a prompt, where it is known; a
    stopping method of `methods` that does not run on `bank` is refused."""
    for name in methods:
        if name in names("stopping") and bank not in lookup("stopping", name).banks:
            other = ("an answers-only bank (python -m stopexp.answers_replay)" if bank == "traces"
                     else "a trace bank (python -m stopexp.evaluate)")
            fail("evaluate.methods" if bank == "traces" else "methods",
                 f"{name!r} runs only on {other}")
    for name in node:
        lookup("stopping", name).of(node[name]).check(f"{where}.{name}",
                                                      n if name in methods else None)


# keys that moved into the methods' subtrees: a command line naming one is told where
MOVED = {
    **{f"evaluate.{old}": f"evaluate.stopping.{new}" for old, new in (
        ("esc_window", "esc.window"), ("asc_threshold", "adaptive_consistency.threshold"),
        ("deepconf_warmup", "deepconf_online.warmup"),
        ("deepconf_keep_percent", "deepconf_online.keep_percent and/or "
                                  "evaluate.stopping.deepconf_top.keep_percent"),
        *((f"combined_{k}", f"combined.{k}") for k in (
            "signal", "first", "wave", "threshold", "prune_below", "prune_confidence")))},
}
MOVED_ANSWERS = {
    "esc_window": "stopping.esc.window", "asc_threshold": "stopping.adaptive_consistency.threshold",
    **{f"pp_{k}": f"stopping.parallel_probe.{k}" for k in ("stable", "deviate", "warmup", "vote_pruned")},
    **{f"combined_{k}": f"stopping.combined.{k}" for k in (
        "first", "wave", "threshold", "settle", "prune_below", "prune_confidence")},
    "out": "hydra.run.dir",
}


def check_moved(config_name: str, overrides: list[str]) -> None:
    """ConfigError naming the new key for an override of a key that moved (MOVED; for
    answers_replay MOVED_ANSWERS, and a bank given without bank=)."""
    moved = MOVED_ANSWERS if config_name == "answers_replay" else MOVED
    for line in overrides:
        key, eq, value = line.lstrip("+~").partition("=")
        if config_name == "answers_replay" and not eq:
            fail("bank", f"give the answers-only bank as {shell_word(override('bank', line))}")
        if key in moved:
            fail(key, f"moved: set {moved[key]}={value}" if " " not in moved[key] else
                 f"moved: set {moved[key]}")
