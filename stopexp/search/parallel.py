"""Launch-Check-Resume, online: launch N paths per prompt, run them to the check prefix,
score every live prefix in one batched call per method, keep what the policy keeps,
drop the rest from batch and cache, and finish the kept ones.

Progressive (several checks): the kept paths run on to the next check, where the paths
still generating are scored and the policy keeps its share again, and so on; the kept
paths of the last check are finished. A path's score at a check is its newest raw score
or the running mean of its raw scores at all its checks (STEP, arXiv 2601.09093;
stopexp.core.voting.rule_score). Paths that end between checks vote.

The prefix phase is run once and shared: each method continues from a copy of the
checked state (its rows only), and `no_prune` continues all rows. Because every path
draws from its own stream, a kept path continues exactly as in the unpruned run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from stopexp.core.token_text import text_of
from stopexp.core.voting import rule_score
from stopexp.search.decode import Decode, Engine, StepRecord
from stopexp.search.memory import KVMeter
from stopexp.search.sample import launch_lists, path_labels, prompt_chunks
from stopexp.signals.columns import signal_matrix
from stopexp.signals.features import SIGNAL_NAMES


@dataclass
class OnlineRun:
    """What one method did on all prompts: which paths it kept at the check, the length
    and text each launched path reached, and the time spent."""
    kept: dict = field(default_factory=dict)     # (prompt index, path id) -> never pruned?
    pruned_at: dict = field(default_factory=dict)  # (prompt index, path id) -> prefix where pruned
    signal: dict = field(default_factory=dict)   # (prompt index, path id) -> score at its last check
    length: dict = field(default_factory=dict)   # (prompt index, path id) -> tokens generated
    text: dict = field(default_factory=dict)
    ids: dict = field(default_factory=dict)      # a path that ran to its end -> its token ids
    kv: KVMeter = field(default_factory=KVMeter)  # cached tokens per prompt (stopexp.search.memory)
    prefix_s: float = 0.0
    check_s: float = 0.0
    resume_s: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.prefix_s + self.check_s + self.resume_s

    def finish(self, key, ids: list[int], tokenizer) -> None:
        """A path that ended (not pruned): its token ids, their count and their text."""
        self.ids[key], self.length[key] = ids, len(ids)
        self.text[key] = text_of(tokenizer, ids)


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
        out.finish(key, prefix + tok[r, : n[r] - checkpoint].tolist(), tokenizer)


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


def fork_with_history(engine: Engine, state: Decode, rows: torch.Tensor) -> Decode:
    """`engine.fork(state, 1, None, rows)` that also carries the rows' step records, lengths
    and pooled taps, and records taps, so the fork can be checked again at a later
    checkpoint with the features and signals of the whole path."""
    child = engine.fork(state, 1, None, rows)
    old = state.paths[rows.cpu()]
    remap = torch.full((state.n_paths,), -1, dtype=torch.long)
    remap[old] = torch.arange(len(old))
    for s in state.steps:
        new = remap[s.paths]
        sel = new >= 0
        child.steps.append(StepRecord(new[sel], s.tokens[sel], s.logprob[sel], s.entropy[sel],
                                      s.conf[sel]))
    child.lengths = state.lengths[old].clone()
    child.record_taps = state.record_taps
    if state.pool_sum is not None:
        child.pool_sum = state.pool_sum[rows.to(state.pool_sum.device)]
    return child


def decide_check(scorer, batch: dict, policy, keys: list, groups: list, history: dict, rule: str,
            run: OnlineRun) -> torch.Tensor:
    """Score the live paths of one check (`keys[r]`: the (prompt, path) of batch row r),
    append each raw score to the path's `history`, and keep prompt by prompt by its score
    under `rule`, which is recorded as the path's signal. Returns the keep mask."""
    raw = scorer(batch).double().cpu()
    now = torch.zeros(len(keys), dtype=torch.float64)
    for r, key in enumerate(keys):
        history.setdefault(key, []).append(float(raw[r]))
        now[r] = rule_score(history[key], rule)
        run.signal[key] = float(now[r])
    keep = torch.zeros(len(keys), dtype=torch.bool)
    for sel in groups:
        keep[sel] = policy.keep(now[sel])
    return keep


