"""The super token as the paper trains it (+exp=smollm2_super_token_paper): the recipe
composes and validates, its LoRA settings reach peft, accumulated batches step on one
batch's gradient, the pairwise loss on a hand-computed example, and the mixed-outcome filter
keeps exactly the prompts with both outcomes."""
import copy
import math

import pytest
import torch
from torch import nn

from conftest import FP32_REORDER, compose
from stopexp.config import ConfigError, PredictorConfig, validate
from stopexp.models.super_token import ADAPTER, SuperTokenPredictor
from stopexp.runtime.overrides import stage_config
from stopexp.store import bank
from stopexp.training.data import mixed_only
from stopexp.training.fit import accumulated_backward, fit
from stopexp.training.losses import build_loss, loss_terms, pairwise

RECIPE = "+exp=smollm2_super_token_paper"


@pytest.mark.parametrize("loss", ["reward_regression", "pairwise"])
def test_the_recipe_composes_and_validates(loss):
    cfg = stage_config("train", [RECIPE, f"loss={loss}"])
    p, t = cfg.predictor, cfg.train
    assert (p.name, p.lora_rank, p.lora_alpha, list(p.lora_targets), p.lora_dropout) == \
        ("super_token", 256, 512.0, ["q_proj", "v_proj"], 0.05)
    assert (t.lr, t.epochs, t.patience, t.batch_prompts, t.accumulate, t.mixed_only) == \
        (1e-4, 10, 10, 2, 2, True)
    assert cfg.loss.name == loss and cfg.collect.prompts.val >= 100
    assert cfg.collect.mc_rollouts == 4 and cfg.train.checkpoint == 49


def test_the_lora_settings_reach_peft(tiny_lm):
    lm, tok = tiny_lm
    pred = PredictorConfig(name="super_token", lora_rank=256, lora_alpha=512.0,
                           lora_targets=["q_proj", "v_proj"], lora_dropout=0.05)
    st = SuperTokenPredictor(pred, copy.deepcopy(lm), tok)
    names = sorted({name.rsplit(".", 1)[-1] for name, m in st.lm.named_modules() if hasattr(m, "lora_A")})
    assert names == ["q_proj", "v_proj"]
    layers = [m for _, m in st.lm.named_modules() if hasattr(m, "lora_A")]
    assert len(layers) == 2 * lm.config.num_hidden_layers
    for m in layers:
        assert m.r[ADAPTER] == 256 and m.lora_alpha[ADAPTER] == 512.0
        assert m.scaling[ADAPTER] == 2.0  # alpha / rank
        assert m.lora_A[ADAPTER].weight.shape == (256, m.in_features)
        assert isinstance(m.lora_dropout[ADAPTER], nn.Dropout) and m.lora_dropout[ADAPTER].p == 0.05
    st.train()  # the dropout runs while the predictor trains, not while it scores
    assert all(m.lora_dropout[ADAPTER].training for m in layers)
    st.eval()
    assert not any(m.lora_dropout[ADAPTER].training for m in layers)
    assert not st.lm.training  # the frozen LM's own modules stay in eval mode


