"""Paths as requests of a vLLM engine (its core in this process, one decode step per step,
for taps and online checks; in vLLM's own process, which runs ahead, for collect without
taps: stopexp.search.vllm_engine.build_llm): added with their seeds, stepped, aborted by id, each request's new tokens, log-probs and (with the engine's
in-engine taps, stopexp.search.vllm_workers) states taken in as they arrive:
stopexp.search.stepping's `Stepper`. Collect (stopexp.search.trace) and online
Launch-Check-Resume (stopexp.search.lcr) run on it. A Monte Carlo rollout cannot fork a
request's cache: it is a new request whose prompt is the path's prompt and prefix (prefix
caching shares its full blocks), run in the same engine alongside the paths. Without taps
the check's states come from `hidden_at`, a teacher-forced forward of prompt + prefix
through the HF model (stopexp.models.extract.prefix_features, what featurize computes for
a bank)."""
from __future__ import annotations

import time

import numpy as np
import torch

from stopexp.search.stepping import Running
from stopexp.search.stops import boundary_stop
from stopexp.signals.confidence import token_stats


class VllmSteps:
    """A vLLM engine (stopexp.search.vllm_engine.VllmEngine) as collect and
    Launch-Check-Resume step it: vLLM schedules all prompts itself (one chunk).
    `hidden_at(sequences)`: the (B, layers, H) features and the (B,) attention entropies
    (or None) of (prompt ids, prefix ids, [check]) triples, for the check of an engine
    without taps."""

    def __init__(self, engine, hidden_at=None):
        self.engine, self.hidden_at = engine, hidden_at

    def start(self, paths: list[Running], meter=None, labels=None) -> "Stepper":
        return Stepper(self.engine, paths, meter, self.hidden_at)

    def open(self) -> "Stepper":
        """A stepper holding no path yet, to which paths are added while others run (a
        server's requests, stopexp.serve: `add`, `release`)."""
        return Stepper(self.engine, [], None, self.hidden_at)

    def chunks(self, n_prompts: int, n_paths: int) -> list[range]:
        return [range(n_prompts)]


