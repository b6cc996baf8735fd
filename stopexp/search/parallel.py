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

from stopexp.memory import KVMeter
from stopexp.search.decode import Decode, Engine
from stopexp.search.sample import launch_lists, path_labels, prompt_chunks
from stopexp.signals.columns import signal_matrix
from stopexp.signals.features import SIGNAL_NAMES


@dataclass
class OnlineRun:
    """What one method did on all prompts: which paths it kept at the check, the length
    and text each launched path reached, and the time spent."""
    kept: dict = field(default_factory=dict)     # (prompt index, path id) -> kept?
    length: dict = field(default_factory=dict)   # (prompt index, path id) -> tokens generated
    text: dict = field(default_factory=dict)
    kv: KVMeter = field(default_factory=KVMeter)  # cached tokens per prompt (stopexp.memory)
    prefix_s: float = 0.0
    check_s: float = 0.0
    resume_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.prefix_s + self.check_s + self.resume_s


def run_metered(engine: Engine, state: Decode, meter: KVMeter, prompt_of_path: list,
                until: int | None = None) -> Decode:
    """`engine.run(state, until)`, with the cached tokens of every prompt's live rows
    observed by `meter` before the first step and after every step (`prompt_of_path[p]`:
    the prompt of path p of the state)."""
    limit = engine.params.max_new_tokens if until is None else until
    meter.observe(state.positions, [prompt_of_path[p] for p in state.paths.tolist()])
    while state.size and state.n_generated < limit:
        engine.step(state)
        if state.size:
            meter.observe(state.positions, [prompt_of_path[p] for p in state.paths.tolist()])
    return state


def check_batch(state: Decode, engine: Engine, checkpoint: int, keys: list[str],
                group_window: int) -> tuple[torch.Tensor, dict]:
    """(live path indices, predictor batch) at the check, from the live state."""
    paths, hidden = state.features[checkpoint]
    tok, lp, ent, conf, lengths = state.tensors(engine.pad_id)
    signals = signal_matrix(lp[paths], ent[paths], conf[paths],
                            torch.clamp(lengths[paths], max=checkpoint), group_window, hidden,
                            state.attn.get(checkpoint))
    batch = {"hidden": hidden, "signals": signals,
             "seed_key": [keys[p] for p in paths.tolist()],
             "prefix_len": signals[:, SIGNAL_NAMES.index("prefix_len")],
             "mc": torch.full((len(paths),), float("nan"))}
    return paths, batch


def _finish(engine, tokenizer, child: Decode, origin: list, checkpoint: int,
            out: OnlineRun) -> None:
    """Record the full text and length of each continued row; `origin[r]` is the row's
    (prompt, path) key and its prefix token ids."""
    tok, *_, n = child.tensors(engine.pad_id)
    for r, (key, prefix) in enumerate(origin):
        ids = prefix + tok[r, : n[r] - checkpoint].tolist()
        out.length[key] = len(ids)
        out.text[key] = tokenizer.decode(ids, skip_special_tokens=True)


class _Pending:
    """Kept rows of one method waiting to continue: forks from several checked chunks are
    merged until they fill a batch, so pruning shrinks the number of forwards, not only
    their width."""

    def __init__(self):
        self.states, self.origin = [], []

    @property
    def rows(self) -> int:
        return sum(s.size for s in self.states)

    def flush(self, engine, tokenizer, checkpoint, run: OnlineRun) -> None:
        if self.rows:
            start = time.perf_counter()
            child = run_metered(engine, engine.merge(self.states), run.kv,
                                [key[0] for key, _ in self.origin])
            run.resume_s += time.perf_counter() - start
            _finish(engine, tokenizer, child, self.origin, checkpoint, run)
        self.states, self.origin = [], []


