"""Paths run one engine step at a time: what every engine offers collect
(stopexp.search.trace), its Monte Carlo rollouts and Launch-Check-Resume
(stopexp.search.lcr). A path is a `Running` record; a `Stepper` adds paths with their
prompts and stream seeds, steps them, aborts some, continues a prefix in rollouts, and
gives the per-token columns and the check's inputs (tapped states, per-token log-prob
statistics) of the paths it holds. An engine's `Steps` starts steppers and says how many
prompts one may hold. Implementations: stopexp.search.decode_steps (the hf engine) and
stopexp.search.vllm_steps (vLLM)."""
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
    finish_reason: str | None = None  # "stop": EOS or a stop string; "length": max tokens
    pruned: bool = False
    # generated tokens after which the state at a prefix can be read: vLLM's taps read the
    # state at prefix c in the forward that feeds token c, which also samples token c + 1
    lag: int = 0
    logprobs: list = field(default_factory=list)  # vLLM's {token id: Logprob} per position
    request_id: str = ""
    watch: object = None     # its in-engine taps (stopexp.search.vllm_taps.Watch)
    prefilled: int | None = None  # prompt tokens computed for it (the rest came from the prefix cache)

    @property
    def stopped(self) -> bool:
        """Ended by an EOS id or a stop string (not at max tokens, not pruned)."""
        return self.finished and self.finish_reason == "stop"

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

    def columns(self, paths: list[Running], upto: int | None = None) -> list[tuple]:
        """Per path its per-token (log-prob, entropy, confidence) float32 arrays, of its
        first `upto` tokens (None: all it has)."""

    def rollouts(self, paths: list[Running], check: int, seeds: list[int], repeats: int,
                 logprobs: bool = False) -> list[list[tuple]]:
        """Per path, `repeats` continuations of its first `check` tokens (every path alive
        there), the r-th drawn from `seeds[path * repeats + r]`: (token ids after the
        prefix, their sampled log-probs or None) each, ended as the path would have ended
        (EOS, stop string, max tokens); the paths themselves are not changed."""

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



def prompt_chunks(n_problems: int, n_paths: int, max_rows: int):
    """Ranges of problems whose N paths fit into `max_rows` rows (at least one problem)."""
    per = max(1, max_rows // n_paths)
    for lo in range(0, n_problems, per):
        yield range(lo, min(n_problems, lo + per))


def run_paths(steps: Steps, prompts: list[list[int]], seeds: list[int],
              labels: list[str] | None = None) -> tuple[Stepper, list[Running]]:
    """Whole paths: each of `prompts` (token ids) with its stream seed, stepped to its end
    by one stepper of the engine's `steps`. Returns the stepper (for `columns`) and the
    paths, keyed (index,)."""
    if len(prompts) != len(seeds) or not prompts:
        raise ValueError("run_paths needs one seed per prompt and at least one prompt")
    paths = [Running((r,), list(p), s) for r, (p, s) in enumerate(zip(prompts, seeds))]
    stepper = steps.start(paths, labels=labels)
    while stepper.running:
        stepper.step()
    return stepper, paths


def step_to(stepper: Stepper, check: int) -> None:
    """Step until every path of `stepper` holds `check` tokens or has ended."""
    while stepper.running and not all(p.finished or p.pruned or len(p.tokens) >= check
                                      for p in stepper.paths):
        stepper.step()
