"""Outputs are never lost: W&B failures cost no stage its metrics.json and plots, every
artifact is written atomically with the user's umask, and run dirs are never shared."""
import errno
import json
import os
import sys
import types

import numpy as np
import pytest

from conftest import compose, run_stage
from stopexp.evaluation import plots
from stopexp.runtime.artifacts import atomic_path, publish_dir, staging_dir, write_json
from stopexp.stages import build

FAST = ["evaluate.n_points=[4,8]", "evaluate.retention=[2,4]", "policy.keep=4",
        "evaluate.bootstrap=50", "train.epochs=2", "evaluate.text_metrics=false"]


def broken_wandb(init_fails: bool = False):
    """A stand-in `wandb` module: init works (or refuses), then every call of the run raises
    as when wandb-core has died. `finished` records the exit codes finish was called with."""
    mod = types.ModuleType("wandb")
    mod.finished = []

    def dead(*args, **kwargs):
        raise ConnectionResetError("Connection lost")

    class Run:
        name, dir = "broken", None
        log = log_artifact = use_artifact = dead

        @property
        def summary(self):
            dead()

        def finish(self, exit_code=0):
            mod.finished.append(exit_code)
            dead()

    def init(**kwargs):
        if init_fails:
            raise RuntimeError("wandb service refused to start")
        return Run()

    mod.init, mod.Settings = init, lambda **kw: None
    mod.Artifact = mod.Table = mod.Image = dead
    return mod


def tracked(small_bank):
    return [o for o in small_bank if o != "logger=none"] + ["logger.mode=offline", *FAST]


def stage_log(run_dir) -> str:
    """The log file Hydra writes into the run dir (it replaces pytest's log handlers)."""
    return "".join(p.read_text() for p in run_dir.glob("*.log"))


def test_every_stage_writes_its_outputs_when_wandb_dies_mid_stage(small_bank, tmp_path,
                                                                  monkeypatch):
    fake = broken_wandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    args = tracked(small_bank)
    for stage in ("collect", "train", "evaluate", "pipeline"):
        run_stage(stage, [*args, f"hydra.run.dir={tmp_path / stage}"])
        metrics = json.loads((tmp_path / stage / "metrics.json").read_text())
        assert metrics, stage
        warnings = [w for w in stage_log(tmp_path / stage).splitlines()
                    if "[stopexp.runtime.tracking][WARNING]" in w]
        assert len(warnings) == 1 and "Connection lost" in warnings[0], (stage, warnings)
        assert "tracking is off for the rest of this run" in warnings[0]
    assert json.loads((tmp_path / "collect/metrics.json").read_text())["collect"]["complete"]
    assert "auroc" in json.loads((tmp_path / "train/metrics.json").read_text())["train"]["test"]
    for d in ("evaluate", "pipeline/evaluate"):
        assert {"pareto.png", "survival.png"} <= {p.name for p in (tmp_path / d).glob("*.png")}
    assert not (tmp_path / "pipeline/train").exists()  # the predictor was already trained
    said = stage_log(tmp_path / "pipeline")
    assert f"metrics.json in {tmp_path / 'pipeline'}, evaluate's plots in " \
           f"{tmp_path / 'pipeline/evaluate'}\n" in said  # train found its predictor: no plots
    assert fake.finished == [0, 0, 0, 0]  # every run still finished, as a success


