"""A predictor's weights and scores do not depend on torch's thread count."""
import shutil

import torch
from safetensors.torch import load_file

from conftest import compose
from stopexp.config import validate
from stopexp.runtime.threads import one_thread
from stopexp.stages import build
from stopexp.stages.build import predictor_dir
from stopexp.stages.train import train_with_controls


def test_training_gives_the_same_bits_at_one_and_at_two_threads(small_bank):
    before = torch.get_num_threads()
    cfg = validate(compose("train", [*small_bank, "predictor=conf_features", "train.epochs=4"]))
    weights, metrics = [], []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            shutil.rmtree(predictor_dir(cfg, build.feature_set(cfg)), ignore_errors=True)
            m = train_with_controls(cfg, progress=False)
            weights.append(load_file(f"{m['checkpoint']}/predictor.safetensors"))
            metrics.append({s: m[s]["auroc_pooled"] for s in ("train", "val", "test")})
            assert torch.get_num_threads() == threads  # restored after training
    finally:
        torch.set_num_threads(before)
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert metrics[0] == metrics[1]


def test_one_thread_leaves_big_models_alone():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread(torch.nn.Linear(4, 4)):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with one_thread(torch.nn.Embedding(10_000, 1_001)):  # > 10M parameters: an LM
            assert torch.get_num_threads() == 2
        # the super token holds a small adapter and runs a big LM kept out of its submodules
        head = torch.nn.Linear(4, 1)
        object.__setattr__(head, "lm", torch.nn.Embedding(10_000, 1_001))
        assert sum(p.numel() for p in head.parameters()) == 5
        with one_thread(head):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
