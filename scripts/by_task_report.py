"""Task-adaptive predictors on a mixture's bank (task=mixture), each against confidence per
task: the four ways of stopexp.signals.by_task, trained on the bank's train split
(train.checkpoint, the configured predictor's settings; one_hot is the MLP probe with the
task's one-hot beside the normalised state) and scored on its test paths alive at the
checkpoint:

  shared         one predictor over all tasks
  per_task       one per task, trained on its task's rows, each row scored by its task's
  one_hot        one shared predictor reading the task as a one-hot input
  leave_one_out  each task's rows scored by a predictor trained on the other tasks only

Per task: the within-prompt AUROC, its paired bootstrap difference from confidence over the
task's prompts with both outcomes (evaluate.bootstrap resamples, evaluate.seed), Holm-
corrected over the tasks (stopexp.evaluation.by_task), and the prompts per task.

    python -m stopexp.collect +exp=toy_mixture && python -m stopexp.featurize +exp=toy_mixture
    python scripts/by_task_report.py +exp=toy_mixture

Prints the table as markdown.
"""
from __future__ import annotations

import sys

import numpy as np

from stopexp.core.names import lookup
from stopexp.evaluation.by_task import per_task
from stopexp.metrics.multiplicity import holm_text
from stopexp.metrics.ranking import per_group_auroc
from stopexp.runtime.overrides import stage_config
from stopexp.signals.by_task import BY_TASK
from stopexp.stages import build
from stopexp.store import bank, feature_sets
from stopexp.store.feature_rows import task_labels
from stopexp.training.by_task import fit_by_task
from stopexp.training.fit import score


def per_prompt(scores, rows) -> tuple[np.ndarray, np.ndarray]:
    """(task index, within-prompt AUROC) of each prompt of `rows` (NaN: one outcome)."""
    group = rows["group"].numpy()
    keys, values = per_group_auroc(scores, rows["correct"].numpy(), group)
    first = np.searchsorted(np.sort(group), keys)
    return rows["task"].numpy()[np.argsort(group, kind="stable")][first], values


def main(overrides: list[str]) -> str:
    cfg = stage_config("train", overrides)
    features = build.feature_set(cfg)
    meta = bank.read_meta(bank.require_bank(features.bank))
    spec = feature_sets.spec_of(cfg.tap.layers, meta)
    data = build.training_data(cfg, features, meta)
    labels = task_labels(bank.load_bank(features.bank.root, "test"))
    test = data["test"]
    tasks, base = per_prompt(lookup("baseline", "confidence")(test).numpy(), test)
    lines = ["| predictor | task | prompts | mixed | AUROC | confidence | difference [95% CI], Holm over the tasks |",
             "|---|---|---|---|---|---|---|"]
    for way in BY_TASK:
        predictor = fit_by_task(way, {s: data[s] for s in ("train", "val")}, labels, cfg.predictor,
                                spec, cfg.train, cfg.loss, cfg.train.seed)
        _, values = per_prompt(score(predictor, test).numpy(), test)
        diffs = per_task(values, base, tasks, labels, cfg.evaluate.bootstrap, cfg.evaluate.seed)
        for k, label in enumerate(labels):
            d, mine = diffs[label], tasks == k
            lines.append(f"| {way} | {label} | {d['task_prompts']} | {d['prompts']} | "
                         f"{np.nanmean(values[mine]):.3f} | {np.nanmean(base[mine]):.3f} | "
                         f"{d['diff']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]{holm_text(d)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
