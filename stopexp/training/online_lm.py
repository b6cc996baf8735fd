"""The LM in the adaptation loop (`python -m stopexp.adapt +exp=toy_shift evaluate.mode=online`).

Each stream batch really runs Launch-Check-Resume with the target LM: the current
predictor scores the live paths at the check, the policy keeps its top K plus the paths
exploration draws, and only those continue. Feedback, votes and token counts come from
what the LM generated. Every path has its own random stream, so the paths, and with them
the curves, equal the replay's (tests/test_adapt_stream.py); the seconds are measured, not
estimated. The LM also runs the unpruned continuation of every path (as evaluate's online
mode does), whose outcomes give the batch's AUROC; its time is not charged to the variant.

Monte Carlo feedback continues the chosen pruned prefixes at the check in K rollouts with
the seeds collect gives its Monte Carlo labels (stopexp/search/trace.py rollout_rewards),
so the rates equal the bank's; their tokens are counted, not estimated. The loop's check
state is gone by then, so the chosen paths are relaunched up to the check first (their own
streams give the same prefixes); only the rollouts are timed and charged.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from stopexp.core.policies import build_policy
from stopexp.core.seeds import stream_seed
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import keep_by_policy
from stopexp.engines.hf import run_launch_check_resume
from stopexp.evaluation.online import OnlineLM, scatter_batch
from stopexp.search.decode import make_engine
from stopexp.search.sample import path_labels, prompt_ids
from stopexp.search.stepping import Running, step_to
from stopexp.search.trace import rollout_rewards
from stopexp.tasks import vote_format
from stopexp.training.stream import predictor_scores, predictor_tensor


class Exploring:
    """A threshold policy that also keeps each would-be-pruned path with probability
    epsilon: one draw from `rng` per live path, in the order the paths are scored."""

    def __init__(self, policy, epsilon: float, rng):
        self.policy, self.epsilon, self.rng = policy, epsilon, rng

    def keep(self, scores: torch.Tensor) -> torch.Tensor:
        kept = self.policy.keep(scores)
        if not self.epsilon:
            return kept
        return kept | torch.as_tensor(self.rng.random(len(scores)) < self.epsilon)


def prompt_ids_of(paths: Paths) -> np.ndarray:
    """The task's prompt id of each group of `paths` (the stream's prompts)."""
    return paths.prompt_ids if paths.prompt_ids is not None else np.arange(int(paths.group.max()) + 1)


def online_decider(lm: OnlineLM, paths: Paths, checkpoint: int, *, search, tap, policy,
                   seed: int, mc_rollouts: int):
    """(`decide(groups, predictor, epsilon, rng)`, `continue_(view, rows)`) for
    stopexp.training.stream.run_stream that run the LM of `lm` (the target config's, with
    its task, the split's first prompts and the sampling) on the prompts of `paths` (the
    target bank's split, `prompt_ids_of`), with the `search`, `tap` and `policy` sections:
    the pruning step, and the Monte Carlo continuations of pruned prefixes, `mc_rollouts`
    each (success rate, tokens per row and measured seconds)."""
    model, tokenizer, task, params = lm.model, lm.tokenizer, lm.task, lm.params
    ids = prompt_ids_of(paths)
    by_id = {p.prompt_id: p for p in lm.problems}
    N, K = search.n_paths, policy.keep

    def decide(groups, predictor, epsilon: float, rng):
        batch_problems = [by_id[int(ids[g])] for g in groups]
        methods = {}
        if predictor is not None:
            methods["adapt"] = (lambda b: predictor_tensor(predictor, b),
                                lambda: Exploring(build_policy(policy, keep=K), epsilon, rng))
        runs, batch = run_launch_check_resume(model, tokenizer, task, batch_problems, methods,
                                              checkpoint, params, search, tap, seed,
                                              lm.rows_for(batch_problems))
        view = _view(runs["no_prune"], batch, batch_problems, task, N, checkpoint)
        run = runs["adapt" if predictor is not None else "no_prune"]
        keys = [(i, j) for i in range(len(batch_problems)) for j in range(N)]
        kept = np.asarray([bool(run.kept[k]) for k in keys]) & view.alive
        if predictor is None:
            return view, None, kept, np.zeros(len(kept), bool), run.wall_s
        scores = predictor_scores(predictor, view.batch)
        top = keep_by_policy(view, scores, build_policy(policy, keep=K), N)
        return view, scores, kept & top, kept & ~top, run.wall_s

    def continue_(view: Paths, rows: np.ndarray):
        problems = [by_id[int(view.prompt_ids[view.group[r]])] for r in rows]
        owners = [(k, int(view.path_id[r])) for k, r in enumerate(rows)]
        paths = [Running(key, prompt_ids(tokenizer, p.prompt), stream_seed(seed, p.prompt, key[1]))
                 for p, key in zip(problems, owners)]
        steps = make_engine(model, tokenizer, params).steps(lm.rows_for(problems))
        stepper = steps.start(paths, labels=path_labels(problems, owners))
        step_to(stepper, checkpoint)
        if not all(p.live_at(checkpoint) for p in paths):
            raise RuntimeError("Monte Carlo feedback: a relaunched prefix ended before the "
                               "check although the loop saw it live")
        start = time.perf_counter()
        rates, tokens = rollout_rewards(stepper, tokenizer, task, problems, paths, checkpoint,
                                        seed, mc_rollouts)
        seconds = time.perf_counter() - start
        return (np.asarray([rates[k] for k in owners]),
                np.asarray([tokens[k] for k in owners], float), seconds)

    return decide, continue_


def _view(run, batch: dict, problems: list, task, n: int, checkpoint: int) -> Paths:
    """The batch's paths as the unpruned run generated them, with the check features."""
    keys = [(i, j) for i in range(len(problems)) for j in range(n)]
    text = np.asarray([run.text[k] for k in keys], dtype=object)
    view = Paths(group=np.repeat(np.arange(len(problems)), n), path_id=np.tile(np.arange(n), len(problems)),
                 length=np.asarray([run.length[k] for k in keys]),
                 correct=np.asarray([task.grade(problems[i], t) for (i, _), t in zip(keys, text)]),
                 answer=np.asarray([task.answer_for(problems[i], t) for (i, _), t in zip(keys, text)], dtype=object),
                 text=text,
                 alive=np.asarray([k in batch["row"] for k in keys]), batch={},
                 prompt_ids=np.asarray([p.prompt_id for p in problems]), answer_format=vote_format(task))
    view.batch = scatter_batch(batch, [batch["row"][k] for k in keys if k in batch["row"]], len(keys), view)
    view.batch["group"] = torch.as_tensor(view.group)
    view.batch["remaining"] = torch.as_tensor(np.maximum(view.length - checkpoint, 0).astype(np.float32))
    return view
