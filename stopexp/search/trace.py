"""Tracing: sample N unpruned paths per prompt and record, per path, its tokens, outcome
and per-token confidences, and (optionally) per checkpoint a Monte Carlo success rate
estimated by K rollouts from the prefix. Hidden features are traced only by an engine that
taps them while it generates (vLLM); otherwise `stopexp.store.features` extracts them from
the stored tokens."""
from __future__ import annotations

import numpy as np
import torch

from stopexp.core.seeds import stream_seed
from stopexp.core.token_text import text_of, texts_of
from stopexp.search.decode import Decode, Engine
from stopexp.search.sample import launch_lists, path_labels, prompt_chunks
from stopexp.search.stops import StopStrings
from stopexp.tasks.thinking import thinking_length


def _decode_texts(tokenizer, tokens: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    return texts_of(tokenizer, [tokens[i, : lengths[i]].tolist() for i in range(len(lengths))])


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
    return hasattr(task, "wrong_value_end")


def first_wrong_value(tokenizer, task, problem, ids: list[int], text: str) -> int:
    """The bank's `first_wrong_value` (tasks with `has_values`): the generated tokens up to
    and with the path's first wrong intermediate value, i.e. the shortest prefix that shows
    it (-1: every written value is right)."""
    end = task.wrong_value_end(problem, text)
    return -1 if end is None else prefix_holding(tokenizer, ids, end)


def mc_success(engine: Engine, tokenizer, task, state: Decode, problems, owners, seed: int,
               rollouts: int, max_rows: int, tokens_of: dict | None = None, reward=None
               ) -> tuple[dict[int, float], int]:
    """Mean reward of `rollouts` continuations from each live row's current prefix (with
    `reward` None or `correct`: their success rate); the rollouts copy the prefix's cache
    rows (no re-encoding). Returns {path index: mean reward} and the number of tokens
    generated; `tokens_of`, when given, receives {path index: tokens its rollouts generated}."""
    prefix_tok, prefix_lp, *_, prefix_len = state.tensors(engine.pad_id)
    t = state.n_generated
    out, generated = {}, 0
    per = max(1, max_rows // rollouts)
    for lo in range(0, state.size, per):
        rows = torch.arange(lo, min(state.size, lo + per))
        paths = state.paths[rows].tolist()
        seeds = [stream_seed(seed, problems[owners[p][0]].prompt, owners[p][1], "mc", t, r)
                 for p in paths for r in range(rollouts)]
        child = engine.run(engine.fork(state, rollouts, seeds, rows))
        tok, lp, *_, n = child.tensors(engine.pad_id)
        generated += int((n - t).sum())
        for k, p in enumerate(paths):
            prefix = prefix_tok[p, :t].tolist()  # decoded with each rollout, as a path's text is
            full = texts_of(tokenizer, [prefix + tok[k * rollouts + r, : n[k * rollouts + r] - t].tolist()
                                        for r in range(rollouts)])
            rows_lp = [torch.cat([prefix_lp[p, :t], lp[k * rollouts + r, : n[k * rollouts + r] - t]]).numpy()
                       for r in range(rollouts)] if reward is not None and reward.needs_logprobs else None
            out[p] = mean_reward(task, problems[owners[p][0]], full, reward, rows_lp)
            if tokens_of is not None:
                tokens_of[p] = int((n - t)[k * rollouts:(k + 1) * rollouts].sum())
    return out, generated


def mean_reward(task, problem, texts: list[str], reward=None, logprobs=None) -> float:
    """The mean reward of a path's rollouts (whole texts; reward None: their success rate)."""
    if reward is None:
        return sum(task.check(problem, t) for t in texts) / len(texts)
    return float(reward.scores(task, [problem] * len(texts), texts, logprobs).mean())


def boundary_stop(stops: StopStrings, prefix: list[int], ids: list[int]) -> int:
    """How many of a rollout's tokens `ids` the hf engine keeps after `prefix`, as far as a
    stop string that starts inside the prefix decides it: up to the token completing one
    (a request that starts after the prefix cannot see such a stop), else all."""
    seen = 0
    for k in range(1, len(ids) + 1):
        if stops.hits([prefix + ids[:k]])[0]:
            return k
        seen += not stops.is_blank(ids[k - 1])
        if seen >= stops.window:  # a stop spans fewer tokens that decode to something
            break
    return len(ids)


def resubmitted_mc(engine, tokenizer, task, problems, owners, prompts: list[list[int]],
                   tok: torch.Tensor, lp: torch.Tensor, lengths: torch.Tensor,
                   checkpoints: list[int], seed: int, rollouts: int, max_rows: int, reward=None
                   ) -> tuple[np.ndarray, int]:
    """Monte Carlo labels from an engine that cannot fork a path (vLLM): every path alive at
    a checkpoint c (longer than c tokens) is continued `rollouts` times, each a new request
    whose prompt is the path's prompt and first c tokens (with prefix caching their prefill
    is shared), for at most max_new_tokens - c tokens, with the seed the hf engine gives that
    rollout (its sampler draws other tokens from it). Returns the (P, C) mean rewards (NaN
    where a path has ended by c: the caller knows its reward) and the tokens generated."""
    P, C = len(prompts), len(checkpoints)
    mc = np.full((P, C), np.nan, dtype=np.float32)
    params = engine.params
    stops = StopStrings(params.stop, tokenizer) if params.stop else None
    with_lp = reward is not None and reward.needs_logprobs
    live = [(p, ci, c) for ci, c in enumerate(checkpoints) for p in range(P) if int(lengths[p]) > c]
    generated, per = 0, max(1, max_rows // rollouts)
    for lo in range(0, len(live), per):
        part = live[lo:lo + per]
        prefixes = [tok[p, :c].tolist() for p, _, c in part]
        heads = [prompts[p] + prefix for (p, _, _), prefix in zip(part, prefixes)
                 for _ in range(rollouts)]
        seeds = [stream_seed(seed, problems[owners[p][0]].prompt, owners[p][1], "mc", c, r)
                 for p, _, c in part for r in range(rollouts)]
        caps = [params.max_new_tokens - c for _, _, c in part for _ in range(rollouts)]
        done = engine.continuations(heads, seeds, caps, logprobs=with_lp)
        for k, ((p, ci, c), prefix) in enumerate(zip(part, prefixes)):
            kept = []
            for ids, r_lp in done[k * rollouts:(k + 1) * rollouts]:
                n = boundary_stop(stops, prefix, ids) if stops else len(ids)
                kept.append((ids[:n], None if r_lp is None else r_lp[:n]))
            generated += sum(len(ids) for ids, _ in kept)
            texts = texts_of(tokenizer, [prefix + ids for ids, _ in kept])
            rows_lp = [np.concatenate([lp[p, :c].numpy(), r_lp]) for _, r_lp in kept] if with_lp else None
            mc[p, ci] = mean_reward(task, problems[owners[p][0]], texts, reward, rows_lp)
    return mc, generated


def trace_problems(engine, tokenizer, task, problems, n_paths: int, seed: int,
                   checkpoints: list[int], mc_rollouts: int, max_rows: int = 1024, reward=None
                   ) -> tuple[dict[str, list], int]:
    """Columns of the trace bank for `problems` (N paths each), in (prompt, path) order,
    and the number of tokens the Monte Carlo rollouts generated. `reward`
    (stopexp.tasks.rewards.Reward; None: the outcome) fills the `reward` column. With
    `mc_rollouts`, "mc" holds per path the mean reward of that many rollouts from each of
    `checkpoints` (a path that ended by then: its own reward); without, it is empty. The
    engine needs no taps: hidden features are extracted later from the stored tokens.
    `engine` is the hf Engine (its rollouts fork a path's cache), or anything with its
    `generate` and `pad_id` and, for rollouts, `params` and `continuations`
    (stopexp.search.vllm_engine.VllmEngine: `resubmitted_mc`). An engine that taps states
    while it generates (`take_states`) adds the column "states": per path {position:
    (layers, H) state}, for the features artifact (stopexp.store.tapped_features)."""
    mc_tokens = 0
    cols: dict[str, list] = {k: [] for k in (
        "split", "prompt_id", "prompt", "prompt_len", "path_id", "tokens", "text", "answer", "correct",
        "reward", "length", "finished", "style", "first_error", "token_logprob", "token_entropy",
        "token_conf", "mc")}
    values = has_values(task)
    if values:
        cols["first_wrong_value"] = []
    thinking = hasattr(task, "end_tag")  # a thinking model (stopexp.tasks.thinking)
    if thinking:
        cols["thinking_tokens"] = []
    C = len(checkpoints) if mc_rollouts else 0
    for chunk in prompt_chunks(len(problems), n_paths, max_rows):
        prompts, seeds, owners = launch_lists(tokenizer, problems, chunk, n_paths, seed)
        P = len(prompts)
        mc = np.full((P, C), np.nan, dtype=np.float32)
        if C and hasattr(engine, "fork"):  # rollouts fork the live paths' KV cache (hf engine)
            state = engine.launch(prompts, seeds, path_labels(problems, owners))
            for c_idx, c in enumerate(checkpoints[:C]):
                engine.run(state, until=c)
                if state.size:
                    rates, n_tok = mc_success(engine, tokenizer, task, state, problems, owners,
                                              seed, mc_rollouts, max_rows, reward=reward)
                    mc_tokens += n_tok
                    for p, rate in rates.items():
                        mc[p, c_idx] = rate
            engine.run(state)
            tok, lp, ent, conf, lengths = state.tensors(engine.pad_id)
            finished = state.finished
        else:  # whole paths: any engine (hf or vLLM)
            tok, lp, ent, conf, lengths, finished = engine.generate(
                prompts, seeds, path_labels(problems, owners))
            states = engine.take_states() if hasattr(engine, "take_states") else None
            if states is not None:  # tapped while generated (vLLM): the features artifact's
                cols.setdefault("states", []).extend(states)
            if C:  # rollouts start from new requests (vLLM)
                mc, n_tok = resubmitted_mc(engine, tokenizer, task, problems, owners, prompts, tok,
                                           lp, lengths, checkpoints[:C], seed, mc_rollouts,
                                           max_rows, reward)
                mc_tokens += n_tok
        texts = _decode_texts(tokenizer, tok, lengths)
        owned = [problems[i] for i, _ in owners]
        rewards = [float(task.check(q, t)) for q, t in zip(owned, texts)] if reward is None else \
            reward.scores(task, owned, texts, [lp[p, : int(lengths[p])].numpy() for p in range(P)]
                          if reward.needs_logprobs else None)
        for p, (i, j) in enumerate(owners):
            problem, text, n = problems[i], texts[p], int(lengths[p])
            correct = task.check(problem, text)
            ended = np.asarray(checkpoints[:C]) >= n  # alive at c <=> length > c
            mc[p, ended] = float(rewards[p])  # a path already ended knows its reward
            diag = task.diagnose(problem, text)
            cols["split"].append(problem.split)
            cols["prompt_id"].append(problem.prompt_id)
            cols["prompt"].append(problem.prompt)
            cols["prompt_len"].append(len(prompts[p]))  # tokens, for the KV-memory estimate
            cols["path_id"].append(j)
            cols["tokens"].append(tok[p, :n].tolist())
            cols["text"].append(text)
            cols["answer"].append(task.answer_of(text))
            cols["correct"].append(correct)
            cols["reward"].append(float(rewards[p]))
            cols["length"].append(n)
            cols["finished"].append(bool(finished[p]))
            cols["style"].append(diag["style"])
            cols["first_error"].append(diag["first_error"])
            if values:
                cols["first_wrong_value"].append(first_wrong_value(tokenizer, task, problem,
                                                                   cols["tokens"][-1], text))
            cols["token_logprob"].append(lp[p, :n].numpy())
            cols["token_entropy"].append(ent[p, :n].numpy())
            cols["token_conf"].append(conf[p, :n].numpy())
            cols["mc"].append(mc[p])
            if thinking:
                cols["thinking_tokens"].append(thinking_length(tokenizer, cols["tokens"][-1], task.end_tag))
    return cols, mc_tokens
