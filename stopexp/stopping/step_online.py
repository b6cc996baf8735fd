"""STEP on the engine (stopexp.stopping.step's protocol, stopexp.search.inpath's loop):
step scores from the states the engine taps at step boundaries, and the bank's step scores
for its replay, both as `step_probability` makes them."""
from __future__ import annotations

import numpy as np
import torch

from stopexp.core.policies import quantize
from stopexp.signals.columns import signal_matrix
from stopexp.stopping.step import KVBudget, prune_at, trace_score, vote_weights


def step_probability(raw: torch.Tensor) -> list[float]:
    """Step scores as probabilities: sigmoid of the scores rounded as the policies round
    them (stopexp.core.policies.quantize), so that replayed and online scores that differ in
    the last float bits (batch composition) rank alike."""
    return torch.sigmoid(quantize(raw)).tolist()


def bank_steps(rows: dict, tokens: list, step_end, raw: torch.Tensor, n_paths: int) -> list[list]:
    """Per bank row (0..n_paths-1) its (position, probability) at each step boundary: the
    position rows (stopexp.training.per_step.position_rows: "path", "position") whose
    position c ends a step (`step_end[tokens[path][c - 1]]`), `raw` the signal's scores of
    every position row."""
    out: list[list] = [[] for _ in range(n_paths)]
    probs = step_probability(raw)
    for path, c, p in zip(rows["path"].tolist(), rows["position"].tolist(), probs):
        if step_end[int(tokens[path][c - 1])]:
            out[path].append((c, p))
    for steps in out:
        steps.sort()
    return out


class OnlineStep:
    """STEP on the engine (stopexp.search.inpath): reads the states its in-engine tap keeps
    at step boundaries (`separator` is what the engine taps), scores each once, and at each
    time t of a prompt (once all its running traces hold their state at t) prunes as
    `prune_at` says."""

    def __init__(self, scorer, budget: KVBudget, n: int, group_window: int, separator: str):
        self.scorer, self.budget, self.n, self.window = scorer, budget, n, group_window
        self.separator = separator  # the engine taps the states there (stopexp.engines.Backend.stopping)
        self.members: dict = {}   # prompt -> {key: Running}, in launch order
        self.time: dict = {}      # prompt -> its next t
        self.gone: set = set()    # keys pruned
        self.steps: dict = {}     # key -> [(position, probability)]
        self.weights: dict = {}

    def waves(self, n: int) -> list[range]:
        return [range(n)]

    def stops(self, stepper, prompt, paths) -> list:
        members = self.members.setdefault(prompt, {})
        members.update((p.key, p) for p in paths)
        self._score(stepper, [p for p in members.values() if p.key not in self.gone])
        out, t = [], self.time.get(prompt, 1)
        live = [p for p in members.values() if p.key not in self.gone]
        while live and all(p.finished or len(p.tokens) >= t + p.lag for p in live):
            running = [p for p in live if len(p.tokens) > t or not p.finished]
            if not running:
                break
            P = len(running[0].prompt)
            scores = [trace_score(self.steps.get(p.key, []), t) for p in running]
            for i in prune_at(t, self.budget, P, self.n, scores):
                self.gone.add(running[i].key)
                out.append((running[i], t))
            live = [p for p in live if p.key not in self.gone]
            t += 1
        self.time[prompt] = t
        return out

    def _score(self, stepper, paths) -> None:
        """Score the newly tapped step boundaries of `paths` in one batch."""
        todo = [(p, c) for p in paths for c in sorted(p.watch.states)
                if c > max((s for s, _ in self.steps.get(p.key, [])), default=0)]
        if not todo:
            return
        cols = stepper.columns([p for p, _ in todo])
        T = max(c for _, c in todo)
        arrays = [torch.zeros((len(todo), T)) for _ in range(3)]
        for r, ((p, c), col) in enumerate(zip(todo, cols)):
            for a, values in zip(arrays, col):
                a[r, :c] = torch.from_numpy(np.asarray(values[:c], np.float32))
        hidden = torch.from_numpy(np.stack([p.watch.states[c] for p, c in todo]))
        prefix = torch.tensor([c for _, c in todo], dtype=torch.long)
        signals = signal_matrix(*arrays, prefix, self.window, hidden)
        raw = self.scorer({"hidden": hidden, "signals": signals, "prefix_len": prefix.float(),
                           "seed_key": [""] * len(todo), "mc": torch.full((len(todo),), float("nan"))})
        for (p, c), s in zip(todo, step_probability(raw)):
            self.steps.setdefault(p.key, []).append((c, s))

    def wave_done(self, stepper, wave: int, prompt, paths) -> None:
        keys = [p.key for p in paths]
        final = [trace_score(self.steps.get(k, []), len(p.tokens)) for k, p in zip(keys, paths)]
        voter = np.asarray([k not in self.gone for k in keys])
        self.weights.update(zip(keys, vote_weights(final, voter)))
