"""Tasks: prompts, references and a checker. `build_task(cfg.task, cfg.model.thinking)`
picks one by name (read through a thinking model where model.thinking.enabled is true)."""
from omegaconf import OmegaConf

from stopexp.core.names import lookup
from stopexp.core.text import decode_escapes, decoded_text
from stopexp.tasks.arith import ArithTask, Problem
from stopexp.tasks.datatotext import DataToTextTask, Record
from stopexp.tasks.qa import QAProblem, QATask
from stopexp.tasks.thinking import ThinkingTask
from stopexp.tasks.wordprob import WordProblem, WordProblemTask

def vote_format(task) -> str | None:
    """The answer format whose equivalent answers vote as one (stopexp.metrics.answers.
    vote_clusters), of a task or its config: qa's answer_format; None for the other tasks,
    whose canonical answers are one string per answer (data-to-text's are words, not math)."""
    return task.answer_format if task.name == "qa" else None


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


__all__ = ["ArithTask", "Problem", "DataToTextTask", "Record", "QATask", "QAProblem", "WordProblemTask", "WordProblem",
           "build_task", "vote_format"]
