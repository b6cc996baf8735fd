"""The hf engine taking new paths while others run (a server's requests: stopexp.serve).

Its batch is lockstep (stopexp.search.decode): every row of a launch holds as many tokens,
so a path cannot join a batch that is under way. Paths added between two steps with the
same sampling are launched together as a cohort (one `DecodeStepper`: their prompts
prefilled once per distinct prompt, at most `max_rows` rows); each step advances every
cohort by one token, one forward per cohort. Requests that arrive together therefore share
forwards, and requests that arrive apart run side by side in the same steps (vLLM, whose
scheduler batches requests of any length, runs them all in one forward:
stopexp.search.vllm_steps). An abort drops the rows from their cohort's batch and cache.

The protocol a server steps (`OpenStepper`, also vLLM's `Stepper` from `VllmSteps.open`):
`add(paths, params)`, `step()`, `abort(paths)`, `release(paths)` (forget ended paths),
`held()` (the paths still running), `running`, `score` where the engine scores given tokens
(the hf engine; vLLM's stepper has none), and the check's `inputs`, `columns` and
`lm_state` of stopexp.search.stepping.Stepper.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch

from stopexp.search.decode_steps import DecodeStepper
from stopexp.search.scoring import teacher_forced
from stopexp.search.stepping import Running


class CohortStepper:
    """Paths of the hf engine added over time, stepped together. `engine_for(params)`: the
    engine (stopexp.search.decode.Engine) that samples with `params` (SamplingParams)."""

    def __init__(self, engine_for: Callable, max_rows: int = 1024):
        self.engine_for, self.max_rows = engine_for, max_rows
        self.cohorts: list[DecodeStepper] = []
        self.owner: dict[int, DecodeStepper] = {}   # id(path) -> its cohort
        self.kept: dict[int, int] = {}              # id(cohort) -> its paths not yet released

    @property
    def paths(self) -> list[Running]:
        return [p for c in self.cohorts for p in c.paths if id(p) in self.owner]

    @property
    def running(self) -> bool:
        return any(c.running for c in self.cohorts)

    def add(self, paths: list[Running], params=None) -> None:
        """Launch `paths` now (prefilled here), at most max_rows rows per cohort."""
        engine = self.engine_for(params)
        for lo in range(0, len(paths), self.max_rows):
            part = paths[lo:lo + self.max_rows]
            cohort = DecodeStepper(engine, part, max_rows=self.max_rows)
            self.cohorts.append(cohort)
            self.kept[id(cohort)] = len(part)
            self.owner.update((id(p), cohort) for p in part)

    def step(self) -> None:
        for c in self.cohorts:
            if c.running:
                c.step()

    def abort(self, paths: list[Running]) -> None:
        for cohort, part in self._by_cohort(paths):
            cohort.abort(part)

    def release(self, paths: list[Running]) -> None:
        """Forget `paths` (ended or aborted); a cohort all of whose paths are released goes,
        with its recorded states."""
        for cohort, part in self._by_cohort(paths):
            for p in part:
                del self.owner[id(p)]
            self.kept[id(cohort)] -= len(part)
            if not self.kept[id(cohort)]:
                cohort.abort([p for p in cohort.paths if not (p.finished or p.pruned)])
                del self.kept[id(cohort)]
                self.cohorts.remove(cohort)

    def held(self) -> list[Running]:
        """The paths still running in some cohort's batch."""
        return [c.paths[n] for c in self.cohorts for n in c.state.paths.tolist()]

    def observe(self) -> None:
        """No KV meter here: a server reports no memory per prompt."""

    def score(self, ids: list[int], start: int, top: int) -> list[tuple]:
        """The LM's log-probs of ids[start:] after what precedes each, with the `top` most
        likely ids (stopexp.search.scoring.teacher_forced)."""
        return teacher_forced(self.engine_for(None).model, ids, start, top)

    def columns(self, paths: list[Running], upto: int | None = None) -> list[tuple]:
        got = {}
        for cohort, part in self._by_cohort(paths):
            got.update(zip(map(id, part), cohort.columns(part, upto)))
        return [got[id(p)] for p in paths]

    def inputs(self, paths: list[Running], check: int) -> tuple:
        """The check's inputs of `paths`, read from each one's cohort, in the order given."""
        parts = self._by_cohort(paths)
        if len(parts) == 1:
            return parts[0][0].inputs(paths, check)
        read = [cohort.inputs(part, check) for cohort, part in parts]
        row = {id(p): r for r, p in enumerate(p for _, part in parts for p in part)}
        back = torch.tensor([row[id(p)] for p in paths])
        out = []
        for k in range(len(read[0])):
            pieces = [r[k] for r in read]
            out.append(None if pieces[0] is None else torch.cat(pieces)[back])
        return tuple(out)

    def lm_state(self, paths: list[Running]):
        parts = self._by_cohort(paths)
        return parts[0][0].lm_state(paths) if len(parts) == 1 else None

    def _by_cohort(self, paths: list[Running]) -> list[tuple[DecodeStepper, list[Running]]]:
        groups: OrderedDict = OrderedDict()
        for p in paths:
            cohort = self.owner[id(p)]
            groups.setdefault(id(cohort), (cohort, []))[1].append(p)
        return list(groups.values())
