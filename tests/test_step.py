"""STEP (arXiv 2601.09093): the KV budget's arithmetic, its pruning by hand, and the engine
side (stopexp.stopping.step_online) deciding as replay does, whatever the engine's order."""
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stopexp.search.stepping import Running
from stopexp.stopping.replay import Replay
from stopexp.stopping.step import KVBudget, Step, prune_at, trace_score, vote_weights
from stopexp.stopping.step_online import OnlineStep, step_probability
from stopexp.store.path_table import Paths

# block 4 tokens, prompt 6 tokens (one full block, shared by the paths under prefix caching)
SHARED = KVBudget(6, 4, True, 10)


def test_blocks_and_limits():
    assert SHARED.blocks(6, [7, 7, 7]) == 1 + 3 * 1
    assert SHARED.blocks(6, [9, 9, 9]) == 1 + 3 * 2
    assert SHARED.blocks(6, []) == 0
    assert KVBudget(6, 4, False, 10).blocks(6, [9, 9, 9]) == 3 * 3
    assert SHARED.limit(6, 3) == 6
    # a share: of the 1 + 3 * 3 blocks that three paths of 16 tokens hold
    assert KVBudget(0.5, 4, True, 10).limit(6, 3) == 5


def test_prune_at_drops_the_lowest_scored_until_the_rest_fit():
    assert prune_at(2, SHARED, 6, 3, [0.9, 0.2, None]) == []          # 4 blocks fit
    assert prune_at(3, SHARED, 6, 3, [0.9, 0.2, None]) == [1]         # 7 -> 5
    assert prune_at(3, SHARED, 6, 3, [None, None, None]) == []        # nothing known: none pruned
    assert prune_at(3, SHARED, 6, 3, [0.5, 0.5, 0.9]) == [1]          # a tie: the later launched
    assert prune_at(3, SHARED, 6, 3, [0.5, float("nan"), 0.9]) == [1]  # NaN ranks lowest
    assert prune_at(10, SHARED, 6, 3, [0.1, 0.2, 0.3]) == [0, 1]      # 16 tokens: 10 -> 7 -> 4
    assert trace_score([(2, 0.2), (5, 0.8)], 4) == 0.2 and trace_score([(2, 0.2), (5, 0.8)], 5) == 0.5
    assert trace_score([(4, 0.5)], 3) is None
    assert vote_weights([0.9, None, None], np.array([True, True, False])).tolist() == [0.9, 0.9, 0.9]
    assert vote_weights([None], np.array([True])).tolist() == [1.0]


def hand_paths():
    """Prompt 0: three paths of 10, 12, 9 tokens, answers 4, 7, 7 (gold 4)."""
    return Paths(group=np.zeros(3, int), path_id=np.arange(3), length=np.array([10, 12, 9]),
                 correct=np.array([True, False, False]), answer=np.array(["4", "7", "7"], dtype=object),
                 text=np.array(["4", "7", "7"], dtype=object), alive=np.ones(3, bool), batch={},
                 prompt_len=np.array([6, 6, 6]))


STEPS = [[(2, 0.9)], [(2, 0.2), (5, 0.8)], [(4, 0.5)]]


def test_replay_by_hand():
    """t = 3: 7 blocks > 6, path 1 (0.2) goes, path 2 has no score yet; t = 7: paths 0 and 2
    hold 13 tokens (1 + 2 * 3 = 7 blocks), path 2 (0.5 < 0.9) goes. Path 0 alone votes: 4."""
    o = Step().replay(Replay(hand_paths(), [], 3, 2, steps=STEPS, budget=SHARED))
    assert o["spent"].tolist() == [10, 3, 7]
    assert o["voter"].tolist() == [True, False, False]
    assert o["correct"].tolist() == [True]  # without STEP the majority says 7
    assert o["tokens"].tolist() == [20]
    assert o["stopped"].tolist() == [False, True, True]


class FakeStepper:
    """Paths whose tokens are known, stepped as an engine with a lag of one token may step
    them: each step moves a random subset of the running paths one token on; the state at
    a step boundary c is tapped once the path holds c + 1 tokens."""

    def __init__(self, paths, full, ends, rng):
        self.paths, self.full, self.ends, self.rng = paths, full, ends, rng

    @property
    def running(self):
        return any(not (p.finished or p.pruned) for p in self.paths)

    def step(self):
        live = [p for p in self.paths if not (p.finished or p.pruned)]
        for p in self.rng.sample(live, self.rng.randint(1, len(live))):
            k = p.key[1]
            p.tokens.append(self.full[k][len(p.tokens)])
            n = len(p.tokens)
            if n - 1 in self.ends[k]:
                p.watch.states[n - 1] = np.full((1, 2), self.ends[k][n - 1], np.float32)
            p.finished = n == len(self.full[k])

    def columns(self, paths):
        return [tuple(np.zeros(len(p.tokens), np.float32) for _ in range(3)) for p in paths]


