"""Parallel-Probe (Zheng et al., arXiv 2602.03845): probe every branch's intermediate answer
every probe_freq tokens, stop on a stable consensus and prune the branches that deviate
from it, as the authors' simulator runs it (repository zhengkid/Parallel-Probe,
evaluation/method.py `ParallelESTPruningBurstMajorityOnActiveBranches`, the README's
Parallel-Probe rows; `vote_pruned=True`: `ParallelESTPruning`).

All n branches run in parallel and are read at probes t = 1, 2, ... (after t * probe_freq
tokens); a branch's answer at probe t is its intermediate answer, its final one from its
end probe on (`AnswersPrompt.answer_at`). From the second probe on, with s = t - 2 the
step of the authors' loop:
- the leader is the plurality answer of the branches not pruned (with `vote_pruned`, of
  every branch, a pruned one with the answer it had when pruned); ties go to the branch
  first in the order, and a probe without a readable answer is nobody's vote;
- from step `warmup` on, while more than one branch votes (with `vote_pruned`: is still
  running), a running branch whose answer is not the leader's (an unreadable one included)
  for `deviate` probes in a row is pruned there; the leader is then taken again over the
  remaining voters (not with `vote_pruned`);
- once the leader has been the same `stable` probes in a row after its first (stable + 1
  probes), every running branch stops there and the leader is the answer.
If every branch ends or is pruned first, the last probe's leader is the answer. A branch
stopped at probe t has spent t * probe_freq tokens (at most its total); one that reached
its end, its total. The authors' loop also ends after 100 steps (probe 101, 50,500 tokens
at their probe_freq of 500), which no branch of their public banks reaches; here there is
no such cap.

Defaults: the published settings, evaluation/evaluation_main_table.py of that repository
(T=40, prune_patience=7, warm_up=15, num_chains=64 at probe_freq=500, the runs behind
evaluation/matrix_results_Qwen3-8B-128/*.csv and the README table).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from stopexp.stopping.answers_bank import AnswersPrompt, Decision, vote_codes
from stopexp.stopping.method import StoppingMethod, whole


@dataclass
class ParallelProbe(StoppingMethod):
    """Parallel-Probe's settings (the published ones, see the module doc): stable and
    deviate in probes, warmup in steps, vote_pruned whether a pruned branch keeps its vote.
    It reads intermediate answers, which only an answers-only bank stores."""
    stable: int = 40
    deviate: int = 7
    warmup: int = 15
    vote_pruned: bool = False
    name: ClassVar[str] = "parallel_probe"
    source: ClassVar[str] = "arXiv 2602.03845"
    banks: ClassVar[tuple[str, ...]] = ("answers",)

    def problems(self, n=None):
        return {"stable": whole(self.stable, 1), "deviate": whole(self.deviate, 1),
                "warmup": whole(self.warmup, 0)}

    def decide(self, prompt, order):
        return parallel_probe(prompt, order, self.stable, self.deviate, self.warmup,
                              self.vote_pruned)


def parallel_probe(prompt: AnswersPrompt, order: np.ndarray, stable: int = ParallelProbe.stable,
                   deviate: int = ParallelProbe.deviate, warmup: int = ParallelProbe.warmup,
                   vote_pruned: bool = ParallelProbe.vote_pruned) -> Decision:
    """Parallel-Probe on one prompt's branches `order` (n,), all launched at once.
    stable, deviate >= 1 are counted in probes, warmup >= 0 in steps (probe warmup + 2 is
    the first that may prune)."""
    if stable < 1 or deviate < 1 or warmup < 0:
        raise ValueError(f"parallel_probe needs stable >= 1, deviate >= 1, warmup >= 0; got "
                         f"{stable}, {deviate}, {warmup}")
    order = np.asarray(order)
    tokens, end = prompt.tokens[order], prompt.end_probe[order]
    n, freq = len(order), prompt.probe_freq
    pruned, spent = np.zeros(n, bool), tokens.copy()
    held = np.zeros(n, np.int64)  # each branch's answer when it was pruned
    off = np.zeros(n, np.int64)  # probes in a row each branch deviated
    leader = streak = 0
    for t in range(2, int(end.max(initial=1)) + 1):
        answer = np.where(pruned, held, prompt.answer_at(t)[order])
        running = ~pruned & (end > t)
        voters = np.ones(n, bool) if vote_pruned else ~pruned
        lead = vote_codes(answer[voters])
        quorum = running.sum() if vote_pruned else voters.sum()
        if t - 2 >= warmup and quorum > 1:
            off = np.where(running, np.where(answer != lead, off + 1, 0), off)
            cut = running & (off >= deviate)
            pruned |= cut
            held[cut] = answer[cut]
            spent[cut] = np.minimum(t * freq, tokens[cut])
            running &= ~cut
            if not vote_pruned and pruned.all():  # nobody left to vote: the last leader
                return Decision(answer=leader, spent=spent, launched=n)
            if not vote_pruned and cut.any():
                lead = vote_codes(answer[~pruned])
        streak = streak + 1 if t > 2 and lead == leader else 0
        leader = lead
        if streak >= stable:
            spent[running] = np.minimum(t * freq, tokens[running])
            return Decision(answer=lead, spent=spent, launched=n)
        if not running.any():
            break
    return Decision(answer=leader, spent=spent, launched=n)
