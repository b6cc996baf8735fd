"""Online adaptation in service (serve.feedback): a client reports a response's outcome
(POST /v1/feedback), which labels the paths that response revealed, and the predictor takes
the adapt update on them (stopexp.training.stream: adapt.steps AdamW steps of the training
loss, with adapt.lr and adapt.weight_decay, on this feedback and the adapt.buffer earlier
ones). Every response names the predictor's version: the number of updates before its
check.

What a response reveals: its voters (never pruned) that were alive at the first check, with
their state there. Labels: with `answer` (the reference), a voter is right when its answer
is the reference (equivalent answers clustered as the vote clusters them); with `correct`
(whether the response's answer was right), the voters of the winning answer take it, and
when it was right the others are wrong (when it was wrong, the others stay unknown and are
left out). Pruned paths have no outcome: as adapt's kept-only feedback, the sample is the
one the predictor's own pruning left.
"""
from __future__ import annotations

from collections import OrderedDict, deque

import torch

from stopexp.metrics.answers import vote_clusters
from stopexp.serve.bodies import BadRequest
from stopexp.tasks import vote_format
from stopexp.training.stream import FEEDBACK_KEYS, concat


class Adapter:
    """The served `predictor` updated from feedback with the training `loss`
    (stopexp.training.losses.build_loss) and the adapt section's settings; the material of
    the last `remember` responses is kept for their feedback."""

    def __init__(self, predictor, loss, adapt, task, remember: int):
        self.predictor, self.loss, self.steps, self.task = predictor, loss, adapt.steps, task
        weights = [p for p in predictor.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(weights, lr=adapt.lr, weight_decay=adapt.weight_decay) \
            if weights and adapt.steps else None
        self.memory: deque = deque(maxlen=adapt.buffer + 1)
        self.responses: OrderedDict = OrderedDict()
        self.remember, self.version = remember, 0

    def keep(self, response_id: str, run, ballot) -> None:
        """What response `response_id` revealed (its RequestRun and Ballot), for its feedback."""
        rows = [(p, run.first[p.key]) for p in ballot.voters if p.key in run.first]
        if not rows:
            return
        self.responses[response_id] = {
            "rows": rows, "answers": [ballot.answers[p.key[1]] for p, _ in rows],
            "winner": ballot.winner, "check": run.method.checks[0]}
        while len(self.responses) > self.remember:
            self.responses.popitem(last=False)

    def update(self, response_id: str, correct: bool | None, answer: str | None) -> dict:
        """One update from the outcome of `response_id` (in the engine loop, between steps).
        BadRequest names the field when there is nothing to learn from."""
        kept = self.responses.get(response_id)
        if kept is None:
            raise BadRequest("id", f"{response_id!r} is no response of this server that revealed a "
                                   f"checked path (or one older than the last {self.remember})")
        labels = self._labels(kept, correct, answer)
        use = [k for k, y in enumerate(labels) if y is not None]
        if not use:
            raise BadRequest("correct", "a wrong answer tells nothing of the paths that gave "
                                        "another: no path to learn from")
        rows = [kept["rows"][k] for k in use]
        batch = {name: torch.stack([torch.as_tensor(r[name]) for _, r in rows])
                 for name in ("hidden", "signals", "prefix_len")}
        batch["correct"] = torch.tensor([float(labels[k]) for k in use])
        batch["mc"] = torch.full((len(use),), float("nan"))
        batch["remaining"] = torch.tensor([float(max(len(p.tokens) - kept["check"], 0)) for p, _ in rows])
        batch["group"] = torch.full((len(use),), self.version, dtype=torch.long)  # pairs within a response
        batch["weight"] = torch.ones(len(use))
        self.memory.append({k: batch[k] for k in (*FEEDBACK_KEYS, "weight")})
        losses = self._steps(concat(list(self.memory)))
        self.version += 1
        return {"predictor_version": self.version, "paths": len(use),
                "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}

    def _labels(self, kept: dict, correct: bool | None, answer: str | None) -> list:
        answers = kept["answers"]
        if answer is not None:
            *clustered, reference = vote_clusters([*answers, str(answer)], vote_format(self.task))
            return [a == reference for a in clustered]
        return [correct if a == kept["winner"] else (False if correct else None) for a in answers]

    def _steps(self, data: dict) -> list[float]:
        if self.opt is None:
            return []
        self.predictor.train()
        losses = []
        try:
            for _ in range(self.steps):
                value = self.loss(self.predictor(data), data)
                self.opt.zero_grad(set_to_none=True)
                value.backward()
                self.opt.step()
                losses.append(float(value.item()))
        finally:
            self.predictor.eval()  # the checks score in eval mode
        return losses
