import pytest

from conftest import compose
from stopexp.tracking import NullRun, tracked_run


def test_null_run_has_the_run_methods():
    cfg = compose("collect", ["logger=none"])
    with tracked_run(cfg, "collect") as run:
        assert isinstance(run, NullRun)
        run.log({"a": 1})
        run.summary_update({"b": 2})


def test_wandb_offline_writes_under_outputs(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR",
                "WANDB_ARTIFACT_DIR"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "outputs"
    cfg = compose("collect", [f"paths.output_dir={out}", "logger.mode=offline"])
    with tracked_run(cfg, "collect") as run:
        run.log({"loss": 1.0})
        f = tmp_path / "x.json"
        f.write_text("{}")
        run.log_artifact(f, "thing", "test")
    runs = list((out / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))
    import os
    assert all(os.environ[v].startswith(str(out)) for v in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"))


def test_run_is_finished_and_marked_failed_on_error(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "outputs"
    cfg = compose("collect", [f"paths.output_dir={out}", "logger.mode=offline"])
    with pytest.raises(RuntimeError):
        with tracked_run(cfg, "collect"):
            raise RuntimeError("boom")
    with tracked_run(cfg, "collect"):
        pass
    assert len(list((out / "wandb" / "wandb").glob("offline-run-*"))) == 2
