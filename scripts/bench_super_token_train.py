"""What the super token's training saves by keeping the prefixes' K/V across epochs
(train.prefix_cache_gb, stopexp.models.prefix_cache) and by attending from [STOP] with the
prefix held constant (stopexp.models.stop_attention), measured in one run.

SmolLM2-135M-Instruct as +exp=smollm2_super_token loads it for training (the HF model, in
bfloat16), --prompts prompts of its task (the multi-step mix's few-shot prompts) x 16
paths, each a prefix of --prefix seeded random token ids (49: the exp's check), soft labels
drawn at random: timing needs the shapes, not the text. Each way runs --epochs epochs of
the training step (batches of train.batch_prompts prompts, reward regression, AdamW) from
the same initial weights:

  fused, encoded   PyTorch's fused attention (the LM's own) for [STOP], every prefix
                   encoded at every step: the training before either change;
  stop, encoded    stopexp's [STOP] attention, every prefix encoded at every step;
  stop, kept       stopexp's [STOP] attention, the prefixes' K/V kept (what train runs).

The table gives the seconds of each epoch and the ratios, then the cache's size and the
largest difference of the per-epoch mean loss from the first way (other kernels and
padding: float reductions reorder).

    .venv/bin/python scripts/bench_super_token_train.py
    .venv/bin/python scripts/bench_super_token_train.py --prompts 32 --epochs 3

About 5 minutes on 2 cores. Run it on an idle machine: it prints the load average.
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
    from stopexp.runtime.overrides import stage_config

    return stage_config("train", ["+exp=smollm2_super_token", *extra])


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


def run(cfg, lm, tokenizer, rows: dict, epochs: int, budget_gb: float,
        fused: bool = False) -> tuple[list[float], list[float], float]:
    """(seconds per epoch, mean loss per epoch, GiB kept) training from the seeded start;
    `fused`: [STOP] attends with the LM's own attention instead of stopexp's."""
    import contextlib

    import stopexp.models.super_token as super_token
    from stopexp.models.super_token import SuperTokenPredictor
    from stopexp.training.losses import build_loss

    torch.manual_seed(cfg.train.seed)
    st = SuperTokenPredictor(cfg.predictor, copy.deepcopy(lm), tokenizer, cfg.search.max_batch_rows)
    st.keep_prefixes(budget_gb)
    loss_fn = build_loss(cfg.loss)
    opt = torch.optim.AdamW([p for p in st.parameters() if p.requires_grad], lr=cfg.train.lr,
                            weight_decay=cfg.train.weight_decay)
    st.train()
    ours = super_token.stop_attention
    if fused:
        super_token.stop_attention = lambda lm: contextlib.nullcontext()
    try:
        seconds, losses = _epochs(st, rows, epochs, loss_fn, opt, random.Random(cfg.train.seed), cfg)
    finally:
        super_token.stop_attention = ours
    kept = st.prefixes.bytes / 2**30 if st.prefixes is not None else 0.0
    return seconds, losses, kept


def _epochs(st, rows, epochs, loss_fn, opt, rng, cfg) -> tuple[list[float], list[float]]:
    """(seconds, mean loss) of each of `epochs` epochs of training steps."""
    from stopexp.store import bank
    from stopexp.training.fit import prompt_batches

    seconds, losses = [], []
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
    return seconds, losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prefix", type=int, default=49, help="generated tokens per prefix")
    ap.add_argument("--budget-gb", type=float, default=8.0, help="the cached way's budget (GiB)")
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
    ways = {"fused, encoded": run(cfg, lm, tokenizer, rows, args.epochs, 0.0, fused=True),
            "stop, encoded": run(cfg, lm, tokenizer, rows, args.epochs, 0.0),
            "stop, kept": run(cfg, lm, tokenizer, rows, args.epochs, args.budget_gb)}
    (base, base_loss, _), (enc, _, _), (kept, _, gib) = ways.values()
    print(f"\n| epoch | {' (s) | '.join(ways)} (s) | stop, encoded vs fused | stop, kept vs fused |")
    print("|---" * (len(ways) + 3) + "|")
    for e in range(args.epochs):
        print(f"| {e + 1} | {' | '.join(f'{w[0][e]:.1f}' for w in ways.values())} | "
              f"{base[e] / enc[e]:.2f}x | {base[e] / kept[e]:.2f}x |")
    later = sum(base[1:]) / max(sum(kept[1:]), 1e-9)
    diff = max(abs(a - b) for w in ways.values() for a, b in zip(base_loss, w[1]))
    print(f"\nepochs after the first, stop + kept against fused + encoded: {later:.2f}x; kept {gib:.2f} GiB "
          f"({gib * 2**30 / len(rows['group']) / 2**20:.2f} MiB a path with its share of the prompt); "
          f"largest per-epoch mean loss difference from fused, encoded {diff:.2e}")

if __name__ == "__main__":
    main()
