"""Online evaluation of the standard protocol: Launch-Check-Resume really runs the LM for
every method on the bank's test prompts and measures wall time and KV memory, on the
configured engine (stopexp.engines; the loop: stopexp.search.lcr)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch

from stopexp.store.path_table import Pruning, Paths
from stopexp.search.decode import SamplingParams
from stopexp.search.memory import kv_bytes_per_token, memory_summary
from stopexp.stopping.replay import spent_outcome
from stopexp.tasks import vote_format
from stopexp.tasks.thinking import ThinkingTask, thinking_length


@dataclass
class OnlineLM:
    """What an online evaluation runs: the LM and its tokenizer, the task and its prompts
    (`problems`, those that fit the model), the sampling (`params`), and `launch(methods,
    checks) -> (runs, check batch)`, Launch-Check-Resume of the prompts on the configured
    engine (stopexp.engines.Backend.online, bound by the stage), `stop(controllers) ->
    runs`, stopping methods inside the running paths (stopexp.engines.Backend.stopping), and
    `rows_for(problems)`, the rows per forward for those prompts (stopexp.search.sample.row_cap)."""
    model: Any
    tokenizer: Any
    task: Any
    problems: list
    params: SamplingParams
    launch: Callable
    rows_for: Callable
    stop: Callable | None = None


def online_paths(lm: OnlineLM, names, scorers, policies: dict, plan: list[tuple[int, int]],
                 n_paths: int):
    """Run Launch-Check-Resume with the LM of `lm` on its prompts, `n_paths` per prompt, at
    every check of `plan` (stopexp.core.protocol.check_plan; the first is where the AUROC
    batch is read), each method pruning by its `policies` (name -> one per check,
    stopexp.core.policies.check_policies). Returns the paths as the no_prune run saw
    them, per method the paths as that method's run saw them with its `Pruning` (None for
    no_prune), and per method the measured time."""
    model, tokenizer, task, problems, N = lm.model, lm.tokenizer, lm.task, lm.problems, n_paths
    methods = {m: (scorers[m], lambda i=0, m=m: policies[m][i]) for m in names if m in scorers}
    checks = plan[0][0] if len(plan) == 1 else [c for c, _ in plan]
    runs, batch = lm.launch(methods, checks)
    keys = [(i, j) for i in range(len(problems)) for j in range(N)]
    thinking = thinking_tokens(runs["no_prune"], keys, tokenizer, task)
    views, timing = {}, {}
    for name, run in runs.items():
        text = np.asarray([run.text[k] for k in keys], dtype=object)
        answer = np.asarray([task.answer_for(problems[i], t) for (i, _), t in zip(keys, text)], dtype=object)
        views[name] = (Paths(
            group=np.repeat(np.arange(len(problems)), N), path_id=np.tile(np.arange(N), len(problems)),
            length=np.asarray([run.length[k] for k in keys]),
            correct=np.asarray([task.grade(problems[i], t) for (i, _), t in zip(keys, text)]),
            answer=answer, text=text, alive=np.asarray([k in batch["row"] for k in keys]),
            batch={}, prompt_ids=np.asarray([p.prompt_id for p in problems]),
            answer_format=vote_format(task), thinking=thinking),
            None if name == "no_prune" else Pruning(
                kept=np.asarray([run.kept[k] for k in keys]),
                pruned_at=np.asarray([run.pruned_at.get(k, 0) for k in keys], np.int64),
                signal=np.asarray([run.signal.get(k, np.nan) for k in keys], np.float64)))
        gen = run.prefix_s + run.resume_s
        timing[name] = {"wall_s": run.wall_s, "wall_estimated": False, "check_s": run.check_s, "prefix_s": run.prefix_s,
                        "resume_s": run.resume_s,
                        "check_share": run.check_s / gen if gen else 0.0,
                        **memory_summary([run.kv.peak[i] for i in range(len(problems))],
                                         kv_bytes_per_token(model), estimated=False),
                        **run.kv.queue_summary()}
    paths = views["no_prune"][0]
    rows = [batch["row"][k] for k in keys if k in batch["row"]]
    paths.batch = scatter_batch(batch, rows, len(keys), paths)
    return paths, views, timing


def thinking_tokens(no_prune, keys: list, tokenizer, task) -> np.ndarray | None:
    """A thinking model's thinking tokens per path (as the bank stores them), from no_prune's
    full paths: every method's path draws the same tokens as no_prune's up to where it was
    pruned, so the accounting's min(spent, thinking) is its share, as in replay. None when
    the task is no thinking task."""
    if not isinstance(task, ThinkingTask):
        return None
    return np.asarray([thinking_length(tokenizer, no_prune.ids[k], task.end_tag) for k in keys])


def scatter_batch(batch: dict, rows: list[int], n: int, paths: Paths) -> dict:
    """The check batch (live paths only; `rows[i]` is the batch row of the i-th live path)
    spread over all n paths, zeros where a path ended before the check."""
    live = torch.as_tensor(np.nonzero(paths.alive)[0])
    full = {}
    for key in ("hidden", "signals", "prefix_len", "mc"):
        v = batch[key][rows]
        full[key] = torch.zeros((n, *v.shape[1:]), dtype=v.dtype)
        full[key][live] = v
    full["mc"][torch.as_tensor(~paths.alive)] = float("nan")
    full["correct"] = torch.as_tensor(paths.correct.astype(np.float32))
    full["seed_key"], full["prompt"], full["tokens"] = [""] * n, [""] * n, [[]] * n
    for r, i in zip(rows, live.tolist()):
        full["seed_key"][i] = batch["seed_key"][r]
        full["prompt"][i], full["tokens"][i] = batch["prompt"][r], batch["tokens"][r]
    return full


def online_stopping(lm: OnlineLM, methods: dict, no_prune: Paths, n_paths: int,
                    group_window: int, inputs: dict) -> tuple[dict, dict]:
    """Run the stopping methods of `methods` (name -> StoppingMethod with a `controller`)
    inside the running paths, one run each from the launch, on the prompts of `lm`.
    Returns (name -> outcome dict as replay gives it, name -> measured time and memory).
    `no_prune` (online_paths' paths) gives each stopped path's full length; a voter's
    answer is its own run's. `inputs`: what controllers read beside the task (scorers, the
    predictor's name, STEP's budget)."""
    controllers = {name: m.controller(n_paths, group_window, task=lm.task, **inputs)
                   for name, m in methods.items()}
    runs = lm.stop(controllers)
    keys = [(i, j) for i in range(len(lm.problems)) for j in range(n_paths)]
    outcomes, timing = {}, {}
    for name, run in runs.items():
        voter = np.asarray([run.kept[k] for k in keys])
        text = np.where(voter, np.asarray([run.text[k] for k in keys], dtype=object), no_prune.text)
        view = replace(no_prune, text=text,
                       answer=np.asarray([lm.task.answer_for(lm.problems[i], t) for (i, _), t in zip(keys, text)],
                                         dtype=object),
                       correct=np.asarray([lm.task.grade(lm.problems[i], t) for (i, _), t in zip(keys, text)]))
        spent = np.asarray([run.pruned_at.get(k, run.length[k]) for k in keys], np.int64)
        weight = np.asarray([run.signal.get(k, 0.0) for k in keys])
        outcomes[name] = spent_outcome(view, spent, voter, weight, n_paths)
        timing[name] = {"wall_s": run.wall_s, "wall_estimated": False, "check_s": run.check_s,
                        "prefix_s": 0.0, "resume_s": run.resume_s,
                        "check_share": run.check_s / run.resume_s if run.resume_s else 0.0,
                        **memory_summary([run.kv.peak[i] for i in range(len(lm.problems))],
                                         kv_bytes_per_token(lm.model), estimated=False),
                        **run.kv.queue_summary()}
    return outcomes, timing
