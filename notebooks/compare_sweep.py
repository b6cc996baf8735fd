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
# # Compare the jobs of a sweep
# One row per job of a multirun (the settings the sweep varied, the learned pruner's
# accuracy, tokens and AUROC, and no_prune's), and accuracy against tokens across jobs.
# The numbers come from the W&B API when the sweep logged online (or `wandb_group` is
# given), else from the run dirs.
#
#     papermill notebooks/compare_sweep.ipynb out.ipynb -p sweep_dir outputs/multirun/<time>

# %% tags=["parameters"]
sweep_dir = None    # a multirun dir (None: the newest under outputs/multirun)
wandb_group = None  # read this W&B group from the API instead of the run dirs
out_dir = None      # where the figure goes (None: the sweep dir)

# %%
from pathlib import Path

import pandas as pd
from IPython.display import Image, display

from stopexp.config import project_root
from stopexp.evaluation import plots
from stopexp.runtime import sweeps

sweep = Path(sweep_dir) if sweep_dir else max((project_root() / "outputs/multirun").iterdir())
runs = sweeps.dir_runs(sweep)
logger = runs[0]["config"]["logger"]
source = "run dirs"
if wandb_group or (logger["name"] == "wandb" and logger["mode"] == "online"):
    try:
        runs = sweeps.wandb_runs(wandb_group or logger["group"] or sweep.name,
                                 logger["project"], logger["entity"])
        source = "W&B API"
    except Exception as e:  # offline, or no API key: the run dirs hold the same numbers
        print(f"W&B API unavailable ({e.__class__.__name__}: {e}); using the run dirs")
print(f"{sweep}: {len(runs)} finished jobs, from the {source}")

# %%
rows = sweeps.table(runs)
df = pd.DataFrame(rows).set_index("job").drop(columns="label")
df

# %%
out = Path(out_dir) if out_dir else sweep
fig = plots.pareto(sweeps.points(runs), out / "sweep_pareto.png")
display(Image(filename=str(fig)))
