"""Sweeps end to end: concurrent writers of one artifact, a real Hydra multirun with its
W&B group, an Optuna sweep with a crashing trial, and the notebooks on the results."""
import os
import struct
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, compose
from stopexp.config import validate
from stopexp.store import bank
from stopexp.stages import build

SMALL = ["search.n_paths=8", "collect.prompts.train=12", "collect.prompts.val=6",
         "collect.prompts.test=6", "collect.mc_rollouts=0", "evaluate.n_points=[4,8]",
         "evaluate.retention=[2,4]", "evaluate.bootstrap=100", "train.epochs=3",
         "evaluate.text_metrics=false"]
ENV = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"} | {
    "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1", "TOKENIZERS_PARALLELISM": "false"}


def pipeline(*args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "stopexp.pipeline", *args], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def override_of(job_dir, key: str) -> str:
    """The value a sweep gave `key` in one job (Hydra's .hydra/overrides.yaml)."""
    overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text())
    return next(o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}="))


def wandb_records(path):
    """The protobuf records of an offline .wandb file (LevelDB log format: 32 KiB blocks of
    chunks with a 7-byte header: crc, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf = path.read_bytes(), 7, b""  # after the file header
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            yield record
            buf = b""


@pytest.mark.slow
def test_two_concurrent_collects_make_one_complete_bank(tmp_path):
    args = [f"paths.output_dir={tmp_path}", "logger=none", "search.n_paths=4",
            "collect.prompts.train=0", "collect.prompts.val=0", "collect.prompts.test=16",
            "collect.shard_prompts=1", "collect.mc_rollouts=0"]
    cmd = [sys.executable, "-m", "stopexp.collect", *args]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert all("collecting 16 shards" in log for log in logs), "the two writers did not overlap"
    root = build.bank(validate(compose("collect", args))).root
    ds = bank.load_bank(root)
    keys = list(zip(ds["prompt_id"][:], ds["path_id"][:]))
    assert len(keys) == 16 * 4 and len(set(keys)) == 16 * 4
    assert len(bank.finished_shards(root)) == 16
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no staging dir left
    assert bank.read_meta(root)["complete"]


@pytest.mark.slow
def test_multirun_2x2_one_run_and_group_per_job_then_notebooks(tmp_path):
    import papermill

    sweep = tmp_path / "sweep-2x2"
    pipeline("-m", "+exp=toy_contrastive", "tap.layers=[-1],[1]", "loss=contrastive,reward_regression",
             *SMALL, "policy.keep=4", "logger.mode=offline", f"paths.output_dir={tmp_path}",
             f"hydra.sweep.dir={sweep}")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    assert all((j / "metrics.json").exists() and (j / "evaluate" / "pareto.png").exists() for j in jobs)
    # shared upstream artifacts made once: one bank for both tap layers (taps are not
    # generation), features per tap layer; per (tap, loss) the predictor and its
    # conf_features control
    cache = tmp_path / "cache"
    assert len(list((cache / "traces").iterdir())) == 1
    assert len(list((cache / "features").iterdir())) == 2
    assert len(list((cache / "predictors").iterdir())) == 4 + 4
    runs = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*/*.wandb"))
    assert len(runs) == 4
    for run in runs:
        records = {r.WhichOneof("record_type"): r for r in wandb_records(run)}
        assert records["run"].run.run_group == "sweep-2x2"
        assert records["exit"].exit.exit_code == 0

    papermill.execute_notebook(str(ROOT / "notebooks/compare_sweep.ipynb"), str(tmp_path / "c.ipynb"),
                               parameters={"sweep_dir": str(sweep)}, kernel_name="python3",
                               cwd=str(ROOT), progress_bar=False)
    assert (sweep / "sweep_pareto.png").exists()
    papermill.execute_notebook(str(ROOT / "notebooks/run_report.ipynb"), str(tmp_path / "r.ipynb"),
                               parameters={"run_dir": str(jobs[3])}, kernel_name="python3",
                               cwd=str(ROOT), progress_bar=False)
    figs = {p.stem for p in (jobs[3] / "report").glob("*.png")}
    assert {"pareto", "survival", "prune_steps", "signal_histograms", "calibration_mlp",
            "loss_curve"} <= figs


@pytest.mark.slow
def test_optuna_sweep_goes_on_past_a_crashed_trial(tmp_path):
    sweep = tmp_path / "optuna"
    # at temperature 1e-4 sampling is greedy: every prompt's paths agree, no prompt has
    # mixed outcomes, and train fails after collect, i.e. mid-trial (validate cannot know)
    pipeline("-m", "+exp=toy_contrastive", "+hparams_search=optuna_toy", "hydra.sweeper.params=null",
             "search.temperature=choice(0.0001,1.0)", "hydra.sweeper.n_trials=2",
             "hydra.sweeper.sampler.seed=0",  # its first two trials try both
             "hydra.sweeper.n_jobs=1", *SMALL, "policy.keep=4", "logger=none",
             f"paths.output_dir={tmp_path}", f"hydra.sweep.dir={sweep}")
    jobs = sorted(j for j in sweep.iterdir() if j.is_dir())
    temp = {j.name: float(override_of(j, "search.temperature")) for j in jobs}
    assert sorted(temp.values()) == [0.0001, 1.0]
    assert {j.name for j in jobs if (j / "metrics.json").exists()} == {n for n, t in temp.items() if t == 1.0}
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["best_params"] == {"search.temperature": 1.0} and 0 < result["best_value"] <= 1