def prompt_groups(prompt_of: np.ndarray) -> list:
    """Row indices of each prompt, in prompt order."""
    return [torch.as_tensor(np.nonzero(prompt_of == i)[0]) for i in dict.fromkeys(prompt_of.tolist())]


def launch_check_resume(engine: Engine, tokenizer, task, problems, n_paths: int, seed: int,
                        checkpoint, methods: dict, group_window: int, max_rows: int = 1024,
                        score_rule: str = "last") -> tuple[dict[str, OnlineRun], dict]:
    """Run every method of `methods` (name -> (scorer, policy factory)) plus `no_prune`
    on `problems`, at most `max_rows` live rows per forward. `checkpoint`: the check's
    prefix (tokens), or a list of increasing prefixes (progressive; the engine must record
    taps at each); the policy factory is called with no argument for one check, with the
    check's index for several. `score_rule`: last | running_mean (`rule_score`). The oracle
    sees the outcomes of the no_prune continuation. Returns the runs and the check batch of
    all chunks at the first check (its "row" maps (prompt, path) to a row)."""
    checks = [checkpoint] if isinstance(checkpoint, (int, np.integer)) else [int(c) for c in checkpoint]
    first, last = checks[0], checks[-1]
    runs = {name: OnlineRun() for name in ["no_prune", *methods]}
    policies = {name: [make()] if len(checks) == 1 else [make(i) for i in range(len(checks))]
                for name, (_, make) in methods.items()}
    pending = {name: _Pending() for name in runs}
    batches = []
    for chunk in prompt_chunks(len(problems), n_paths, max_rows):
        prompts, seeds, owners = launch_lists(tokenizer, problems, chunk, n_paths, seed)
        keys = [f"{problems[i].prompt}/{j}" for i, j in owners]
        start = time.perf_counter()
        prefix_kv = KVMeter()
        state = run_metered(engine, engine.launch(prompts, seeds, path_labels(problems, owners)),
                            prefix_kv, [i for i, _ in owners], until=first)
        prefix_s = time.perf_counter() - start
        prefix_tok, *_, prefix_len = state.tensors(engine.pad_id)
        live_set = set(state.paths.tolist())
        for run in runs.values():
            run.prefix_s += prefix_s
            run.kv.merge(prefix_kv)  # the prefix phase is every method's
            for p in range(len(prompts)):
                if p not in live_set:  # ended before the check: votes directly
                    run.kept[owners[p]] = False
                    run.finish(owners[p], prefix_tok[p, : prefix_len[p]].tolist(), tokenizer)
        live, batch = check_batch(state, engine, first, keys, group_window)
        # the super token scores from the live cache; replaying it re-encodes prompt + tokens
        batch.update(lm_state=state, prompt=[problems[owners[p][0]].prompt for p in live.tolist()],
                     tokens=[prefix_tok[p, :first] for p in live.tolist()])
        origin = [(owners[p], prefix_tok[p, :first].tolist()) for p in live.tolist()]
        # no_prune first: the oracle needs the outcomes
        pending["no_prune"].states.append(engine.fork(state, 1, None))
        pending["no_prune"].origin += origin
        pending["no_prune"].flush(engine, tokenizer, first, runs["no_prune"])
        for p in live.tolist():
            runs["no_prune"].kept[owners[p]] = True
        batch["correct"] = _outcomes(task, problems, runs["no_prune"], [owners[p] for p in live.tolist()])
        batch["row"] = [owners[p] for p in live.tolist()]
        batches.append(batch)
        groups = prompt_groups(np.array([owners[p][0] for p in live.tolist()]))
        for name, (scorer, _) in methods.items():
            run, history = runs[name], {}
            start = time.perf_counter()
            keep = decide_check(scorer, batch, policies[name][0], batch["row"], groups, history,
                                score_rule, run)
            run.check_s += time.perf_counter() - start
            _record_check(run, batch["row"], keep, first)
            rows = keep.nonzero().squeeze(-1)  # live rows are state rows in order
            if len(checks) == 1:
                pending[name].states.append(engine.fork(state, 1, None, rows))
                pending[name].origin += [origin[r] for r in rows.tolist()]
            elif len(rows):
                _later_checks(engine, tokenizer, task, problems, fork_with_history(engine, state, rows),
                              [batch["row"][r] for r in rows.tolist()], checks, group_window,
                              scorer, policies[name], history, score_rule, run, pending[name],
                              runs["no_prune"])
            if pending[name].rows >= max_rows:
                pending[name].flush(engine, tokenizer, last, run)
        del batch["lm_state"]  # frees the chunk's cache
    for name in methods:
        pending[name].flush(engine, tokenizer, last, runs[name])
    merged = {k: torch.cat([b[k] for b in batches]) for k in ("hidden", "signals", "prefix_len",
                                                               "mc", "correct")}
    for key in ("seed_key", "prompt", "tokens"):
        merged[key] = [k for b in batches for k in b[key]]
    merged["row"] = {key: r for r, key in enumerate(k for b in batches for k in b["row"])}
    return runs, merged


