"""task=mixture: prompts drawn from several tasks by weight, splits stratified by task, each
prompt graded by its own task, the task recorded per path and carried into the rows."""
from collections import Counter

import numpy as np
import pytest
import torch
from datasets import Dataset
from omegaconf import OmegaConf

from stopexp.config import ConfigError
from stopexp.runtime.overrides import stage_config
from stopexp.store.bank import path_columns
from stopexp.store.feature_rows import PathFeatures, task_labels, tensors_at
from stopexp.tasks import build_task
from stopexp.tasks.arith import solution
from stopexp.tasks.mixture import draw_order


def test_draw_order_apportions_every_prefix():
    order = draw_order([2.0, 1.0, 1.0], 12)
    assert order == [0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0]
    assert Counter(order) == {0: 6, 1: 3, 2: 3}
    assert Counter(draw_order([3.0, 1.0], 10)) == {0: 8, 1: 2}
    for n in range(1, 40):  # within one prompt of n * share, and a prefix of the longer draw
        got = Counter(draw_order([0.5, 0.3, 0.2], n))
        assert all(abs(got[k] - n * w) < 1 for k, w in enumerate([0.5, 0.3, 0.2]))
        assert draw_order([0.5, 0.3, 0.2], n) == draw_order([0.5, 0.3, 0.2], 40)[:n]


