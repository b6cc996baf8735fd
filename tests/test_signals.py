"""Signal predictors (stopexp/signals) and their losses (stopexp/training/losses.py).

Held-out quality is the *within-prompt* AUROC: roc_auc_score per prompt group with mixed
outcomes, averaged over groups (what a pruning decision among one prompt's paths can use).
"""
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from conftest import compose
from stopexp.config import LossConfig, PredictorConfig
from stopexp.core.names import lookup, names
from stopexp.signals import SIGNAL_NAMES, FeatureSpec, build_predictor
from stopexp.training.losses import LOSSES, build_loss

H, TAPS, PATHS = 32, [0, 1, 2], 8
SPEC = FeatureSpec("synthetic", H, TAPS)
LEARNED = ["linear", "mlp", "fusion", "conf_features"]


def synthetic_batch(n_groups, seed, separation=2.0, length_leak=False):
    """Paths of `n_groups` prompts; the label shifts every tap along a fixed direction and
    the confidence signals by a fixed amount, on top of a per-prompt offset and noise.
    With `length_leak`, correct paths are longer and the hidden state encodes the length."""
    directions = torch.nn.functional.normalize(
        torch.randn(len(TAPS) + 1, H, generator=torch.Generator().manual_seed(123)), dim=-1)
    directions, length_dir = directions[:-1], directions[-1]
    g = torch.Generator().manual_seed(seed)
    b = n_groups * PATHS
    group = torch.arange(n_groups).repeat_interleave(PATHS)
    correct = (torch.rand(b, generator=g) < 0.5).float()
    correct[0::PATHS], correct[1::PATHS] = 1.0, 0.0  # every prompt has mixed outcomes
    sign = 2 * correct - 1
    prompt = 2 * torch.randn(n_groups, len(TAPS), H, generator=g)
    hidden = prompt[group] + separation * sign[:, None, None] * directions \
        + torch.randn(b, len(TAPS), H, generator=g)
    prefix_len = 200 + 40 * torch.randn(b, generator=g)
    if length_leak:
        prefix_len = prefix_len + 60 * sign
        hidden = hidden + 4 * ((prefix_len - 200) / 70)[:, None, None] * length_dir
    signals = torch.stack([
        -1.0 + 0.4 * sign + 0.3 * torch.randn(b, generator=g),   # mean_logprob
        -4.0 + 1.5 * sign + 1.0 * torch.randn(b, generator=g),   # min_logprob
        1.5 - 0.3 * sign + 0.3 * torch.randn(b, generator=g),    # mean_entropy
        0.6 + 0.1 * sign + 0.1 * torch.randn(b, generator=g),    # group_conf
        50 + 5 * torch.randn(b, generator=g),                    # hidden_norm (unused noise)
        torch.zeros(b), torch.zeros(b), torch.zeros(b),          # hidden_mean, _var, attn_entropy
        prefix_len,
    ], dim=1)
    return {"hidden": hidden, "signals": signals, "group": group, "correct": correct,
            "mc": torch.full((b,), float("nan")), "prefix_len": prefix_len,
            "remaining": torch.full((b,), 30.0)}


def train(name, loss_name, batch, steps=200, length_reg=0.0):
    """A tiny full-batch AdamW loop; returns the predictor in eval mode."""
    torch.manual_seed(0)
    model = build_predictor(PredictorConfig(name=name), SPEC)
    loss_fn = build_loss(LossConfig(name=loss_name, length_reg=length_reg))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only lose to threads spin-waiting on busy cores
    try:
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(model(batch), batch).backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def within_prompt_auroc(scores, batch):
    s, y, grp = scores.detach().numpy(), batch["correct"].numpy(), batch["group"].numpy()
    aucs = [roc_auc_score(y[grp == k], s[grp == k]) for k in np.unique(grp)
            if 0 < y[grp == k].mean() < 1]
    return float(np.mean(aucs))


def pearson(a, b):
    return float(np.corrcoef(a.detach().numpy(), b.numpy())[0, 1])


# --- losses: pinned values on a hand-made batch ----------------------------------------

SCORES = [0.3, -0.2, 1.5, 0.1, -0.7, 0.4]
HAND = {"group": torch.tensor([0, 0, 0, 1, 1, 2]),
        "correct": torch.tensor([1.0, 0, 0, 1, 0, 1]),
        "mc": torch.tensor([0.75, float("nan"), 0.25, float("nan"), 0.5, float("nan")]),
        "remaining": torch.tensor([10.0, 4, 0, 20, 3, 1]),
        "prefix_len": torch.tensor([12.0, 30, 5, 18, 9, 40])}
# good/bad pairs of the same prompt: (0, 1), (0, 2), (3, 4); prompt 2 has no pair
DIFFS = [0.3 - -0.2, 0.3 - 1.5, 0.1 - -0.7]


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def bce(s, t):
    return -(t * math.log(sigmoid(s)) + (1 - t) * math.log(1 - sigmoid(s)))


