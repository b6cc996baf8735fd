"""Atomic writes (stopexp/runtime/artifacts.py): what a killed writer leaves behind is removed by the
next writer, what a live one is writing is not; concurrent writers of one artifact (every
kind: bank, features, predictor, converted model, toy LM) leave one whole artifact that the
next consumer accepts."""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import filelock
import pytest

from conftest import compose, featurized
from stopexp.config import validate
from stopexp.runtime import artifacts, integrity
from stopexp.runtime.artifacts import staging_dir, write_json
from stopexp.stages import build
from stopexp.store import bank
from stopexp.store import feature_sets
from stopexp.stages.collect import collect
from stopexp.stages.featurize import featurize


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_next_write_removes_dead_writers_temporaries_only(tmp_path):
    host, dead = socket.gethostname(), _dead_pid()
    stale_dir = tmp_path / f".shard-00003.tmp~{host}~{dead}~ab12"
    stale_file = tmp_path / f".metrics.json.~{host}~{dead}~cd34.tmp"
    live = tmp_path / f".shard-00004.tmp~{host}~{os.getpid()}~ef56"
    elsewhere = tmp_path / f".shard-00005.tmp~another-host~{dead}~gh78"
    old_copy = tmp_path / ".shard-00006.old-ij90"  # replace_dir's old copy: never swept
    for d in (stale_dir, live, elsewhere, old_copy):
        d.mkdir()
        (d / "data.arrow").write_text("x")
    stale_file.write_text("{")
    made = staging_dir(tmp_path / "shard-00007")
    assert not stale_dir.exists() and not stale_file.exists() and made.exists()
    assert live.exists() and elsewhere.exists() and old_copy.exists()
    again = tmp_path / f".pareto.png.~{host}~{dead}~kl12.tmp"
    again.write_text("half")
    write_json(tmp_path / "metrics.json", {"a": 1})  # an atomic file write sweeps too
    assert not again.exists() and (tmp_path / "metrics.json").read_text() == '{\n  "a": 1\n}'


# ---- concurrent writers of one artifact -------------------------------------------------------
def watch_lock_waits(monkeypatch, event: threading.Event) -> None:
    """Set `event` whenever a thread finds an artifact's lock held and waits for it."""
    class Watched(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            try:
                return super().acquire(blocking=False)
            except filelock.Timeout:
                event.set()
                return super().acquire(*args, **kwargs)

    monkeypatch.setattr(artifacts, "FileLock", Watched, raising=False)


def race(monkeypatch, make, owner, step):
    """Run `make()` in two threads at once; returns both results (a thread's error raised).
    The first call of `owner.step` (a write step) is held until the other thread calls it
    too, waits for the artifact's lock (`artifact_lock`), or has finished: the interleaving
    in which two writers that do not take turns both compute and both publish."""
    real = getattr(owner, step)
    other_there, first, guard = threading.Event(), [], threading.Lock()

    def held(*args, **kwargs):
        with guard:
            first.append(threading.get_ident())
        if first[0] == threading.get_ident():
            if len(first) == 1:
                assert other_there.wait(60), "the other thread never came"
        else:
            other_there.set()
        return real(*args, **kwargs)

    def run():
        try:
            return make()
        finally:
            other_there.set()

    monkeypatch.setattr(owner, step, held)
    watch_lock_waits(monkeypatch, other_there)
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(run) for _ in range(2)]
        return [j.result() for j in jobs]


