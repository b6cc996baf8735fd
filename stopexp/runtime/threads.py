"""Results that do not depend on the machine's thread count.

torch splits a CPU reduction (a matmul, a BatchNorm's statistics, a loss's sum) over its
threads, and the summation order changes the float result in the last bits; in training
such a bit can flip an early-stopping or top-k decision, so the same seed could give other
tables under OMP_NUM_THREADS=1 and 2. The predictors are tiny, so they train and score
on one thread: the same numbers whatever the core count, at little cost.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

SMALL = 10_000_000  # parameters; bigger models (the LM behind super_token) keep every thread


def lm_parameters(model: torch.nn.Module) -> list:
    """The parameters of the LM a predictor runs (the super token's `lm`, kept out of its
    submodules so that its state_dict holds the adapter only): it computes with them too."""
    lm = getattr(model, "lm", None)
    return list(lm.parameters()) if isinstance(lm, torch.nn.Module) else []


@contextlib.contextmanager
def one_thread(model: torch.nn.Module | None = None) -> Iterator[None]:
    """Run the block on one torch CPU thread (unless `model`, with the LM it runs, has more
    than `SMALL` parameters or lives on an accelerator), restoring the thread count
    afterwards."""
    params = [] if model is None else [*model.parameters(), *lm_parameters(model)]
    big = sum(p.numel() for p in params) > SMALL or any(p.device.type != "cpu" for p in params)
    before = torch.get_num_threads()
    if big or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
