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
  stop, float32    stopexp's [STOP] attention holding a float32 copy of each layer's prefix
                   for the backward (its products in plain matmuls), every prefix encoded;
  stop, encoded    stopexp's [STOP] attention, the prefix saved in its own precision
                   (stop_attention.constant_matmul), every prefix encoded at every step;
  stop, kept       stopexp's [STOP] attention, the prefixes' K/V kept (what train runs).

Each way runs in a process of its own, one after the other, so that its peak resident
memory (the kernel's high-water mark) is its own. The tables give the seconds of each
epoch and the ratios, then each way's resident memory before training (the LM and the
rows) and its peak, the cache's size and the largest difference of the per-epoch mean
loss from the first way (other kernels and padding: float reductions reorder).

    .venv/bin/python scripts/bench_super_token_train.py
    .venv/bin/python scripts/bench_super_token_train.py --prompts 32 --epochs 3
    .venv/bin/python scripts/bench_super_token_train.py --exp smollm2_super_token_paper \
        --way "stop, kept" --prompts 8 --epochs 2      # the paper's recipe, as train runs it

About 7 minutes on 2 cores. Run it on an idle machine: it prints the load average.
"""
from __future__ import annotations

import argparse
import copy
import multiprocessing
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PATHS = 16


EXP = "smollm2_super_token"


def config(extra: list[str], exp: str = EXP):
    from stopexp.runtime.overrides import stage_config

    return stage_config("train", [f"+exp={exp}", *extra])


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


def plain_matmul(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a @ c in float32 by a plain matmul: autograd saves the float32 copy of c."""
    return a @ c.float()


def resident_gib(field: str) -> float:
    """This process's resident memory now (VmRSS) or its peak (VmHWM), GiB."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    return kib / 2**20


def way(name: str, args) -> dict:
    """One way in this process: the LM loaded, the rows drawn, `args.epochs` epochs."""
    from stopexp.search.sample import prompt_ids
    from stopexp.stages import build

    torch.set_num_threads(args.threads)
    cfg = config([], args.exp)
    lm, tokenizer = build.lm(cfg, progress=False)
    rows = data(cfg, tokenizer, args.prompts, args.prefix)
    prompt_tokens = sum(len(prompt_ids(tokenizer, p)) for p in set(rows["prompt"]))
    before = resident_gib("VmRSS")
    seconds, losses, kept = run(cfg, lm, tokenizer, rows, args.epochs,
                                args.budget_gb if name == "stop, kept" else 0.0,
                                fused=name == "fused, encoded", float32_copy=name == "stop, float32")
    return {"seconds": seconds, "losses": losses, "kept_gib": kept, "rss_before_gib": before,
            "peak_gib": resident_gib("VmHWM"), "prompt_tokens": prompt_tokens,
            "rows": len(rows["group"]), "batch_prompts": cfg.train.batch_prompts,
            "accumulate": cfg.train.accumulate}


def run(cfg, lm, tokenizer, rows: dict, epochs: int, budget_gb: float,
        fused: bool = False, float32_copy: bool = False) -> tuple[list[float], list[float], float]:
    """(seconds per epoch, mean loss per epoch, GiB kept) training from the seeded start;
    `fused`: [STOP] attends with the LM's own attention instead of stopexp's; `float32_copy`:
    stopexp's, with its prefix products as plain matmuls."""
    import contextlib

    import stopexp.models.stop_attention as stop_attention
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
    ours, matmul = super_token.stop_attention, stop_attention.constant_matmul
    if fused:
        super_token.stop_attention = lambda lm: contextlib.nullcontext()
    if float32_copy:
        stop_attention.constant_matmul = plain_matmul
    try:
        seconds, losses = _epochs(st, rows, epochs, loss_fn, opt, random.Random(cfg.train.seed), cfg)
    finally:
        super_token.stop_attention, stop_attention.constant_matmul = ours, matmul
    kept = st.prefixes.bytes / 2**30 if st.prefixes is not None else 0.0
    return seconds, losses, kept


