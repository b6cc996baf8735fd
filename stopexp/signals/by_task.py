"""Predictors across the tasks of a mixture (train.by_task): one per task, routed by each
row's task (`TaskRouted`: per task, or leave-one-task-out, where a task's predictor was
trained on the other tasks only), or one shared predictor that reads the task as a one-hot
beside the state (`OneHotMLP`). A row's task is its index in the bank's task labels (the
rows' "task", stopexp.store.feature_rows)."""
from __future__ import annotations

import torch
from torch import nn

from stopexp.signals.base import OnTappedLayer, Predictor
from stopexp.signals.feature_spec import position_feature
from stopexp.signals.mlp import mlp_head

BY_TASK = ("shared", "per_task", "one_hot", "leave_one_out")


def rows_of(batch: dict, mask: torch.Tensor) -> dict:
    """The rows of `batch` where `mask` holds (every per-row tensor; others as they are)."""
    n = len(mask)
    return {k: v[mask] if torch.is_tensor(v) and v.dim() and len(v) == n else v
            for k, v in batch.items()}


class TaskRouted(nn.Module):
    """One predictor per task label: a row is scored by its task's predictor alone."""

    def __init__(self, predictors: dict[str, Predictor], labels: list[str]):
        super().__init__()
        self.labels = list(labels)
        self.routes = nn.ModuleList(predictors[label] for label in self.labels)
        self.inputs = tuple(dict.fromkeys(k for p in self.routes for k in p.inputs)) + ("task",)
        self.centre_prompts = any(p.centre_prompts for p in self.routes)  # a prompt has one task

    def forward(self, batch: dict) -> torch.Tensor:
        task = batch["task"]
        out = torch.zeros(len(task))
        for k, predictor in enumerate(self.routes):
            mask = task == k
            if mask.any():
                out[mask] = predictor(rows_of(batch, mask)).to(out.dtype)
        return out


class OneHotMLP(OnTappedLayer):
    """The MLP probe (stopexp.signals.mlp) on [LayerNorm(state), one-hot of the row's task]:
    `n_tasks` more inputs, after the norm so that it does not wash them out."""

    def __init__(self, predictor, spec, n_tasks: int):
        super().__init__(predictor, spec, affine_norm=True)
        self.n_tasks = n_tasks
        self.inputs = (*self.inputs, "task")
        self.head = mlp_head(self.in_dim + n_tasks, predictor.hidden, predictor.depth, predictor.dropout)

    def forward(self, batch: dict) -> torch.Tensor:
        x = self.state(batch)
        if self.position_input:
            x = torch.cat([x, position_feature(batch)], dim=-1)
        onehot = nn.functional.one_hot(batch["task"], self.n_tasks).to(x.dtype)
        return self.head(torch.cat([x, onehot], dim=-1)).squeeze(-1)
