"""Tasks: prompts, references and a checker. `build_task(cfg.task, cfg.model.thinking)`
picks one by name (read through a thinking model where model.thinking.enabled is true)."""
from omegaconf import OmegaConf

from stopexp.core.names import lookup, names
from stopexp.core.text import decode_escapes, decoded_text
from stopexp.tasks.arith import ArithTask, Problem
from stopexp.tasks.datatotext import DataToTextTask, Record
from stopexp.tasks.qa import QAProblem, QATask
from stopexp.tasks.thinking import ThinkingTask
from stopexp.tasks.wordprob import WordProblem, WordProblemTask

def vote_format(task) -> str | None:
    """The answer format whose equivalent answers vote as one (stopexp.tasks.answers.
    vote_clusters), of a task or its config: qa's answer_format; None for the other tasks,
    whose canonical answers are one string per answer (data-to-text's are words, not math)."""
    return task.answer_format if task.name == "qa" else None


def build_task(task_cfg, thinking=None):
    """The task of `task_cfg`; with `thinking` (model.thinking) enabled, its paths' answers
    are read after the end tag (stopexp.tasks.thinking.ThinkingTask)."""
    if task_cfg.name not in names("task"):
        raise ValueError(f"task.name: {task_cfg.name!r} unknown; allowed: {', '.join(names('task'))}")
    task_cfg = OmegaConf.create(decoded_text(OmegaConf.to_container(task_cfg, resolve=True)))
    task = _construct(task_cfg)
    task.tokenize = task_cfg.get("tokenize", "13a")  # how text metrics and rewards split words
    if thinking is not None and thinking.enabled is True:
        task = ThinkingTask(task, decode_escapes(thinking.end_tag), decode_escapes(thinking.step_separator))
    return task


def _construct(task_cfg):
    """The registered task class of `task_cfg.name` (stopexp.core.names), with what it reads."""
    common = {"seed": task_cfg.seed, "split_fractions": dict(task_cfg.split_fractions)}
    return lookup("task", task_cfg.name)(**_arguments(task_cfg), **common)


def _arguments(task_cfg) -> dict:
    if task_cfg.name == "qa":
        return dict(path=task_cfg.path, answer_format=task_cfg.answer_format,
                    prompt_template=task_cfg.prompt_template, question_key=task_cfg.question_key,
                    answer_key=task_cfg.answer_key, subset=task_cfg.subset,
                    source_split=task_cfg.source_split, extraction=task_cfg.extraction)
    if task_cfg.name == "wordprob":
        return dict(steps=list(task_cfg.steps), number_range=list(task_cfg.number_range),
                    operations=dict(task_cfg.operations), shots=task_cfg.shots,
                    format=task_cfg.format, extraction=task_cfg.extraction,
                    instruction=task_cfg.instruction, stop=list(task_cfg.stop),
                    solution_style=task_cfg.solution_style, shot_match=task_cfg.shot_match)
    if task_cfg.name == "datatotext":
        return dict(shots=task_cfg.shots, format=task_cfg.format,
                    instruction=task_cfg.instruction, stop=list(task_cfg.stop))
    return dict(n_steps=task_cfg.n_steps, operators=list(task_cfg.operators),
                multipliers=list(task_cfg.multipliers), styles=dict(task_cfg.styles))


__all__ = ["ArithTask", "Problem", "DataToTextTask", "Record", "QATask", "QAProblem", "WordProblemTask", "WordProblem",
           "build_task", "vote_format"]
