"""The server's parts put together from built objects (stopexp.stages.serve builds them):
the request reader, the engine loop over the open stepper, the served method, its metrics,
who may call it and, with feedback on, the adapter."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable

from stopexp.core.token_text import text_of
from stopexp.serve.feedback import Adapter
from stopexp.serve.loop import EngineLoop
from stopexp.serve.metrics import Metrics
from stopexp.serve.requests import Limits, RequestReader
from stopexp.serve.responses import outcome
from stopexp.serve.run import Method, RequestRun


@dataclass
class Service:
    """What the routes (stopexp.serve.app) serve."""
    model_name: str
    method: Method
    reader: RequestReader
    loop: EngineLoop
    predictor: dict | None = None  # the served predictor's artifact: {"name", "key"}
    adapter: Adapter | None = None
    started: float = 0.0
    metrics: Metrics | None = None
    decode: Callable | None = None  # token ids -> text, as the answers decode them
    access: dict | None = None      # who may call it: {"key": the API key or None, "max_body": bytes}

    @property
    def limits(self) -> Limits:
        return self.reader.limits

    def status(self) -> dict:
        version = {"predictor_version": self.method.version()} if self.predictor else {}
        return {"status": "ok", "model": self.model_name, "method": self.method.name,
                **version, **self.loop.status()}


@contextmanager
def open_service(stepper, tokenizer, task, method: Method, limits: Limits, *,
                 max_concurrent: int, template: bool, predictor: dict | None = None,
                 adapter: Adapter | None = None, access: dict | None = None) -> Any:
    """The service over `stepper` (an engine's open stepper, stopexp.engines.Backend.serve)
    with the engine loop running; on exit the loop drains (every request taken is answered).
    `access`: {"key", "max_body"} (None: open, 4 MiB)."""
    lock = threading.Lock()  # the tokenizer, shared by the reader and the loop's decoding

    def decode(ids) -> str:
        with lock:
            return text_of(tokenizer, list(ids))

    if adapter is not None:
        method = replace(method, version=lambda: adapter.version)

    def answer(run: RequestRun) -> dict:
        ballot = run.ballot(task, decode)
        result = outcome(run.gen, run, ballot, predictor)
        metrics.answered(run, result["stopexp"], result["finish_reason"])
        if adapter is not None:
            adapter.keep(run.gen.id, run, ballot)
        return result

    def start_run(gen, key: int) -> RequestRun:
        return RequestRun(key, gen, method, unpruned=not gen.prune)

    loop = EngineLoop(stepper, start_run, answer, max_concurrent)
    metrics = Metrics(loop.status, limits.model_name)
    loop.start()
    try:
        yield Service(limits.model_name, method, RequestReader(tokenizer, limits, template, lock),
                      loop, predictor, adapter, time.time(), metrics, decode,
                      access or {"key": None, "max_body": 4 << 20})
    finally:
        loop.stop()
