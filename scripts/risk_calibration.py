"""policy=risk at several alphas: the threshold Learn-then-Test calibrates on the
validation prompts, and the risk it realises on the test prompts, with its 95% interval
(Clopper-Pearson for risk=answer, a bootstrap over prompts for risk=voter), the share of
the checked paths it prunes, vote accuracy and tokens (against no_prune's), per method.

    python scripts/risk_calibration.py +exp=toy_contrastive          # needs the pipeline's outputs
    python scripts/risk_calibration.py +exp=toy_contrastive policy.risk=answer --alphas 0.05 0.1 0.2

Arguments besides --alphas, --delta and --methods are evaluate's overrides; the methods
shown default to the learned predictor and confidence. The predictor policy=risk scores
with (its epoch picked on training prompts: policy.selection_share) is trained when missing.
"""
from __future__ import annotations

import argparse


from stopexp.stages.evaluate import evaluate
from stopexp.stages.train import train
from stopexp.runtime.overrides import stage_config


def rows(alpha: float, delta: float, overrides: list[str], methods: list[str] | None) -> list[str]:
    cfg = stage_config("evaluate", ["evaluate.text_metrics=false", "evaluate.methods=[learned]",
                                    "policy=risk", f"policy.alpha={alpha}", f"policy.delta={delta}",
                                    *overrides])
    train(cfg, progress=False)  # found when trained
    m = evaluate(cfg)
    base, n = m["methods"]["no_prune"], m["protocol"]["n"]
    out = []
    for name in methods or [cfg.predictor.name, "confidence"]:
        r = m["methods"][name]
        risk, cal = r["risk"], r["risk"]["calibration"]
        taus = "/".join("-" if t is None else f"{t:.4g}" for t in cal["thresholds"])
        pruned = 1 - r["k"] / (n * r["alive_at_check"])
        holds = "yes" if risk["realised"] <= alpha else ("within" if risk["interval"][0] <= alpha else "NO")
        out.append(f"{alpha:<7}{delta:<7}{name:<12}{taus:>12}{cal['risk_hat']:>9.4f}"
                   f"{risk['realised']:>10.4f} [{risk['interval'][0]:.4f},{risk['interval'][1]:.4f}]"
                   f"{holds:>7}{pruned:>8.3f}{r['accuracy']:>7.3f} ({base['accuracy']:.3f})"
                   f"{r['tokens_total']:>10.0f} ({r['tokens_ratio']:.3f})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--methods", nargs="+", default=None)
    args, overrides = parser.parse_known_args()
    lines = [f"{'alpha':<7}{'delta':<7}{'method':<12}{'threshold':>12}{'val risk':>9}"
             f"{'test risk [95% interval]':>28}{'<=a':>7}{'pruned':>8}{'acc (no_prune)':>15}"
             f"{'tokens (ratio)':>19}"]
    for alpha in args.alphas:
        lines += rows(alpha, args.delta, overrides, args.methods)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
