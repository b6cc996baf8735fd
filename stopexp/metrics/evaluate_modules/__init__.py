"""The field's metrics as Hugging Face `evaluate` modules, shipped in the package so that
`evaluate.load` needs no hub: each file is a thin `evaluate.Metric` over stopexp's own
implementation (stopexp.metrics), so both give the same numbers.

    >>> import evaluate
    >>> from stopexp.metrics import evaluate_module
    >>> auroc = evaluate.load(evaluate_module("within_prompt_auroc"))
    >>> auroc.compute(predictions=[0.9, 0.1, 0.4], references=[1, 0, 1], groups=[0, 0, 0])
    {'within_prompt_auroc': 1.0}

This file imports nothing: the modules import `evaluate` (and `datasets`), and only
`evaluate.load` imports them.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
# the modules shipped here: name -> what it computes (its file is HERE / f"{name}.py")
MODULES = {"within_prompt_auroc": "mean AUROC over the prompts with both outcomes",
           "avg_at_k": "mean over prompts of the kept paths' mean correctness (avg@k)",
           "cons_at_n": "share of prompts whose majority answer is the gold one (Cons@N)",
           "pass_at_1": "chance that one sampled path is right (pass@1: avg@k over all paths)"}


def evaluate_module(name: str) -> str:
    """The path of the shipped `evaluate` module `name`, for `evaluate.load(path)`;
    ValueError naming the shipped ones otherwise."""
    if name not in MODULES:
        raise ValueError(f"no evaluate module {name!r} ships with stopexp; shipped: {', '.join(MODULES)}")
    return str(HERE / f"{name}.py")