EXPECTED = {
    "contrastive": sum(max(0.0, 1.0 - d) for d in DIFFS) / 3,  # margin 1
    "pairwise": sum(math.log1p(math.exp(-d)) for d in DIFFS) / 3,
    "reward_regression": sum(bce(s, t) for s, t in zip(SCORES, [0.75, 0, 0.25, 1, 0.5, 1])) / 6,
    "mse": sum((sigmoid(s) - c * 0.9 ** r) ** 2 for s, c, r in
               zip(SCORES, [1, 0, 0, 1, 0, 1], [10, 4, 0, 20, 3, 1])) / 6,
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_pinned_values(name):
    scores = torch.tensor(SCORES, requires_grad=True)
    value = build_loss(LossConfig(name=name, margin=1.0, discount=0.9))(scores, HAND)
    assert value.item() == pytest.approx(EXPECTED[name], abs=1e-6)
    value.backward()
    assert torch.isfinite(scores.grad).all()

    corr = np.corrcoef(SCORES, HAND["prefix_len"].numpy())[0, 1]
    reg = build_loss(LossConfig(name=name, margin=1.0, discount=0.9, length_reg=0.5))
    assert reg(scores, HAND).item() == pytest.approx(EXPECTED[name] + 0.5 * corr ** 2, abs=1e-6)


def test_reward_regression_on_hard_labels_ignores_the_monte_carlo_labels():
    """loss.labels=reward: binary cross-entropy on the outcomes, the mc column unread; the
    predictor's key is the old one at the default (mc) and another with reward."""
    from stopexp.store.keys import predictor_key
    scores = torch.tensor(SCORES)
    hard = build_loss(LossConfig(name="reward_regression", labels="reward"))(scores, HAND)
    assert hard.item() == pytest.approx(sum(bce(s, t) for s, t in zip(SCORES, [1, 0, 0, 1, 0, 1])) / 6, abs=1e-6)
    soft = LossConfig(name="reward_regression")
    keys = {labels: predictor_key("f", {"name": "mlp"}, {**vars(soft), "labels": labels}, {"epochs": 3})
            for labels in ("mc", "reward")}
    without = {k: v for k, v in vars(soft).items() if k != "labels"}
    assert keys["mc"] == predictor_key("f", {"name": "mlp"}, without, {"epochs": 3}) != keys["reward"]


@pytest.mark.parametrize("name", ["contrastive", "pairwise"])
def test_pair_loss_without_pairs_is_zero_with_grad(name):
    scores = torch.tensor(SCORES, requires_grad=True)
    batch = dict(HAND, correct=torch.ones(6))
    value = build_loss(LossConfig(name=name, length_reg=0.1))(scores, dict(batch, prefix_len=torch.ones(6)))
    assert value.item() == 0.0
    value.backward()
    assert torch.equal(scores.grad, torch.zeros(6))


def test_unknown_loss_names_key():
    with pytest.raises(ValueError, match="loss.name"):
        build_loss(LossConfig(name="hinge"))


# --- learned predictors separate good from bad paths -----------------------------------

@pytest.mark.parametrize("loss_name", ["contrastive", "reward_regression"])
@pytest.mark.parametrize("name", LEARNED)
def test_learned_predictor_separates_held_out_paths(name, loss_name):
    model = train(name, loss_name, synthetic_batch(40, seed=1))
    test = synthetic_batch(20, seed=2)
    with torch.no_grad():
        assert within_prompt_auroc(model(test), test) > 0.95


def test_length_regulariser_lowers_length_correlation():
    train_batch, test = synthetic_batch(40, seed=3, length_leak=True), synthetic_batch(20, seed=4, length_leak=True)
    corr = {}
    for reg in (0.0, 5.0):
        model = train("mlp", "reward_regression", train_batch, length_reg=reg)
        with torch.no_grad():
            corr[reg] = abs(pearson(model(test), test["prefix_len"]))
    assert corr[0.0] > 0.5 and corr[5.0] < 0.3 * corr[0.0], corr


# --- the statistic baseline ------------------------------------------------------------

@pytest.mark.parametrize("stat, reference", [
    ("l2", lambda h: np.linalg.norm(h, axis=-1)),
    ("mean", lambda h: h.mean(axis=-1)),
    ("var", lambda h: h.var(axis=-1)),  # population variance (ddof=0)
])
def test_statistic_is_exact(stat, reference):
    spec = FeatureSpec("synthetic", H, [4, 0, 7])  # unsorted on purpose
    hidden = torch.randn(5, 3, H, generator=torch.Generator().manual_seed(0))
    for layer, tap in [(0, 1), (7, 2), (-1, 2), (-2, 0), (-3, 1)]:
        model = build_predictor(PredictorConfig(name="statistic", statistic=stat, layer=layer), spec)
        assert sum(p.numel() for p in model.parameters()) == 0
        expected = reference(hidden[:, tap].double().numpy())
        np.testing.assert_allclose(model({"hidden": hidden}).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["statistic", "linear", "mlp"])
@pytest.mark.parametrize("layer", [5, -4])
def test_bad_layer_names_the_key(name, layer):
    with pytest.raises(ValueError, match=r"predictor\.layer.*\[0, 4, 7\]"):
        build_predictor(PredictorConfig(name=name, layer=layer), FeatureSpec("m", H, [4, 0, 7]))


def test_bad_names_and_shapes_are_explained():
    with pytest.raises(ValueError, match="predictor.name"):
        build_predictor(PredictorConfig(name="super_token"), SPEC)
    with pytest.raises(ValueError, match="predictor.statistic"):
        build_predictor(PredictorConfig(name="statistic", statistic="max"), SPEC)
    with pytest.raises(ValueError, match=r"batch\['hidden'\]"):
        build_predictor(PredictorConfig(name="mlp"), SPEC)({"hidden": torch.zeros(2, 3, H + 1)})


# --- shapes, sizes, determinism --------------------------------------------------------

def test_mlp_parameter_count():
    spec = FeatureSpec("qwen-1.5b", 1536, [27])
    n = sum(p.numel() for p in build_predictor(PredictorConfig(name="mlp", hidden=128), spec).parameters())
    print(f"mlp parameters at H=1536, hidden=128: {n}")
    assert n == 2 * 1536 + (1536 * 128 + 128) + (128 + 1) == 199_937


@pytest.mark.parametrize("name", sorted(names("predictor")))
def test_shape_and_determinism(name):
    batch = synthetic_batch(3, seed=5)
    cfg = PredictorConfig(name=name, dropout=0.1)
    outputs = []
    for _ in range(2):
        torch.manual_seed(7)
        model = build_predictor(cfg, SPEC)
        with torch.no_grad():
            train_out = model.train()(batch)
            outputs.append((train_out, model.eval()(batch)))
    assert outputs[0][1].shape == (3 * PATHS,)
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])
    assert set(lookup("predictor", name).inputs) <= set(batch)