def _outcomes(task, problems, no_prune: OnlineRun, keys: list) -> torch.Tensor:
    """Whether each path (prompt, path id) ends correct in the unpruned run (the oracle's)."""
    return torch.tensor([float(task.check(problems[i], no_prune.text[(i, j)])) for i, j in keys])


def _record_check(run: OnlineRun, keys: list, keep: torch.Tensor, tokens: int) -> None:
    """A check's verdicts: a pruned path stops at `tokens` and leaves the vote."""
    for key, k in zip(keys, keep.tolist()):
        run.kept[key] = k
        if not k:
            run.pruned_at[key] = tokens
            run.length[key] = tokens
            run.text[key] = ""


def _later_checks(engine, tokenizer, task, problems, child: Decode, keys: list, checks: list,
                  group_window: int, scorer, policies: list, history: dict, rule: str,
                  run: OnlineRun, pending: _Pending, no_prune: OnlineRun) -> None:
    """The checks after the first for one chunk's kept paths (`child`, path p = keys[p]):
    run to each check, record the paths that ended on the way (they vote), score and keep
    the live ones; the kept paths of the last check go to `pending` to be finished."""
    prompt_of = [key[0] for key in keys]
    for i, c in enumerate(checks[1:], start=1):
        start = time.perf_counter()
        run_metered(engine, child, run.kv, prompt_of, until=c)
        run.resume_s += time.perf_counter() - start
        tok, *_, n = child.tensors(engine.pad_id)
        live_set = set(child.paths.tolist())
        for p, key in enumerate(keys):
            if p not in live_set and key not in run.text:  # ended since the last check
                run.finish(key, tok[p, : n[p]].tolist(), tokenizer)
        if not child.size:
            return
        seed_keys = [f"{problems[k[0]].prompt}/{k[1]}" for k in keys]
        live, batch = check_batch(child, engine, c, seed_keys, group_window)
        live_keys = [keys[p] for p in live.tolist()]
        batch.update(lm_state=child, prompt=[problems[k[0]].prompt for k in live_keys],
                     tokens=[tok[p, :c] for p in live.tolist()],
                     correct=_outcomes(task, problems, no_prune, live_keys))
        start = time.perf_counter()
        keep = decide_check(scorer, batch, policies[i], live_keys,
                            prompt_groups(np.array([k[0] for k in live_keys])), history, rule, run)
        run.check_s += time.perf_counter() - start
        _record_check(run, live_keys, keep, c)
        rows = keep.nonzero().squeeze(-1)
        if i == len(checks) - 1:
            pending.states.append(engine.fork(child, 1, None, rows))
            pending.origin += [(live_keys[r], tok[live[r], :c].tolist()) for r in rows.tolist()]
            return
        keys = [live_keys[r] for r in rows.tolist()]
        prompt_of = [key[0] for key in keys]
        if not keys:
            return
        child = fork_with_history(engine, child, rows)
