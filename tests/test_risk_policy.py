"""policy=risk: Learn-then-Test thresholds (stopexp.evaluation.risk, stopexp.metrics.risk)."""
import math

import numpy as np
import pytest
import torch
from conftest import compose
from test_progressive import cfg_for, trained3  # noqa: F401 (a fixture)

from stopexp.config import ConfigError, validate
from stopexp.core.policies import FixedThreshold, build_policy
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import keep_by_policy, outcome
from stopexp.evaluation.risk import calibrate, realised_risk
from stopexp.metrics.risk import binomial_tail, clopper_pearson, fixed_sequence, hoeffding_bentkus
from stopexp.stages import evaluate as evaluate_stage
from stopexp.stages.evaluate import evaluate, print_table
from stopexp.stages import build
from stopexp.stages.train import train_with_controls
from stopexp.training import predictor as training
from stopexp.training.data import NothingToLearn
from stopexp.training.selection import hold_out_for_selection, selection_prompts


def test_p_values_and_fixed_sequence_by_hand():
    # no loss in 50 prompts: Hoeffding's exp(-n KL(0 || 0.1)) = 0.9^50, below Bentkus' e 0.9^50
    assert hoeffding_bentkus(0.0, 50, 0.1) == pytest.approx(0.9 ** 50, rel=1e-12)
    # a mean above alpha: Hoeffding's term is 1, Bentkus' e P(Bin <= 14) > 1: p = 1
    assert hoeffding_bentkus(1 / 3, 40, 0.1) == 1.0
    assert binomial_tail(1, 10, 0.2) == pytest.approx(0.8 ** 10 + 10 * 0.2 * 0.8 ** 9, rel=1e-12)
    assert fixed_sequence([0.01, 0.05, 0.2, 0.01], 0.1) == 2  # stops at the first acceptance
    assert fixed_sequence([0.2, 0.01], 0.1) == 0 and fixed_sequence([0.01], 0.1) == 1
    lo, hi = clopper_pearson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** 0.1, rel=1e-9)


def _prompts(answers: list[list[str]]) -> Paths:
    G, n = len(answers), len(answers[0])
    return Paths(group=np.repeat(np.arange(G), n), path_id=np.tile(np.arange(n), G),
                 length=np.full(G * n, 20), correct=np.zeros(G * n, bool),
                 answer=np.asarray(sum(answers, []), dtype=object),
                 text=np.asarray([""] * (G * n), dtype=object), alive=np.ones(G * n, bool),
                 batch={}, checks=[{"alive": torch.ones(G * n, dtype=torch.bool)}] * 2)


SCORES = [0.1, 0.2, 0.3, 0.4]  # every prompt's four paths; pooled, 20 copies of each in 80


def test_answer_risk_by_hand():
    """40 prompts; pruning path 0 (threshold above 0.1) flips the vote of the `hurt` ones
    (a a b b: the tie goes to a; without the first a, b wins) and of no clean one (x a a a).
    The quantile of the 80 pooled scores at level L sits at position 79 L: 0.1 up to
    L = 0.24, above 0.1 from L = 0.25. Nothing pruned: p = (1 - alpha)^40."""
    def cal(hurt, alpha):
        answers = [list("aabb")] * hurt + [list("xaaa")] * (40 - hurt)
        paths = _prompts(answers)
        return calibrate(paths, [np.tile(SCORES, 40)], [5], 4, "last", "answer", alpha, 0.1)
    # 2 hurt, alpha 0.1: P(Bin(40, 0.1) <= 2) = 0.223 > delta, so the first level that prunes
    # is accepted and the last rejected one, 0.24, prunes nothing (threshold 0.1)
    c = cal(2, 0.1)
    assert (c.thresholds, c.level, c.risk_hat) == ([0.1], 0.24, 0.0)
    assert c.p_value == pytest.approx(0.9 ** 40, rel=1e-12)
    # 1 hurt, alpha 0.2: P(Bin(40, 0.2) <= 1) = 0.8^40 + 8 0.8^39 = 0.0015 <= delta at every
    # level: the last one, 0.99, whose threshold 0.4 prunes all but the best path
    c = cal(1, 0.2)
    assert (c.thresholds, c.level, c.risk_hat) == ([0.4], 0.99, 1 / 40)
    assert c.p_value == pytest.approx(0.8 ** 40 + 8 * 0.8 ** 39, rel=1e-12)
    # 20 prompts at alpha 0.05: even pruning nothing has p = 0.95^20 = 0.36 > delta
    answers = [list("xaaa")] * 20
    c = calibrate(_prompts(answers), [np.tile(SCORES, 20)], [5], 4, "last",
                  "answer", 0.05, 0.1)
    assert c.level is None and c.thresholds == [-math.inf] and c.prompts == 20


