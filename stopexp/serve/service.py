"""The server's parts put together from built objects (stopexp.stages.serve builds them):
the request reader, the engine loop over the open stepper, the served method, the choices'
texts, the metrics, who may call it and, with feedback on, the adapter."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from stopexp.core.token_text import text_of
from stopexp.search.stops import split_stop
from stopexp.serve.access import Access
from stopexp.serve.choices import ChoiceTexts
from stopexp.serve.feedback import Adapter
from stopexp.serve.loop import EngineLoop
from stopexp.serve.metrics import Metrics
from stopexp.serve.requests import Generation, Limits, RequestReader
from stopexp.serve.responses import outcome, scored
from stopexp.serve.run import Method, RequestRun


@dataclass(frozen=True)
class Served:
    """What prunes the requests: the `method`, the served predictor's artifact ({"name",
    "key"}; None: no trained predictor) and, with feedback on, the `adapter` that updates it."""
    method: Method
    predictor: dict | None = None
    adapter: Adapter | None = None


@dataclass
class Service:
    """What the routes (stopexp.serve.app) serve."""
    served: Served
    reader: RequestReader
    loop: EngineLoop
    texts: ChoiceTexts
    metrics: Metrics
    access: Access = field(default_factory=Access)
    started: float = 0.0

    @property
    def limits(self) -> Limits:
        return self.reader.limits

    @property
    def model_name(self) -> str:
        return self.limits.model_name

    def submit(self, gen: Generation, watch: Callable | None = None) -> Future:
        """The future answer of `gen`: its paths run in the engine loop (`watch`: see
        EngineLoop.submit), or, generating nothing (echo with max_tokens 0), its prompt
        scored there between two steps; either is counted as a request."""
        if gen.params.max_new_tokens == 0:
            return self.loop.call(lambda: self._score(gen), gen)
        return self.loop.submit(gen, watch)

    def _score(self, gen: Generation) -> dict:
        result = scored(gen, self.texts.echoed(gen))
        self.metrics.answered(result["stopexp"], result["choices"][0]["finish_reason"])
        return result

    def status(self) -> dict:
        served = self.served
        version = {"predictor_version": served.method.version()} if served.predictor else {}
        return {"status": "ok", "model": self.model_name, "method": served.method.name,
                **version, **self.loop.status()}


@contextmanager
def open_service(stepper, tokenizer, task, served: Served, limits: Limits, *,
                 max_concurrent: int, template: bool, access: Access = Access()) -> Any:
    """The service over `stepper` (an engine's open stepper, stopexp.engines.Backend.serve)
    with the engine loop running; on exit the loop drains (every request taken is answered)."""
    lock = threading.Lock()  # the tokenizer, shared by the reader and the loop's decoding

    def decode(ids) -> str:
        with lock:
            return text_of(tokenizer, list(ids))

    adapter = served.adapter
    if adapter is not None:
        served = replace(served, method=replace(served.method, version=lambda: adapter.version))
    texts = ChoiceTexts(decode, tokenizer, lock, stepper)

    def answer(run: RequestRun) -> dict:
        stops = run.gen.params.stop
        ballot = run.ballot(task, lambda p: split_stop(decode(p.tokens), stops)[0])
        result = outcome(run.gen, run, ballot, served.predictor, [texts.choice(run.gen, p) for p in ballot.picks])
        metrics.answered(result["stopexp"], result["choices"][0]["finish_reason"], run.check_seconds)
        if adapter is not None:
            adapter.keep(run.gen.feedback_id, run, ballot)
        return result

    def start_run(gen, key: int) -> RequestRun:
        return RequestRun(key, gen, served.method, unpruned=not gen.prune)

    loop = EngineLoop(stepper, start_run, answer, max_concurrent)
    metrics = Metrics(loop.status, limits.model_name)
    loop.start()
    limits = replace(limits, scores=hasattr(stepper, "score"))
    try:
        yield Service(served, RequestReader(tokenizer, limits, template, lock), loop, texts, metrics,
                      access, time.time())
    finally:
        loop.stop()
