"""Training across the tasks of a mixture (stopexp.signals.by_task): which training rows
each task's predictor sees, and the four ways fitted on the same splits."""
from __future__ import annotations

import torch

from stopexp.signals import build_predictor
from stopexp.signals.by_task import OneHotMLP, TaskRouted, rows_of
from stopexp.training.fit import fit


def task_rows(data: dict, k: int, way: str) -> dict:
    """The splits' rows that the predictor of task index `k` trains on: its own task's
    (per_task) or every other task's (leave_one_out)."""
    keep = (lambda t: t == k) if way == "per_task" else (lambda t: t != k)
    return {split: rows_of(rows, keep(rows["task"])) for split, rows in data.items()}


def fit_by_task(way: str, data: dict, labels: list[str], predictor_cfg, spec, train, loss, seed: int):
    """The predictor of `way` (stopexp.signals.by_task.BY_TASK) fitted on `data` (split ->
    rows with "task"), each fit seeded with `seed`."""
    if way in ("per_task", "leave_one_out"):
        routes = {}
        for k, label in enumerate(labels):
            torch.manual_seed(seed)
            routes[label] = build_predictor(predictor_cfg, spec)
            fitted(routes[label], task_rows(data, k, way), train, loss)
        return TaskRouted(routes, labels)
    torch.manual_seed(seed)
    predictor = OneHotMLP(predictor_cfg, spec, len(labels)) if way == "one_hot" else \
        build_predictor(predictor_cfg, spec)
    return fitted(predictor, data, train, loss)


def fitted(predictor, data: dict, train, loss):
    """`predictor` at its best epoch on `data` (stopexp.training.fit.fit)."""
    best, _ = fit(predictor, data, train, loss, progress=False)
    predictor.load_state_dict(best["state"])
    predictor.eval()
    return predictor
