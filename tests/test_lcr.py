"""The one Launch-Check-Resume loop (stopexp/search/lcr.py) on a scripted engine: every
path's tokens and length follow from its seed, so what the loop keeps, counts and meters
is known by hand, whatever engine implements the stepper (tests/test_memory.py and
tests/test_vllm.py run it on the real engines)."""
import numpy as np
import pytest
import torch

from stopexp.core.policies import TopK
from stopexp.models.tokenizer import build_char_tokenizer
from stopexp.search.lcr import launch_check_resume
from stopexp.search.sample import launch_lists
from stopexp.search.stepping import Running
from stopexp.tasks import ArithTask

N, K, CHECK = 8, 2, 4


def length_of(seed: int) -> int:
    return 2 + seed % 9  # 2..10 tokens: some paths end before the check


def score_of(seed: int) -> float:
    return float(seed % 101)


class ScriptedStepper:
    """Each running path gets one token per step until its scripted length; its state at
    any prefix is its score. `lag`: tokens after a prefix before its state can be read."""

    def __init__(self, paths: list[Running], meter, lag: int):
        self.paths, self.meter = paths, meter
        for p in paths:
            p.lag = lag
        self.observe()

    @property
    def running(self) -> bool:
        return any(not (p.finished or p.pruned) for p in self.paths)

    def step(self) -> None:
        for p in self.paths:
            if not (p.finished or p.pruned):
                p.tokens.append(4 + len(p.tokens) % 10)
                p.finished = len(p.tokens) >= length_of(p.seed)

    def abort(self, paths) -> None:
        for p in paths:
            p.pruned = True

    def observe(self) -> None:
        live = [p for p in self.paths if not (p.finished or p.pruned)]
        if self.meter is not None and live:
            self.meter.observe(torch.tensor([len(p.prompt) + len(p.tokens) for p in live]),
                               [p.key[0] for p in live])

    def inputs(self, paths, check: int) -> tuple:
        assert all(len(p.tokens) >= check + p.lag or p.finished for p in paths)
        hidden = torch.tensor([score_of(p.seed) for p in paths]).reshape(-1, 1, 1).repeat(1, 1, 4)
        zeros = torch.zeros(len(paths), check)
        return hidden, None, zeros, zeros, zeros

    def lm_state(self, paths):
        return None


class ScriptedSteps:
    def __init__(self, lag: int = 0):
        self.lag = lag

    def start(self, paths, meter=None, labels=None):
        return ScriptedStepper(paths, meter, self.lag)

    def chunks(self, n_prompts: int, n_paths: int):
        return [range(n_prompts)]


@pytest.fixture(scope="module")
def setting():
    tok = build_char_tokenizer()
    task = ArithTask(n_steps=2)
    problems = task.problems("test", 4)
    prompts, seeds, owners = launch_lists(tok, problems, range(len(problems)), N, 0)
    return tok, task, problems, dict(zip(owners, seeds)), {i: len(prompts[i * N]) for i in range(4)}


def run(setting, lag=0, check=CHECK):
    tok, task, problems, _, _ = setting
    methods = {"scripted": (lambda b: b["hidden"][:, 0, 0], lambda: TopK(K))}
    return launch_check_resume(ScriptedSteps(lag), tok, task, problems, N, 0, check, methods, 4)


@pytest.mark.parametrize("lag", [0, 1])
def test_the_loop_keeps_the_best_live_paths_and_counts_pruned_ones_at_the_check(setting, lag):
    _, _, problems, seed, _ = setting
    runs, batch = run(setting, lag)
    pruned = runs["scripted"]
    for i in range(len(problems)):
        live = [j for j in range(N) if length_of(seed[i, j]) > CHECK]
        best = sorted(live, key=lambda j: (-score_of(seed[i, j]), j))[:K]
        for j in range(N):
            full = length_of(seed[i, j])
            assert runs["no_prune"].length[i, j] == full
            assert ((i, j) in batch["row"]) == (j in live)
            if j in live and j not in best:  # pruned: its tokens up to the check
                assert pruned.length[i, j] == CHECK and pruned.pruned_at[i, j] == CHECK
                assert not pruned.kept[i, j] and pruned.text[i, j] == ""
            else:  # kept, or ended before the check (it votes unchecked)
                assert pruned.length[i, j] == full and (i, j) not in pruned.pruned_at
                assert pruned.kept[i, j] == (j in best)
    assert any(length_of(s) <= CHECK for s in seed.values())  # the setting has early ends
    assert len(pruned.pruned_at) >= 2 * len(problems)  # and prunes
    rows = sorted(batch["row"], key=batch["row"].get)
    assert batch["hidden"][:, 0, 0].tolist() == [score_of(seed[k]) for k in rows]
    assert runs["no_prune"].check_s == 0.0 and pruned.check_s > 0


def test_no_prunes_kv_peak_is_every_running_path_at_its_longest_step(setting):
    _, _, problems, seed, prompt_len = setting
    runs, _ = run(setting)
    for i in range(len(problems)):
        lengths = np.array([length_of(seed[i, j]) for j in range(N)])
        # observed at the launch (t = 0) and after every step t, over the paths still running
        peak = max(int(((prompt_len[i] + t) * (lengths > t)).sum()) for t in range(lengths.max()))
        assert runs["no_prune"].kv.peak[i] == peak


def test_a_check_that_no_path_reaches_is_refused_with_the_prefix(setting):
    with pytest.raises(ValueError, match=r"no path of the 4 prompts is alive at the first check \(10 tokens\)"):
        run(setting, check=10)
