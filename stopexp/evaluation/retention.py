"""The retention guideline: which share gamma = K/N of the launched paths to keep after the
check, as a power law of the budget and the lengths (the paper's form),

    1/gamma = a * C^b * L_prefix^c / L_task^d,
    log(1/gamma) = log a + b log C + c log L_prefix - d log L_task   (least squares).

Data, from the jobs of one or more multirun dirs (each job's `metrics.json` and config):
- a configuration = one entry of the job's `points` for its learned method (config
  `predictor.name`): launch N = `n` paths, keep K = `k`; gamma = k / n.
- C = `tokens_total` / `protocol.prompts`: tokens that configuration spends per prompt.
- L_prefix = `protocol.check_tokens`: tokens each path generates before the check.
- L_task = `methods.no_prune.tokens_total` / (`protocol.prompts` * `protocol.n`): the mean
  length of an unpruned path.
- the gamma *chosen* at budget C: configurations of jobs that share L_prefix and the task
  (config `task`) are pooled (whatever their N); the chosen ones form the Pareto front, each
  more accurate than every cheaper one. Every front point is one data point
  (C, L_prefix, L_task, gamma), L_task averaged over the pooled jobs.
"""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

PARAMS = ("a", "b", "c", "d")
# what to sweep when a regressor is constant (its exponent is then not identifiable)
SWEEP_HINT = {"C": "search.n_paths or evaluate.retention", "L_prefix": "search.check_at",
              "L_task": "the task length, e.g. task.n_steps=4,6,8"}


def guideline_points(runs: list[dict]) -> list[dict]:
    """The chosen (C, L_prefix, L_task, gamma) of the jobs `runs` (stopexp.runtime.sweeps.dir_runs)."""
    groups = defaultdict(lambda: {"configs": set(), "l_task": []})
    for r in runs:
        m, method = r["metrics"], r["config"]["predictor"]["name"]
        p = m["protocol"]
        g = groups[(p["check_tokens"], json.dumps(r["config"]["task"], sort_keys=True))]
        g["l_task"].append(m["methods"]["no_prune"]["tokens_total"] / (p["prompts"] * p["n"]))
        g["configs"] |= {(pt["tokens_total"] / p["prompts"], pt["accuracy"], pt["k"] / pt["n"])
                         for pt in m["points"] if pt["method"] == method}
    out = []
    for (l_prefix, _), g in groups.items():
        best = -np.inf
        for c, acc, gamma in sorted(g["configs"], key=lambda x: (x[0], -x[1])):
            if acc > best:
                out.append({"C": c, "L_prefix": float(l_prefix),
                            "L_task": float(np.mean(g["l_task"])), "gamma": gamma})
                best = acc
    return out


def fit_retention(points: list[dict]) -> dict:
    """Least-squares a, b, c, d (and R^2 in log space) of the guideline; refuses data that
    cannot determine them."""
    if len(points) < len(PARAMS):
        raise ValueError(f"cannot fit the retention guideline: {len(points)} points for "
                         f"{len(PARAMS)} parameters (a, b, c, d); sweep more settings")
    logs = {k: np.log([p[k] for p in points]) for k in ("C", "L_prefix", "L_task")}
    for k, v in logs.items():
        if np.ptp(v) < 1e-9:
            raise ValueError(f"cannot fit the retention guideline: {k} is the same at every "
                             f"point, so its exponent is undetermined; sweep {SWEEP_HINT[k]}")
    X = np.column_stack([np.ones(len(points)), logs["C"], logs["L_prefix"], -logs["L_task"]])
    if np.linalg.matrix_rank(X) < len(PARAMS):
        raise ValueError("cannot fit the retention guideline: log C, log L_prefix and "
                         "log L_task are collinear over these points; sweep them independently")
    y = -np.log([p["gamma"] for p in points])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    ss = float(((y - y.mean()) ** 2).sum())
    return {"a": float(np.exp(coef[0])), "b": float(coef[1]), "c": float(coef[2]),
            "d": float(coef[3]), "r2": 1 - float((resid ** 2).sum()) / ss if ss else float("nan"),
            "points": len(points)}


def predict_inverse_gamma(coef: dict, C, L_prefix, L_task) -> np.ndarray:
    """1/gamma of the fitted guideline."""
    return (coef["a"] * np.power(C, coef["b"]) * np.power(L_prefix, coef["c"])
            / np.power(L_task, coef["d"]))
