"""Tracing, the collect loop of every engine: sample N unpruned paths per prompt on the
engine's stepper (stopexp.search.stepping) and record, per path, its tokens, outcome and
per-token confidences, and (optionally) per checkpoint a Monte Carlo success rate
estimated by K rollouts from the prefix, which the stepper continues as the engine can
(the hf engine forks the prefix's cache, vLLM adds requests). Hidden features are traced
only by an engine that taps them while it generates (vLLM); otherwise
`stopexp.store.feature_sets` extracts them from the stored tokens."""
from __future__ import annotations

import numpy as np

from stopexp.core.seeds import stream_seed
from stopexp.core.token_text import text_of, texts_of
from stopexp.search.sample import launch_lists, path_labels
from stopexp.search.stepping import Running, step_to
from stopexp.tasks.thinking import thinking_length


def prefix_holding(tokenizer, ids: list[int], end: int) -> int:
    """The fewest leading tokens of `ids` whose decoded text reaches character `end` of the
    whole decoded text (a decoded prefix is a prefix of the text; bisection: ~log2 decodes)."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(text_of(tokenizer, ids[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo


def has_values(task) -> bool:
    """Whether the task's problems have intermediate values a path can get wrong (its bank
    then records `first_wrong_value`)."""
    return task.wrong_value_end is not None


def first_wrong_value(tokenizer, task, problem, ids: list[int], text: str) -> int:
    """The bank's `first_wrong_value` (tasks with `has_values`): the generated tokens up to
    and with the path's first wrong intermediate value, i.e. the shortest prefix that shows
    it (-1: every written value is right)."""
    end = task.wrong_value_end(problem, text)
    return -1 if end is None else prefix_holding(tokenizer, ids, end)


def rollout_rewards(stepper, tokenizer, task, problems, paths: list, check: int, seed: int,
                    rollouts: int, reward=None) -> tuple[dict, dict]:
    """Monte Carlo labels at prefix `check`: each of `paths` (stopexp.search.stepping's
    Running, keyed (problem index, path id), all alive there) continued `rollouts` times by
    the `stepper` holding them, the r-th rollout drawn from the seed
    stream_seed(seed, prompt, path id, "mc", check, r) whatever the engine. Returns
    {key: mean reward of its rollouts' whole texts} (with `reward` None or `correct`: their
    success rate) and {key: tokens its rollouts generated}."""
    with_lp = reward is not None and reward.needs_logprobs
    seeds = [stream_seed(seed, problems[p.key[0]].prompt, p.key[1], "mc", check, r)
             for p in paths for r in range(rollouts)]
    done = stepper.rollouts(paths, check, seeds, rollouts, with_lp)
    prefix_lp = [c[0] for c in stepper.columns(paths, check)] if with_lp else None
    rates, tokens = {}, {}
    for k, (p, runs) in enumerate(zip(paths, done)):
        prefix = p.tokens[:check]  # decoded with each rollout, as a path's text is
        texts = texts_of(tokenizer, [prefix + ids for ids, _ in runs])
        rows_lp = [np.concatenate([prefix_lp[k], lp]) for _, lp in runs] if with_lp else None
        rates[p.key] = mean_reward(task, problems[p.key[0]], texts, reward, rows_lp)
        tokens[p.key] = sum(len(ids) for ids, _ in runs)
    return rates, tokens


def mean_reward(task, problem, texts: list[str], reward=None, logprobs=None) -> float:
    """The mean reward of a path's rollouts (whole texts; reward None: their success rate)."""
    if reward is None:
        return sum(task.grade(problem, t) for t in texts) / len(texts)
    return float(reward.scores(task, [problem] * len(texts), texts, logprobs).mean())


