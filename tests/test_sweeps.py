import itertools
import json
import math
import shlex
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from conftest import CONF, ROOT, compose
from stopexp.config import validate
from stopexp.evaluation.retention import fit_retention, guideline_points, predict_inverse_gamma
from stopexp.runtime import sweeps
from stopexp.runtime.tracking import run_group

OPTUNA = ["+exp=toy_contrastive", "+hparams_search=optuna_toy"]


def one_of_each(axes: list[list]) -> set[tuple]:
    """Jobs that take every value of every axis once, the other axes at their first value
    (the full product costs a compose per job)."""
    return {tuple(a[i] if n == j else a[0] for n, a in enumerate(axes))
            for j, axis in enumerate(axes) for i in range(len(axis))}


@pytest.fixture
def hydra_job(monkeypatch, tmp_path):
    """Make HydraConfig look like one job of a sweep (restored afterwards)."""
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)

    def set_job(overrides=(), mode=RunMode.MULTIRUN):
        cfg = compose("pipeline", [*overrides, f"hydra.sweep.dir={tmp_path}/sweep-7"],
                      return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.mode = mode
        HydraConfig.instance().set_config(cfg)
        return cfg
    return set_job


def test_multirun_jobs_share_a_wandb_group_named_after_the_sweep(hydra_job):
    assert run_group(compose("pipeline").logger) is None  # no Hydra job at all
    assert run_group(hydra_job().logger) == "sweep-7"
    assert run_group(hydra_job(["logger.group=mine"]).logger) == "mine"
    assert run_group(hydra_job(mode=RunMode.RUN).logger) is None


def test_objective_counts_nan_as_the_worst_value_and_refuses_a_typo(hydra_job):
    metrics = {"methods": {"mlp": {"accuracy": 0.75, "auroc": math.nan}}}
    assert sweeps.objective(metrics, "methods.mlp.accuracy") == 0.75
    assert sweeps.objective(metrics, "methods.mlp.auroc") == math.inf  # no sweeper: minimize
    hydra_job(OPTUNA)
    assert sweeps.objective(metrics, "methods.mlp.auroc") == -math.inf  # optuna_toy maximizes
    with pytest.raises(KeyError, match="methods.mpl.accuracy"):
        sweeps.objective(metrics, "methods.mpl.accuracy")


def test_optuna_search_space_composes_and_validates_at_each_choice():
    cfg = compose("pipeline", OPTUNA, return_hydra_config=True)
    sw = cfg.hydra.sweeper
    assert sw._target_.endswith("OptunaSweeper") and sw.direction == "maximize"
    assert sw.sampler.seed == 1234 and sw.n_trials >= 10 and 0 < sw.max_failure_rate < 1
    assert set(sw.params) == {"predictor", "loss", "policy", "train.lr"}
    choices = [OmegaConf.to_container(sw.params)[k][len("choice("):-1].split(", ")
               for k in ("predictor", "loss", "policy")]
    for predictor, loss, policy in one_of_each(choices):
        c = validate(compose("pipeline", [*OPTUNA, f"predictor={predictor}", f"loss={loss}",
                                          f"policy={policy}", "train.lr=0.003"]))
        assert c.optimized_metric == f"methods.{predictor}.accuracy"
        # each trial's policy gets the budget in its own knob; the others stay at default
        budget = {"topk": ("keep", 8), "quantile": ("quantile", 0.875),
                  "adaptive": ("target_prune_rate", 0.875)}[policy]
        assert c.policy[budget[0]] == budget[1]
        assert (c.policy.quantile, c.policy.target_prune_rate) == (
            0.875 if policy == "quantile" else 0.5, 0.875 if policy == "adaptive" else 0.5)


def test_slurm_and_joblib_launchers_compose_with_their_values():
    cfg = compose("pipeline", ["+exp=toy_contrastive", "hydra/launcher=submitit_slurm"],
                  return_hydra_config=True)
    la = cfg.hydra.launcher
    assert la._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (la.partition, la.gpus_per_node, la.cpus_per_task, la.mem_gb, la.timeout_min,
            la.array_parallelism) == ("gpu", 1, 8, 64, 240, 16)
    assert la.setup[0].startswith("export OMP_NUM_THREADS=8")
    assert type(instantiate(la)).__name__ == "SlurmLauncher"
    joblib = compose("pipeline", ["hydra/launcher=joblib"], return_hydra_config=True).hydra.launcher
    assert joblib._target_.endswith("JoblibLauncher") and joblib.n_jobs == 2


@pytest.mark.parametrize("script", ["sweep_taps.sh", "sweep_retention.sh", "sweep_policies.sh"])
def test_every_job_of_the_sweep_scripts_composes_and_validates(script):
    text = (ROOT / "scripts" / script).read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("exec "))
    words = shlex.split(line)
    assert words[words.index("stopexp.pipeline") + 1] == "-m"  # a multirun
    args = [a for a in words[words.index("stopexp.pipeline") + 2:] if a != "$@"]
    parser = OverridesParser.create()
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
            if o.is_sweep_override() else [o.input_line] for o in parser.parse_overrides(args)]
    jobs = one_of_each(axes)  # in the retention sweep the first N is the smallest: K <= N binds
    assert len(jobs) > 1
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for job in jobs:
            validate(hydra_compose("pipeline", overrides=list(job)))


