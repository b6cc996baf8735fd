"""One request's paths, from their launch to the vote: `RequestRun`, which the engine loop
(stopexp.serve.loop) launches into the shared engine and shows every step.

Launch-Check-Resume decides as evaluate does (stopexp.search.lcr: `CheckSchedule`,
`check_batch`, `decide_check`): once every path of the request reached a check, the live
ones are scored in one batch and the policy's pruned paths are aborted. A stopping method
that runs inside the paths (DeepConf online) decides as stopexp.search.inpath does: its
controller sees the request's paths after every step and stops some, wave by wave.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from stopexp.core.seeds import stream_seed
from stopexp.search.inpath import controller_stops
from stopexp.search.lcr import CheckSchedule, OnlineRun, check_batch, decide_check, prompt_groups
from stopexp.search.stepping import Running
from stopexp.serve.requests import Generation
from stopexp.serve.vote import Ballot, elect_path


@dataclass
class Method:
    """What prunes every request's paths (the stage builds it once): Launch-Check-Resume
    by `scorer` at `checks` (tokens) with `policies(n)` (one policy per check for a request
    of n paths; shared by the requests as evaluate's run shares them across prompts), or an
    in-path stopping method (`controller(n)`: its controller for n paths), or neither
    (no_prune)."""
    name: str
    checks: list[int]
    group_window: int
    score_rule: str = "last"
    vote: str = "majority"
    vote_top: float = 0.5
    scorer: Callable | None = None
    policies: Callable | None = None
    controller: Callable | None = None
    version: Callable[[], int] = lambda: 0  # the predictor's version (online adaptation)


class RequestRun:
    """The paths of request `key` (path j: Running((key, j)), its stream seed
    stream_seed(seed, prompt, j)) under `method`; `unpruned`: no check (the request's
    `prune: false`)."""

    def __init__(self, key: int, gen: Generation, method: Method, unpruned: bool = False):
        self.key, self.gen, self.method = key, gen, method
        self.paths = [Running((key, j), gen.prompt_ids, stream_seed(gen.seed, gen.prompt, j))
                      for j in range(gen.paths)]
        self.record = OnlineRun()   # pruned_at, signal as evaluate's runs hold them
        self.history: dict = {}     # path key -> its raw scores, check by check
        self.checks: list[dict] = []
        self.first: dict = {}       # path key -> its check batch row at the first check
        self.versions: list[int] = []
        self.check_seconds: list[float] = []  # each check's scoring and decision (the metrics')
        inside = method.controller is not None and not unpruned
        self.controller = method.controller(gen.paths) if inside else None
        checked = method.scorer is not None and not unpruned
        self.schedule = CheckSchedule(method.checks if checked else [], self.paths)
        self.policies = method.policies(gen.paths) if checked else []
        self.waves = [self.paths] if self.controller is None else \
            [[self.paths[j] for j in ids] for ids in self.controller.waves(gen.paths)]
        self.wave, self.ended = 0, set()
        self.launched: list[Running] = []  # the paths added to the engine so far

    def launch(self) -> list[Running]:
        """The paths to add to the engine now (the first wave's)."""
        self.launched += self.waves[0]
        return self.waves[0]

    @property
    def done(self) -> bool:
        return self.wave >= len(self.waves)

    def committed(self) -> Running | None:
        """The path the answer is, once that is decided before the end: the one path of the
        request that nothing pruned (every other pruned, none left to launch), which is
        then the vote's only voter and its one choice; None while several may still vote
        (always with n > 1: `_spare` keeps a path per choice)."""
        voters = [p for p in self.paths if p.key not in self.record.pruned_at]
        return voters[0] if len(voters) == 1 else None

    def advance(self, stepper) -> None:
        """After an engine step: run the checks (or the controller) that are due, abort what
        they prune, and add the next wave once the current one has ended."""
        if self.controller is not None:
            self._stop_inside(stepper)
        else:
            self._check(stepper)
        while not self.done and all(p.finished or p.pruned for p in self.waves[self.wave]):
            if self.controller is not None:
                self.controller.wave_done(stepper, self.wave, self.key, self.waves[self.wave])
            self.wave += 1
            if not self.done and self.waves[self.wave]:
                self.launched += self.waves[self.wave]
                stepper.add(self.waves[self.wave], self.gen.params)

    def _check(self, stepper) -> None:
        m = self.method
        for i, live in self.schedule.due():
            if not live:
                continue
            start = time.perf_counter()
            batch = check_batch(stepper, live, m.checks[i], m.group_window, {self.key: self.gen})
            keys = [p.key for p in live]
            keep = decide_check(m.scorer, batch, self.policies[i], keys,
                                prompt_groups(np.array([k[0] for k in keys])), self.history,
                                m.score_rule, self.record)
            self.check_seconds.append(time.perf_counter() - start)
            gone = self._spare([p for p, k in zip(live, keep.tolist()) if not k])
            keep = torch.tensor([all(p is not g for g in gone) for p in live])
            if gone:
                stepper.abort(gone)
                for p in gone:
                    self.record.pruned_at[p.key] = m.checks[i]
            self.versions.append(m.version())
            self.checks.append({"at": m.checks[i], "predictor_version": self.versions[-1],
                                "scores": {k[1]: self.record.signal[k] for k in keys},
                                "kept": [k[1] for k, on in zip(keys, keep.tolist()) if on]})
            if i == 0:
                self.first = {k: {name: batch[name][r] for name in ("hidden", "signals", "prefix_len")}
                              for r, k in enumerate(keys)}

    def _spare(self, gone: list[Running]) -> list[Running]:
        """`gone` less the best-scored of them that the request's choices need: at least
        `choices` of its paths are never pruned (each choice is a path that ran to its end)."""
        need = self.gen.choices - (len(self.paths) - len(self.record.pruned_at) - len(gone))
        if need <= 0:
            return gone
        best = {p.key for p in sorted(gone, key=lambda p: -self.record.signal.get(p.key, -math.inf))[:need]}
        return [p for p in gone if p.key not in best]

    def _stop_inside(self, stepper) -> None:
        wave = self.waves[self.wave]
        stopped = controller_stops(self.controller, stepper, wave, self.ended)
        room = len(self.paths) - len(self.record.pruned_at) - self.gen.choices
        stopped = stopped[:max(room, 0)]  # as _spare: the choices' paths are never stopped
        running = [p for p, _ in stopped if not (p.finished or p.pruned)]
        if running:
            stepper.abort(running)
        for p, spent in stopped:
            p.pruned = True
            self.record.pruned_at[p.key] = spent

    def abort(self, stepper) -> None:
        """Stop every path still running (the client went away)."""
        running = [p for p in self.launched if not (p.finished or p.pruned)]
        if running:
            stepper.abort(running)
        self.wave = len(self.waves)

    def ballot(self, task, text_of: Callable) -> Ballot:
        """The vote over the paths never pruned, and the request's choices (`text_of(path)`:
        its text before any stop string)."""
        voters = [p for p in self.paths if p.key not in self.record.pruned_at]
        m = self.method
        if self.controller is not None:  # DeepConf: weighted by the voters' confidence
            weights = [float(self.controller.weights.get(p.key, math.nan)) for p in voters]
            return elect_path(voters, weights, task, text_of, "deepconf_weighted", choices=self.gen.choices)
        weights = [self.record.signal.get(p.key, math.nan) for p in voters]
        return elect_path(voters, weights, task, text_of, m.vote, m.vote_top, self.gen.choices)
