"""What a stopping method is: a dataclass of its settings (defaults: its source's) that
knows where it runs and how, registered by name in stopexp.core.names REGISTRY["stopping"]
("module:Class", looked up lazily, so that the config checks its settings without torch).

    @dataclass
    class ESC(StoppingMethod):
        window: int = 8
        name: ClassVar[str] = "esc"
        source: ClassVar[str] = "arXiv 2401.10480"

        def problems(self, n=None):            # field -> why it is out of range
            return {"window": at_least(self.window, 1)}

        def replay(self, r):                   # on a trace bank (stopexp.stopping.replay.Replay)
            ...
        def decide(self, prompt, order):       # on an answers-only prompt -> Decision
            ...

`banks` says where it runs ("traces": evaluate's replay, "answers": answers_replay); a
method that stops paths while they run (`inside`) also has a `controller`, which runs its
protocol on the engine under evaluate.mode=online (stopexp.search.inpath);
`traces_only` / `answers_only` name the fields only one kind of bank reads. The config
holds one subtree per method and bank kind (evaluate.stopping.<name>, answers_replay's
stopping.<name>: stopexp.config.stopping), whose values build the method (`of`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from stopexp.core.errors import fail

BANKS = ("traces", "answers")


def at_least(value, low) -> str | None:
    """Why value is below `low` (NaN included), None when it is not."""
    return None if value is not None and value >= low else f"must be >= {low}, got {value}"


def within(value, low, high, low_open: bool = False) -> str | None:
    """Why value is outside [low, high] ((low, high] with `low_open`; NaN fails)."""
    ok = (value > low if low_open else value >= low) and value <= high
    return None if ok else f"must lie in {'(' if low_open else '['}{low}, {high}], got {value}"


def whole(value, low: int) -> str | None:
    """Why value is not an integer >= low (a bool or a float is not one)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= low:
        return None
    return f"must be an integer >= {low}, got {value!r}"


@dataclass
class StoppingMethod:
    """A stopping method and its settings (the dataclass fields of a subclass)."""
    name: ClassVar[str] = ""
    source: ClassVar[str] = ""          # where the method and its defaults come from
    banks: ClassVar[tuple[str, ...]] = BANKS
    traces_only: ClassVar[tuple[str, ...]] = ()
    answers_only: ClassVar[tuple[str, ...]] = ()
    inside: ClassVar[bool] = False      # stops running paths: `controller` runs it online

    @classmethod
    def settings(cls, bank: str) -> list[dataclasses.Field]:
        """The fields read on `bank` ("traces" or "answers")."""
        skip = cls.answers_only if bank == "traces" else cls.traces_only
        return [f for f in dataclasses.fields(cls) if f.name not in skip]

    @classmethod
    def of(cls, values: Any = None) -> "StoppingMethod":
        """The method with `values` (a mapping or config node of some of its fields; None:
        its defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: values[k] for k in (values or {}) if k in names})

    def problems(self, n: int | None = None) -> dict[str, str | None]:
        """field -> why its value is out of range (None: fine); `n`, the paths of a prompt,
        where known."""
        return {}

    def check(self, where: str, n: int | None = None) -> None:
        """ConfigError "<where>.<field>: why" for the first setting out of range."""
        for key, why in self.problems(n).items():
            if why:
                fail(f"{where}.{key}", why)

    def replay(self, r) -> dict:
        """The outcome dict on a trace bank's paths (`stopexp.stopping.replay.Replay`)."""
        raise NotImplementedError(f"{self.name} does not run on a trace bank")

    def controller(self, n: int, group_window: int, **inputs):
        """The engine-side protocol for `n` paths per prompt (stopexp.search.inpath);
        `inputs`: scorers, tokenizer, task, for the methods that read them."""
        raise NotImplementedError(f"{self.name} does not run inside the engine")

    def decide(self, prompt, order: np.ndarray):
        """The Decision on an answers-only prompt's branches `order`, in sampling order."""
        raise NotImplementedError(f"{self.name} does not run on an answers-only bank")
