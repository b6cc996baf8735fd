"""Stopping inside the running paths, online, against no pruning at the same N, in one run:
STEP's protocol (arXiv 2601.09093: the lowest-scored path aborted when a prompt's KV passes
engine.kv_budget) and DeepConf online's early stop (arXiv 2508.15260). Per method: vote
accuracy and its paired difference from no_prune with a bootstrap interval over the
prompts, tokens, end-to-end wall seconds, the share of the requests' time spent waiting in
the engine's queue and the preemptions (vLLM; a small engine.cpu_kvcache_space forces
them), the peak KV per prompt; and the ratios to no_prune. Then the same methods replayed
from the bank: the pruned paths and tokens must be equal (online equals replay) unless vLLM
preempted a path and its recomputed cache flipped a sampled token ("off bank": the online
Launch-Check-Resume paths that differ from the bank's).

    scripts/main.sh +exp=smollm2_multistep tap.positions.step_ends=true   # the outputs it needs
    python scripts/bench_inpath.py +exp=smollm2_multistep tap.positions.step_ends=true \\
        engine.kv_budget=0.25 engine.cpu_kvcache_space=0.25
"""
from __future__ import annotations

import sys


from stopexp.core.errors import reported
from stopexp.stages.evaluate import evaluate
from stopexp.runtime.overrides import stage_config

METHODS = ("step", "deepconf_online")


def main(overrides: list[str]) -> None:
    base = ["logger=none", f"evaluate.methods=[{','.join(METHODS)},learned]",
            "evaluate.text_metrics=false", *overrides]
    online_cfg = stage_config("evaluate", [*base, "evaluate.mode=online"])
    replay_cfg = stage_config("evaluate", base)
    online = evaluate(online_cfg)
    m, p = online["methods"], online["protocol"]
    full = m["no_prune"]
    print(f"stopping inside the paths, online on engine={online_cfg.engine.name}: {p['prompts']} "
          f"prompts x N={p['n']}, engine.kv_budget={online_cfg.engine.kv_budget}")
    print(f"{'method':<17}{'accuracy':>9}{'vs no_prune [95% CI]':>26}{'tokens':>9}{'ratio':>7}"
          f"{'wall s':>8}{'ratio':>7}{'waiting':>8}{'preempt':>8}{'KV MiB':>8}{'pruned':>7}{'off bank':>9}")
    for name in ("no_prune", *METHODS):
        r = m[name]
        d = r["vs_no_prune"]["accuracy_diff"]
        diff = "" if name == "no_prune" else f"{d['diff']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
        print(f"{name:<17}{r['accuracy']:>9.3f}{diff:>26}{r['tokens_total']:>9.0f}"
              f"{r['tokens_total'] / full['tokens_total']:>7.3f}{r['wall_s']:>8.1f}"
              f"{r['wall_s'] / full['wall_s']:>7.3f}{r.get('waiting_share', float('nan')):>8.3f}"
              f"{r.get('preemptions', -1):>8}{r['peak_kv_bytes'] / 2 ** 20:>8.1f}{r['pruned_paths']:>7}"
              f"{r.get('paths_off_bank', '-'):>9}")
    replay = evaluate(replay_cfg)["methods"]
    for name in METHODS:
        same = all(m[name][k] == replay[name][k] for k in ("accuracy", "tokens_total", "pruned_paths"))
        print(f"{name}: online {'equals' if same else 'DIFFERS FROM'} its replay (accuracy "
              f"{replay[name]['accuracy']:.3f}, tokens {replay[name]['tokens_total']:.0f}, pruned "
              f"{replay[name]['pruned_paths']})")


if __name__ == "__main__":
    with reported():  # a user error (a missing predictor, a bad key) is one line
        main(sys.argv[1:])
