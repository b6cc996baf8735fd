"""Hidden states tapped inside vLLM (engine.taps, stopexp/search/vllm_taps.py), measured in
one run on this machine:

1. decode: tokens/s of the same requests (prompts x N paths, the same seeds) on an engine
   that taps tap.layers at every generated position, against one without taps (target
   >= 0.95): engines with and without taps alternate, each runs the requests once to warm
   up and then --repeats times, and the ratio is of the medians; and the prompt tokens each
   prompt's N paths prefill with engine.block_size against vLLM's CPU default of 128 (1.0 =
   one prefill per prompt);
2. collect: collect with in-engine taps (it writes the features too), against collect
   without them plus featurize's teacher-forced forward, in the config's dtype and in the
   other one of float32 / bfloat16 (target <= 0.6). Every run starts its own vLLM and
   writes into its own directory, so nothing is reused.

    python scripts/bench_taps.py +exp=smollm2_multistep --prompts 4
    python scripts/bench_taps.py +exp=smollm2_multistep --prompts 4 --repeats 3 --skip-collect
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from omegaconf import OmegaConf

from stopexp.models.vllm_lm import open_vllm_engine
from stopexp.search.sample import path_seeds, prompt_ids
from stopexp.search.stepping import Running
from stopexp.search.vllm_steps import Stepper
from stopexp.stages.build import collection, feature_set, sampling
from stopexp.stages.collect import collect
from stopexp.store.feature_sets import featurize
from stopexp.tasks import build_task
from stopexp.core.commands import override
from stopexp.runtime.overrides import stage_config


def config(overrides: list[str], out: str):
    return stage_config("collect", [override("paths.output_dir", out), *overrides])


def decode(cfg, prompts: int, every: bool, block_size: int | None = None, repeats: int = 1) -> dict:
    """tokens/s (the median of `repeats` runs after one to warm up) and prefilled prompt
    tokens of `prompts` x N paths on a fresh in-process engine (taps at every position with
    `every`, else none)."""
    engine_cfg = OmegaConf.create(OmegaConf.to_container(cfg.engine, resolve=True) | (
        {} if block_size is None else {"block_size": block_size}))
    positions = {"checkpoints": [], "stride": 1, "separator": None}
    runs = []
    with open_vllm_engine(cfg.model, engine_cfg, cfg.paths.cache_dir, cfg.task, sampling(cfg),
                          in_process=True, tap=cfg.tap if every else None,
                          positions=positions) as (engine, _, tokenizer):
        problems = build_task(cfg.task).problems("test", prompts)
        for _ in range(repeats + 1):
            paths = [Running((i, j), prompt_ids(tokenizer, p.prompt), s)
                     for i, p in enumerate(problems)
                     for j, s in enumerate(path_seeds(cfg.seed, p.prompt, cfg.search.n_paths))]
            start = time.perf_counter()
            stepper = Stepper(engine, paths)
            while stepper.running:
                stepper.step()
            runs.append((time.perf_counter() - start, paths))
            engine.llm.llm_engine.reset_prefix_cache()  # each run prefills as the first did
    wall = statistics.median(w for w, _ in runs[1:])
    paths = runs[0][1]
    tokens = sum(len(p.tokens) for p in paths)
    prompt_tokens = sum(len(paths[i * cfg.search.n_paths].prompt) for i in range(prompts))
    return {"tokens": tokens, "wall_s": wall, "tokens_s": tokens / wall,
            "prefilled": sum(p.prefilled for p in paths), "prompt_tokens": prompt_tokens,
            "ids": [p.tokens for p in paths],
            "same": all([p.tokens for p in ps] == [p.tokens for p in paths] for _, ps in runs)}


def collect_runs(overrides: list[str], prompts: int) -> dict:
    """Seconds of collect with taps, and of collect without taps + featurize."""
    shrink = [f"collect.prompts={{train:{prompts},val:0,test:0}}", f"collect.shard_prompts={prompts}"]
    out = {}
    for taps in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = config([*overrides, *shrink, f"engine.taps={str(taps).lower()}"], tmp)
            start = time.perf_counter()
            collect(collection(cfg))
            collected = time.perf_counter() - start
            start = time.perf_counter()
            summary = featurize(feature_set(cfg))
            out[taps] = {"collect_s": collected, "featurize_s": time.perf_counter() - start,
                         "positions": summary["positions"], "tapped": summary["tapped_shards"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help="prompts per measurement")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per engine, after a warm-up")
    parser.add_argument("--skip-collect", action="store_true", help="part 1 only")
    args, overrides = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(overrides, tmp)
        print(f"decode: {args.prompts} prompts x {cfg.search.n_paths} paths, {cfg.engine.dtype}, "
              f"enforce_eager={cfg.engine.enforce_eager}, taps at layers {list(cfg.tap.layers)}")
        r = args.repeats
        runs = {"no taps": decode(cfg, args.prompts, False, repeats=r),
                "taps": decode(cfg, args.prompts, True, repeats=r),
                "no taps again": decode(cfg, args.prompts, False, repeats=r),
                "taps again": decode(cfg, args.prompts, True, repeats=r),
                "block 128": decode(cfg, args.prompts, False, 128)}
    print(f"{'':<16}{'tokens':>8}{'wall s':>9}{'tokens/s':>10}{'prefilled':>11}{'prompts':>9}")
    for name, r in runs.items():
        print(f"{name:<16}{r['tokens']:>8}{r['wall_s']:>9.2f}{r['tokens_s']:>10.1f}"
              f"{r['prefilled']:>11}{r['prompt_tokens']:>9}")
    same = runs["taps"]["ids"] == runs["no taps"]["ids"] and all(r["same"] for r in runs.values())
    best = {k: max(runs[k]["tokens_s"], runs[f"{k} again"]["tokens_s"]) for k in ("taps", "no taps")}
    print(f"tokens/s with taps / without (best of two engines each, each the median of "
          f"{args.repeats} run(s) after a warm-up): {best['taps'] / best['no taps']:.3f} "
          f"(target >= 0.95); the same tokens in every run: {same}")
    for name in ("no taps", "block 128"):
        r = runs[name]
        print(f"prefills per prompt, block_size {cfg.engine.block_size if name == 'no taps' else 128}: "
              f"{r['prefilled'] / r['prompt_tokens']:.3f} (1.0: one prefill per prompt)")
    if args.skip_collect:
        return
    dtypes = [cfg.engine.dtype] + [d for d in ("float32", "bfloat16") if d != cfg.engine.dtype][:1]
    print(f"\ncollect: {args.prompts} prompts x {cfg.search.n_paths} paths, every run a fresh vLLM")
    print(f"{'dtype':<10}{'taps: collect s':>16}{'no taps: collect s':>20}{'featurize s':>13}"
          f"{'ratio':>8}")
    for dtype in dtypes:
        got = collect_runs([*overrides, f"engine.dtype={dtype}", f"model.dtype={dtype}"], args.prompts)
        on, off = got[True], got[False]
        ratio = (on["collect_s"] + on["featurize_s"]) / (off["collect_s"] + off["featurize_s"])
        print(f"{dtype:<10}{on['collect_s'] + on['featurize_s']:>16.1f}{off['collect_s']:>20.1f}"
              f"{off['featurize_s']:>13.1f}{ratio:>8.3f}   (target <= 0.6; {on['positions']} "
              f"positions, {on['tapped']} shard(s) tapped in the engine)")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
