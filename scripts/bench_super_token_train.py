"""What keeping the prefixes' K/V across epochs (train.prefix_cache_gb,
stopexp.models.prefix_cache) saves the super token's training, measured in one run.

SmolLM2-135M-Instruct as +exp=smollm2_super_token loads it for training (the HF model),
--prompts prompts of its task (the multi-step mix's few-shot prompts) x 16 paths, each a
prefix of --prefix seeded random token ids (49: the exp's check), soft labels drawn at
random: timing needs the shapes, not the text. Each way runs --epochs epochs of the
training step (batches of train.batch_prompts prompts, reward regression, AdamW) from the
same initial weights; the table gives the seconds of each epoch, the ratio, the cache's
size and the largest difference of the per-epoch mean loss between the two ways (the
cached rows are laid out in another padding, so float32 reductions may reorder).

    .venv/bin/python scripts/bench_super_token_train.py
    .venv/bin/python scripts/bench_super_token_train.py --prompts 32 --epochs 3

Run it on an idle machine: it prints the load average.
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PATHS = 16


def config(extra: list[str]):
    from hydra import compose, initialize_config_dir

    from stopexp.config import validate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return validate(compose("train", ["+exp=smollm2_super_token", "logger=none", *extra]))


def data(cfg, tokenizer, n_prompts: int, prefix: int, seed: int = 0) -> dict:
    """Training rows: n_prompts of the task's prompts x PATHS random prefixes each."""
    from stopexp.tasks import build_task

    problems = build_task(cfg.task).problems("train", n_prompts)
    gen = torch.Generator().manual_seed(seed)
    rows = n_prompts * PATHS
    tokens = np.empty(rows, dtype=object)  # object arrays, as stopexp.store.bank.prefix_columns
    tokens[:] = list(torch.randint(100, tokenizer.vocab_size - 100, (rows, prefix), generator=gen).numpy())
    return {"prompt": np.asarray([p.prompt for p in problems for _ in range(PATHS)], dtype=object),
            "tokens": tokens,
            "prefix_len": torch.full((rows,), float(prefix)),
            "group": torch.arange(n_prompts).repeat_interleave(PATHS),
            "mc": torch.rand(rows, generator=gen), "correct": (torch.rand(rows, generator=gen) < 0.5).float()}


def run(cfg, lm, tokenizer, rows: dict, epochs: int, budget_gb: float) -> tuple[list[float], list[float], float]:
    """(seconds per epoch, mean loss per epoch, GiB kept) training from the seeded start."""
    from stopexp.models.super_token import SuperTokenPredictor
    from stopexp.store import bank
    from stopexp.training.fit import prompt_batches
    from stopexp.training.losses import build_loss

    torch.manual_seed(cfg.train.seed)
    st = SuperTokenPredictor(cfg.predictor, copy.deepcopy(lm), tokenizer, cfg.search.max_batch_rows)
    st.keep_prefixes(budget_gb)
    loss_fn = build_loss(cfg.loss)
    opt = torch.optim.AdamW([p for p in st.parameters() if p.requires_grad], lr=cfg.train.lr,
                            weight_decay=cfg.train.weight_decay)
    rng, seconds, losses = random.Random(cfg.train.seed), [], []
    st.train()
    for _ in range(epochs):
        start, epoch_losses = time.perf_counter(), []
        for idx in prompt_batches(rows["group"], cfg.train.batch_prompts, rng):
            batch = bank.select_rows(rows, idx)
            loss = loss_fn(st(batch), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            epoch_losses.append(loss.item())
        seconds.append(time.perf_counter() - start)
        losses.append(sum(epoch_losses) / len(epoch_losses))
    kept = st.prefixes.bytes / 2**30 if st.prefixes is not None else 0.0
    return seconds, losses, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prefix", type=int, default=49, help="generated tokens per prefix")
    ap.add_argument("--budget-gb", type=float, default=8.0, help="train.prefix_cache_gb of the cached way")
    args = ap.parse_args()
    from stopexp.search.sample import prompt_ids
    from stopexp.stages import build

    cfg = config([])
    lm, tokenizer = build.lm(cfg, progress=False)
    rows = data(cfg, tokenizer, args.prompts, args.prefix)
    prompt_tokens = sum(len(prompt_ids(tokenizer, p)) for p in set(rows["prompt"]))
    print(f"load average {os.getloadavg()[0]:.2f}; torch threads {torch.get_num_threads()}; "
          f"{args.prompts} prompts ({prompt_tokens / args.prompts:.0f} tokens on average) x {PATHS} "
          f"paths x {args.prefix} generated tokens; batch_prompts={cfg.train.batch_prompts}")
    plain_s, plain_loss, _ = run(cfg, lm, tokenizer, rows, args.epochs, 0.0)
    kept_s, kept_loss, gib = run(cfg, lm, tokenizer, rows, args.epochs, args.budget_gb)
    print("\n| epoch | encoded every epoch (s) | prefixes kept (s) | ratio |\n|---|---|---|---|")
    for e, (a, b) in enumerate(zip(plain_s, kept_s), 1):
        print(f"| {e} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    later = sum(plain_s[1:]) / max(sum(kept_s[1:]), 1e-9)
    print(f"\nepochs after the first: {later:.1f}x faster; kept {gib:.2f} GiB "
          f"({gib * 2**30 / len(rows['group']) / 2**20:.2f} MiB a path with its share of the prompt); "
          f"largest per-epoch mean loss difference {max(abs(a - b) for a, b in zip(plain_loss, kept_loss)):.2e}")


if __name__ == "__main__":
    main()
