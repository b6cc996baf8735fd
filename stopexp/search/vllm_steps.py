"""Paths as requests of a stepped vLLM engine (its core in this process, no step scheduled
ahead: stopexp.search.vllm_engine.VllmSettings.stepped): added with their seeds, stepped one
engine step at a time, aborted by id, each request's new tokens, log-probs and (with the
engine's in-engine taps, stopexp.search.vllm_taps) states taken in as they arrive. Collect
with taps and online Launch-Check-Resume (stopexp.search.vllm_lcr) run on it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Running:
    """One path run as a request on a stepped engine, as its outputs arrive."""
    key: tuple          # who it is to the caller: (prompt index, path id), or (row,)
    prompt: list        # prompt token ids
    seed: int
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # vLLM's {token id: Logprob} per position
    finished: bool = False   # ended: EOS, stop string or max tokens
    finish_reason: str | None = None
    pruned: bool = False
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
        """Ready to be checked at `check`: ended, or `check` tokens long; with taps, the
        state at `check` is read by the forward that feeds token `check`, the one that also
        samples the next token, so a path is ready one token later."""
        return self.finished or self.pruned or len(self.tokens) >= check + (self.watch is not None)


class Stepper:
    """Paths run as requests of a stepped engine (its core in this process, no step
    scheduled ahead): `step` runs one engine step and takes in every request's new tokens
    and log-probs (and, with the engine's taps, its states); `abort` stops requests. A
    `meter` (stopexp.search.memory.KVMeter) observes the cached tokens per prompt at the
    launch and at each `observe`."""

    def __init__(self, engine, paths: list[Running], meter=None):
        from vllm.inputs import TokensPrompt

        self.core, self.paths, self.meter = engine.llm.llm_engine, paths, meter
        if self.core.has_unfinished_requests():
            raise RuntimeError("the vLLM engine has unfinished requests: it is not free for a run")
        self.taps, self.ids = engine.taps, {}
        for n, p in enumerate(paths):
            p.request_id = f"path{n}"
            self.ids[p.request_id] = p
            if self.taps is not None:
                p.watch = self.taps.watch(p.request_id, len(p.prompt), engine.wanted(p.tokens))
            self.core.add_request(p.request_id, TokensPrompt(prompt_token_ids=list(p.prompt)),
                                  engine.request(p.seed, delta=True))
        if meter is not None:
            meter.observe(torch.tensor([len(p.prompt) for p in paths]), [p.key[0] for p in paths])

    @property
    def running(self) -> bool:
        return self.core.has_unfinished_requests()

    def observe(self) -> None:
        """The meter observes the cached tokens of the paths still live (a caller that
        aborts after a step observes after the abort)."""
        live = [p for p in self.paths if not (p.finished or p.pruned)]
        if self.meter is not None and live:
            self.meter.observe(torch.tensor([len(p.prompt) + len(p.tokens) for p in live]),
                               [p.key[0] for p in live])

    def step(self) -> None:
        for out in self.core.step():
            p, o = self.ids[out.request_id], out.outputs[0]
            if p.prefilled is None and out.num_cached_tokens is not None:
                p.prefilled = len(p.prompt) - out.num_cached_tokens
            p.tokens += list(o.token_ids)
            p.logprobs += list(o.logprobs or [])
            p.finished = out.finished
            p.finish_reason = o.finish_reason or p.finish_reason
            if out.finished and self.taps is not None:
                self.taps.forget(p.request_id)

    def abort(self, paths: list[Running]) -> None:
        self.core.abort_request([p.request_id for p in paths])
        for p in paths:
            p.pruned = True
            if self.taps is not None:
                self.taps.forget(p.request_id)
