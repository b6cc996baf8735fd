"""Paths run one engine step at a time: what every engine offers Launch-Check-Resume
(stopexp.search.lcr) and collect with taps. A path is a `Running` record; a `Stepper`
adds paths with their prompts and stream seeds, steps them, aborts some, and gives the
check's inputs (tapped states, per-token log-prob statistics) of the paths it holds. An
engine's `Steps` starts steppers and says how many prompts one may hold. Implementations:
stopexp.search.decode_steps (the hf engine) and stopexp.search.vllm_steps (vLLM)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Running:
    """One path as it runs: its tokens as they arrive and how it ended."""
    key: tuple          # who it is to the caller: (prompt index, path id), or (row,)
    prompt: list        # prompt token ids
    seed: int
    tokens: list = field(default_factory=list)
    finished: bool = False   # ended: EOS, stop string or max tokens
    finish_reason: str | None = None
    pruned: bool = False
    # generated tokens after which the state at a prefix can be read: vLLM's taps read the
    # state at prefix c in the forward that feeds token c, which also samples token c + 1
    lag: int = 0
    logprobs: list = field(default_factory=list)  # vLLM's {token id: Logprob} per position
    request_id: str = ""
    watch: object = None     # its in-engine taps (stopexp.search.vllm_taps.Watch)
    prefilled: int | None = None  # prompt tokens computed for it (the rest came from the prefix cache)

    @property
    def token_ids(self) -> list:  # read as a vLLM CompletionOutput is
        return self.tokens

    def live_at(self, check: int) -> bool:
        """Alive at the check, as replay counts it: the path is longer than the check."""
        return len(self.tokens) > check or (not self.finished and len(self.tokens) >= check)

    def reached(self, check: int) -> bool:
        """Ready to be checked at `check`: ended, or long enough for its state there."""
        return self.finished or self.pruned or len(self.tokens) >= check + self.lag


class Stepper(Protocol):
    """Paths run as one batch of an engine, one step at a time."""
    paths: list[Running]

    @property
    def running(self) -> bool:
        """Whether any path still runs."""

    def step(self) -> None:
        """One engine step: every running path's new tokens (and taps) taken in."""

    def abort(self, paths: list[Running]) -> None:
        """Stop `paths` and free their cache."""

    def observe(self) -> None:
        """The KV meter observes the cached tokens of the paths still running."""

    def inputs(self, paths: list[Running], check: int) -> tuple:
        """(hidden (B, layers, H), attention entropy (B,) or None, log-prob, entropy,
        confidence (B, check)) of `paths`, all alive at prefix `check`."""

    def lm_state(self, paths: list[Running]):
        """The live decode state whose rows are `paths` in order (for super_token's check
        from the cache), or None (it re-encodes the prefixes)."""


class Steps(Protocol):
    """An engine as Launch-Check-Resume steps it."""

    def start(self, paths: list[Running], meter=None, labels: list[str] | None = None) -> Stepper:
        """A stepper holding `paths` (launched now); `meter` (stopexp.search.memory.KVMeter)
        observes their cached tokens; `labels` name them in error messages."""

    def chunks(self, n_prompts: int, n_paths: int) -> list[range]:
        """The prompts that run together, chunk by chunk."""

