"""Sweeps: the value a Hydra sweeper optimizes, and the jobs of a finished sweep.

A multirun dir (`outputs/multirun/<time>`) holds one subdir per job with Hydra's
`.hydra/config.yaml` and the pipeline's `metrics.json`; the same jobs are also W&B runs
of one group (see stopexp/runtime/tracking.py). Both sources give (job, config, summary), the
summary keyed `<method>/<metric>` as evaluate logs it to W&B, so one table serves both.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from omegaconf import OmegaConf

import stopexp.config  # noqa: F401  (the resolvers a saved config uses)

log = logging.getLogger(__name__)
# settings that differ between jobs without being part of the study
IGNORED = ("paths.", "logger.", "hydra.")
COLUMNS = ("accuracy", "tokens_total", "tokens_ratio", "auroc", "auroc_pooled")


def worst_value() -> float:
    """The worst objective for the running sweeper's direction (optuna: `direction`),
    so a failed trial ranks last instead of ending the sweep."""
    from hydra.core.hydra_config import HydraConfig

    direction = "minimize"
    if HydraConfig.initialized():
        direction = str(OmegaConf.select(HydraConfig.get(), "sweeper.direction", default=direction))
    return -math.inf if "max" in direction.lower() else math.inf


def objective(metrics: dict, key: str) -> float:
    """metrics[key] (a dotted path) for the sweeper; NaN or None counts as the worst value.
    A key absent from the metrics is a typo in `optimized_metric`, and raises."""
    node = metrics
    for part in key.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(f"optimized_metric: {key!r} is not in metrics.json "
                           f"(top-level keys: {', '.join(sorted(metrics))})")
    value = math.nan if node is None else float(node)
    if math.isnan(value):
        log.warning("optimized_metric %s is NaN; reporting the worst value", key)
        return worst_value()
    return value


def summary_of(metrics: dict) -> dict:
    """evaluate's metrics.json flattened the way it logs its W&B summary."""
    return {f"{m}/{k}": v for m, r in metrics["methods"].items() for k, v in r.items()
            if isinstance(v, (int, float))}


def dir_runs(sweep_dir: str | Path) -> list[dict]:
    """The finished jobs of a multirun dir in job order (a job that failed has no
    metrics.json and is left out)."""
    jobs = [d for d in Path(sweep_dir).iterdir() if (d / "metrics.json").exists()
            and (d / ".hydra" / "config.yaml").exists()]
    if not jobs:
        raise FileNotFoundError(f"{sweep_dir}: no finished job (a subdir with metrics.json "
                                "and .hydra/config.yaml); is it a multirun dir?")
    jobs.sort(key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))
    runs = []
    for d in jobs:
        try:
            metrics = json.loads((d / "metrics.json").read_text())
            config = OmegaConf.to_container(OmegaConf.load(d / ".hydra" / "config.yaml"), resolve=True)
            summary = summary_of(metrics)
        except Exception as e:  # a damaged file: name it rather than fail in a library
            raise ValueError(f"job {d}: metrics.json or .hydra/config.yaml is unreadable "
                             f"({e.__class__.__name__}: {str(e)[:160]}); rerun that job (its "
                             f"overrides are in {d / '.hydra' / 'overrides.yaml'}) or delete {d} "
                             "to leave it out") from e
        runs.append({"job": d.name, "dir": d, "metrics": metrics, "summary": summary,
                     "config": config})
    return runs


def wandb_runs(group: str, project: str = "stopexp", entity: str | None = None) -> list[dict]:
    """The finished pipeline runs of a W&B group (needs the W&B API, i.e. internet)."""
    import wandb

    found = wandb.Api().runs(f"{entity}/{project}" if entity else project,
                             filters={"group": group, "jobType": "pipeline", "state": "finished"})
    return [{"job": r.name, "config": dict(r.config), "summary": dict(r.summary)} for r in found]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def varying(configs: list[dict]) -> list[str]:
    """Config keys whose values differ between jobs: what the sweep changed."""
    flats = [_flat(c) for c in configs]
    keys = dict.fromkeys(k for f in flats for k in f)
    return [k for k in keys if not k.startswith(IGNORED)
            and len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]


def table(runs: list[dict]) -> list[dict]:
    """One row per job: the settings the sweep varied (as `label` too), then the learned
    method's numbers and no_prune's, from the summary."""
    keys = varying([r["config"] for r in runs])
    rows = []
    for r in runs:
        flat, s = _flat(r["config"]), r["summary"]
        method = flat["predictor.name"]
        settings = {k: flat.get(k) for k in keys}
        row = {"job": r["job"], "label": " ".join(f"{k}={v}" for k, v in settings.items()) or r["job"],
               **settings, "method": method, "n": s.get(f"{method}/n"), "k": s.get(f"{method}/k")}
        row.update({c: s.get(f"{method}/{c}") for c in COLUMNS})
        row.update({f"no_prune_{c}": s.get(f"no_prune/{c}") for c in ("accuracy", "tokens_total")})
        rows.append(row)
    return rows


def _point(method: str, n, k, accuracy, tokens_total) -> dict:
    return {"method": method, "n": n, "k": k, "accuracy": accuracy, "tokens_total": tokens_total}


def points(runs: list[dict]) -> list[dict]:
    """Accuracy-vs-tokens points for stopexp.evaluation.plots.pareto, one series per job: its learned
    method at every (N, K) of its metrics.json (a W&B summary has only the protocol's),
    and no_prune at each N, once per distinct point."""
    pts, base = [], {}
    for r, row in zip(runs, table(runs)):
        saved = r.get("metrics", {}).get("points", [])
        mine = [p for p in saved if p["method"] == row["method"]] or [
            _point(row["method"], row["n"], row["k"], row["accuracy"], row["tokens_total"])]
        pts += [{**p, "method": row["label"]} for p in mine]
        for p in [p for p in saved if p["method"] == "no_prune"] or [
                _point("no_prune", row["n"], row["n"], row["no_prune_accuracy"],
                       row["no_prune_tokens_total"])]:
            base[(p["n"], p["tokens_total"])] = p
    return pts + list(base.values())
