"""Full N vs N -> K Launch-Check-Resume with the learned signal, online, in one run:
accuracy, tokens and wall (split into launch, check and resume); the pruned/full ratios
for tokens and wall (target: wall ratio <= 1.15 x token ratio, and on vLLM within 0.10
of the token ratio, the physical limit); the check's share of generation time (target
<= 1%); the time to replay one policy over 1,000 prompts x 32 paths (target < 2 s); and
the process's peak RSS.

    python scripts/bench_prune.py +exp=toy_contrastive     # needs the pipeline's outputs
    python scripts/bench_prune.py +exp=smollm2_contrastive engine=vllm   # on vLLM, likewise
"""
from __future__ import annotations

import resource
import sys
import time

import numpy as np

from stopexp.core.policies import build_policy, kept_text
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import keep_by_policy, outcome
from stopexp.stages.evaluate import evaluate
from stopexp.runtime.overrides import stage_config


def replay_seconds(cfg, prompts: int = 1000, n: int = 32, k: int = 8) -> float:
    rng = np.random.default_rng(0)
    size = prompts * n
    correct = rng.random(size) < 0.5
    paths = Paths(group=np.repeat(np.arange(prompts), n), path_id=np.tile(np.arange(n), prompts),
                  length=rng.integers(20, 40, size), correct=correct,
                  answer=rng.integers(0, 10, size).astype(str).astype(object),
                  text=np.asarray([""] * size, dtype=object), alive=rng.random(size) < 0.97,
                  batch={})
    scores = rng.normal(size=size)
    start = time.perf_counter()
    outcome(paths, keep_by_policy(paths, scores, build_policy(cfg.policy, keep=k), n), 6, n)
    return time.perf_counter() - start


def main(overrides: list[str]) -> None:
    cfg = stage_config("evaluate", ["evaluate.mode=online", "evaluate.methods=[learned]",
                                    "evaluate.text_metrics=false", *overrides])
    m = evaluate(cfg)
    full, pruned = m["methods"]["no_prune"], m["methods"][cfg.predictor.name]
    p = m["protocol"]
    print(f"Launch-Check-Resume online, {p['prompts']} prompts, check at {p['check_tokens']} tokens")
    print(f"{'':<22}{'accuracy':>9}{'tokens':>10}{'wall s':>9}{'launch s':>9}{'check s':>9}"
          f"{'resume s':>9}")
    kept = kept_text(p["policy"], p["policy_params"], p["k"])
    for name, r in ((f"full N={p['n']}", full), (f"{p['n']} -> {kept} ({cfg.predictor.name})", pruned)):
        print(f"{name:<22}{r['accuracy']:>9.3f}{r['tokens_total']:>10.0f}{r['wall_s']:>9.2f}"
              f"{r['prefix_s']:>9.2f}{r['check_s']:>9.3f}{r['resume_s']:>9.2f}")
    tok_ratio = pruned["tokens_total"] / full["tokens_total"]
    wall_ratio = pruned["wall_s"] / full["wall_s"]
    print(f"token ratio {tok_ratio:.3f}   wall ratio {wall_ratio:.3f}   wall/token ratio "
          f"{wall_ratio / tok_ratio:.2f} (target <= 1.15)   wall - token ratio "
          f"{wall_ratio - tok_ratio:+.3f} (target <= 0.10)")
    print(f"check overhead: {100 * pruned['check_share']:.2f}% of generation time (target <= 1%)")
    print(f"replay of one policy over 1000 prompts x 32 paths: {replay_seconds(cfg):.2f} s (target < 2 s)")
    # this process's peak (an in-process engine's included; vLLM's own engine process is not)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    print(f"peak RSS of this process: {peak:.2f} GiB")


if __name__ == "__main__":
    main(sys.argv[1:])