def launch_check_resume(engine: Engine, tokenizer, task, problems, n_paths: int, seed: int,
                        checkpoint: int, methods: dict, group_window: int,
                        max_rows: int = 1024) -> tuple[dict[str, OnlineRun], dict]:
    """Run every method of `methods` (name -> (scorer, policy factory)) plus `no_prune`
    on `problems`, at most `max_rows` live rows per forward. The oracle sees the outcomes
    of the no_prune continuation. Returns the runs and the check batch of all chunks (its
    "row" maps (prompt, path) to a row)."""
    runs = {name: OnlineRun() for name in ["no_prune", *methods]}
    policies = {name: make() for name, (_, make) in methods.items()}
    pending = {name: _Pending() for name in runs}
    batches = []
    for chunk in prompt_chunks(len(problems), n_paths, max_rows):
        prompts, seeds, owners = launch_lists(tokenizer, problems, chunk, n_paths, seed)
        keys = [f"{problems[i].prompt}/{j}" for i, j in owners]
        start = time.perf_counter()
        prefix_kv = KVMeter()
        state = run_metered(engine, engine.launch(prompts, seeds, path_labels(problems, owners)),
                            prefix_kv, [i for i, _ in owners], until=checkpoint)
        prefix_s = time.perf_counter() - start
        prefix_tok, *_, prefix_len = state.tensors(engine.pad_id)
        live_set = set(state.paths.tolist())
        for run in runs.values():
            run.prefix_s += prefix_s
            run.kv.merge(prefix_kv)  # the prefix phase is every method's
            for p in range(len(prompts)):
                if p not in live_set:  # ended before the check: votes directly
                    run.kept[owners[p]] = False
                    run.length[owners[p]] = int(prefix_len[p])
                    run.text[owners[p]] = tokenizer.decode(
                        prefix_tok[p, : prefix_len[p]].tolist(), skip_special_tokens=True)
        live, batch = check_batch(state, engine, checkpoint, keys, group_window)
        # the super token scores from the live cache; replaying it re-encodes prompt + tokens
        batch.update(lm_state=state, prompt=[problems[owners[p][0]].prompt for p in live.tolist()],
                     tokens=[prefix_tok[p, :checkpoint] for p in live.tolist()])
        origin = [(owners[p], prefix_tok[p, :checkpoint].tolist()) for p in live.tolist()]
        # no_prune first: the oracle needs the outcomes
        pending["no_prune"].states.append(engine.fork(state, 1, None))
        pending["no_prune"].origin += origin
        pending["no_prune"].flush(engine, tokenizer, checkpoint, runs["no_prune"])
        for p in live.tolist():
            runs["no_prune"].kept[owners[p]] = True
        batch["correct"] = torch.tensor([float(task.check(problems[owners[p][0]],
                                                          runs["no_prune"].text[owners[p]]))
                                         for p in live.tolist()])
        batch["row"] = [owners[p] for p in live.tolist()]
        batches.append(batch)
        prompt_of = np.array([owners[p][0] for p in live.tolist()])
        groups = [torch.as_tensor(sel) for i in chunk if len(sel := np.nonzero(prompt_of == i)[0])]
        for name, (scorer, _) in methods.items():
            run = runs[name]
            start = time.perf_counter()
            scores = scorer(batch)
            keep = torch.zeros(len(live), dtype=torch.bool)
            for sel in groups:
                keep[sel] = policies[name].keep(scores[sel])
            run.check_s += time.perf_counter() - start
            for p, k in zip(live.tolist(), keep.tolist()):
                run.kept[owners[p]] = k
                if not k:
                    run.length[owners[p]] = checkpoint
                    run.text[owners[p]] = ""
            rows = keep.nonzero().squeeze(-1)  # live rows are state rows in order
            pending[name].states.append(engine.fork(state, 1, None, rows))
            pending[name].origin += [origin[r] for r in rows.tolist()]
            if pending[name].rows >= max_rows:
                pending[name].flush(engine, tokenizer, checkpoint, run)
        del batch["lm_state"]  # frees the chunk's cache
    for name in methods:
        pending[name].flush(engine, tokenizer, checkpoint, runs[name])
    merged = {k: torch.cat([b[k] for b in batches]) for k in ("hidden", "signals", "prefix_len",
                                                               "mc", "correct")}
    for key in ("seed_key", "prompt", "tokens"):
        merged[key] = [k for b in batches for k in b[key]]
    merged["row"] = {key: r for r, key in enumerate(k for b in batches for k in b["row"])}
    return runs, merged
