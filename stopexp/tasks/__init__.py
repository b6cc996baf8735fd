"""Tasks: prompts, references and a grader, each a `Task` (stopexp.tasks.task) registered
by name (stopexp.core.names REGISTRY["task"]) and imported when it is looked up.
`build_task(cfg.task, cfg.model.thinking)` picks one by name (read through a thinking model
where model.thinking.enabled is true)."""
from omegaconf import OmegaConf

from stopexp.core.names import lookup
from stopexp.core.config_text import decode_escapes, decoded_text
from stopexp.tasks.task import Task
from stopexp.tasks.thinking import ThinkingTask

# the public names of the built-in tasks' modules, imported on first use
_LAZY = {"ArithTask": "arith", "Problem": "arith", "DataToTextTask": "datatotext",
         "Record": "datatotext", "QATask": "qa", "QAProblem": "qa",
         "WordProblemTask": "wordprob", "WordProblem": "wordprob"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


def vote_format(task) -> str | None:
    """The answer format whose equivalent answers vote as one (stopexp.metrics.answers.
    vote_clusters), of a built task or its config section (whose view holds answer_format
    for every task: the task's class says whether it reads it); None for a task whose
    canonical answers are one string per answer (data-to-text's are words, not math)."""
    if isinstance(task, Task):
        return task.answer_format
    return task.answer_format if lookup("task", task.name).answer_format is not None else None


def build_task(task_cfg, thinking=None):
    """The task of `task_cfg`: task.name's class in the registry (stopexp.core.names), built
    by its `from_config` from the section, text decoded; with `thinking` (model.thinking)
    enabled, its paths' answers are read after the end tag (ThinkingTask)."""
    cls = lookup("task", task_cfg.name)  # an unknown name: one line listing the tasks
    task_cfg = OmegaConf.create(decoded_text(OmegaConf.to_container(task_cfg, resolve=True)))
    task = cls.from_config(task_cfg)
    task.tokenize = task_cfg.get("tokenize", "13a")  # how text metrics and rewards split words
    if thinking is not None and thinking.enabled is True:
        task = ThinkingTask(task, decode_escapes(thinking.end_tag), decode_escapes(thinking.step_separator))
    return task


__all__ = [*_LAZY, "Task", "ThinkingTask", "build_task", "vote_format"]