def _synthetic_points(coef, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    grid = itertools.product([500, 1000, 2000, 4000], [4, 8, 16], [24, 32, 48])
    pts = []
    for C, lp, lt in grid:
        inv = predict_inverse_gamma(coef, C, lp, lt) * np.exp(noise * rng.standard_normal())
        pts.append({"C": C, "L_prefix": lp, "L_task": lt, "gamma": 1 / inv})
    return pts


def test_fit_recovers_known_coefficients():
    true = {"a": 0.8, "b": 0.35, "c": -0.2, "d": 0.5}
    got = fit_retention(_synthetic_points(true))
    for k in "abcd":
        assert got[k] == pytest.approx(true[k], abs=1e-9)
    assert got["r2"] == pytest.approx(1.0) and got["points"] == 36
    noisy = fit_retention(_synthetic_points(true, noise=0.02))
    for k in "bcd":
        assert noisy[k] == pytest.approx(true[k], abs=0.05)


def test_fit_refuses_too_few_points_or_a_constant_regressor():
    pts = _synthetic_points({"a": 1, "b": 0.3, "c": 0.1, "d": 0.4})
    with pytest.raises(ValueError, match="3 points for 4 parameters"):
        fit_retention(pts[:3])
    with pytest.raises(ValueError, match="L_prefix is the same at every point.*search.check_at"):
        fit_retention([p for p in pts if p["L_prefix"] == 8])


def _fake_sweep(root, jobs):
    """A multirun dir whose jobs have a config and a metrics.json like the pipeline's."""
    for i, (overrides, metrics) in enumerate(jobs):
        d = root / str(i)
        (d / ".hydra").mkdir(parents=True)
        cfg = compose("pipeline", overrides)
        OmegaConf.save(cfg, d / ".hydra" / "config.yaml")
        (d / "metrics.json").write_text(json.dumps(metrics))
    (root / "9").mkdir()  # a failed job: no metrics.json
    return root


def _metrics(check, lengths, front):
    """metrics.json of one job: N=8 on 10 prompts, no_prune paths of mean length `lengths`,
    learned (mlp) points (k, tokens per prompt, accuracy)."""
    pts = [{"method": "mlp", "n": 8, "k": k, "tokens_total": t * 10, "accuracy": acc}
           for k, t, acc in front]
    methods = {"mlp": {"accuracy": front[-1][2], "tokens_total": front[-1][1] * 10, "n": 8, "k": 4},
               "no_prune": {"accuracy": 0.9, "tokens_total": lengths * 8 * 10, "n": 8, "k": 8}}
    return {"methods": methods, "points": pts,
            "protocol": {"n": 8, "k": 4, "check_tokens": check, "prompts": 10}}


def test_sweep_runs_table_and_guideline_points(tmp_path):
    front = [(1, 60, 0.5), (2, 90, 0.7), (4, 150, 0.65), (8, 260, 0.8)]  # k=4 is dominated
    root = _fake_sweep(tmp_path / "sweep", [
        (["tap.layers=[-1]", "search.check_at=6"], _metrics(6, 30, front)),
        (["tap.layers=[1]", "search.check_at=16"], _metrics(16, 30, front))])
    runs = sweeps.dir_runs(root)
    assert [r["job"] for r in runs] == ["0", "1"]
    rows = sweeps.table(runs)
    assert rows[0]["label"] == "tap.layers=[-1] search.check_at=6"  # as given (a prefix or a list)
    assert rows[1]["accuracy"] == 0.8 and rows[1]["no_prune_tokens_total"] == 2400
    pts = sweeps.points(runs)
    assert {p["method"] for p in pts} == {rows[0]["label"], rows[1]["label"], "no_prune"}
    chosen = guideline_points(runs)
    assert sorted(p["gamma"] for p in chosen if p["L_prefix"] == 6) == [1 / 8, 2 / 8, 1]
    assert {p["L_task"] for p in chosen} == {30.0}
    with pytest.raises(FileNotFoundError, match="no finished job"):
        sweeps.dir_runs(tmp_path)


# slow: three runs of the script in subprocesses, each importing matplotlib (~18 s)
@pytest.mark.slow
def test_fit_retention_script_fits_and_plots_or_refuses_clearly(tmp_path):
    front = [(1, 60, 0.5), (2, 90, 0.7), (8, 260, 0.8)]
    # 2 checks x 2 task lengths: longer tasks cost more, a later check costs and gains a little
    jobs = [([f"search.check_at={check}", f"task.n_steps={steps}"],
             _metrics(check, 5 * steps, [(k, t * steps / 6 + check, acc + check / 100)
                                         for k, t, acc in front]))
            for check in (6, 16) for steps in (5, 6)]
    root = _fake_sweep(tmp_path / "sweep", jobs)
    script = [sys.executable, "scripts/fit_retention.py"]
    r = subprocess.run([*script, str(root)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "4 jobs, 12 Pareto points" in r.stdout and "  d  =" in r.stdout
    assert (root / "retention_fit.png").stat().st_size > 0
    (tmp_path / "empty").mkdir()
    r = subprocess.run([*script, str(tmp_path / "empty")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "no finished job" in r.stderr
    few = _fake_sweep(tmp_path / "few", jobs[:1])
    r = subprocess.run([*script, str(few)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "3 points for 4 parameters" in r.stderr


def test_notebooks_are_paired_and_committed_without_outputs():
    import jupytext
    import nbformat

    for py in sorted((ROOT / "notebooks").glob("*.py")):
        ipynb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
        paired = jupytext.read(py)
        assert [c.source for c in ipynb.cells] == [c.source for c in paired.cells], py.name
        code = [c for c in ipynb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), py.name
        assert "parameters" in code[0].metadata.get("tags", []), py.name