class Scores(nn.Module):
    """A tiny predictor: one linear layer on batch["x"]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 1)

    def forward(self, batch):
        return self.lin(batch["x"]).squeeze(-1)


def rows(n_prompts=4, paths=5, weight=False):
    gen = torch.Generator().manual_seed(1)
    n = n_prompts * paths
    out = {"x": torch.randn(n, 3, generator=gen), "group": torch.arange(n_prompts).repeat_interleave(paths),
           "correct": (torch.rand(n, generator=gen) < 0.5).float(),
           "mc": torch.rand(n, generator=gen), "prefix_len": torch.full((n,), 9.0),
           "length": torch.full((n,), 20.0)}
    out["reward"] = out["correct"]
    if weight:
        out["weight"] = torch.rand(n, generator=gen) + 0.5
    return out


@pytest.mark.parametrize("loss_name", ["pairwise", "contrastive", "reward_regression", "mse"])
@pytest.mark.parametrize("weight", [False, True])
def test_accumulated_batches_give_one_batchs_gradient(loss_name, weight):
    from omegaconf import OmegaConf

    loss = OmegaConf.create({"name": loss_name, "length_reg": 0.0, "min_gap": 0.0, "margin": 1.0,
                             "labels": "mc", "discount": 0.95})
    data, fn = rows(weight=weight), build_loss(loss)
    data["remaining"] = torch.arange(len(data["x"])).float()
    parts = [bank.select_rows(data, data["group"] < 1), bank.select_rows(data, data["group"] >= 1)]
    assert 0 < loss_terms(loss, parts[0]) < loss_terms(loss, data)  # unequal shares
    one, apart = Scores(), Scores()
    accumulated_backward(one, [data], fn, loss)
    losses = accumulated_backward(apart, parts, fn, loss)
    assert len(losses) == 2
    # the same float32 sums of 20 terms of magnitude <= ~3 in another order: within the
    # suite's float32 reordering tolerance (tests/conftest.py), far below a gradient's size
    assert one.lin.weight.grad.abs().max() > 1e-2  # (a pair loss gives the bias none)
    for a, b in zip(one.parameters(), apart.parameters()):
        torch.testing.assert_close(b.grad, a.grad, **FP32_REORDER)


def test_fit_steps_once_per_accumulated_batches(monkeypatch):
    from omegaconf import OmegaConf

    steps = []
    real = torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: (steps.append(1), real(self, *a, **k))[1])
    data = {s: rows(n_prompts=5) for s in ("train", "val")}
    loss = OmegaConf.create({"name": "pairwise", "length_reg": 0.0, "min_gap": 0.0})
    for accumulate, expected in ((1, 5), (2, 3), (5, 1)):
        steps.clear()
        train = OmegaConf.create({"epochs": 1, "batch_prompts": 1, "lr": 1e-3, "weight_decay": 0.0,
                                  "patience": 1, "seed": 0, "early_stopping": False, "accumulate": accumulate})
        fit(Scores(), data, train, loss, progress=False)
        assert len(steps) == expected


def test_the_pairwise_loss_on_a_hand_computed_example():
    from omegaconf import OmegaConf

    loss = OmegaConf.create({"name": "pairwise", "min_gap": 0.0})
    # prompt 0: paths 0 and 2 end correct, path 1 not: pairs (0, 1) and (2, 1); prompt 1 has
    # one outcome only: no pair (a pair never spans two prompts)
    batch = {"group": torch.tensor([0, 0, 0, 1, 1]), "correct": torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])}
    scores = torch.tensor([2.0, 0.0, 1.0, 5.0, -5.0])
    want = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-1.0))) / 2  # 0.2200947...
    assert pairwise(scores, batch, loss).item() == pytest.approx(want, rel=1e-6)
    assert loss_terms(loss, batch) == 2.0


def test_the_mixed_outcome_filter_keeps_the_prompts_with_both_outcomes():
    data = {"group": torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 3]),
            "correct": torch.tensor([1, 0, 1, 1, 1, 0, 0, 0, 1, 0]).float(),
            "x": torch.arange(10)}
    kept = mixed_only(data)
    assert kept["x"].tolist() == [0, 1, 7, 8, 9]  # prompts 0 and 3; 1 all right, 2 all wrong
    # train.positions=all: rows grouped by (prompt, position), filtered by the prompt
    per_step = {**data, "prompt_group": data["group"], "group": torch.arange(10)}
    assert mixed_only(per_step)["x"].tolist() == [0, 1, 7, 8, 9]
    with pytest.raises(ConfigError, match=r"^train\.mixed_only: none of the 2 training prompts has "
                                          r"paths with both outcomes"):
        mixed_only({k: v[2:7] for k, v in data.items()})


@pytest.mark.parametrize("overrides, message", [
    (["train.accumulate=2", "loss.length_reg=0.5"],
     "train.accumulate: 2: loss.length_reg=0.5 correlates the scores of one batch"),
    (["train.accumulate=0"], "train.accumulate: must be >= 1, got 0"),
    (["predictor=super_token", "predictor.lora_dropout=1.0"],
     "predictor.lora_dropout: must lie in [0, 1), got 1.0"),
])
def test_bad_recipe_values_are_refused(overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(compose("train", ["logger=none", *overrides]))
    assert str(e.value).startswith(message)
