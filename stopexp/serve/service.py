"""The server's parts put together from built objects (stopexp.stages.serve builds them):
the request reader, the engine loop over the open stepper, the served method and, with
feedback on, the adapter."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from stopexp.core.token_text import text_of
from stopexp.serve.feedback import Adapter
from stopexp.serve.loop import EngineLoop
from stopexp.search.stops import split_stop
from stopexp.serve.choices import ChoiceTexts
from stopexp.serve.requests import Generation, Limits, RequestReader
from stopexp.serve.responses import outcome, scored
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
    texts: "ChoiceTexts | None" = None

    def submit(self, gen: Generation) -> Future:
        """The future answer of `gen`: its paths run in the engine loop, or, generating
        nothing (echo with max_tokens 0), its prompt scored there between two steps."""
        if gen.params.max_new_tokens == 0:
            return self.loop.call(lambda: scored(gen, self.texts.echoed(gen)))
        return self.loop.submit(gen)

    def status(self) -> dict:
        version = {"predictor_version": self.method.version()} if self.predictor else {}
        return {"status": "ok", "model": self.model_name, "method": self.method.name,
                **version, **self.loop.status()}


@contextmanager
def open_service(stepper, tokenizer, task, method: Method, limits: Limits, *,
                 max_concurrent: int, template: bool, predictor: dict | None = None,
                 adapter: Adapter | None = None) -> Any:
    """The service over `stepper` (an engine's open stepper, stopexp.engines.Backend.serve)
    with the engine loop running; on exit the loop drains (every request taken is answered)."""
    lock = threading.Lock()  # the tokenizer, shared by the reader and the loop's decoding

    def decode(ids) -> str:
        with lock:
            return text_of(tokenizer, list(ids))

    if adapter is not None:
        method = replace(method, version=lambda: adapter.version)
    texts = ChoiceTexts(decode, tokenizer, lock, stepper)

    def answer(run: RequestRun) -> dict:
        stops = run.gen.params.stop
        ballot = run.ballot(task, lambda p: split_stop(decode(p.tokens), stops)[0])
        result = outcome(run.gen, run, ballot, predictor, [texts.choice(run.gen, p) for p in ballot.picks])
        if adapter is not None:
            adapter.keep(run.gen.feedback_id, run, ballot)
        return result

    def start_run(gen, key: int) -> RequestRun:
        return RequestRun(key, gen, method, unpruned=not gen.prune)

    loop = EngineLoop(stepper, start_run, answer, max_concurrent).start()
    limits = replace(limits, scores=hasattr(stepper, "score"))
    try:
        yield Service(limits.model_name, method, RequestReader(tokenizer, limits, template, lock),
                      loop, predictor, adapter, time.time(), texts)
    finally:
        loop.stop()
