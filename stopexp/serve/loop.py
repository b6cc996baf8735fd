"""The engine loop: one thread owns the engine and steps it; every request's paths are in
flight together. Between two steps it admits waiting requests (up to `max_concurrent` in
the engine; their paths added, those of one sampling together), aborts the paths of
requests whose client went away, and runs queued tasks (a feedback update, a prompt scored
without generating); after each step every request in the engine sees its paths' new
tokens (the stepper takes them in, tapped states included) and checks, prunes and votes
(stopexp.serve.run). A request that is done is answered through its future and its paths
are released from the engine; one that streams is shown its committed path's tokens after
each step (`watch`).

`submit` and `cancel` are called from the server's event loop; everything that touches
the engine or the predictor runs in this thread, with the torch thread count of the thread
that opened the engine (OpenMP's count is per thread: vLLM's CPU attention refuses a kernel
that runs on another count than it planned with).
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import Future
from typing import Callable

import torch

log = logging.getLogger(__name__)


class Closed(RuntimeError):
    """The loop is draining for shutdown and takes no new request."""


class EngineLoop:
    """`stepper`: an open stepper (stopexp.search.cohorts); `start_run(gen, key)`: the
    RequestRun of a request; `answer(run)`: its result (what the future holds)."""

    def __init__(self, stepper, start_run: Callable, answer: Callable, max_concurrent: int):
        self.stepper, self.start_run, self.answer = stepper, start_run, answer
        self.max_concurrent = max_concurrent
        self.cond = threading.Condition()
        self.waiting: list[tuple] = []     # (request, future, watch) in arrival order
        self.active: dict = {}             # future -> its RequestRun in the engine
        self.watches: dict = {}            # future -> watch(path key, tokens) of a streamed request
        self.cancels: list[Future] = []
        self.tasks: list[tuple] = []       # (function, future, request or None) to run between steps
        self.closed = False
        # completion_tokens: every generated token of every path, as the responses' `usage`
        self.counts: Counter = Counter(dict.fromkeys(("answered", "cancelled", "failed", "steps",
                                                      "peak_active", "prompt_tokens",
                                                      "completion_tokens"), 0))
        self.keys = 0
        self.threads = torch.get_num_threads()  # this thread's, which opened the engine
        self.thread = threading.Thread(target=self._main, name="stopexp-engine", daemon=True)

    def start(self) -> "EngineLoop":
        self.thread.start()
        return self

    def submit(self, gen, watch: Callable | None = None) -> Future:
        """The future of request `gen`'s answer. `watch(path key, tokens)`, if given, is
        called in this loop's thread after each step once the request has committed to a
        path (stopexp.serve.run.RequestRun.committed) while that path runs, with its tokens."""
        future: Future = Future()
        with self.cond:
            if self.closed:
                raise Closed("the server is shutting down")
            self.waiting.append((gen, future, watch))
            self.cond.notify()
        return future

    def cancel(self, future: Future) -> None:
        """The client went away: its paths are aborted between two steps."""
        with self.cond:
            self.cancels.append(future)
            self.cond.notify()

    def call(self, fn: Callable, gen=None) -> Future:
        """Run `fn()` in this thread between two steps; with `gen`, `fn()` is the answer of
        that request (one that generates nothing), counted as the requests are."""
        future: Future = Future()
        with self.cond:
            if self.closed:
                raise Closed("the server is shutting down")
            self.tasks.append((fn, future, gen))
            self.cond.notify()
        return future

    def stop(self) -> None:
        """Answer every request taken, then end the thread (a drain)."""
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join()

    def status(self) -> dict:
        with self.cond:
            return {"active": len(self.active), "waiting": len(self.waiting), **dict(self.counts)}

    def _main(self) -> None:
        try:
            # the C binding: vLLM's CPU worker replaces torch.set_num_threads with a no-op
            torch._C.set_num_threads(self.threads)
            self._serve()
        except BaseException as e:  # the loop cannot go on: no request may wait for it forever
            log.exception("the engine loop stopped")
            with self.cond:
                self.closed = True
                pending = [w[1] for w in self.waiting] + list(self.active) + [t[1] for t in self.tasks]
                self.waiting, self.tasks = [], []
            self.active.clear()
            for future in pending:
                if not future.done() and (future.running() or future.set_running_or_notify_cancel()):
                    future.set_exception(RuntimeError(f"the engine loop stopped: {e}"))
            raise

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not (self.waiting or self.active or self.cancels or self.tasks or self.closed):
                    self.cond.wait()
                if self.closed and not (self.waiting or self.active or self.tasks or self.cancels):
                    return
                room = max(0, self.max_concurrent - len(self.active))
                admitted, self.waiting = self.waiting[:room], self.waiting[room:]
                cancels, self.cancels = self.cancels, []
                tasks, self.tasks = self.tasks, []
            for fn, future, gen in tasks:
                self._settle(future, fn, gen)
            self._admit(admitted)
            for future in cancels:  # after admitting: a request admitted just now is found
                self._cancel(future)
            self._step()

    def _admit(self, admitted: list[tuple]) -> None:
        by_params: dict = {}
        for gen, future, watch in admitted:
            if not future.set_running_or_notify_cancel():  # cancelled while it waited
                self.counts["cancelled"] += 1
                continue
            self.keys += 1
            try:
                run = self.start_run(gen, self.keys)
            except Exception as e:  # noqa: BLE001  (the request fails, the loop goes on)
                future.set_exception(e)
                self.counts["failed"] += 1
                continue
            self.active[future] = run
            self.counts["prompt_tokens"] += len(gen.prompt_ids)
            if watch is not None:
                self.watches[future] = watch
            by_params.setdefault(gen.params, []).append(future)
        for params, futures in by_params.items():  # one sampling: one batch (hf: one cohort)
            try:
                self.stepper.add([p for f in futures for p in self.active[f].launch()], params)
            except Exception as e:  # noqa: BLE001  (these requests fail, the loop goes on)
                log.exception("adding requests to the engine failed")
                for future in futures:
                    self._finish(future, error=e)
        self.counts["peak_active"] = max(self.counts["peak_active"], len(self.active))

    def _step(self) -> None:
        if not self.active:
            return
        if self.stepper.running:
            try:
                self.stepper.step()
                self.counts["steps"] += 1
            except Exception as e:  # noqa: BLE001  (every request in the engine fails with it)
                log.exception("engine step failed")
                for future in list(self.active):
                    self._finish(future, error=e)
                return
        for future, run in list(self.active.items()):
            try:
                run.advance(self.stepper)
                if not run.done and not any(not (p.finished or p.pruned) for p in run.launched):
                    raise RuntimeError("a request has no running path but is not done")
                if run.done:
                    self._finish(future)
                elif future in self.watches:
                    self._show(future, run)
            except Exception as e:  # noqa: BLE001  (this request fails, the others go on)
                log.exception("request failed")
                self._finish(future, error=e)

    def _show(self, future: Future, run) -> None:
        """A streamed request's committed path, while it runs (a finished one's end, stop
        string included, is for the answer to cut)."""
        path = run.committed()
        if path is not None and not (path.finished or path.pruned) and path.tokens:
            self.watches[future](path.key, list(path.tokens))

    def _finish(self, future: Future, error: Exception | None = None) -> None:
        run = self.active.pop(future)
        self.watches.pop(future, None)
        if error is not None:
            run.abort(self.stepper)
        else:
            try:
                result = self.answer(run)
            except Exception as e:  # noqa: BLE001
                error = e
        self.stepper.release(run.launched)
        self.counts["completion_tokens"] += sum(len(p.tokens) for p in run.launched)
        if error is not None:
            self.counts["failed"] += 1
            future.set_exception(error)
        else:
            self.counts["answered"] += 1
            future.set_result(result)

    def _cancel(self, future: Future) -> None:
        run = self.active.pop(future, None)
        self.watches.pop(future, None)
        if run is None:  # still waiting, or answered meanwhile
            with self.cond:
                waiting = [w for w in self.waiting if w[1] is not future]
                if len(waiting) < len(self.waiting):
                    self.waiting = waiting
                    future.cancel()
                    self.counts["cancelled"] += 1
            return
        run.abort(self.stepper)
        self.stepper.release(run.launched)
        self.counts["completion_tokens"] += sum(len(p.tokens) for p in run.launched)
        self.counts["cancelled"] += 1
        future.cancel() or future.set_exception(Closed("cancelled: the client went away"))

    def _settle(self, future: Future, fn: Callable, gen) -> None:
        if not future.set_running_or_notify_cancel():
            self.counts["cancelled"] += gen is not None
            return
        if gen is not None:
            self.counts["prompt_tokens"] += len(gen.prompt_ids)
        try:
            future.set_result(fn())
        except Exception as e:  # noqa: BLE001  (the caller gets it)
            self.counts["failed"] += gen is not None
            future.set_exception(e)
        else:
            self.counts["answered"] += gen is not None
