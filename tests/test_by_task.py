"""Predictors across a mixture's tasks: routing by task, the one-hot input, the rows each
task's predictor trains on, the tasks one family under Holm."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from stopexp.evaluation.by_task import per_task
from stopexp.metrics.ranking import paired_difference
from stopexp.signals.by_task import OneHotMLP, TaskRouted
from stopexp.signals.feature_spec import FeatureSpec
from stopexp.signals.mlp import MLPPredictor
from stopexp.training.by_task import task_rows

CFG = OmegaConf.create({"name": "mlp", "layer": -1, "hidden": 8, "depth": 1, "dropout": 0.0})
SPEC = FeatureSpec("toy", 6, [2], ("mean_logprob",))


def batch(tasks):
    torch.manual_seed(0)
    n = len(tasks)
    return {"hidden": torch.randn(n, 1, 6), "task": torch.tensor(tasks), "prefix_len": torch.full((n,), 5.0),
            "correct": torch.arange(n) % 2 == 0, "group": torch.arange(n) // 2}


def test_a_row_is_scored_by_its_tasks_predictor_alone():
    torch.manual_seed(1)
    routes = {label: MLPPredictor(CFG, SPEC).eval() for label in ("a", "b", "c")}
    routed = TaskRouted(routes, ["a", "b", "c"]).eval()
    b = batch([2, 0, 1, 2, 0, 0])
    got = routed(b)
    for k, label in enumerate(["a", "b", "c"]):
        mask = b["task"] == k
        own = routes[label]({"hidden": b["hidden"][mask]})
        assert torch.equal(got[mask], own)
    assert routed.inputs == ("hidden", "task")


def test_the_one_hot_predictor_reads_the_state_and_one_input_per_task():
    p = OneHotMLP(CFG, SPEC, 3)
    assert p.head[0].in_features == 6 + 3
    b = batch([0, 1, 2])
    other = dict(b, task=torch.tensor([1, 1, 2]))
    assert not torch.equal(p(b)[0], p(other)[0]) and torch.equal(p(b)[1:], p(other)[1:])


def test_leave_one_out_trains_on_every_other_tasks_rows_exactly():
    data = {"train": batch([0, 1, 2, 2, 1, 0, 1]), "val": batch([2, 1, 0])}
    held = task_rows(data, 1, "leave_one_out")
    assert held["train"]["task"].tolist() == [0, 2, 2, 0] and held["val"]["task"].tolist() == [2, 0]
    assert torch.equal(held["train"]["hidden"], data["train"]["hidden"][[0, 2, 3, 5]])
    own = task_rows(data, 1, "per_task")
    assert own["train"]["task"].tolist() == [1, 1, 1] and own["val"]["group"].tolist() == [0]


def test_the_tasks_are_one_family_under_holm():
    from stopexp.metrics.multiplicity import holm

    rng = np.random.default_rng(0)
    tasks = np.repeat([0, 1, 2], 40)
    a = rng.normal(size=120) + np.repeat([1.0, 0.3, 0.0], 40)  # clear, borderline, none
    b = np.zeros(120)
    got = per_task(a, b, tasks, ["x", "y", "z"], 1000, 0)
    assert [got[k]["task_prompts"] for k in "xyz"] == [40, 40, 40]
    for k, i in zip("xyz", range(3)):  # each task's cell is its own paired difference
        own = paired_difference(a[tasks == i], b[tasks == i], 1000, 0)
        assert got[k]["diff"] == own["diff"] and got[k]["ci"] == own["ci"] and got[k]["p"] == own["p"]
    assert [got[k]["p_holm"] for k in "xyz"] == holm([got[k]["p"] for k in "xyz"]).tolist()
    assert got["x"]["holm"] and not got["z"]["holm"]