def test_voter_risk_one_threshold_per_check_by_hand():
    """x a a a: pruning path 0 loses no majority voter; pruning path 1 too loses 1 of 3 (loss
    1/3 > alpha: p = 1). The threshold may reach 0.2 (position 79 L <= 39: L <= 0.49).
    A second check whose scores are ten times the first's gets its own threshold, 2.0."""
    paths = _prompts([list("xaaa")] * 40)
    s = np.tile(SCORES, 40)
    c = calibrate(paths, [s], [5], 4, "last", "voter", 0.1, 0.1)
    assert (c.thresholds, c.level, c.risk_hat) == ([0.2], 0.49, 0.0)
    assert c.p_value == pytest.approx(0.9 ** 40, rel=1e-12)
    two = calibrate(paths, [s, 10 * s], [5, 10], 4, "last", "voter", 0.1, 0.1)
    assert (two.thresholds, two.level) == ([0.2, 2.0], 0.49)


def _synthetic(G: int, n: int, rng) -> tuple[Paths, np.ndarray]:
    """Prompts with right answer 1 at a prompt's own rate, wrong answers 2..4, and a score
    that is 2 for a right path plus unit normal noise."""
    p = rng.uniform(0.3, 0.9, G).repeat(n)
    right = rng.random(G * n) < p
    answer = np.where(right, "1", rng.integers(2, 5, G * n).astype(str)).astype(object)
    paths = Paths(group=np.repeat(np.arange(G), n), path_id=np.tile(np.arange(n), G),
                  length=np.full(G * n, 20), correct=right, answer=answer,
                  text=np.asarray([""] * (G * n), dtype=object), alive=np.ones(G * n, bool),
                  batch={}, checks=[{}])
    return paths, 2.0 * right + rng.normal(size=G * n)


@pytest.mark.parametrize("risk, levels", [("voter", [0.04, 0.13, 0.27]), ("answer", [0.02, 0.11, 0.66])])
def test_realised_risk_stays_below_alpha_on_exchangeable_prompts(risk, levels):
    """Calibrated on 200 prompts, the risk realised on 1000 new ones from the same draw
    stays <= alpha at every alpha, while the threshold does prune (the certified quantile
    levels are pinned: this seed's draw)."""
    rng = np.random.default_rng(0)
    val, val_s = _synthetic(200, 8, rng)
    test, test_s = _synthetic(1000, 8, rng)
    for alpha, level in zip((0.05, 0.1, 0.2), levels):
        c = calibrate(val, [val_s], [5], 8, "last", risk, alpha, 0.1)
        assert c.level == level and c.risk_hat <= alpha
        kept = keep_by_policy(test, test_s, FixedThreshold(c.thresholds[0]), 8)
        o = outcome(test, kept, 5, 8, signal=test_s)
        r = realised_risk(test, o, 8, risk, c, 200, 0)
        assert o["stopped"].mean() > 0.015 and r["realised"] <= alpha, (alpha, o["stopped"].mean(), r)
        assert r["interval"][0] <= r["realised"] <= r["interval"][1]