def trace_problems(steps, tokenizer, task, problems, n_paths: int, seed: int,
                   checkpoints: list[int], mc_rollouts: int, reward=None) -> tuple[dict[str, list], int]:
    """Columns of the trace bank for `problems` (N paths each), in (prompt, path) order,
    sampled by the engine's `steps` (stopexp.search.stepping.Steps), and the number of
    tokens the Monte Carlo rollouts generated. `reward` (stopexp.tasks.rewards.Reward;
    None: the outcome) fills the `reward` column. With `mc_rollouts`, "mc" holds per path
    the mean reward of that many rollouts from each of `checkpoints` (`rollout_rewards`; a
    path that ended by then: its own reward); without, it is empty. An engine that taps
    states while it generates (vLLM's: a path's `watch`) adds the column "states": per path
    {position: (layers, H) state}, for the features artifact
    (stopexp.store.tapped_features); otherwise `stopexp.store.feature_sets` extracts them from
    the stored tokens."""
    mc_tokens = 0
    cols: dict[str, list] = {k: [] for k in (
        "split", "prompt_id", "prompt", "prompt_len", "path_id", "tokens", "text", "answer", "correct",
        "reward", "length", "finished", "style", "first_error", "token_logprob", "token_entropy",
        "token_conf", "mc")}
    values = has_values(task)
    if values:
        cols["first_wrong_value"] = []
    if task.mixed:
        cols["task"] = []
    thinking = task.end_tag is not None  # a thinking model (stopexp.tasks.thinking)
    if thinking:
        cols["thinking_tokens"] = []
    C = len(checkpoints) if mc_rollouts else 0
    for chunk in steps.chunks(len(problems), n_paths):
        prompts, seeds, owners = launch_lists(tokenizer, problems, chunk, n_paths, seed)
        paths = [Running(key, p, s) for key, p, s in zip(owners, prompts, seeds)]
        stepper = steps.start(paths, labels=path_labels(problems, owners))
        P = len(paths)
        mc = np.full((P, C), np.nan, dtype=np.float32)
        for c_idx, c in enumerate(checkpoints[:C]):
            step_to(stepper, c)
            live = [p for p in paths if p.live_at(c)]
            if live:
                rates, n_tok = rollout_rewards(stepper, tokenizer, task, problems, live, c, seed,
                                               mc_rollouts, reward)
                mc_tokens += sum(n_tok.values())
                for r, p in enumerate(paths):
                    mc[r, c_idx] = rates.get(p.key, np.nan)
        while stepper.running:
            stepper.step()
        stats = stepper.columns(paths)
        if any(p.watch is not None for p in paths):  # tapped while generated (vLLM)
            cols.setdefault("states", []).extend(p.watch.states for p in paths)
        texts = texts_of(tokenizer, [p.tokens for p in paths])
        owned = [problems[i] for i, _ in owners]
        rewards = [float(task.grade(q, t)) for q, t in zip(owned, texts)] if reward is None else \
            reward.scores(task, owned, texts, [s[0] for s in stats] if reward.needs_logprobs else None)
        for p, (i, j) in enumerate(owners):
            problem, text, n = problems[i], texts[p], len(paths[p].tokens)
            correct = task.grade(problem, text)
            ended = np.asarray(checkpoints[:C]) >= n  # alive at c <=> length > c
            mc[p, ended] = float(rewards[p])  # a path already ended knows its reward
            diag = task.diagnose(problem, text)
            cols["split"].append(problem.split)
            cols["prompt_id"].append(problem.prompt_id)
            cols["prompt"].append(problem.prompt)
            cols["prompt_len"].append(len(prompts[p]))  # tokens, for the KV-memory estimate
            cols["path_id"].append(j)
            cols["tokens"].append(list(paths[p].tokens))
            cols["text"].append(text)
            cols["answer"].append(task.answer_for(problem, text))
            cols["correct"].append(correct)
            cols["reward"].append(float(rewards[p]))
            cols["length"].append(n)
            cols["finished"].append(paths[p].stopped)
            cols["style"].append(diag["style"])
            cols["first_error"].append(diag["first_error"])
            if values:
                cols["first_wrong_value"].append(first_wrong_value(tokenizer, task, problem,
                                                                   cols["tokens"][-1], text))
            for name, column in zip(("token_logprob", "token_entropy", "token_conf"), stats[p]):
                cols[name].append(column)
            cols["mc"].append(mc[p])
            if task.mixed:
                cols["task"].append(task.task_of(problem))
            if thinking:
                cols["thinking_tokens"].append(thinking_length(tokenizer, cols["tokens"][-1], task.end_tag))
    return cols, mc_tokens
