import pytest

from conftest import compose
from stopexp.runtime.tracking import NullRun
from stopexp.stages.build import tracked


def test_null_run_has_the_run_methods():
    cfg = compose("collect", ["logger=none"])
    with tracked(cfg, "collect") as run:
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
    with tracked(cfg, "collect") as run:
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
        with tracked(cfg, "collect"):
            raise RuntimeError("boom")
    with tracked(cfg, "collect"):
        pass
    assert len(list((out / "wandb" / "wandb").glob("offline-run-*"))) == 2


class _DeadRun:
    """A W&B run object whose service has died: every call raises."""
    name, dir = "dead", None
    finished = []

    def log(self, *a, **k):
        raise ConnectionResetError("Connection lost")

    log_artifact = use_artifact = log

    def finish(self, exit_code=0):
        self.finished.append(exit_code)
        raise ConnectionResetError("Connection lost")


def test_wandb_run_fails_safe_warns_once_and_still_tries_finish(caplog, tmp_path):
    from stopexp.runtime.tracking import WandbRun

    class W:  # the wandb module: its constructors fail too
        def Artifact(*a, **k):
            raise RuntimeError("no artifact")

    run = WandbRun(_DeadRun(), W)
    with caplog.at_level("WARNING", logger="stopexp.runtime.tracking"):
        assert run.log({"a": 1}) is None
        run.summary_update({"b": 2})
        run.log_artifact(tmp_path, "x", "y")
        assert run.table(["a"], [[1]]) is None and run.image(tmp_path) is None
        run.finish(exit_code=1)
    assert run.broken and _DeadRun.finished == [1]
    assert [r.getMessage() for r in caplog.records] == [
        "W&B log failed (ConnectionResetError: Connection lost); tracking is off for the rest "
        "of this run, the stage's outputs are written as usual"]


@pytest.mark.parametrize("shape", ["a file", "read-only"])
def test_an_unusable_wandb_dir_gives_a_null_run_and_one_warning(shape, tmp_path, monkeypatch,
                                                               read_only, caplog):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "outputs"
    out.mkdir()
    if shape == "a file":
        (out / "wandb").write_text("in the way")
    else:
        (out / "wandb").mkdir()
        read_only(out / "wandb")
    cfg = compose("collect", [f"paths.output_dir={out}", "logger.mode=offline"])
    with caplog.at_level("WARNING", logger="stopexp.runtime.tracking"):
        with tracked(cfg, "collect") as run:
            assert type(run) is NullRun
            run.log({"loss": 1.0})
    error = (f"FileExistsError: [Errno 17] File exists: '{out / 'wandb'}'" if shape == "a file"
             else f"PermissionError: [Errno 13] Permission denied: '{out / 'wandb/.cache'}'")
    assert [r.getMessage() for r in caplog.records] == [
        f"W&B could not start a run ({error}); going on without tracking (logger=none "
        "silences this)"]
