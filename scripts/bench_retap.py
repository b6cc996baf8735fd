"""Re-tapping a trace bank vs regenerating it, in one run: the wall time of collect (the
paths, from scratch in a fresh cache) and of featurize at 3 other tap layers from the
stored paths (a teacher-forced forward; LM loading included in both), their ratio (target:
re-tap <= 0.25 x regenerate), and the bytes per path of the bank and of the features.

    python scripts/bench_retap.py                      # the embedded toy LM (3 layers: 0, 1, 2)
    python scripts/bench_retap.py --smollm2            # SmolLM2-135M (layers 5, 15, 25); slow
    python scripts/bench_retap.py --prompts 40 -- search.n_paths=32

One torch thread by default (`--threads`), so the ratio does not depend on the machine's
cores; run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from stopexp.store import bank
from stopexp.store import feature_sets
from stopexp.stages import build
from stopexp.core.commands import override
from stopexp.runtime.overrides import stage_config


def artifact_bytes(meta: dict) -> int:
    return sum(f["size"] for r in meta["shards"].values() for f in r["files"].values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct instead of the toy LM")
    ap.add_argument("--prompts", type=int, default=None,
                    help="prompts per split train/val/test (default: toy 100/25/25, SmolLM2 8/2/2)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="cache dir (default: a fresh temp dir)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for both stages")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    exp, layers = ("smollm2_contrastive", "[5,15,25]") if args.smollm2 else ("toy_contrastive", "[0,1,2]")
    n = args.prompts or (8 if args.smollm2 else 100)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_retap-"))
    base = [f"+exp={exp}", "logger=none", override("paths.output_dir", str(out)), f"collect.prompts.train={n}",
            f"collect.prompts.val={max(1, n // 4)}", f"collect.prompts.test={max(1, n // 4)}",
            *args.overrides]
    cfg = stage_config("pipeline", base)
    retap = stage_config("pipeline", [*base, f"tap.layers={layers}"])
    from stopexp.stages.collect import collect

    start = time.perf_counter()
    collected = collect(build.collection(cfg))
    regenerate_s = time.perf_counter() - start
    start = time.perf_counter()
    made = feature_sets.featurize(build.feature_set(retap))
    retap_s = time.perf_counter() - start
    bmeta = bank.read_meta(build.bank(cfg).root)
    fmeta = bank.read_meta(build.feature_set(retap).root, kind="features")
    paths, tokens = collected["paths"], collected["tokens_total"]
    bank_b, feat_b = artifact_bytes(bmeta), artifact_bytes(fmeta)
    L, H = len(fmeta["tap_layers"]), fmeta["hidden_size"]
    floats = made["positions"] * L * H
    print(f"{cfg.model.name}: {paths} paths, {tokens} generated tokens, {args.threads} thread(s); "
          f"re-tap at layers {fmeta['tap_layers']} of {bmeta['num_layers']}, positions "
          f"{fmeta['positions']['checkpoints']} ({made['positions']} stored)")
    print(f"{'stage':<36}{'wall s':>9}{'tokens/s':>10}")
    print(f"{'regenerate (collect, fresh cache)':<36}{regenerate_s:>9.1f}{tokens / regenerate_s:>10.0f}")
    print(f"{'re-tap (featurize, 3 layers)':<36}{retap_s:>9.1f}{tokens / retap_s:>10.0f}")
    print(f"ratio re-tap / regenerate: {retap_s / regenerate_s:.3f} (target <= 0.25)")
    print(f"bytes per path: bank {bank_b / paths:.0f} ({bank_b / tokens:.1f} per generated token), "
          f"features {feat_b / paths:.0f} ({feat_b / floats:.3f} per stored float, "
          f"{fmeta['dtype']})")


if __name__ == "__main__":
    main()
