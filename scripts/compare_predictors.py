"""Within-prompt and pooled AUROC of every predictor x loss on one trace bank, next to
the non-learnable signals at the same checkpoint (validation and test splits).

    python scripts/compare_predictors.py +exp=toy_reward      # after its collect
"""
from __future__ import annotations

import sys


from stopexp.signals.methods import BASELINES
from stopexp.stages import build
from stopexp.stages.train import train
from stopexp.store import bank
from stopexp.training.fit import evaluate_scores
from stopexp.runtime.overrides import stage_config

PREDICTORS = ("statistic", "linear", "mlp", "conf_features")
LOSSES = ("contrastive", "pairwise", "reward_regression", "mse")


def main(overrides: list[str]) -> None:
    rows = []
    for pred in PREDICTORS:
        for loss in LOSSES if pred != "statistic" else ("contrastive",):
            cfg = stage_config("train", [*overrides, f"predictor={pred}", f"loss={loss}"])
            m = train(cfg, progress=False)
            rows.append((f"{pred} / {loss}", m["val"], m["test"]))
    root = bank.require_bank(build.bank(cfg))
    data = build.training_data(cfg, build.feature_set(cfg), bank.read_meta(root))
    for name, scorer in BASELINES.items():
        rows.append((name, evaluate_scores(scorer(data["val"]), data["val"]),
                     evaluate_scores(scorer(data["test"]), data["test"])))
    print(f"checkpoint {cfg.train.checkpoint} of {cfg.search.max_new_tokens} tokens, bank {root.name}")
    print(f"{'signal':<34}{'val AUROC':>10}{'pooled':>8}{'test AUROC':>11}{'pooled':>8}")
    for name, val, test in rows:
        print(f"{name:<34}{val['auroc']:>10.3f}{val['auroc_pooled']:>8.3f}"
              f"{test['auroc']:>11.3f}{test['auroc_pooled']:>8.3f}")
    best = max((r for r in rows if r[0].split(" ")[0] not in BASELINES), key=lambda r: r[1]["auroc"])
    base = max((r for r in rows if r[0] in BASELINES), key=lambda r: r[1]["auroc"])
    print(f"best learned {best[0]} vs best non-learnable {base[0]} (val, within-prompt): "
          f"{best[1]['auroc'] - base[1]['auroc']:+.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
