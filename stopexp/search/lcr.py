"""Launch-Check-Resume online, one loop for every engine (stopexp.search.stepping): launch
N paths per prompt, each with its own random stream; step them; when every live path of a
prompt has reached the check, score its prefixes in one batched call, abort the paths the
policy prunes, and let the kept ones go on. Nothing is re-prefilled and no stream restarts,
so a kept path continues exactly as in the unpruned run and as in a bank collected from the
same seeds (replay of that bank decides the same: tests/test_vllm.py, tests/test_memory.py).

Progressive (several checks): the kept paths run on to the next check, where the paths
still generating are scored and the policy keeps its share again, and so on. A path's score
at a check is its newest raw score or the running mean of its raw scores at all its checks
(STEP, arXiv 2601.09093; stopexp.core.voting.rule_score). Paths that end between checks
vote.

Each method is its own run from the launch, so its wall time is what a deployment of it
spends: launch (until its first check), check (inputs and scores) and resume. `no_prune`
runs first on each chunk of prompts, since the oracle reads its outcomes. A pruned path
costs the tokens generated before its abort: the check (an engine whose state at a prefix
is read one token later, vLLM's taps, samples one token more and is still counted at the
check, as replay counts it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from stopexp.core.token_text import text_of
from stopexp.core.voting import rule_score
from stopexp.search.memory import KVMeter
from stopexp.search.sample import launch_lists, path_labels
from stopexp.search.stepping import Running, Stepper, Steps
from stopexp.signals.columns import signal_matrix
from stopexp.signals.feature_spec import SIGNAL_NAMES


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


def check_batch(stepper: Stepper, paths: list[Running], check: int, group_window: int,
                problems) -> dict:
    """The predictor batch of `paths` (all alive at `check`) at prefix `check`; "prompt" and
    "tokens" (and, where the engine has it, "lm_state") let super_token read the prefixes."""
    hidden, attn, lp, ent, conf = stepper.inputs(paths, check)
    prefix = torch.full((len(paths),), check, dtype=torch.long)
    signals = signal_matrix(lp, ent, conf, prefix, group_window, hidden, attn)
    batch = {"hidden": hidden, "signals": signals,
             "seed_key": [f"{problems[p.key[0]].prompt}/{p.key[1]}" for p in paths],
             "prefix_len": signals[:, SIGNAL_NAMES.index("prefix_len")],
             "mc": torch.full((len(paths),), float("nan")),
             "prompt": [problems[p.key[0]].prompt for p in paths],
             "tokens": [torch.tensor(p.tokens[:check]) for p in paths]}
    state = stepper.lm_state(paths)
    if state is not None:
        batch["lm_state"] = state
    return batch


class CheckSchedule:
    """Which prompts are due at which check. A prompt is checked at `checks[i]` once every
    one of its paths has reached it (stopexp.search.stepping.Running.reached: ended, pruned,
    or long enough); the paths checked there are those alive at it. Paths join by prompt
    (`add`), also while others run (a server's requests: stopexp.serve)."""

    def __init__(self, checks: list[int], paths: list[Running] = ()):
        self.checks, self.groups, self.at = checks, {}, {}
        self.add(paths)

    def add(self, paths: list[Running]) -> None:
        for p in paths:
            self.groups.setdefault(p.key[0], []).append(p)
            self.at.setdefault(p.key[0], 0)  # per prompt: the index of its next check

    def due(self):
        """Yield (check index, paths alive there) for every prompt group ready now, lowest
        index first; the caller decides (and aborts) before the next is computed, since a
        pruned path has reached every later check."""
        checks, groups, at = self.checks, self.groups, self.at
        while True:
            ready = [g for g, i in at.items() if i < len(checks) and all(p.reached(checks[i]) for p in groups[g])]
            if not ready:
                return
            for i in sorted({at[g] for g in ready}):
                yield i, [p for g in ready if at[g] == i for p in groups[g]
                          if not p.pruned and p.live_at(checks[i])]
            for g in ready:
                at[g] += 1

    def done(self, prompt) -> bool:
        """Whether `prompt` has passed every check."""
        return self.at[prompt] >= len(self.checks)


def _run(launch, tokenizer, checks: list[int], decide, run: OnlineRun) -> None:
    """Launch the paths (`launch()` returns their stepper; an engine may prefill there) and
    step them to the end; at each check, every prompt whose live paths all reached it is
    handed to `decide(stepper, check index, paths alive there)`, which returns the paths to
    prune (an empty list for no_prune). Fills `run`'s lengths, texts and times."""
    start, checked, first_done = time.perf_counter(), 0.0, None
    stepper = launch()
    paths = stepper.paths
    schedule = CheckSchedule(checks, paths)
    # the cache a check sees is that of the step where every path holds `check` tokens: with
    # a lag that step is the one before, so the cache is observed after the pruned paths left
    late = any(p.lag for p in paths)
    while stepper.running:
        stepper.step()
        if not late:
            stepper.observe()
        tic = time.perf_counter()
        for i, live in schedule.due():
            if live and first_done is None:  # the launch phase ends at the first check
                first_done = tic
            gone = decide(stepper, i, live) if live else []
            if gone:
                stepper.abort(gone)
                for p in gone:
                    run.pruned_at[p.key] = checks[i]
            checked += time.perf_counter() - tic
            tic = time.perf_counter()
        if late:
            stepper.observe()
    wall = time.perf_counter() - start
    prefix = (first_done or time.perf_counter()) - start
    run.prefix_s += prefix
    run.check_s += checked
    run.resume_s += wall - prefix - checked
    for p in paths:
        if p.pruned:  # counted at its check, whatever the engine sampled after it
            run.length[p.key], run.text[p.key] = run.pruned_at[p.key], ""
        else:
            run.finish(p.key, list(p.tokens), tokenizer)


def launch_check_resume(steps: Steps, tokenizer, task, problems, n_paths: int, seed: int,
                        checkpoint, methods: dict, group_window: int,
                        score_rule: str = "last") -> tuple[dict[str, OnlineRun], dict]:
    """Run every method of `methods` (name -> (scorer, policy factory)) plus `no_prune` on
    `problems` with the engine's `steps`, chunk of prompts by chunk. `checkpoint`: the
    check's prefix (tokens), or a list of increasing prefixes (progressive); the policy
    factory is called with no argument for one check, with the check's index for several.
    `score_rule`: last | running_mean (`rule_score`). The oracle sees the outcomes of the
    no_prune run. Returns the runs and the check batch of every path alive at the first
    check (its "row" maps (prompt, path) to a row)."""
    checks = [checkpoint] if isinstance(checkpoint, (int, np.integer)) else [int(c) for c in checkpoint]
    runs = {name: OnlineRun() for name in ["no_prune", *methods]}
    policies = {name: [make()] if len(checks) == 1 else [make(i) for i in range(len(checks))]
                for name, (_, make) in methods.items()}
    histories = {name: {} for name in methods}
    first, outcome, owners_all = {}, {}, []
    for chunk in steps.chunks(len(problems), n_paths):
        prompts, seeds, owners = launch_lists(tokenizer, problems, chunk, n_paths, seed)
        labels = path_labels(problems, owners)
        owners_all += owners

        def launch(run):
            return lambda: steps.start([Running(key, p, s) for key, p, s in zip(owners, prompts, seeds)],
                                       run.kv, labels)

        def record_first(stepper, i, live):  # no_prune keeps all; the first check's batch, untimed
            if i == 0:
                first.update({p.key: b for p, b in zip(live, _rows(check_batch(
                    stepper, live, checks[0], group_window, problems)))})
            return []

        check_s = runs["no_prune"].check_s
        _run(launch(runs["no_prune"]), tokenizer, checks, record_first, runs["no_prune"])
        runs["no_prune"].check_s = check_s  # the AUROC batch it made is no part of not pruning
        outcome.update({k: float(task.grade(problems[k[0]], runs["no_prune"].text[k])) for k in owners})
        for name, (scorer, _) in methods.items():
            run = runs[name]

            def decide(stepper, i, live, scorer=scorer, policies=policies[name],
                       history=histories[name], run=run):
                batch = check_batch(stepper, live, checks[i], group_window, problems)
                batch["correct"] = torch.tensor([outcome[p.key] for p in live])
                keys = [p.key for p in live]
                keep = decide_check(scorer, batch, policies[i], keys,
                                    prompt_groups(np.array([k[0] for k in keys])), history,
                                    score_rule, run)
                return [p for p, k in zip(live, keep.tolist()) if not k]

            _run(launch(run), tokenizer, checks, decide, run)
    keys = [k for k in owners_all if k in first]
    if not keys:
        raise ValueError(f"no path of the {len(problems)} prompts is alive at the first check "
                         f"({checks[0]} tokens): every path ended before it, so nothing is "
                         "checked; check at an earlier prefix")
    merged = {name: torch.stack([first[k][name] for k in keys])
              for name in ("hidden", "signals", "prefix_len", "mc")}
    merged["correct"] = torch.tensor([outcome[k] for k in keys])
    for name in ("seed_key", "prompt", "tokens"):
        merged[name] = [first[k][name] for k in keys]
    merged["row"] = {k: r for r, k in enumerate(keys)}
    for run in runs.values():  # a path that ended before the first check votes unchecked
        for k in owners_all:
            run.kept[k] = k in first and k not in run.pruned_at
    return runs, merged


def _rows(batch: dict) -> list[dict]:
    """A batch split into one dict per row (the live decode state left out)."""
    n = len(batch["seed_key"])
    return [{k: v[r] for k, v in batch.items() if k != "lm_state"} for r in range(n)]