def counted(monkeypatch, owner, name) -> list:
    """Record every call of `owner.name` (its return values) and let it run."""
    real, calls = getattr(owner, name), []

    def spy(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(owner, name, spy)
    return calls


def records_in_place(root) -> bool:
    """Whether meta.json records every shard exactly as its own shard.json does."""
    meta = bank.read_meta(root)
    return all(bank.read_record(root / n) == rec for n, rec in meta["shards"].items())


def _private_bank(small_bank, tmp_path) -> list[str]:
    """Overrides of a private copy of the session's small bank."""
    overrides = [*small_bank, f"paths.output_dir={tmp_path / 'out'}"]
    shutil.copytree(build.bank(validate(compose("collect", small_bank))).root,
                    build.bank(validate(compose("collect", overrides))).root)
    return overrides


def test_two_featurizers_at_once_make_features_once_that_train_accepts(small_bank, tmp_path,
                                                                      monkeypatch):
    feats = build.feature_set(validate(compose("train", _private_bank(small_bank, tmp_path))))
    written = counted(monkeypatch, bank, "write_shard")
    a, b = race(monkeypatch, lambda: featurize(feats), bank, "write_shard")
    n_shards = len(bank.read_meta(feats.bank.root)["shards"])
    assert len(written) == n_shards  # each shard computed once
    assert {**a, "wall_s": 0} == {**b, "wall_s": 0} and a["paths"] == 24 * 8
    # the loser kept the winner's shards: their records match the bank's
    assert feature_sets.require_features(feats) == feats.root
    assert records_in_place(feats.root)


def test_two_collects_of_one_bank_at_once_keep_the_first_shards_and_record_them(tmp_path,
                                                                              monkeypatch):
    cfg = validate(compose("collect", [f"paths.output_dir={tmp_path}", "logger=none",
                                       "search.n_paths=2", "collect.prompts.train=2",
                                       "collect.prompts.val=1", "collect.prompts.test=1",
                                       "collect.shard_prompts=2", "collect.mc_rollouts=0"]))
    job = build.collection(cfg)
    one_load = threading.Lock()  # transformers' loading is not thread-safe (processes are apart)
    import stopexp.engines.hf as hf_engine

    load_lm = hf_engine.load_lm

    def load_in_turn(*args, **kwargs):
        with one_load:
            return load_lm(*args, **kwargs)

    monkeypatch.setattr(hf_engine, "load_lm", load_in_turn)
    written = counted(monkeypatch, bank, "write_shard")
    a, b = race(monkeypatch, lambda: collect(job), bank, "write_shard")
    assert a["complete"] and b["complete"] and a["paths"] == b["paths"] == 4 * 2
    root = bank.require_bank(job.bank)
    assert bank.verify_bank(root, full=True) and records_in_place(root)
    # each writer returned the record of the shard in place: the first one published
    assert len(written) == 2 * 3 and all(rec == bank.read_record(root / bank.shard_name(rec["index"]))
                                         for rec in written)


def test_two_trainers_at_once_train_once_and_evaluate_loads_it(small_bank, tmp_path, monkeypatch):
    from stopexp.signals.saved_predictor import load_predictor
    from stopexp.stages import train as train_stage
    from stopexp.store.feature_sets import spec_of

    cfg = featurized(validate(compose("train", [*_private_bank(small_bank, tmp_path), "predictor=linear",
                                                "train.epochs=2"])))
    saved = counted(monkeypatch, train_stage, "save_predictor")
    a, b = race(monkeypatch, lambda: train_stage.train(cfg, progress=False), train_stage,
                "save_predictor")
    assert len(saved) == 1 and a["checkpoint"] == b["checkpoint"] == str(saved[0])
    assert a["val"] == b["val"]  # the second found the first one's checkpoint
    spec = spec_of(cfg.tap.layers, bank.read_meta(build.bank(cfg).root))
    _, meta = load_predictor(saved[0], spec, cfg.predictor)
    assert meta["metrics"]["val"] == a["val"]


def test_two_gguf_conversions_at_once_convert_once(tmp_path, monkeypatch):
    from stopexp.models import gguf

    def convert(path, out_dir):
        (out_dir / "config.json").write_text("{}")
        (out_dir / gguf.SOURCE).write_text("{}")
        return {"parameters": 0, "seconds": 0.0}

    monkeypatch.setattr(gguf, "convert_gguf", convert)
    converted = counted(monkeypatch, gguf, "convert_gguf")
    (tmp_path / "m.gguf").write_bytes(b"GGUF fake")
    a, b = race(monkeypatch, lambda: gguf.ensure_gguf(str(tmp_path / "m.gguf"), tmp_path / "cache"),
                gguf, "convert_gguf")
    assert len(converted) == 1 and a == b and (a / gguf.SOURCE).is_file()
    assert sorted(p.name for p in a.parent.iterdir()) == [f".{a.name}.lock", a.name]


def _fake_toy_training(calls):
    from stopexp.models import toy_lm

    def train(toy, task, out_dir, progress=True):
        calls.append(out_dir)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (out_dir / name).write_text(f"{name} {len(calls)}")
        info = {"parameters": 0, "steps": 0, "train_seconds": 0.0,
                "files": integrity.records(out_dir)}
        (out_dir / toy_lm.INFO).write_text(json.dumps(info))
        return info
    return train


def test_two_processes_needing_an_untrained_toy_lm_train_it_once(tmp_path, monkeypatch):
    from stopexp.models import toy_lm

    cfg = compose("collect", [f"paths.output_dir={tmp_path}", "model.toy.seed=12345"])
    final = tmp_path / "cache" / "toy_lm" / toy_lm.toy_key(cfg.model.toy, cfg.task)
    assert not (toy_lm.COMMITTED / f"toy-{final.name}").exists()
    calls = []
    monkeypatch.setattr(toy_lm, "train_toy_lm", _fake_toy_training(calls))
    a, b = race(monkeypatch, lambda: toy_lm.ensure_toy_lm(cfg.model.toy, cfg.task, cfg.paths.cache_dir),
                toy_lm, "train_toy_lm")
    assert len(calls) == 1 and a == b == final and toy_lm.toy_lm_problem(final) is None


def test_a_toy_lm_being_replaced_is_read_only_once_the_new_one_is_in_place(tmp_path, monkeypatch):
    import inspect
    from types import SimpleNamespace

    from stopexp.models import toy_lm
    from stopexp.stages import toy_lm as toy_stage

    cfg = validate(compose("collect", [f"paths.output_dir={tmp_path}"]))
    final = tmp_path / "cache" / "toy_lm" / toy_lm.toy_key(cfg.model.toy, cfg.task)
    shutil.copytree(toy_lm.COMMITTED / f"toy-{final.name}", final)  # the old copy, retrained now
    calls = []
    monkeypatch.setattr(toy_stage, "train_toy_lm", _fake_toy_training(calls))
    monkeypatch.setattr(toy_stage, "solve_report", lambda *a: {})
    monkeypatch.setattr(build, "lm", lambda *a, **k: (None, None))
    read, waiting = {}, threading.Event()
    watch_lock_waits(monkeypatch, waiting)
    real_publish = artifacts.publish_dir

    reader = threading.Thread(target=lambda: read.setdefault(
        "dir", toy_lm.ensure_toy_lm(cfg.model.toy, cfg.task, cfg.paths.cache_dir)))

    def publish(tmp, to):  # inside replace_dir, the old copy renamed aside: a reader comes now
        reader.start()
        while reader.is_alive() and not waiting.wait(0.01):
            pass  # until it has read, or waits for the lock
        return real_publish(tmp, to)

    monkeypatch.setattr(artifacts, "publish_dir", publish)
    done = inspect.unwrap(toy_stage.main)(SimpleNamespace(cfg=cfg))
    reader.join()
    # the reader waited for the retrained copy, not the one renamed aside
    assert read["dir"] == final and done["checkpoint"] == str(final) and len(calls) == 1
    assert (final / "model.safetensors").read_text() == "model.safetensors 1"


def test_a_file_system_without_locks_writes_unlocked_with_a_warning(tmp_path, monkeypatch, caplog):
    import errno

    def refuse(self, *args, **kwargs):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(filelock.FileLock, "acquire", refuse)
    with caplog.at_level("WARNING"), artifacts.artifact_lock(tmp_path / "features" / "abc"):
        write_json(tmp_path / "features" / "abc" / "meta.json", {"a": 1})
    assert "cannot lock files (No locks available)" in caplog.text
    assert json.loads((tmp_path / "features" / "abc" / "meta.json").read_text()) == {"a": 1}

    def fail(self, *args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(filelock.FileLock, "acquire", fail)
    with pytest.raises(OSError, match="Input/output error"):  # any other error is raised
        with artifacts.artifact_lock(tmp_path / "features" / "abc"):
            pass
