"""The engines that generate paths, behind one interface (`Backend`), registered by name
(`stopexp.core.names.REGISTRY["engine"]`, the `engine` config group): stopexp's own decode
engine (`hf`) and vLLM (`vllm`). Stages ask `backend(cfg.engine.name)` for what they need,
and nothing outside these modules and the config branches on an engine's name. Adding an
engine: docs/engines.md#adding-an-engine."""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from stopexp.core.names import lookup


@dataclass(frozen=True)
class Sections:
    """The config sections an engine runs from (a stage builds it once)."""
    model: Any
    engine: Any
    task: Any
    search: Any
    tap: Any
    seed: int
    cache_dir: str


class Backend(Protocol):
    """What stopexp asks of an engine. `open` gives collect a generator: `steps(max_rows)`
    (stopexp.search.stepping.Steps: its paths stepped, their Monte Carlo rollouts, and
    with taps their hidden states as they are generated), `record()` (for the bank's
    meta.json). `online` is Launch-Check-Resume of `problems`."""

    def taps_in_engine(self, engine, tap) -> bool:
        """Whether it reads `tap`'s hidden states while it generates (no second pass)."""

    def open(self, model, engine, cache_dir: str, task, params, tap=None,
             positions: dict | None = None) -> AbstractContextManager[tuple[Any, Any, Any]]:
        """(generator, model, tokenizer) for collect; with `tap`, the states of tap.layers
        at the generated `positions` (a features position spec) are tapped as it goes."""

    def load(self, model, engine, cache_dir: str, task, tap, progress: bool) -> tuple[Any, Any]:
        """(model, tokenizer) as online evaluate needs them (weights only where the check
        reads them from a second forward)."""

    def online(self, lm, tokenizer, task, problems, methods: dict, checkpoint, *,
               sections: Sections, params, max_rows: int):
        """Launch-Check-Resume of `problems` (the `task`'s) with `lm` (`load`'s) for
        `methods` (name -> (scorer, policy factory)) plus no_prune, checked at `checkpoint`
        (tokens, or a list: progressive), at most `max_rows` rows per forward: (runs, check
        batch) as stopexp.search.lcr.launch_check_resume returns them."""

    def serve(self, lm, tokenizer, *, sections: Sections, params, checks: tuple[int, ...],
              max_rows: int) -> AbstractContextManager[Any]:
        """An open stepper for a server (stopexp.search.cohorts: `add(paths, params)` while
        others run, `step`, `abort`, `release`, `held`, and the check's inputs at `checks`,
        tokens), sampling with `params` unless `add` says otherwise; at most `max_rows` rows
        per forward where the engine batches by rows."""

    def stopping(self, lm, tokenizer, task, problems, controllers: dict, *, sections: Sections,
                 params, max_rows: int) -> dict:
        """Each stopping method's protocol inside the running paths of `problems`
        (`controllers`: name -> its controller, stopexp.search.inpath), one run per method:
        name -> stopexp.search.lcr.OnlineRun. A controller with a `separator` reads the
        tapped states at the tokens that end a reasoning step."""


def backend(name: str) -> Backend:
    """The engine registered as `name` (engine.name)."""
    return lookup("engine", name)()
