"""Soft against hard labels, and the published super token, on one bank with Monte Carlo
labels at train.checkpoint (collect.mc_rollouts > 0 with the checkpoint among
tap.checkpoints): each predictor trained (or found) by the train stage with

  soft   loss=reward_regression (the Monte Carlo label of each prefix, the STOP paper's)
  hard   loss=reward_regression loss.labels=reward (the path's 0/1 outcome, the same loss)
  pairs  loss=contrastive (the outcome, ranked within the prompt: stopexp's default)

and scored on the test paths alive at the checkpoint: the within-prompt AUROC, its paired
bootstrap difference from confidence over the prompts with both outcomes (evaluate.bootstrap
resamples, evaluate.seed), and soft minus hard for each predictor; every interval with its
bootstrap p-value and Holm's over the table's intervals (one family), * where it survives.

    python -m stopexp.collect +exp=smollm2_super_token && python -m stopexp.featurize +exp=smollm2_super_token
    python scripts/labels_report.py +exp=smollm2_super_token [--predictors=mlp,super_token] [--labels=soft,hard,pairs]

Hydra overrides compose the bank's config as train's do; nothing is collected or
featurized here (a missing bank or features ends the script with the command that makes
them). The super token (predictor=super_token) loads the LM, encodes every prefix in its
first epoch and keeps their K/V for the next (train.prefix_cache_gb): on 2 cores it is the
slow row. Prints the table as markdown and writes
labels.json into --out (default <paths.output_dir>/labels/<features key>).
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path


from stopexp.core.errors import ConfigError, reported
from stopexp.core.names import predictor_names
from stopexp.core.protocol import checkpoint_tokens
from stopexp.evaluation import scaling
from stopexp.metrics.multiplicity import correct_family, holm_note, holm_text
from stopexp.runtime.artifacts import write_json
from stopexp.signals import methods as M
from stopexp.stages import build
from stopexp.stages.scorers import load_trained
from stopexp.stages.train import train
from stopexp.store import bank, feature_sets
from stopexp.runtime.overrides import stage_config

log = logging.getLogger("labels_report")

LABELS = {"soft": ["loss=reward_regression"],
          "hard": ["loss=reward_regression", "loss.labels=reward"],
          "pairs": ["loss=contrastive"]}
OPTIONS = ("--predictors", "--labels", "--out")
EXAMPLES = {"--predictors": "mlp,super_token", "--labels": "soft,hard", "--out": "DIR"}


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    options, overrides = {}, []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if key in OPTIONS:
            if not eq or not value:
                raise ConfigError(f"{key}: give a value, e.g. {key}={EXAMPLES[key]}")
            options[key] = value
        elif arg.startswith("--"):
            raise ConfigError(f"{key}: unknown option; allowed: {', '.join(OPTIONS)} and Hydra overrides")
        else:
            overrides.append(arg)
    for key, allowed in (("--labels", tuple(LABELS)), ("--predictors", predictor_names())):
        if key in options:
            values = list(dict.fromkeys(v for v in options[key].split(",") if v))
            if not values or any(v not in allowed for v in values):
                raise ConfigError(f"{key}: {options[key]!r}; give a comma-separated list of "
                                  f"{', '.join(allowed)}")
            options[key] = values
    return options, overrides


def main(argv: list[str]) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    options, overrides = parse(argv)
    cfg = stage_config("train", overrides)
    predictors = options.get("--predictors", ["mlp", "super_token"])
    labels = options.get("--labels", list(LABELS))
    features = build.feature_set(cfg)
    root = bank.require_bank(features.bank, overrides)  # never collects: names the command
    meta = bank.read_meta(root)
    ckpt = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
    if ckpt not in meta.get("checkpoints", []):
        raise ConfigError(f"train.checkpoint: the bank {root.name} holds Monte Carlo labels at "
                          f"{meta.get('checkpoints') or 'no prefix'} (collect.mc_rollouts="
                          f"{meta.get('mc_rollouts', 0)}), not at {ckpt} tokens; collect with "
                          "collect.mc_rollouts > 0 and the checkpoint among tap.checkpoints")
    spec = feature_sets.spec_of(cfg.tap.layers, meta)
    test = build.training_data(cfg, features, meta, overrides, prefixes=True)["test"]
    correct, group = test["correct"].numpy(), test["group"].numpy()
    confidence = M.confidence(test).numpy().astype(float)
    n_boot, seed = int(cfg.evaluate.bootstrap), int(cfg.evaluate.seed)
    rows, scores = [], {}
    for predictor in predictors:
        for label in labels:
            sub = stage_config("train", [*overrides, f"predictor={predictor}", *LABELS[label]])
            start = time.time()
            m = train(sub, overrides=overrides, progress=False)
            s = M.learned(load_trained(sub, spec, features, overrides))(test).numpy().astype(float)
            scores[(predictor, label)] = s
            rows.append({"predictor": predictor, "labels": label, "train_prompts": m["train_prompts"],
                         "checkpoint": m["checkpoint"],
                         "best_epoch": m["best_epoch"], "epochs": m["epochs"],
                         "val_auroc": m["val"]["auroc"],
                         **scaling.versus(s, confidence, correct, group, n_boot, seed),
                         "seconds": round(time.time() - start, 1)})
            log.info("%s / %s: test %.3f (%.0f s)", predictor, label, rows[-1]["auroc"],
                     rows[-1]["seconds"])
    soft_hard = {p: scaling.versus(scores[(p, "soft")], scores[(p, "hard")], correct, group, n_boot, seed)
                 for p in predictors if (p, "soft") in scores and (p, "hard") in scores}
    family = correct_family(rows + list(soft_hard.values()))  # one table, one family
    report = {"bank": root.name, "holm_family": family, "bootstrap": n_boot, "features": features.key, "checkpoint_tokens": ckpt,
              "mc_rollouts": meta.get("mc_rollouts"), "test_paths": len(correct),
              "confidence_auroc": rows[0]["reference_auroc"] if rows else None,
              "rows": rows, "soft_minus_hard": soft_hard}
    out = Path(options["--out"]) if options.get("--out") else \
        Path(cfg.paths.output_dir) / "labels" / features.key
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "labels.json", report)
    print(table(report))
    print(f"\nlabels.json in {out}")
    return report


def table(report: dict) -> str:
    lines = [f"Test paths alive at {report['checkpoint_tokens']} tokens ({report['test_paths']}), "
             f"{report['mc_rollouts']} Monte Carlo rollouts per live prefix; confidence "
             f"{report['confidence_auroc']:.3f}",
             "", "| predictor | labels | train prompts | val | test | test - confidence | mixed prompts |",
             "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lo, hi = r["ci"]
        lines.append(f"| {r['predictor']} | {r['labels']} | {r['train_prompts']} | {r['val_auroc']:.3f} | "
                     f"{r['auroc']:.3f} | "
                     f"{r['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]{holm_text(r)} | {r['mixed_prompts']} |")
    for p, d in report["soft_minus_hard"].items():
        lo, hi = d["ci"]
        lines.append(f"\n{p}: soft - hard {d['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]{holm_text(d)}")
    if "holm_family" in report:
        lines.append(f"\n{holm_note(report['holm_family'], report['bootstrap'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    with reported():
        main(sys.argv[1:])
