"""Launch-Check-Resume, online: launch N paths per prompt, run them to the check prefix,
score every live prefix in one batched call per method, keep what the policy keeps,
drop the rest from batch and cache, and finish the kept ones.

The prefix phase is run once and shared: each method continues from a copy of the
checked state (its rows only), and `no_prune` continues all rows. Because every path
draws from its own stream, a kept path continues exactly as in the unpruned run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from stopexp.search.decode import Decode, Engine
from stopexp.search.sample import path_seeds, prompt_chunks
from stopexp.signals.confidence import confidence_signals
from stopexp.signals.features import SIGNAL_NAMES


@dataclass
class OnlineRun:
    """What one method did on all prompts: which paths it kept at the check, the length
    and text each launched path reached, and the time spent."""
    kept: dict = field(default_factory=dict)     # (prompt index, path id) -> kept?
    length: dict = field(default_factory=dict)   # (prompt index, path id) -> tokens generated
    text: dict = field(default_factory=dict)
    prefix_s: float = 0.0
    check_s: float = 0.0
    resume_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.prefix_s + self.check_s + self.resume_s


def check_batch(state: Decode, engine: Engine, checkpoint: int, keys: list[str],
                group_window: int) -> tuple[torch.Tensor, dict]:
    """(live path indices, predictor batch) at the check, from the live state."""
    paths, hidden = state.features[checkpoint]
    tok, lp, ent, conf, lengths = state.tensors(engine.pad_id)
    sig = confidence_signals(lp[paths], ent[paths], conf[paths],
                             torch.clamp(lengths[paths], max=checkpoint), group_window)
    sig["hidden_norm"] = hidden[:, -1].norm(dim=-1)
    batch = {"hidden": hidden, "signals": torch.stack([sig[n] for n in SIGNAL_NAMES], -1),
             "seed_key": [keys[p] for p in paths.tolist()],
             "prefix_len": sig["prefix_len"], "mc": torch.full((len(paths),), float("nan"))}
    return paths, batch


def _finish(engine, tokenizer, child: Decode, origin: list[int], owners, prefix_tok,
            prefix_len, checkpoint, out: OnlineRun) -> None:
    tok, *_, n = child.tensors(engine.pad_id)
    for r, p in enumerate(origin):
        ids = prefix_tok[p, :checkpoint].tolist() + tok[r, : n[r] - checkpoint].tolist()
        out.length[owners[p]] = len(ids)
        out.text[owners[p]] = tokenizer.decode(ids, skip_special_tokens=True)


def launch_check_resume(engine: Engine, tokenizer, task, problems, n_paths: int, seed: int,
                        checkpoint: int, methods: dict, group_window: int,
                        max_rows: int = 1024) -> tuple[dict[str, OnlineRun], dict]:
    """Run every method of `methods` (name -> (scorer, policy factory)) plus `no_prune`
    on `problems`. The oracle sees the outcomes of the no_prune continuation. Returns the
    runs and the check batch of all chunks (its "row" maps (prompt, path) to a row)."""
    runs = {name: OnlineRun() for name in ["no_prune", *methods]}
    batches = []
    policies = {name: make() for name, (_, make) in methods.items()}
    for chunk in prompt_chunks(len(problems), n_paths, max_rows):
        prompts, seeds, owners, keys = [], [], [], []
        for i in chunk:
            ids = tokenizer(problems[i].prompt)["input_ids"]
            prompts += [ids] * n_paths
            seeds += path_seeds(seed, problems[i].prompt, n_paths)
            owners += [(i, j) for j in range(n_paths)]
            keys += [f"{problems[i].prompt}/{j}" for j in range(n_paths)]
        start = time.perf_counter()
        state = engine.run(engine.launch(prompts, seeds), until=checkpoint)
        prefix_s = time.perf_counter() - start
        prefix_tok, *_, prefix_len = state.tensors(engine.pad_id)
        ended = [p for p in range(len(prompts)) if p not in set(state.paths.tolist())]
        for run in runs.values():
            run.prefix_s += prefix_s
            for p in ended:  # ended before the check: they vote directly
                run.kept[owners[p]] = False
                run.length[owners[p]] = int(prefix_len[p])
                run.text[owners[p]] = tokenizer.decode(prefix_tok[p, : prefix_len[p]].tolist(),
                                                       skip_special_tokens=True)
        live, batch = check_batch(state, engine, checkpoint, keys, group_window)
        row_of = {p: r for r, p in enumerate(state.paths.tolist())}
        # no_prune first: the oracle needs the outcomes
        start = time.perf_counter()
        child = engine.run(engine.fork(state, 1, None))
        runs["no_prune"].resume_s += time.perf_counter() - start
        _finish(engine, tokenizer, child, state.paths.tolist(), owners, prefix_tok, prefix_len,
                checkpoint, runs["no_prune"])
        for p in live.tolist():
            runs["no_prune"].kept[owners[p]] = True
        batch["correct"] = torch.tensor([float(task.check(problems[owners[p][0]],
                                                          runs["no_prune"].text[owners[p]]))
                                         for p in live.tolist()])
        batch["row"] = [owners[p] for p in live.tolist()]
        batches.append(batch)
        for name, (scorer, _) in methods.items():
            run = runs[name]
            start = time.perf_counter()
            scores = scorer(batch)
            keep = torch.zeros(len(live), dtype=torch.bool)
            prompt_of = np.array([owners[p][0] for p in live.tolist()])
            for i in chunk:
                sel = np.nonzero(prompt_of == i)[0]
                if len(sel):
                    keep[sel] = policies[name].keep(scores[sel])
            run.check_s += time.perf_counter() - start
            kept_paths = live[keep].tolist()
            for p, k in zip(live.tolist(), keep.tolist()):
                run.kept[owners[p]] = k
                if not k:
                    run.length[owners[p]] = checkpoint
                    run.text[owners[p]] = ""
            start = time.perf_counter()
            child = engine.run(engine.fork(state, 1, None,
                                           torch.tensor([row_of[p] for p in kept_paths],
                                                        dtype=torch.long)))
            run.resume_s += time.perf_counter() - start
            _finish(engine, tokenizer, child, kept_paths, owners, prefix_tok, prefix_len,
                    checkpoint, run)
    merged = {k: torch.cat([b[k] for b in batches]) for k in ("hidden", "signals", "prefix_len",
                                                               "mc", "correct")}
    merged["seed_key"] = [k for b in batches for k in b["seed_key"]]
    merged["row"] = {key: r for r, key in enumerate(k for b in batches for k in b["row"])}
    return runs, merged