@pytest.mark.parametrize("overrides, key", [
    (["policy.alpha=0"], "policy.alpha"), (["policy.alpha=1"], "policy.alpha"),
    (["policy.delta=1.5"], "policy.delta"), (["policy.risk=pruned"], "policy.risk"),
    (["evaluate.split=val"], "evaluate.split"), (["collect.prompts.val=0"], "collect.prompts.val"),
    (["collect.keep_correct=[1,7]"], "collect.keep_correct_splits"),
    (["policy.selection_share=1"], "policy.selection_share"),
    (["policy.selection_share=-0.1"], "policy.selection_share"), (["search=beam"], "policy.name")])
def test_bad_risk_settings_fail_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        validate(compose("evaluate", ["policy=risk", "search.n_paths=8", *overrides]))


def test_risk_keys_are_refused_under_another_policy():
    with pytest.raises(ConfigError, match=r"^policy.alpha: .*policy=risk"):
        validate(compose("evaluate", ["policy=topk", "policy.alpha=0.2"]))
    with pytest.raises(ConfigError, match=r"^policy.selection_share: .*policy=risk"):
        validate(compose("evaluate", ["policy=topk", "policy.selection_share=0.3"]))
    with pytest.raises(ValueError, match="calibrated on the validation split"):
        build_policy(compose("evaluate", ["policy=risk"]).policy)


RISK = ["policy=risk", "policy.alpha=0.5", "policy.delta=0.5"]


def test_risk_policy_on_the_toy_bank(trained3):
    """On the small bank (6 validation prompts): one calibrated threshold per check and
    method, in the protocol and the header; online prunes as replay does; one check's
    threshold, given to policy=fixed, reproduces the method's run (with selection_share 0
    policy=risk scores with the predictor policy=fixed finds: the one trained3 made)."""
    bank = [*trained3, *RISK, "policy.selection_share=0"]
    two = ["search.check_at=[0.08,0.25]"]
    replay = evaluate(cfg_for(bank, *two))
    online = evaluate(cfg_for(bank, *two, "evaluate.mode=online"))
    taus = replay["protocol"]["policy_params"]["thresholds"]
    assert set(taus) == {"random", "confidence", "entropy", "mlp", "oracle"}
    assert all(len(t) == 2 for t in taus.values())
    assert online["protocol"]["policy_params"]["thresholds"] == taus
    header = print_table(replay).splitlines()[0]
    assert "(policy=risk)" in header and f"mlp {taus['mlp'][1]:.4g}" in header
    for name, r in replay["methods"].items():
        o = online["methods"][name]
        assert (o["accuracy"], o["tokens_total"]) == (r["accuracy"], r["tokens_total"]), name
        if name in taus:
            assert r["risk"]["realised"] == o["risk"]["realised"]
            assert r["risk"]["calibration"]["prompts"] == 6
    one = evaluate(cfg_for(bank, "search.check_at=0.08"))
    tau = one["protocol"]["policy_params"]["thresholds"]["mlp"][0]
    assert tau is not None and one["methods"]["mlp"]["k"] < 8
    fixed = evaluate(cfg_for(trained3, "search.check_at=0.08", "policy=fixed",
                             f"policy.tau={tau}"))
    assert fixed["methods"]["mlp"]["tokens_total"] == one["methods"]["mlp"]["tokens_total"]
    assert fixed["methods"]["mlp"]["accuracy"] == one["methods"]["mlp"]["accuracy"]


def _rows(prompts: list[int], correct: list[int], key: str = "group") -> dict:
    return {key: torch.tensor(prompts), "correct": torch.tensor(correct, dtype=torch.float32),
            "row": torch.arange(len(prompts))}


