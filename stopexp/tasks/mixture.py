"""A mixture of tasks as one task (task=mixture): prompts drawn from several tasks with
weights, each keeping its own task's prompt, grader or reward, references and answers, so
that one bank holds several kinds of work and records each path's task.

Every split is stratified by task: the `n` prompts of a split are apportioned to the
components by weight, prefix by prefix (`draw_order`: each next prompt goes to the
component furthest below its share), so any first `n` prompts hold each task within one
prompt of `n * weight / sum(weights)`, and `problems(split, n)` is a prefix of
`problems(split, n + 1)`. A prompt's id is its index in the mixture's split."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from stopexp.config.task import component_section
from stopexp.tasks import build_task
from stopexp.tasks.task import Task


def component_label(component) -> str:
    """A component's name in the bank's task column: its `label`, else its task's name."""
    return component.get("label") or component["task"]["name"]


def labels(task_section) -> list[str]:
    """The task labels of a task section, in component order (one, its name, for a task
    that is not a mixture)."""
    components = task_section.get("components") or []
    return [component_label(c) for c in components] or [task_section["name"]]


def draw_order(weights: list[float], n: int) -> list[int]:
    """The component of each of the first `n` prompts: each next prompt goes to the
    component whose count lies furthest below its share of the prompts so far (ties: the
    first listed), so every prefix is apportioned within one prompt of its shares."""
    total = sum(weights)
    counts = [0] * len(weights)
    order = []
    for i in range(n):
        deficit = [(i + 1) * w / total - c for w, c in zip(weights, counts)]
        k = max(range(len(weights)), key=lambda j: (deficit[j], -j))
        counts[k] += 1
        order.append(k)
    return order


@dataclass(frozen=True)
class MixedProblem:
    """A component's problem under the mixture's id; other attributes are the component's."""
    prompt_id: int
    split: str
    task: str          # the component's label
    inner: Any         # the component task's problem

    @property
    def prompt(self) -> str:
        return self.inner.prompt

    def __getattr__(self, name):  # answer, record, ...: what the component's code reads
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class MixtureTask(Task):
    """Several tasks with weights: `components` is [(label, task, weight)]."""

    name = "mixture"
    mixed = True
    generated = True  # validate draws the prompts (each component's own check is run too)
    toy_keys = ("name", "components", "split_fractions", "seed")

    def __init__(self, components: list[tuple[str, Task, float]]):
        self.labels = [c[0] for c in components]
        self.tasks = {label: task for label, task, _ in components}
        self.weights = [float(c[2]) for c in components]
        separators = {t.step_separator for t in self.tasks.values()}
        # one separator for every step end (tap.positions.step_ends), shared by all its tasks
        self.step_separator = separators.pop() if len(separators) == 1 else None
        chars = [t.toy_chars for t in self.tasks.values()]
        self.toy_chars = None if all(c is None for c in chars) else \
            "".join(dict.fromkeys("".join(c or "" for c in chars)))
        self.shots = max(t.shots for t in self.tasks.values())

    @classmethod
    def from_config(cls, task_cfg) -> "MixtureTask":
        """Each component's task built from its section over its task's schema."""
        return cls([(component_label(c), build_task(component_section(c["task"], f"task.components.{i}.task")),
                     float(c["weight"])) for i, c in enumerate(task_cfg.components)])

    def task_of(self, problem) -> str:
        return problem.task

    def _task(self, problem) -> Task:
        return self.tasks[problem.task]

    def problems(self, split: str, n: int) -> list[MixedProblem]:
        order = draw_order(self.weights, n)
        drawn = {label: iter(self.tasks[label].problems(split, order.count(k)))
                 for k, label in enumerate(self.labels)}
        return [MixedProblem(i, split, self.labels[k], next(drawn[self.labels[k]]))
                for i, k in enumerate(order)]

    def distinct(self, split: str, n: int) -> list:
        order = draw_order(self.weights, n)
        for k, label in enumerate(self.labels):
            try:
                self.tasks[label].distinct(split, order.count(k))
            except ValueError as e:
                raise ValueError(f"component {label}: {str(e).removeprefix('task: ')}") from None
        return self.problems(split, n)

    def size(self) -> int | None:
        sizes = [t.size() for t in self.tasks.values()]
        return None if None in sizes else sum(sizes)

    def shot_pool(self) -> list:
        return [p for t in self.tasks.values() if t.shots for p in t.shot_pool()]

    def grade(self, problem, completion: str) -> bool:
        return self._task(problem).grade(problem.inner, completion)

    def answer_for(self, problem, completion: str) -> str:
        return self._task(problem).answer_for(problem.inner, completion)

    def answer_of(self, completion: str) -> str:
        raise TypeError("task mixture: a path's answer depends on its prompt's task; "
                        "call answer_for(problem, text)")

    def reference(self, problem) -> str:
        return self._task(problem).reference(problem.inner)

    def references(self, problem) -> list[str]:
        return self._task(problem).references(problem.inner)

    def diagnose(self, problem, completion: str) -> dict:
        return self._task(problem).diagnose(problem.inner, completion)

    def sample(self, split: str, rng: random.Random) -> MixedProblem:
        label = rng.choices(self.labels, self.weights)[0]
        return MixedProblem(-1, split, label, self.tasks[label].sample(split, rng))

    def training_text(self, problem, rng: random.Random) -> str:
        return self._task(problem).training_text(problem.inner, rng)