def test_conf_features_reads_confidence_signals_only():
    batch = synthetic_batch(3, seed=6)
    torch.manual_seed(0)
    model = build_predictor(PredictorConfig(name="conf_features"), SPEC).eval()
    signals = batch["signals"].clone()
    signals[:, SIGNAL_NAMES.index("hidden_norm")] = 1e3
    with torch.no_grad():
        assert torch.equal(model(batch), model({"signals": signals}))


def test_every_predictor_and_loss_option_builds_from_its_yaml():
    losses = sorted(LOSSES)
    for i, name in enumerate(names("predictor")):  # one compose per predictor, cycling the losses
        cfg = compose("train", [f"predictor={name}", f"loss={losses[i % len(losses)]}"])
        assert build_predictor(cfg.predictor, SPEC)(synthetic_batch(2, seed=0)).shape == (2 * PATHS,)
        assert build_loss(cfg.loss)(torch.zeros(6), HAND).dim() == 0


def test_token_stats_of_vllm_logprobs_by_hand():
    """vLLM's per-position {token id: Logprob}: the sampled token's log-prob, the entropy of
    the returned top alternatives renormalised, minus the mean log-prob of the best k of
    them; a sampled token outside the top counts for its log-prob only."""
    from types import SimpleNamespace as Logprob

    from stopexp.signals.confidence import token_stats

    a, b = math.log(0.5), math.log(0.25)
    positions = [{7: Logprob(logprob=a, rank=1), 9: Logprob(logprob=b, rank=2)},
                 {7: Logprob(logprob=a, rank=1), 9: Logprob(logprob=b, rank=2),
                  3: Logprob(logprob=-5.0, rank=40)},
                 {7: Logprob(logprob=a, rank=1)}]
    lp, ent, conf = token_stats(positions, [9, 3, 7], top=2, conf_topk=2)
    q = [2 / 3, 1 / 3]  # 0.5 and 0.25 renormalised
    h = -sum(x * math.log(x) for x in q)
    assert lp.dtype == ent.dtype == conf.dtype == np.float32
    assert lp.tolist() == [np.float32(b), np.float32(-5.0), np.float32(a)]
    # float32 results of float64 arithmetic: within a float32 rounding step
    assert ent.tolist() == pytest.approx([h, h, 0.0], rel=2 ** -23)
    assert conf.tolist() == pytest.approx([-(a + b) / 2] * 2 + [-a], rel=2 ** -23)  # one alternative: its own
    empty = token_stats([], [], top=20, conf_topk=20)
    assert [len(x) for x in empty] == [0, 0, 0]