@pytest.mark.parametrize("seed", range(10))
def test_the_engine_side_decides_as_replay_whatever_the_engine_order(seed):
    """Random paths, scores and schedules: the controller on a stepper that moves paths out
    of step spends, per path, what replay of the same paths spends, and weighs voters alike."""
    rng = random.Random(seed)
    n, P = 6, 5
    lengths = [rng.randint(8, 30) for _ in range(n)]
    full = [list(range(L)) for L in lengths]
    ends = [{c: rng.randint(-192, 192) / 64 for c in range(1, L) if rng.random() < 0.5} for L in lengths]
    budget = KVBudget(rng.choice([0.15, 0.25, 0.4]), 4, rng.random() < 0.5, 30)
    paths = [Running((0, k), [1] * P, k, lag=1, watch=SimpleNamespace(states={})) for k in range(n)]
    online = OnlineStep(lambda batch: batch["hidden"][:, 0, 0], budget, n, 2, "\n")
    stepper, spent, ended = FakeStepper(paths, full, ends, rng), {}, set()
    while stepper.running:
        stepper.step()
        shown = [p for p in paths if not p.pruned and p.key not in ended]
        for p, t in online.stops(stepper, 0, shown):
            p.pruned, spent[p.key[1]] = True, t
        ended.update(p.key for p in shown if p.finished)
    online.wave_done(stepper, 0, 0, paths)
    table = Paths(group=np.zeros(n, int), path_id=np.arange(n), length=np.array(lengths),
                  correct=np.zeros(n, bool), answer=np.array(["1"] * n, dtype=object),
                  text=np.array(["1"] * n, dtype=object), alive=np.ones(n, bool), batch={},
                  prompt_len=np.full(n, P))
    steps = [[(c, p) for c, p in zip(e, step_probability(torch.tensor(list(e.values()))))]
             for e in ends]
    o = Step().replay(Replay(table, [], n, 2, steps=steps, budget=budget))
    assert [spent.get(k, lengths[k]) for k in range(n)] == o["spent"].tolist()
    assert spent  # the budget bites
    voters = [k for k in range(n) if k not in spent]
    assert voters == np.nonzero(o["voter"])[0].tolist()
    final = [trace_score(steps[k], lengths[k]) for k in range(n)]
    weights = vote_weights(final, o["voter"])
    assert [online.weights[(0, k)] for k in voters] == weights[voters].tolist()


def test_step_replays_on_the_toy_bank(small_bank):
    """evaluate.methods=[step]: step scores from the features at the toy's step ends (";"),
    a budget of half the worst case; STEP prunes and spends fewer tokens than no_prune."""
    from conftest import compose, featurized
    from stopexp.config import validate
    from stopexp.stages.evaluate import evaluate
    from stopexp.stages.train import train_with_controls

    over = [*small_bank, "tap.positions.step_ends=true", "train.epochs=2", "engine.kv_budget=0.5",
            "evaluate.methods=[step,mlp]", "evaluate.text_metrics=false", "evaluate.bootstrap=50",
            "policy.keep=4", "evaluate.n_points=[4,8]", "evaluate.retention=[2,4]"]
    train_with_controls(featurized(validate(compose("train", over))), progress=False)
    m = evaluate(validate(compose("evaluate", over)))["methods"]
    step, base = m["step"], m["no_prune"]
    assert step["replayed"] and step["pruned_paths"] > 0
    assert step["tokens_total"] < base["tokens_total"] and step["peak_kv_bytes"] < base["peak_kv_bytes"]


@pytest.mark.parametrize("overrides, key", [
    ([], "engine.kv_budget"),  # no budget
    (["engine.kv_budget=0.5", "evaluate.stopping.step.signal=hidden_norm"],
     "evaluate.stopping.step.signal"),  # not among evaluate.methods
    (["engine.kv_budget=0.5", "tap.positions.step_ends=false"], "tap.positions.step_ends"),
    (["engine.kv_budget=0.5", "evaluate.mode=online"], "evaluate.methods"),  # hf: no states at step ends
])
def test_what_step_cannot_run_fails_at_validate_naming_the_key(overrides, key):
    from conftest import compose
    from stopexp.config import ConfigError, validate

    base = ["evaluate.methods=[step,learned]", "tap.positions.step_ends=true"]
    with pytest.raises(ConfigError, match=f"^{key}: ") as err:
        validate(compose("evaluate", [*base, *overrides]))
    assert "\n" not in str(err.value)
