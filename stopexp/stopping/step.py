"""STEP (Liang et al., arXiv 2601.09093): prune the lowest-scored running trace when the KV
cache runs short, and vote weighted by the traces' scores.

- A step score at every reasoning-step boundary (the task's step separator: "\\n\\n" in the
  paper, stopexp.tasks.task.Task.step_separator), from the hidden state there: the
  predictor named by `signal` (evaluate.stopping.step.signal; the paper's is an MLP
  H -> 512 -> 1 trained with BCE on the trace's final correctness), as a probability
  (sigmoid of its score).
- A trace's score is the running mean of its step scores.
- When the KV cache that a prompt's running traces hold passes the budget
  (engine.kv_budget), the lowest-scored trace that has a score is aborted, and the next,
  until the cache fits again; a trace without a step score yet is never pruned (nothing is
  known of it), so the cache can stay above the budget until one has one.
- The answer is the vote of the traces that ran to their end, each weighing its score (one
  that ended before its first step boundary weighs the mean of the prompt's scored voters).

The budget is per prompt, so that a decision depends only on the prompt's own traces and
replay of a bank decides as the engine does, decision for decision, however the engine
schedules the prompts: a prompt's traces move one token per step together (time t = the
tokens each has generated), and at each t the traces still running hold prompt + t tokens
each (`KVBudget.blocks`; stopexp.search.memory's count of what a path holds). Online
(stopexp.search.inpath, on vLLM with its in-engine taps) the decision at t waits until every
running trace of the prompt has its state at t; a trace that ran ahead is counted at t.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from stopexp.core.names import lookup, method_name
from stopexp.stopping.method import StoppingMethod

SOURCE = "arXiv 2601.09093"


@dataclass(frozen=True)
class KVBudget:
    """engine.kv_budget as a prompt's limit: `value` >= 1 is KV blocks of `block_size`
    tokens, below 1 a share of the most its N paths can hold (every path at prompt +
    max_new_tokens tokens); with `shared_prompt` (prefix caching) the prompt's full blocks
    count once for all its paths."""
    value: float
    block_size: int
    shared_prompt: bool
    max_new_tokens: int

    def blocks(self, prompt_len: int, held) -> int:
        """KV blocks of running paths holding `held` tokens each (prompt included)."""
        held = np.asarray(held, np.int64)
        own = -(-held // self.block_size)
        if not self.shared_prompt:
            return int(own.sum())
        common = prompt_len // self.block_size
        return int(common + (own - common).sum()) if len(held) else 0

    def limit(self, prompt_len: int, n: int) -> float:
        if self.value >= 1:
            return self.value
        return self.value * self.blocks(prompt_len, [prompt_len + self.max_new_tokens] * n)


def prune_at(t: int, budget: KVBudget, prompt_len: int, n: int, scores: list) -> list[int]:
    """Indices (into `scores`, the running traces at time t in launch order: a score, or
    None for a trace without one yet) that STEP prunes at t: the lowest-scored, then the
    next, while the rest hold more blocks than the budget (NaN ranks lowest; ties: the
    later launched goes first)."""
    alive = list(range(len(scores)))
    limit = budget.limit(prompt_len, n)
    gone = []
    while budget.blocks(prompt_len, [prompt_len + t] * len(alive)) > limit:
        scored = [i for i in alive if scores[i] is not None]
        if not scored:
            break
        worst = min(scored, key=lambda i: (_rank(scores[i]), -i))
        alive.remove(worst)
        gone.append(worst)
    return gone


def _rank(score: float) -> float:
    return -math.inf if math.isnan(score) else score


def trace_score(steps: list[tuple[int, float]], t: int) -> float | None:
    """A trace's score at time t: the mean of its step probabilities at boundaries <= t
    (None: none yet)."""
    probs = [p for c, p in steps if c <= t]
    return float(np.mean(probs)) if probs else None


def vote_weights(scores: list, voter: np.ndarray) -> np.ndarray:
    """Each voter's weight: its final score, or the mean of the scored voters' (1 when none)."""
    scored = [s for s, v in zip(scores, voter) if v and s is not None]
    fill = float(np.mean(scored)) if scored else 1.0
    return np.asarray([fill if s is None else s for s in scores], np.float64)


@dataclass
class Step(StoppingMethod):
    """STEP's settings: `signal`, the scoring method whose score at each step boundary is
    the step score (`learned`: the configured predictor). Its budget is engine.kv_budget."""
    signal: str = "learned"
    name: ClassVar[str] = "step"
    source: ClassVar[str] = SOURCE
    banks: ClassVar[tuple[str, ...]] = ("traces",)
    inside: ClassVar[bool] = True

    def replay(self, r) -> dict:
        """Each prompt's traces in lockstep, t = 1, 2, ...: `r.steps[row]` the (position,
        probability) of its step boundaries, `r.budget` the KVBudget."""
        paths = r.paths
        spent = np.asarray(paths.length, np.int64).copy()
        voter = np.ones(len(spent), bool)
        final: list = [None] * len(spent)
        for rows in r.prompt_rows():
            P = int(paths.prompt_len[rows[0]])
            length = spent[rows].copy()
            gone = set()
            for t in range(1, int(length.max())):
                running = [k for k in range(len(rows)) if k not in gone and length[k] > t]
                if not running:
                    break
                scores = [trace_score(r.steps[rows[k]], t) for k in running]
                for i in prune_at(t, r.budget, P, len(rows), scores):
                    k = running[i]
                    gone.add(k)
                    spent[rows[k]], voter[rows[k]] = t, False
            for k, row in enumerate(rows):
                final[row] = trace_score(r.steps[row], int(length[k]))
        weight = np.zeros(len(spent))
        for rows in r.prompt_rows():
            weight[rows] = vote_weights([final[i] for i in rows], voter[rows])
        return r.outcome(spent, voter, weight=weight)

    def controller(self, n: int, group_window: int, *, scorers: dict, predictor: str,
                   budget: KVBudget, task, **_):
        """stopexp.stopping.step_online.OnlineStep (it needs torch: looked up lazily)."""
        return lookup("stopping_online", self.name)(scorers[method_name(self.signal, predictor)],
                                                     budget, n, group_window, task.step_separator)