def test_epoch_selection_prompts_by_hand():
    """k = share * G rounded half up, evenly spaced: the j-th of the sorted ids at position
    floor((j + 1/2) G / k). 10 ids at 0.2: k = 2, positions 2 and 7; 12 ids at 0.2: k = 2
    (2.4), positions 3 and 9; 5 ids at 0.5: k = 3 (2.5 up), positions 0, 2, 4; at 0.01 still one."""
    ids = np.arange(10) * 3
    assert selection_prompts(np.repeat(ids, 4), 0.2).tolist() == [6, 21]
    assert selection_prompts(np.arange(12)[::-1], 0.2).tolist() == [3, 9]
    assert selection_prompts(np.arange(5), 0.5).tolist() == [0, 2, 4]
    assert selection_prompts(np.arange(5), 0.01).tolist() == [2]
    # 5 training prompts of two paths (one right, one wrong) at share 0.4: k = 2, prompts
    # 1 and 3 pick the epoch in place of the validation rows; the test rows stay
    train = _rows([0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [1, 0] * 5)
    data = {"train": train, "val": _rows([0, 0], [1, 0]), "test": _rows([0, 0], [0, 1])}
    out = hold_out_for_selection(data, 0.4)
    assert out["train"]["row"].tolist() == [0, 1, 4, 5, 8, 9]
    assert out["val"]["row"].tolist() == [2, 3, 6, 7] and out["test"] is data["test"]
    assert hold_out_for_selection(data, 0.0) is data
    # every-position rows: the prompt is "prompt_group" (the pair id "group" is per position)
    per_step = {"train": {**_rows([0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [1, 0] * 5, "prompt_group"),
                          "group": torch.arange(10) // 2}, "val": data["val"]}
    assert hold_out_for_selection(per_step, 0.4)["val"]["row"].tolist() == [2, 3, 6, 7]
    # the held-out prompts 1 and 3 are all right: nothing to pick an epoch by
    data["train"] = _rows([0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [1, 0, 1, 1, 1, 0, 1, 1, 1, 0])
    with pytest.raises(NothingToLearn, match=r"^policy.selection_share: none of the 2 training prompts held out"):
        hold_out_for_selection(data, 0.4)


def test_the_predictor_never_saw_a_calibration_prompt(small_bank, monkeypatch):
    """Under policy=risk (default selection_share 0.2) no path that calibrates the thresholds
    is among the paths the predictor was fitted to or picked its epoch on (a path known by
    its hidden state at the check, which is the training checkpoint); with selection_share 0
    the epoch is picked on exactly those paths. Bank keys do not move; the predictor's key
    moves only where the epoch is picked elsewhere."""
    seen, calibrated_on = [], []
    fit = training.fit

    def recording_fit(predictor, data, train, loss, progress=True):
        seen.append({k: data[k]["hidden"].numpy() for k in ("train", "val")})
        return fit(predictor, data, train, loss, progress)

    def recording_calibration(policy, search, evaluate, scorers, checks, val):
        calibrated_on.append(val)
        return calibrate_methods(policy, search, evaluate, scorers, checks, val)

    calibrate_methods = evaluate_stage.calibrate_methods
    monkeypatch.setattr(training, "fit", recording_fit)
    monkeypatch.setattr(evaluate_stage, "calibrate_methods", recording_calibration)
    bank = [*small_bank, *RISK, "train.seed=31"]  # no other test trains these
    held_out, on_val = cfg_for(bank), cfg_for(bank, "policy.selection_share=0")
    topk = cfg_for([*small_bank, "train.seed=31"])
    assert build.bank(held_out).root == build.bank(on_val).root == build.bank(topk).root
    assert build.predictor_dir(on_val, build.feature_set(on_val)) == build.predictor_dir(topk, build.feature_set(topk)) != build.predictor_dir(held_out, build.feature_set(held_out))
    for cfg in (held_out, on_val):  # seen[0]: selection_share 0.2, seen[1]: 0
        train_with_controls(cfg, progress=False)
    m = evaluate(held_out)
    assert m["methods"]["mlp"]["risk"]["calibration"]["prompts"] == 6

    def fingerprints(hidden):
        return {row.tobytes() for row in hidden if row.any()}  # zero rows: not alive there
    calibration = fingerprints(calibrated_on[0].checks[0]["hidden"].numpy())
    assert len(calibration) >= 6  # paths of a prompt with the same first tokens share one
    fitted = fingerprints(seen[0]["train"]) | fingerprints(seen[0]["val"])
    assert not calibration & fitted
    assert calibration == fingerprints(seen[1]["val"])  # the overlap the hold-out removes
