import torch

from conftest import compose
from stopexp.core.policies import Adaptive, FixedThreshold, Quantile, TopK, build_policy


def test_topk_keeps_the_k_best_and_breaks_ties_by_order():
    s = torch.tensor([0.1, 0.9, 0.5, 0.9, -1.0])
    assert TopK(2).keep(s).tolist() == [False, True, False, True, False]
    assert TopK(3).keep(torch.tensor([1.0, 1.0, 1.0, 1.0])).tolist() == [True, True, True, False]
    assert TopK(10).keep(s).all()


def test_near_ties_from_float_noise_are_ties():
    a = torch.tensor([0.5, 0.5 + 1e-7, 0.2])
    assert TopK(1).keep(a).tolist() == [True, False, False]


def test_fixed_and_quantile_never_empty_a_prompt():
    s = torch.tensor([0.1, 0.4, 0.3])
    assert FixedThreshold(0.35).keep(s).tolist() == [False, True, False]
    assert FixedThreshold(5.0).keep(s).tolist() == [False, True, False]  # best stays
    assert Quantile(0.5).keep(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [False, False, True, True]


def test_adaptive_moves_tau_toward_the_target_rate():
    p = Adaptive(tau=0.0, target=0.5, gain=0.5)
    torch.manual_seed(0)
    for _ in range(200):
        p.keep(torch.rand(64))
    rates = [1 - p.keep(torch.rand(64)).float().mean().item() for _ in range(200)]
    assert abs(sum(rates) / len(rates) - 0.5) < 0.05
    assert 0.35 < p.tau < 0.65


def test_build_policy_from_every_config():
    for name in ("fixed", "quantile", "topk", "adaptive"):
        pol = build_policy(compose("evaluate", [f"policy={name}"]).policy)
        assert pol.name == name
    assert build_policy(compose("evaluate", ["policy=topk"]).policy, keep=3).k == 3