class Stepper:
    """Paths run as requests of the engine: `step` runs one engine step and takes in every
    request's new tokens and log-probs (and, with the engine's taps, its states); `abort`
    stops requests. A `meter` (stopexp.search.memory.KVMeter) observes the cached tokens
    per prompt at the launch and at each `observe`."""

    def __init__(self, engine, paths: list[Running], meter=None, hidden_at=None):
        self.engine, self.hidden_at = engine, hidden_at
        self.core, self.meter = engine.llm.llm_engine, meter
        if self.core.has_unfinished_requests():
            raise RuntimeError("the vLLM engine has unfinished requests: it is not free for a run")
        self.taps, self.ids, self.stats = engine.taps, {}, {}
        # the in-process core's scheduler (None out of process): its queue, for the meter
        self.scheduler = getattr(getattr(getattr(self.core, "engine_core", None), "engine_core", None),
                                 "scheduler", None)
        self.preempted: dict[str, int] = {}  # request id -> preemptions seen
        # rollouts: id -> (token ids, log-probs or None, finished)
        self.pending: dict[str, tuple] = {}
        self.paths, self.added = paths, 0
        self._requests(paths)
        if meter is not None:
            meter.observe(torch.tensor([len(p.prompt) for p in paths]), [p.key[0] for p in paths])

    def add(self, paths: list[Running], params=None) -> None:
        """Add `paths` as requests now, sampled with `params` (stopexp.search.decode.
        SamplingParams; None: the engine's); they run from the next step with those running."""
        self._requests(paths, params)
        self.paths += paths

    def _requests(self, paths: list[Running], params=None) -> None:
        """Add `paths` as requests, each watched by the taps before any of them runs."""
        from vllm.inputs import TokensPrompt

        for p in paths:
            p.request_id = f"path{self.added}"
            self.added += 1
            self.ids[p.request_id] = p
            if self.taps is not None:
                p.watch = self.taps.watch(p.request_id, len(p.prompt), self.engine.wanted(p.tokens),
                                          p.tokens)
                p.lag = 1
        if self.taps is not None:
            self.taps.flush()
        for p in paths:
            self.core.add_request(p.request_id, TokensPrompt(prompt_token_ids=list(p.prompt)),
                                  self.engine.request(p.seed, delta=True, params=params))

    def release(self, paths: list[Running]) -> None:
        """Forget `paths`, which have ended or were aborted (a server's finished request)."""
        gone = {id(p) for p in paths}
        for p in paths:
            self.ids.pop(p.request_id, None)
            self.stats.pop(p.request_id, None)
        self.paths = [p for p in self.paths if id(p) not in gone]

    def held(self) -> list[Running]:
        """The paths the engine still runs (neither ended nor aborted)."""
        return [p for p in self.paths if not (p.finished or p.pruned)]

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
        tic = time.perf_counter()
        outputs = self.core.step()
        if self.meter is not None and self.scheduler is not None:
            self._queue(time.perf_counter() - tic)
        for out in outputs:
            if out.request_id in self.pending:
                self._rollout_output(out)
                continue
            p = self.ids.get(out.request_id)
            if p is None:  # released after its abort (a server's cancelled request)
                continue
            o = out.outputs[0]
            if p.prefilled is None and out.num_cached_tokens is not None:
                p.prefilled = len(p.prompt) - out.num_cached_tokens
            p.tokens += list(o.token_ids)
            p.logprobs += list(o.logprobs or [])
            p.finished = out.finished
            p.finish_reason = o.finish_reason or p.finish_reason
            if out.finished and self.taps is not None:
                self.taps.forget(p.request_id)
        if self.taps is not None:
            self.taps.collect()  # the step's states (a finished path's last ones)

    def _queue(self, seconds: float) -> None:
        """The meter sees the step's queue. A preempted request waits, so preemptions are
        counted only after a step that leaves some request waiting."""
        running, waiting = self.scheduler.get_request_counts()
        new = 0
        if waiting:
            for rid, req in self.scheduler.requests.items():
                if req.num_preemptions > self.preempted.get(rid, 0):
                    new += req.num_preemptions - self.preempted.get(rid, 0)
                    self.preempted[rid] = req.num_preemptions
        self.meter.queue(seconds, running, waiting, new)

    def abort(self, paths: list[Running]) -> None:
        self.core.abort_request([p.request_id for p in paths])
        for p in paths:
            p.pruned = True
            if self.taps is not None:
                self.taps.forget(p.request_id)

    def columns(self, paths: list[Running], upto: int | None = None) -> list[tuple]:
        return [self._stats(p, len(p.tokens) if upto is None else upto) for p in paths]

    def rollouts(self, paths: list[Running], check: int, seeds: list[int], repeats: int,
                 logprobs: bool = False) -> list[list[tuple]]:
        """New requests from each path's prompt and prefix, stepped with the paths still
        running (their outputs are taken in meanwhile). A stop string that starts inside
        the prefix is one such a request cannot see: its tokens are cut where the path's
        own stop would have ended it (stopexp.search.stops.boundary_stop)."""
        from vllm.inputs import TokensPrompt

        e = self.engine
        names = []
        for k, p in enumerate(paths):
            if not p.live_at(check):
                raise ValueError(f"{p.request_id} is not alive at prefix {check}: no rollout from it")
            head = TokensPrompt(prompt_token_ids=list(p.prompt) + p.tokens[:check])
            for r in range(repeats):
                name = f"mc:{p.request_id}:{check}:{r}"  # no "-": the taps strip vLLM's suffix at one
                self.pending[name] = ([], [] if logprobs else None, False)
                self.core.add_request(name, head, e.request(
                    seeds[k * repeats + r], delta=True, max_tokens=e.params.max_new_tokens - check,
                    logprobs="sampled" if logprobs else None))
                names.append(name)
        while not all(self.pending[n][2] for n in names):
            self.step()
        done = [self.pending.pop(n)[:2] for n in names]
        out = []
        for k, p in enumerate(paths):
            prefix, kept = p.tokens[:check], []
            for ids, lp in done[k * repeats:(k + 1) * repeats]:
                n = boundary_stop(e.stops, prefix, ids) if e.stops else len(ids)
                kept.append((ids[:n], None if lp is None else np.asarray(lp[:n], np.float32)))
            out.append(kept)
        return out

    def _rollout_output(self, out) -> None:
        ids, lps, _ = self.pending[out.request_id]
        o = out.outputs[0]
        new = list(o.token_ids)
        ids += new
        if lps is not None:
            lps += [d[t].logprob for d, t in zip(o.logprobs or [], new)]
        self.pending[out.request_id] = (ids, lps, out.finished)

    def inputs(self, paths: list[Running], check: int) -> tuple:
        if self.taps is None and self.hidden_at is None:
            raise ValueError("an engine without taps needs hidden_at to read the check's states")
        if self.taps is not None:
            hidden = torch.from_numpy(np.stack([p.watch.states[check] for p in paths]))
            attn = None
        else:
            hidden, attn = self.hidden_at([(p.prompt, p.tokens[:check], [check]) for p in paths])
        stats = [self._stats(p, check) for p in paths]
        return (hidden, attn, *(torch.from_numpy(np.stack([s[k] for s in stats])) for k in range(3)))

    def _stats(self, p: Running, check: int) -> tuple:
        """The path's per-token (log-prob, entropy, confidence) up to `check`, each token's
        computed once (progressive checks read longer prefixes of the same path)."""
        done = self.stats.get(p.request_id, ())
        if not done or len(done[0]) < check:
            start = len(done[0]) if done else 0
            new = token_stats(p.logprobs[start:check], p.tokens[start:check],
                              self.engine.max_logprobs, self.engine.params.conf_topk)
            done = tuple(np.concatenate([a, b]) for a, b in zip(done, new)) if done else new
            self.stats[p.request_id] = done
        return tuple(a[:check] for a in done)

    def lm_state(self, paths: list[Running]):
        return None  # vLLM's cache is its own
