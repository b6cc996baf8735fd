# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Run report
# Every standard figure of one pipeline run, rebuilt from its outputs: the table and the
# Pareto points from `metrics.json`; the histograms, survival, prune steps and calibration
# by replaying the run's trace bank with its trained predictors (the cached artifacts its
# config hashes to), through the same `stopexp.evaluation.plots` calls the evaluate stage makes.
#
#     papermill notebooks/run_report.ipynb out.ipynb -p run_dir outputs/runs/pipeline/<time>

# %% tags=["parameters"]
run_dir = None  # a pipeline run dir (None: the newest under outputs/runs/pipeline)
out_dir = None  # where the figures go (None: <run_dir>/report)

# %%
import json
from pathlib import Path

import numpy as np
from IPython.display import Image, display
from omegaconf import OmegaConf

from stopexp.config import Config, project_root, validate
from stopexp.core.policies import build_policy
from stopexp.evaluation import plots
from stopexp.evaluation.accounting import keep_by_policy, outcome, replay_paths
from stopexp.evaluation.report import make_plots
from stopexp.signals.saved_predictor import read_checkpoint
from stopexp.stages import build
from stopexp.stages.evaluate import print_table
from stopexp.stages.scorers import build_scorers
from stopexp.core.names import names as registered
from stopexp.stopping.replay import stopping_outcomes
from stopexp.store import bank
from stopexp.store import feature_sets

run = Path(run_dir) if run_dir else max((project_root() / "outputs/runs/pipeline").iterdir())
out = Path(out_dir) if out_dir else run / "report"
metrics = json.loads((run / "metrics.json").read_text())
assert metrics.get("search") != "beam", "a beam-search run has no Launch-Check-Resume figures"
cfg = validate(OmegaConf.merge(OmegaConf.structured(Config),
                               OmegaConf.load(run / ".hydra" / "config.yaml")))
print(run)
print(print_table(metrics))

# %% [markdown]
# ## Replay the check
# Each method scores the live paths at the check, the policy keeps K of N per prompt, the
# kept paths finish and vote. The replay must give the run's accuracies exactly (online
# runs too: every path has its own random stream).

# %%
p = metrics["protocol"]
feats = build.feature_set(cfg)
root = bank.require_bank(feats.bank)
meta = bank.read_meta(root)
paths = replay_paths(root, feature_sets.require_features(feats), p["split"], p["check_tokens"])
names = [m for m in metrics["methods"] if m != "no_prune" and m not in registered("stopping")]
scorers = build_scorers(cfg, names, feature_sets.spec_of(cfg.tap.layers, meta), feats)
scores = {m: scorers[m](paths.batch).numpy().astype(float) for m in names}
outcomes = {"no_prune": outcome(paths, np.ones(len(paths.length), bool), p["check_tokens"], p["n"])}
for m, s in scores.items():
    kept = keep_by_policy(paths, s, build_policy(cfg.policy, keep=p["k"]), p["n"])
    outcomes[m] = outcome(paths, kept, p["check_tokens"], p["n"])
# the stopping protocols (ESC, Adaptive-Consistency, DeepConf online, ...) replay the bank
stopping = [m for m in metrics["methods"] if m in registered("stopping")]
confs = list(bank.load_bank(root, p["split"])["token_conf"][:])
outcomes.update(stopping_outcomes(paths, confs, stopping, p["n"], cfg.evaluate.stopping, cfg.search.group_window))
for m, o in outcomes.items():
    # an online run's oracle ranked by outcome, the replayed one by Monte Carlo labels
    if metrics["mode"] == "replay" or m != "oracle":
        assert np.isclose(o["correct"].mean(), metrics["methods"][m]["accuracy"]), m
print(f"replayed {len(outcomes)} methods on {p['prompts']} prompts: accuracies match metrics.json")

# %% [markdown]
# ## Figures

# %%
figs = make_plots(paths, outcomes, scores, metrics["points"], out, metrics["methods"], metrics)
history = read_checkpoint(build.predictor_dir(cfg, feats), cfg.predictor)["history"]  # names a damaged file
figs["loss_curve"] = plots.loss_curve(history, out / "loss_curve.png")
for name, path in figs.items():
    print(name)
    display(Image(filename=str(path)))
