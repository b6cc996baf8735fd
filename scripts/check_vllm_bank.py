"""A bank made with engine=vllm against HF's teacher-forced forward over the same paths:
the largest differences of the log-prob and confidence columns, and how far the bank's
entropy (over vLLM's top engine.max_logprobs alternatives, renormalised) lies below HF's
full-vocabulary entropy, the hf engine's column.

    python scripts/check_vllm_bank.py +exp=smollm2_contrastive engine=vllm --paths 400

Takes the config's bank (Hydra overrides) and `--paths P` paths spread evenly over it
(default 400; 0: all). Needs no vLLM: only the HF model.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from stopexp.stages import build
from stopexp.search.sample import prompt_ids
from stopexp.search.vllm_engine import hf_token_columns
from stopexp.store import bank
from stopexp.runtime.overrides import stage_config


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", type=int, default=400)
    args, overrides = parser.parse_known_args(argv)
    cfg = stage_config("collect", overrides)
    root = build.bank(cfg).root
    meta = bank.read_meta(root)
    if meta.get("engine", {}).get("name") != "vllm":
        sys.exit(f"{root}: not a bank made with engine=vllm (its meta.json records "
                 f"engine={meta.get('engine', {}).get('name', 'hf')})")
    ds = bank.load_bank(root)
    rows = np.arange(len(ds)) if not args.paths else np.unique(
        np.linspace(0, len(ds) - 1, min(args.paths, len(ds))).astype(int))
    model, tok = build.lm(cfg)
    top, temperature = meta["engine"]["settings"]["max_logprobs"], cfg.search.temperature
    worst, full, topk = {"logprob": 0.0, "conf": 0.0, "entropy_topk": 0.0}, [], []
    for i in rows.tolist():
        tokens = list(ds["tokens"][i])
        hf = hf_token_columns(model, prompt_ids(tok, ds["prompt"][i]), tokens, temperature, top,
                              cfg.search.conf_topk)
        for name, column in (("logprob", "token_logprob"), ("conf", "token_conf"),
                             ("entropy_topk", "token_entropy")):
            worst[name] = max(worst[name], float(np.abs(np.asarray(ds[column][i], float) - hf[name]).max()))
        full.append(hf["entropy"])
        topk.append(np.asarray(ds["token_entropy"][i], float))
    full, topk = np.concatenate(full), np.concatenate(topk)
    gap = full - topk
    print(f"bank {root}: {len(rows)} of {len(ds)} paths, {len(gap)} tokens, engine "
          f"{meta['engine']['package']} {meta['engine']['version']}, top {top}")
    print("largest |bank - HF| (nats): " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    print(f"full-vocabulary entropy - bank entropy: mean {gap.mean():.4f}, median "
          f"{np.median(gap):.4f}, p99 {np.quantile(gap, 0.99):.4f}, max {gap.max():.4f} nats; "
          f"mean entropy {full.mean():.4f} (HF) vs {topk.mean():.4f} (bank); "
          f"rank correlation over tokens {_spearman(full, topk):.4f}")


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main(sys.argv[1:])