def _epochs(st, rows, epochs, loss_fn, opt, rng, cfg) -> tuple[list[float], list[float]]:
    """(seconds, mean loss) of each of `epochs` epochs of training steps."""
    from stopexp.store import bank
    from stopexp.training.fit import accumulated_backward, prompt_batches

    seconds, losses = [], []
    for _ in range(epochs):
        start, epoch_losses = time.perf_counter(), []
        batches = list(prompt_batches(rows["group"], cfg.train.batch_prompts, rng))
        for i in range(0, len(batches), cfg.train.accumulate):  # as train steps
            opt.zero_grad(set_to_none=True)
            epoch_losses += accumulated_backward(st, [bank.select_rows(rows, idx) for idx in
                                                      batches[i:i + cfg.train.accumulate]],
                                                 loss_fn, cfg.loss)
            opt.step()
        seconds.append(time.perf_counter() - start)
        losses.append(sum(epoch_losses) / len(epoch_losses))
    return seconds, losses


WAYS = ("fused, encoded", "stop, float32", "stop, encoded", "stop, kept")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prefix", type=int, default=49, help="generated tokens per prefix")
    ap.add_argument("--budget-gb", type=float, default=8.0, help="the cached way's budget (GiB)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    ap.add_argument("--exp", default=EXP, help="the exp whose predictor, loss and train sections "
                                               "train (e.g. smollm2_super_token_paper)")
    ap.add_argument("--way", action="append", dest="ways", help="a way to run (repeat it for "
                                                                "more; default: every way); the "
                                                                "first is the base of the ratios")
    args = ap.parse_args()
    ways_run = args.ways or list(WAYS)
    unknown = [w for w in ways_run if w not in WAYS]
    if unknown:
        ap.error(f"--way: {unknown[0]!r} unknown; allowed: {'; '.join(WAYS)}")
    print(f"load average {os.getloadavg()[0]:.2f}; torch threads {args.threads}")
    ways = {}
    for name in ways_run:  # one at a time: each in its own process, for its own peak memory
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            ways[name] = pool.submit(way, name, args).result()
    base = ways[ways_run[0]]
    enc, kept = ways.get("stop, encoded", base), ways.get("stop, kept", base)
    print(f"{args.prompts} prompts ({base['prompt_tokens'] / args.prompts:.0f} tokens on average) x "
          f"{PATHS} paths x {args.prefix} generated tokens; +exp={args.exp}: batch_prompts="
          f"{base['batch_prompts']}, train.accumulate={base['accumulate']}")
    print(f"\n| epoch | {' (s) | '.join(ways)} (s) | stop, encoded vs fused | stop, kept vs fused |")
    print("|---" * (len(ways) + 3) + "|")
    for e in range(args.epochs):
        cells = " | ".join(f"{w['seconds'][e]:.1f}" for w in ways.values())
        print(f"| {e + 1} | {cells} | "
              f"{base['seconds'][e] / enc['seconds'][e]:.2f}x | {base['seconds'][e] / kept['seconds'][e]:.2f}x |")
    print("\n| way | resident before training (GiB) | peak (GiB) | peak - before (GiB) |\n|---|---|---|---|")
    for name, w in ways.items():
        print(f"| {name} | {w['rss_before_gib']:.2f} | {w['peak_gib']:.2f} | "
              f"{w['peak_gib'] - w['rss_before_gib']:.2f} |")
    later = sum(base["seconds"][1:]) / max(sum(kept["seconds"][1:]), 1e-9)
    diff = max(abs(a - b) for w in ways.values() for a, b in zip(base["losses"], w["losses"]))
    gib = kept["kept_gib"]
    f32, own = ways.get("stop, float32", base), enc
    print(f"\nepochs after the first, stop + kept against fused + encoded: {later:.2f}x; kept {gib:.2f} GiB "
          f"({gib * 2**30 / kept['rows'] / 2**20:.2f} MiB a path with its share of the prompt); "
          f"the prefix saved in its own precision against a float32 copy: peak - before "
          f"{own['peak_gib'] - own['rss_before_gib']:.2f} against {f32['peak_gib'] - f32['rss_before_gib']:.2f} GiB; "
          f"largest per-epoch mean loss difference from fused, encoded {diff:.2e}")


if __name__ == "__main__":
    main()