def test_wandb_that_cannot_start_gives_a_null_run_and_a_warning(small_bank, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", broken_wandb(init_fails=True))
    run_stage("train", [*tracked(small_bank), "train.lr=0.002", f"hydra.run.dir={tmp_path}"])
    assert (tmp_path / "metrics.json").exists() and (tmp_path / "loss_curve.png").exists()
    assert ("W&B could not start a run (RuntimeError: wandb service refused to start); "
            "going on without tracking") in stage_log(tmp_path)


def test_a_real_error_in_the_stage_still_fails_it_and_marks_the_run_failed(small_bank, tmp_path,
                                                                          monkeypatch, capsys):
    fake = broken_wandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.raises(SystemExit) as e:  # no bank for seed 99: the stage's own (user) error
        run_stage("train", [*tracked(small_bank), "seed=99", f"hydra.run.dir={tmp_path}"])
    assert e.value.code == 2 and fake.finished == [1]
    err = capsys.readouterr().err
    assert err.startswith("error: no complete trace bank for this config at ")
    assert "; make it with: python -m stopexp.collect " in err and "Traceback" not in err
    assert err.count("\n") == 1  # one line
    assert not (tmp_path / "metrics.json").exists()


def test_figures_are_written_atomically_and_a_failed_write_keeps_the_old_file(tmp_path):
    path = plots.survival({"a": [1.0, 0.5]}, tmp_path / "survival.png")
    old = path.read_bytes()
    assert old[:4] == b"\x89PNG"
    fig = plots.plt.figure()
    fig.savefig = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        plots.save_figure(fig, path)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["survival.png"]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_artifacts_are_published_with_the_users_umask(tmp_path, umask_022):
    write_json(tmp_path / "m.json", {"a": 1})
    plots.prune_steps({"x": np.array([1, 2])}, tmp_path / "p.png")
    with atomic_path(tmp_path / "t.txt") as tmp:
        tmp.write_text("x")
    final = tmp_path / "art"
    stage = staging_dir(final)
    write_json(stage / "meta.json", {})
    publish_dir(stage, final)
    for f in ("m.json", "p.png", "t.txt", "art/meta.json"):
        assert oct((tmp_path / f).stat().st_mode & 0o777) == "0o644", f
    assert oct(final.stat().st_mode & 0o777) == "0o755"
    os.umask(0o027)
    write_json(tmp_path / "g.json", {})
    assert oct((tmp_path / "g.json").stat().st_mode & 0o777) == "0o640"


def test_runs_and_sweeps_started_in_the_same_second_get_their_own_dirs():
    import re
    import subprocess

    dirs = [compose("evaluate", return_hydra_config=True).hydra for _ in range(2)]
    runs, sweeps = [d.run.dir for d in dirs], [d.sweep.dir for d in dirs]
    assert runs[0] != runs[1] and sweeps[0] != sweeps[1]
    name = re.compile(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_(\d+)-[0-9a-f]{4}$")
    assert all(name.search(d) for d in runs + sweeps), runs + sweeps
    assert name.search(runs[0]).group(1) == str(os.getpid())
    # within one config the value is fixed, so the run dir and what names it agree
    cfg = compose("evaluate", return_hydra_config=True)
    assert cfg.hydra.run.dir == cfg.hydra.run.dir
    # another process in the same second: another dir
    code = ("import stopexp.config; from conftest import compose; "
            "print(compose('evaluate', return_hydra_config=True).hydra.run.dir)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=os.path.dirname(__file__), check=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout
    assert other.strip() != runs[0] and name.search(other.strip())


def test_replace_dir_swaps_a_whole_directory_and_leaves_nothing_behind(tmp_path, umask_022):
    from stopexp.runtime.artifacts import replace_dir

    final = tmp_path / "toy_lm"
    for version in ("old", "new"):
        stage = staging_dir(final)
        (stage / "weights").write_text(version)
        replace_dir(stage, final)
    assert (final / "weights").read_text() == "new"
    assert os.listdir(tmp_path) == ["toy_lm"]
    assert oct(final.stat().st_mode & 0o777) == "0o755"


def test_umask_is_read_without_changing_it(umask_022, monkeypatch):
    from stopexp.runtime import artifacts

    assert artifacts.current_umask() == 0o022
    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError))
    assert artifacts.current_umask() == 0o022  # the portable fallback
    assert os.umask(0o022) == 0o022


def test_a_wandb_dir_that_is_a_file_costs_tracking_not_outputs(small_bank, tmp_path):
    bank_out = next(o.split("=", 1)[1] for o in small_bank if o.startswith("paths.output_dir="))
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "wandb").write_text("in the way")
    run_stage("train", [*tracked(small_bank), "train.lr=0.003", f"paths.output_dir={out}",
                        f"paths.cache_dir={bank_out}/cache", f"hydra.run.dir={tmp_path / 'run'}"])
    assert "auroc" in json.loads((tmp_path / "run/metrics.json").read_text())["train"]["test"]
    assert (tmp_path / "run/loss_curve.png").exists()
    warnings = [w for w in stage_log(tmp_path / "run").splitlines() if "[WARNING]" in w
                and "stopexp.runtime.tracking" in w]
    assert len(warnings) == 1 and "W&B could not start a run (FileExistsError" in warnings[0]
    assert (out / "wandb").read_text() == "in the way"


def test_a_full_disk_during_collect_names_the_shard_and_keeps_the_finished_ones(tmp_path,
                                                                              monkeypatch, capsys):
    from datasets import Dataset

    from stopexp.config import validate
    from stopexp.store import bank

    args = [f"paths.output_dir={tmp_path}", "logger=none", "search.n_paths=2",
            "collect.prompts.train=0", "collect.prompts.val=0", "collect.prompts.test=4",
            "collect.shard_prompts=2", "collect.mc_rollouts=0"]
    save, saved = Dataset.save_to_disk, []

    def fills_the_disk(self, path, **kwargs):
        if saved:  # the second shard finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        saved.append(path)
        return save(self, path, **kwargs)

    monkeypatch.setattr(Dataset, "save_to_disk", fills_the_disk)
    with pytest.raises(SystemExit) as e:
        run_stage("collect", [*args, f"hydra.run.dir={tmp_path / 'run'}"])
    root = build.bank(validate(compose("collect", args))).root
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (  # under the progress bars
        f"error: cannot write {root / bank.shard_name(1)}: No space left on device; free space "
        "on that disk or point paths.cache_dir at another one, then rerun (what was written "
        "before is intact)")
    assert sorted(p.name for p in root.iterdir()) == [bank.shard_name(0)]  # no half shard, no temporary
    assert bank.shard_problem(root / bank.shard_name(0), full=True) is None
    assert not (tmp_path / "run/metrics.json").exists()
