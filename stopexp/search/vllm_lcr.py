"""Launch-Check-Resume online on vLLM, unpatched: every path is one request with its own
seed, as in collect; the engine is stepped one decode step at a time (an in-process engine
core, `VllmSettings.stepped`), and when every live path of a prompt has reached the check
its prefixes are scored and the pruned requests are aborted. The kept requests simply go
on: nothing is re-prefilled and no random stream restarts, so a kept path continues
exactly as in the unpruned run and as in the bank collect made from the same seeds
(replay of that bank decides the same; tests/test_vllm.py).

The check's hidden states are tapped inside vLLM while it generates (the engine's taps,
stopexp.search.vllm_taps: no second model), or with engine.taps=false or attention heads
come from a teacher-forced forward of prompt + prefix through the HF model (`hidden_at`,
stopexp.models.extract, what featurize computes for the bank); its confidence columns come
from the log-probs vLLM returned while sampling the prefix
(stopexp.search.vllm_engine.token_stats). Each method is its own run from the launch, so
its wall time is what a deployment of it spends: launch (until its first check), check
(features and scores) and resume. A pruned path costs the tokens generated before its
abort: the check, in the lockstep of one prefill and one token per step per request. With
taps the state at the check is read by the forward that feeds the check's token, which
also samples one token more: a pruned path is aborted then, and counted at the check, as
the hf engine (whose step feeds the token it samples) and replay count it.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from stopexp.search.parallel import OnlineRun, decide_check, prompt_groups
from stopexp.search.sample import launch_lists
from stopexp.search.vllm_engine import VllmEngine, token_stats
from stopexp.search.vllm_steps import Running, Stepper
from stopexp.signals.columns import signal_matrix
from stopexp.signals.features import SIGNAL_NAMES


def _check_batch(engine: VllmEngine, paths: list[Running], check: int, hidden_at, group_window: int,
                 problems) -> dict:
    """The predictor batch of `paths` (all alive at `check`) at prefix `check`, its states
    tapped in the engine (else `hidden_at`'s); "prompt" and "tokens" let super_token
    re-encode the prefixes."""
    if engine.taps is not None:
        hidden = torch.from_numpy(np.stack([p.watch.states[check] for p in paths]))
        attn = None
    else:
        hidden, attn = hidden_at([(p.prompt, p.tokens[:check], [check]) for p in paths])
    stats = [token_stats(p.logprobs[:check], p.tokens[:check], engine.max_logprobs,
                         engine.params.conf_topk) for p in paths]
    lp, ent, conf = (torch.from_numpy(np.stack([s[k] for s in stats])) for k in range(3))
    prefix = torch.full((len(paths),), check, dtype=torch.long)
    signals = signal_matrix(lp, ent, conf, prefix, group_window, hidden, attn)
    return {"hidden": hidden, "signals": signals, "seed_key": [seed_key(problems, p.key) for p in paths],
            "prefix_len": signals[:, SIGNAL_NAMES.index("prefix_len")],
            "mc": torch.full((len(paths),), float("nan")),
            "prompt": [problems[p.key[0]].prompt for p in paths],
            "tokens": [torch.tensor(p.tokens[:check]) for p in paths]}


def seed_key(problems, key) -> str:
    """The name of path (prompt index, path id)'s random stream, as the hf engine's."""
    return f"{problems[key[0]].prompt}/{key[1]}"


def _run(engine, tokenizer, paths, checks, decide, run: OnlineRun) -> None:
    """Step all `paths` to the end; at each check, every prompt whose live paths all reached
    it is handed to `decide(check index, paths alive there)`, which returns the paths to
    prune (an empty list for no_prune). Fills `run`'s lengths, texts and times."""
    groups: dict = {}
    for p in paths:
        groups.setdefault(p.key[0], []).append(p)
    at = dict.fromkeys(groups, 0)  # per prompt: the index of its next check
    stepper = Stepper(engine, paths, run.kv)
    start, checked = time.perf_counter(), 0.0
    first_done = None
    # the cache a check sees is that of the step where every path holds `check` tokens: with
    # taps that step is the one before (the check waits for the forward feeding token
    # `check`), so the cache is observed after the pruned paths are gone
    tapped = engine.taps is not None
    while stepper.running:
        stepper.step()
        if not tapped:
            stepper.observe()
        while True:
            ready = [g for g, i in at.items() if i < len(checks) and all(p.reached(checks[i]) for p in groups[g])]
            if not ready:
                break
            for i in sorted({at[g] for g in ready}):
                tic = time.perf_counter()
                first_done = tic if first_done is None else first_done
                live = [p for g in ready if at[g] == i for p in groups[g]
                        if not p.pruned and p.live_at(checks[i])]
                gone = decide(i, live) if live else []
                if gone:
                    stepper.abort(gone)
                    for p in gone:
                        run.pruned_at[p.key] = checks[i]
                checked += time.perf_counter() - tic
            for g in ready:
                at[g] += 1
        if tapped:
            stepper.observe()
    wall = time.perf_counter() - start
    run.prefix_s = (first_done or time.perf_counter()) - start
    run.check_s = checked
    run.resume_s = wall - run.prefix_s - checked
    for p in paths:
        if p.pruned:  # with taps it sampled one token more, in the forward its check read
            run.length[p.key], run.text[p.key] = run.pruned_at[p.key], ""
        else:
            run.finish(p.key, list(p.tokens), tokenizer)


def vllm_launch_check_resume(engine: VllmEngine, tokenizer, task, problems, n_paths: int, seed: int,
                             checkpoint, methods: dict, group_window: int, hidden_at,
                             score_rule: str = "last") -> tuple[dict[str, OnlineRun], dict]:
    """stopexp.search.parallel.launch_check_resume on a stepped vLLM engine, with the same
    arguments and results (the runs of no_prune and of every method, and the check batch
    at the first check with its "row" map); `hidden_at(sequences)` returns the (B,
    layers, H) features and the (B,) attention entropies (or None) of (prompt ids, prefix
    ids, [check]) triples. Each method runs from the launch on all prompts; no_prune runs
    first, since the oracle reads its outcomes."""
    checks = [checkpoint] if isinstance(checkpoint, (int, np.integer)) else [int(c) for c in checkpoint]
    prompts, seeds, owners = launch_lists(tokenizer, problems, range(len(problems)), n_paths, seed)

    def launch():
        return [Running(key, p, s) for key, p, s in zip(owners, prompts, seeds)]

    runs, first = {"no_prune": OnlineRun()}, {}

    def record_first(i, live):  # no_prune keeps all; the first check's batch, untimed
        if i == 0:
            first.update({p.key: b for p, b in zip(live, _rows(_check_batch(
                engine, live, checks[0], hidden_at, group_window, problems)))})
        return []

    _run(engine, tokenizer, launch(), checks, record_first, runs["no_prune"])
    runs["no_prune"].check_s = 0.0  # the AUROC batch it made is no part of not pruning
    outcome = {k: float(task.check(problems[k[0]], t)) for k, t in runs["no_prune"].text.items()}
    for name, (scorer, make) in methods.items():
        run = runs[name] = OnlineRun()
        policies = [make()] if len(checks) == 1 else [make(i) for i in range(len(checks))]
        history: dict = {}

        def decide(i, live, scorer=scorer, policies=policies, history=history, run=run):
            batch = _check_batch(engine, live, checks[i], hidden_at, group_window, problems)
            batch["correct"] = torch.tensor([outcome[p.key] for p in live])
            keys = [p.key for p in live]
            keep = decide_check(scorer, batch, policies[i], keys,
                                prompt_groups(np.array([k[0] for k in keys])), history, score_rule, run)
            return [p for p, k in zip(live, keep.tolist()) if not k]

        _run(engine, tokenizer, launch(), checks, decide, run)
    keys = [k for k in owners if k in first]
    merged = {name: torch.stack([first[k][name] for k in keys])
              for name in ("hidden", "signals", "prefix_len", "mc")}
    merged["correct"] = torch.tensor([outcome[k] for k in keys])
    for name in ("seed_key", "prompt", "tokens"):
        merged[name] = [first[k][name] for k in keys]
    merged["row"] = {k: r for r, k in enumerate(keys)}
    for run in runs.values():  # a path that ended before the first check votes unchecked
        for k in owners:
            run.kept[k] = k in first and k not in run.pruned_at
    return runs, merged


def _rows(batch: dict) -> list[dict]:
    """A batch split into one dict per row."""
    n = len(batch["seed_key"])
    return [{k: v[r] for k, v in batch.items()} for r in range(n)]