def test_toy_mixture_splits_are_stratified_by_task():
    cfg = stage_config("pipeline", ["+exp=toy_mixture"])
    task = build_task(cfg.task)
    for split, n in cfg.collect.prompts.items():
        problems = task.problems(split, n)
        assert Counter(p.task for p in problems) == {"short": n // 3, "long": n // 3, "addsub": n // 3}
        assert [p.prompt_id for p in problems] == list(range(n))
        # each component's problems are its own task's first ones, in its order
        for label in task.labels:
            mine = [p.inner for p in problems if p.task == label]
            assert mine == task.tasks[label].problems(split, n // 3)
    long = [p for p in task.problems("test", 6) if p.task == "long"]
    assert len(long) == 2 and all(p.prompt.count("?") == 1 and len(p.inner.ops) == 8 for p in long)


def test_each_prompt_is_graded_and_answered_by_its_own_task():
    cfg = stage_config("pipeline", ["+exp=toy_mixture"])
    task = build_task(cfg.task)
    for p in task.problems("val", 9):
        right = solution(p.inner, "careful")
        own = task.tasks[p.task]
        assert task.grade(p, right) and own.grade(p.inner, right)
        assert task.answer_for(p, right) == own.answer_of(right) == str(p.inner.answer)
        assert task.reference(p) == own.reference(p.inner)
        assert task.task_of(p) == p.task
    with pytest.raises(TypeError, match="answer_for"):
        task.answer_of("1+1=2;#2")


def test_smollm2_mixture_keeps_each_tasks_prompt_and_grader():
    cfg = stage_config("pipeline", ["+exp=smollm2_mixture"])
    task = build_task(cfg.task)
    problems = task.problems("test", 6)
    assert [p.task for p in problems] == ["multistep", "wordprob", "gsm8k"] * 2
    assert problems[2].prompt.endswith("#### <number>") and "Question:" in problems[0].prompt
    assert task.step_separator == "\n"
    gsm = problems[2]
    assert task.grade(gsm, f"so it is\n#### {gsm.inner.answer}") is True
    assert task.answer_for(gsm, "#### 1,000") == task.tasks["gsm8k"].answer_of("#### 1,000")


@pytest.mark.parametrize("override, message", [
    ("task.components.0.weight=0",
     "task.components.0.weight: 0: a component's weight must be a finite number > 0"),
    ("task.components.2.weight=-1.5",
     "task.components.2.weight: -1.5: a component's weight must be a finite number > 0"),
    ("task.components.1.task.n_steps=0", "task.components.1.task.n_steps: must lie in 1..1000, got 0"),
    ("task.components.2.task.operators=[/]",
     "task.components.2.task.operators: ['/']: allowed operators are +, -, *"),
    ("task.components.1.label=short",
     "task.components.1.label: 'short': each component needs a label of its own (a non-empty "
     "string; 'short' is also component 0's); set task.components.1.label"),
    ("task.components.0.task.name=mixture",
     "task.components.0.task.name: 'mixture' is not allowed; allowed: arith, qa, wordprob, datatotext"),
    ("task.components=[{task:{name:arith},weight:1}]",
     "task.components: 1 components: a mixture draws from two tasks or more (one task: task=<its name>)"),
    ("task.components=[{task:{name:arith},weight:1},{task:{name:arith,n_stepz:3},weight:1,label:b}]",
     "task.components.1.task.n_stepz: not a key of task arith; its keys: name, split_fractions, "
     "seed, stop, n_steps, operators, multipliers, styles, prompt_offset"),
    ("task.components=[{task:{name:arith},weight:1},{task:{name:arith},weight:1,size:2}]",
     "task.components.1: {'task': {'name': 'arith'}, 'weight': 1, 'size': 2}: give {task: {name: "
     "<task>, ...}, weight: <number > 0>, label: <optional name>}"),
])
def test_a_bad_component_is_one_line_naming_its_key(override, message):
    with pytest.raises(ConfigError) as e:
        stage_config("pipeline", ["+exp=toy_mixture", override])
    assert str(e.value) == message


def test_components_are_refused_outside_a_mixture():
    with pytest.raises(ConfigError) as e:
        stage_config("pipeline", ["task.components=[{task:{name:arith},weight:1}]"])
    assert str(e.value) == ("task.components: [{'task': {'name': 'arith'}, 'weight': 1}] is read only "
                            "by task=mixture, not under task=arith; leave it unset (default [])")


def test_step_ends_need_one_separator_across_components():
    with pytest.raises(ConfigError) as e:
        stage_config("pipeline", ["+exp=toy_mixture", "tap.positions.step_ends=true",
                                  "model=smollm2",
                                  "task.components=[{task:{name:arith},weight:1},{task:{name:wordprob},weight:1}]",
                                  "model.chat_template=false"])
    assert str(e.value) == ("tap.positions.step_ends: the components of task mixture end a step "
                            "differently (arith: ';', wordprob: '\\n'); step ends need one separator "
                            "shared by every component: use tap.positions.stride or "
                            "tap.positions.checkpoints")


def test_the_task_column_reaches_the_training_rows():
    """The bank's task column (a ClassLabel over the components) is each row's task index in
    the rows a predictor trains and is scored on."""
    labels = ["short", "long", "addsub"]
    tasks = ["long", "short", "short", "addsub", "long"]
    n = len(tasks)
    cols = {"split": ["train"] * n, "prompt_id": [0, 1, 1, 2, 3], "prompt": ["p"] * n,
            "prompt_len": [3] * n, "path_id": [0, 0, 1, 0, 0], "tokens": [[1, 2, 3]] * n,
            "text": ["t"] * n, "answer": ["1"] * n, "correct": [True, False, True, True, False],
            "reward": [1.0, 0.0, 1.0, 1.0, 0.0], "length": [3] * n, "finished": [True] * n,
            "style": ["careful"] * n, "first_error": [-1] * n,
            "token_logprob": [[-0.1] * 3] * n, "token_entropy": [[0.2] * 3] * n,
            "token_conf": [[0.5] * 3] * n, "mc": [[]] * n, "task": tasks}
    ds = Dataset.from_dict(cols, features=path_columns(0, tasks=labels)).with_format("numpy")
    assert task_labels(ds) == labels and list(ds["task"][:]) == [1, 0, 0, 2, 1]
    hidden = np.arange(n * 4, dtype=np.float32).reshape(n, 1, 4)
    feats = PathFeatures(
        meta={"tap_layers": [0], "hidden_size": 4, "group_window": 2, "mc_checkpoints": [],
              "positions": {"checkpoints": [2], "stride": None}},
        offsets=np.arange(n + 1), positions=np.full(n, 2), hidden=hidden,
        attn=np.zeros(n, np.float32), keys=np.stack([cols["prompt_id"], cols["path_id"]], 1),
        splits=np.asarray(cols["split"]))
    rows = tensors_at(ds, feats, 2)
    assert rows["task"].tolist() == [1, 0, 0, 2, 1] and rows["task"].dtype == torch.int64
    assert torch.equal(rows["hidden"], torch.from_numpy(hidden))


def test_a_bank_of_one_task_has_no_task_column():
    assert "task" not in path_columns(0)
    assert OmegaConf.create({"name": "arith"}).get("components") is None
