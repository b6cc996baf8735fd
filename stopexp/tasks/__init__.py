"""Tasks: prompts, references and a checker. `build_task(cfg.task)` picks one by name."""
from stopexp.tasks.arith import ArithTask, Problem

TASKS = {"arith": ArithTask}


def build_task(task_cfg):
    if task_cfg.name not in TASKS:
        raise ValueError(f"task.name: {task_cfg.name!r} unknown; allowed: {', '.join(TASKS)}")
    return ArithTask(n_steps=task_cfg.n_steps, operators=list(task_cfg.operators),
                     multipliers=list(task_cfg.multipliers), styles=dict(task_cfg.styles),
                     seed=task_cfg.seed, split_fractions=dict(task_cfg.split_fractions))


__all__ = ["ArithTask", "Problem", "build_task", "TASKS"]
