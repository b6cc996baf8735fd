"""In-engine taps run inside vLLM's workers, wherever they are: the engine core in this
process or in its own (VLLM_ENABLE_V1_MULTIPROCESSING=1), one worker or one per tensor
parallel rank (engine.tensor_parallel_size > 1).

Through vLLM's extension points only: `TapWorker` is the engine's `worker_extension_cls`,
which vLLM mixes into each worker's class, and `WorkerTaps` (this process) drives it by
`LLM.collective_rpc`: arm the reader on one rank's model runner (stopexp.search.vllm_taps.
EngineTaps), add the requests to watch before they run, and after each engine step take
what was read and drop the requests that ended. The model class that writes the tap
buffers is built in each worker from its name (`tapped_architecture`): importing this
module, which vLLM does in every worker before it loads the model, registers the tapped
twin of every architecture vLLM knows, lazily (nothing is built until a model names it).

Under tensor parallel each rank holds the whole residual stream after a decoder layer:
vLLM's row-parallel projections (attention's o_proj, the MLP's down_proj) all-reduce
their partial sums, and the residual added to them is replicated. So one rank's states
are the model's; rank 0's are read (`rank`).

A worker keeps the states of each watched request at the positions it may want
(`Candidates`: the checkpoints and stride; every position where a step end decides,
because a step end depends on the generated token, which this process knows). Here each
is kept where the path's `wanted` says so, once the token it depends on has arrived (the
engine core in its own process runs ahead of its caller).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from stopexp.search.vllm_taps import TAPPED, EngineTaps, tapped_class_path


@dataclass(frozen=True)
class Candidates:
    """The generated positions a worker keeps."""
    checkpoints: frozenset = frozenset()
    stride: int | None = None
    every: bool = False  # a step end decides: every position, filtered here

    @classmethod
    def of(cls, positions: dict) -> "Candidates":
        """Of a features position spec (checkpoints, stride, separator)."""
        return cls(frozenset(positions["checkpoints"]), positions["stride"],
                   positions["separator"] is not None)

    def plain(self) -> list:
        """As it travels to a worker (vLLM's messages carry plain values only)."""
        return [sorted(self.checkpoints), self.stride, self.every]

    def __call__(self, c: int) -> bool:
        return self.every or c in self.checkpoints or bool(self.stride and c % self.stride == 0)


class TapWorker:
    """vLLM's worker extension (`worker_extension_cls`): the tap reader of one worker,
    driven by `collective_rpc`. Every name starts with `stopexp_`, as vLLM refuses an
    extension that shadows a name of the worker."""

    def stopexp_taps_arm(self, layers, pooling: str, dtype: str, rank: int) -> str | None:
        """Read `layers` on this worker if it is `rank`; the model runner's kind (V1, V2)."""
        self.stopexp_taps_disarm()
        if self.rank != rank:
            return None
        self.stopexp_taps = EngineTaps(self.model_runner, layers, pooling, dtype)
        return self.stopexp_taps.batch.name

    def stopexp_taps_watch(self, watches: list) -> None:
        """Watch each (request id, prompt length, `Candidates.plain()`)."""
        taps = getattr(self, "stopexp_taps", None)
        for request_id, prompt_len, (checkpoints, stride, every) in watches if taps else ():
            taps.watch(request_id, prompt_len, Candidates(frozenset(checkpoints), stride, every))

    def stopexp_taps_sync(self, forget: list[str]) -> list | None:
        """The states read since the last call, then `forget`'s requests dropped: [[request
        id, c], ...], their (n, layers, H) float32 states as bytes, and that shape (vLLM's
        messages carry bytes, not arrays)."""
        taps = getattr(self, "stopexp_taps", None)
        if taps is None:
            return None
        keys, states = [], []
        for request_id, w in taps.watched.items():
            for c, state in w.states.items():
                keys.append([request_id, c])
                states.append(state)
            w.states = {}
        for request_id in forget:
            taps.forget(request_id)
        stacked = np.stack(states) if states else np.zeros((0, 0, 0), np.float32)
        return [keys, stacked.tobytes(), list(stacked.shape)]

    def stopexp_taps_disarm(self) -> None:
        taps = getattr(self, "stopexp_taps", None)
        if taps is not None:
            taps.close()
            self.stopexp_taps = None


WORKER_EXTENSION = f"{TapWorker.__module__}.{TapWorker.__qualname__}"


def _register_tapped_twins() -> None:
    """In a process where vLLM runs (a worker imports this module): every architecture's
    tapped twin, registered by its path (vLLM imports it when a model names it). A process
    that has not imported vLLM registers the one it builds (`tapped_architecture`)."""
    if "vllm" not in sys.modules:
        return
    from vllm import ModelRegistry

    for arch in list(ModelRegistry.get_supported_archs()):
        if not arch.startswith(TAPPED) and TAPPED + arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(TAPPED + arch, tapped_class_path(arch))


_register_tapped_twins()


@dataclass
class PathWatch:
    """One watched path as this process sees it: its states at the positions `wanted`
    keeps (c -> (layers, H) float32), from states that arrive before the token they
    depend on waiting in `waiting`."""
    wanted: Callable[[int], bool]
    tokens: list | None  # the path's generated ids, filled in place (None: no step ends)
    states: dict = field(default_factory=dict)
    waiting: dict = field(default_factory=dict)

    def take(self, read: dict) -> None:
        self.waiting.update(read)
        known = len(self.tokens) if self.tokens is not None else None
        for c in sorted(self.waiting):
            if known is not None and c > known:
                break
            state = self.waiting.pop(c)
            if self.wanted(c):
                self.states[c] = state


class WorkerTaps:
    """In-engine taps of an LLM built with `worker_extension_cls=WORKER_EXTENSION` and a
    tapped model class (stopexp.search.vllm_engine.build_llm), read on tensor parallel
    rank `rank`. `watch` before a path's request is added and `flush` before the engine
    steps; `collect` after each step; `close` disarms the worker."""

    def __init__(self, llm, layers, pooling: str = "last", dtype: str = "float32",
                 positions: dict | None = None, rank: int = 0):
        self.llm, self.rank = llm, rank
        self.layers, self.pooling = tuple(sorted(layers)), pooling  # shallowest first, as read
        self.candidates = Candidates.of(positions) if positions else Candidates(every=True)
        self.runner = self._call("stopexp_taps_arm", tuple(layers), pooling, dtype, rank)
        self.watched: dict[str, PathWatch] = {}
        self._new: list[tuple] = []
        self._gone: list[str] = []

    def _call(self, method: str, *args):
        """`method` on every worker; the reading rank's answer."""
        return self.llm.collective_rpc(method, args=args)[self.rank]

    def watch(self, request_id: str, prompt_len: int, wanted: Callable[[int], bool],
              tokens: list | None = None) -> PathWatch:
        """Watch a request (sent with the next `flush`); `tokens`, the path's generated ids
        as they arrive, where `wanted` reads them (step ends)."""
        self.watched[request_id] = w = PathWatch(wanted, tokens if self.candidates.every else None)
        self._new.append([request_id, prompt_len, self.candidates.plain()])
        return w

    def flush(self) -> None:
        if self._new:
            self.llm.collective_rpc("stopexp_taps_watch", args=(self._new,))
            self._new = []

    def forget(self, request_id: str) -> PathWatch | None:
        """Drop a request after the next `collect` (which takes its last states)."""
        self._gone.append(request_id)
        return self.watched.get(request_id)

    def collect(self) -> None:
        """Take what the worker read since the last call; drop the requests forgotten."""
        if not self.watched:
            return
        keys, data, shape = self._call("stopexp_taps_sync", self._gone)
        states = np.frombuffer(data, np.float32).reshape(shape).copy()
        read: dict[str, dict] = {}
        for (request_id, c), state in zip(keys, states):
            read.setdefault(request_id, {})[int(c)] = state
        for request_id, got in read.items():
            w = self.watched.get(request_id)
            if w is not None:
                w.take(got)
        for request_id in self._gone:
            self.watched.pop(request_id, None)
        self._gone = []

    def close(self) -> None:
        self.llm.collective_rpc("stopexp_taps_disarm")
        self.watched.clear()
