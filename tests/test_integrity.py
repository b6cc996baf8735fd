"""A damaged or stale artifact is never used silently: the trace bank, predictor checkpoints
and the toy LM are checked against what they recorded when written; consumers name the
damaged shard or file and the command that repairs it, and the stage that owns an artifact
rebuilds it."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from conftest import ROOT, compose
from stopexp.config import validate
from stopexp.runtime import integrity
from stopexp.signals.checkpoint import CheckpointDamaged, CheckpointMismatch, load_predictor
from stopexp.stages.build import predictor_dir
from stopexp.stages.train import train
from stopexp.store import bank
from stopexp.stages.collect import collect
from stopexp.store.keys import task_content
from stopexp.stages import build

GSM8K = ROOT / "tests" / "data" / "gsm8k_sample.jsonl"
COLUMNS = ("split", "prompt_id", "path_id", "text", "answer", "correct", "length", "tokens",
           "token_logprob", "mc")


@pytest.fixture
def copied(small_bank, tmp_path):
    """(collect config, bank dir) of a private copy of the session's small bank, safe to damage."""
    original = build.bank(validate(compose("collect", small_bank))).root
    cfg = validate(compose("collect", [*small_bank, f"paths.output_dir={tmp_path / 'out'}"]))
    root = build.bank(cfg).root
    shutil.copytree(original, root, copy_function=shutil.copy2)
    return cfg, root


def shard_of(root, split):
    meta = bank.read_meta(root)
    return next(n for n, r in sorted(meta["shards"].items()) if r["splits"].get(split))


def arrow_of(root, name):
    return next((root / name).glob("*.arrow"))


def snapshot(root):
    return {p.name: (p.stat().st_mtime_ns, bank.read_record(p)) for p in root.glob("shard-*")}


def assert_same_rows(root, reference):
    a, b = bank.load_bank(root), bank.load_bank(reference)
    assert len(a) == len(b) == 24 * 8
    for col in COLUMNS:
        x, y = a[col][:], b[col][:]
        if x.dtype == object:
            assert all(np.array_equal(u, v) for u, v in zip(x, y)), col
        else:
            assert np.array_equal(x, y), col


def test_bank_records_its_plan_rows_and_files(copied):
    cfg, root = copied
    meta = bank.read_meta(root)
    assert [(p["split"], p["prompts"]) for p in meta["plan"]] == [
        ("train", 6), ("train", 6), ("val", 6), ("test", 6)]
    assert sorted(meta["shards"]) == [f"shard-{i:05d}-r000" for i in range(4)]
    assert sum(r["rows"] for r in meta["shards"].values()) == 24 * 8
    for name, rec in meta["shards"].items():
        assert rec == bank.read_record(root / name)
        assert set(rec["files"]) == {"data-00000-of-00001.arrow", "dataset_info.json", "state.json"}
        for f, frec in rec["files"].items():
            assert frec["size"] == (root / name / f).stat().st_size
    assert bank.split_rows(meta, "test") == 6 * 8 and bank.planned_prompts(meta, "val") == 6
    assert bank.main([str(root), "--full"]) == 0


def test_missing_shard_is_named_and_collect_recomputes_only_it(copied, small_bank):
    cfg, root = copied
    reference = build.bank(validate(compose("collect", small_bank))).root
    lost = shard_of(root, "test")
    before = snapshot(root)
    shutil.rmtree(root / lost)
    # every consumer: the shard is named with the exact repair command, nothing is trained
    with pytest.raises(bank.BankDamaged, match=rf"{lost}: missing; repair: python -m stopexp.collect "
                                                r"search.n_paths=8 \(collect recomputes only [^\n]*\)$"):
        bank.require_bank(build.bank(cfg), ["search.n_paths=8"])
    with pytest.raises(bank.BankDamaged, match=f"{lost}: missing"):
        train(validate(compose("train", [*small_bank, f"paths.output_dir={root.parents[2]}"])),
              progress=False)
    with pytest.raises(bank.BankDamaged, match=f"{lost}: missing"):
        bank.load_bank(root, "train")
    assert bank.main([str(root)]) == 1
    result = collect(build.collection(cfg))
    assert result["complete"] and result["paths"] == 24 * 8
    after = snapshot(root)
    assert {n: v for n, v in after.items() if n != lost} == {n: v for n, v in before.items() if n != lost}
    assert after[lost][1]["rows"] == before[lost][1]["rows"]
    assert_same_rows(root, reference)


@pytest.mark.parametrize("damage, named", [
    ("truncate_arrow", r"data-00000-of-00001.arrow has \d+ bytes, \d+ recorded"),
    ("garble_arrow", "data-00000-of-00001.arrow differs from its recorded SHA-256"),
    ("drop_dataset_info", "dataset_info.json is missing"),
    ("garble_record", "shard.json is missing or unreadable"),
])
def test_damaged_shard_is_named_and_collect_repairs_it(copied, small_bank, damage, named):
    cfg, root = copied
    reference = build.bank(validate(compose("collect", small_bank))).root
    bad = shard_of(root, "val")
    arrow = arrow_of(root, bad)
    size = arrow.stat().st_size
    if damage == "truncate_arrow":
        os.truncate(arrow, size // 2)
    elif damage == "garble_arrow":  # same size: only a checksum sees it
        with open(arrow, "r+b") as f:
            f.seek(size // 2)
            f.write(os.urandom(64))
    elif damage == "drop_dataset_info":
        (root / bad / "dataset_info.json").unlink()
    else:
        (root / bad / "shard.json").write_text("{\"rows\": ")
    with pytest.raises(bank.BankDamaged, match=rf"damaged: {bad}: {named}"):
        bank.load_bank(root, "val")
    result = collect(build.collection(cfg))  # before: an endless "recomputed, then discarded" for dataset_info
    assert result["complete"]
    assert bank.verify_bank(root, full=True)["complete"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # nothing half left
    assert_same_rows(root, reference)


def test_spot_checks_catch_large_file_damage_and_full_checks_every_byte(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(integrity.SMALL_FILE + 10_000))
    rec = integrity.file_record(path)
    assert "spot" in rec and integrity.file_problem(path, rec) is None
    with open(path, "r+b") as f:  # inside the middle sampled block
        f.seek(rec["size"] // 2)
        f.write(b"\0" * 16)
    assert "differs from its recorded SHA-256" in integrity.file_problem(path, rec)
    path.write_bytes(os.urandom(integrity.SMALL_FILE + 10_000))
    rec = integrity.file_record(path)
    with open(path, "r+b") as f:  # between two sampled blocks: only the full check sees it
        f.seek(integrity.SPOT_BLOCK + 100)
        f.write(b"\0" * 16)
    assert integrity.file_problem(path, rec) is None
    assert "differs" in integrity.file_problem(path, rec, full=True)


def test_truncated_meta_is_named_and_collect_rewrites_it(copied):
    cfg, root = copied
    original = bank.read_meta(root)
    before = snapshot(root)
    text = (root / "meta.json").read_text()
    (root / "meta.json").write_text(text[: len(text) // 3])
    with pytest.raises(bank.BankDamaged, match=r"meta.json is unreadable \(JSONDecodeError.*\)"
                                                r"; repair: python -m stopexp.collect"):
        bank.require_bank(build.bank(cfg))
    assert collect(build.collection(cfg))["complete"]
    assert bank.read_meta(root) == original and snapshot(root) == before  # nothing recomputed


def test_a_bank_record_of_another_model_is_refused_and_collect_rewrites_it(copied, small_bank):
    cfg, root = copied
    original = bank.read_meta(root)
    before = snapshot(root)
    (root / "meta.json").write_text(json.dumps({**original, "model_name": "SmolLM2-135M",
                                                "hidden_size": 576}))
    want = (rf"^trace bank {root} does not fit this config: its meta.json records "
            r"model_name='SmolLM2-135M', this config expects 'toy'; repair: python -m stopexp.collect")
    with pytest.raises(bank.ArtifactMismatch, match=want):
        bank.require_bank(build.bank(cfg))
    train_cfg = validate(compose("train", [*small_bank, f"paths.output_dir={root.parents[2]}",
                                           "predictor=linear", "train.epochs=2"]))
    with pytest.raises(bank.ArtifactMismatch, match=want):
        train(train_cfg, progress=False)  # before: a shape error at the first batch
    assert collect(build.collection(cfg))["complete"]
    assert bank.read_meta(root) == original and snapshot(root) == before  # nothing recomputed
    assert train(train_cfg, progress=False)["val"]["paths"] > 0


def test_a_shard_of_another_bank_is_refused_and_collect_recomputes_it(copied, small_bank, tmp_path):
    cfg, root = copied
    reference = build.bank(validate(compose("collect", small_bank))).root
    other = validate(compose("collect", [*small_bank, f"paths.output_dir={tmp_path / 'other'}", "seed=1"]))
    collect(build.collection(other))
    name = shard_of(root, "test")
    before = snapshot(root)
    shutil.rmtree(root / name)
    shutil.copytree(build.bank(other).root / name, root / name)  # byte for byte as it recorded
    meta = bank.read_meta(root)
    meta["shards"][name] = bank.read_record(root / name)  # as a collect that trusted it wrote
    (root / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(bank.ArtifactMismatch, match=rf"^trace bank {root} does not fit its own "
                                                     rf"record: shard {name} was written for the "
                                                     rf"bank {build.bank(other).root.name}; repair: "):
        bank.require_bank(build.bank(cfg))
    assert collect(build.collection(cfg))["complete"]  # before: kept, it matched its own record
    after = snapshot(root)
    assert {n: v for n, v in after.items() if n != name} == {n: v for n, v in before.items() if n != name}
    assert after[name][1]["bank"] == root.name
    assert_same_rows(root, reference)


def test_a_single_collect_never_ends_with_an_incomplete_bank(copied, monkeypatch):
    import stopexp.stages.collect as C

    cfg, root = copied
    shutil.rmtree(root / shard_of(root, "test"))
    monkeypatch.setattr(C, "_fill", lambda *a, **k: (set(), 0))  # the shard never arrives
    with pytest.raises(bank.BankDamaged, match=r"still incomplete after collect: 1 of 4 shards "
                                                r"missing \(indices 3\)"):
        collect(build.collection(cfg))
    assert not bank.read_meta(root)["complete"] and bank.read_meta(root)["missing"] == [3]
    with pytest.raises(bank.BankMissing, match=r"incomplete \(1 of 4 shards missing: indices 3\)"):
        bank.load_bank(root)


def test_editing_the_task_file_changes_the_bank(tmp_path, monkeypatch):
    task = tmp_path / "qa.jsonl"
    shutil.copy(GSM8K, task)

    def key(path):
        return build.bank(compose("collect", ["task=gsm8k", f"task.path={path}"])).root.name

    first = key(task)
    rows = task.read_text().splitlines()
    row = json.loads(rows[0])
    row["answer"] = row["answer"].rsplit("####", 1)[0] + "#### 123456"
    task.write_text("\n".join([json.dumps(row), *rows[1:]]) + "\n")
    assert key(task) != first
    shutil.copy(GSM8K, task)
    assert key(task) == first  # the content, not the time of the edit
    # a hub id: its cached revision when the local cache has one
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    plain = key("openai/gsm8k")
    refs = tmp_path / "hub" / "datasets--openai--gsm8k" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("0123abcd\n")
    assert task_content(compose("collect", ["task=gsm8k", "task.path=openai/gsm8k"]).task) == \
        "hub:openai/gsm8k@0123abcd"
    assert key("openai/gsm8k") != plain


def _rewrite_keeping_size_and_mtime(path, data: bytes):
    """An in-place rewrite of the same length whose mtime is set back (as `cp -p` or a
    restore would): only the ctime tells."""
    st = path.stat()
    assert len(data) == st.st_size
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_content_digests_follow_every_change_and_are_read_once(tmp_path, monkeypatch):
    monkeypatch.setattr(integrity, "RACY_NS", -10**18)  # the files here are seconds old at most
    monkeypatch.setattr(integrity, "_DIGESTS", {})
    reads = []
    real = integrity.file_sha256
    monkeypatch.setattr(integrity, "file_sha256", lambda p: reads.append(p.name) or real(p))
    store = tmp_path / "store"
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"a" * 64)
    first = integrity.content_sha256(f, store)
    assert first == hashlib.sha256(b"a" * 64).hexdigest() and reads == ["model.safetensors"]
    assert integrity.content_sha256(f, store) == first and len(reads) == 1  # one stat
    monkeypatch.setattr(integrity, "_DIGESTS", {})  # another process: the store answers
    assert integrity.content_sha256(f, store) == first and len(reads) == 1
    _rewrite_keeping_size_and_mtime(f, b"b" * 64)
    assert integrity.content_sha256(f, store) == hashlib.sha256(b"b" * 64).hexdigest()
    # a copy that keeps the mtime of another version, put in its place
    other = tmp_path / "other"
    other.write_bytes(b"c" * 64)
    shutil.copy2(other, tmp_path / "staged")
    os.replace(tmp_path / "staged", f)
    assert integrity.content_sha256(f, store) == hashlib.sha256(b"c" * 64).hexdigest()
    assert len(reads) == 3


def test_a_changed_local_model_or_gguf_file_makes_another_bank(tmp_path):
    """The weights, the tokenizer or the chat template of a local model directory replaced
    (same path, even same size and mtime): another bank; a README edit: the same."""
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\0" * 256)
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (model / "README.md").write_text("a model")

    def key(*over):
        return build.bank(compose("collect", ["model=llama", *over])).key

    hub = key()  # a hub id: its id and revision, keys as before
    first = key(f"model.path={model}")
    assert first != hub and key(f"model.path={model}") == first
    (model / "README.md").write_text("a model, described")
    assert key(f"model.path={model}") == first
    _rewrite_keeping_size_and_mtime(model / "model.safetensors", b"\1" * 256)
    weights = key(f"model.path={model}")
    assert weights != first
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ message }}"}')
    assert key(f"model.path={model}") not in (first, weights)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    over = ["model=smollm2", f"model.gguf_file={gguf}"]
    before = key(*over)
    _rewrite_keeping_size_and_mtime(gguf, b"GGUF" + b"\0" * 30 + b"\1" + b"\0" * 29)
    assert key(*over) != before
    from stopexp.models.gguf import gguf_key
    assert gguf_key(gguf) == gguf_key(gguf, tmp_path / "store")


def test_empty_split_messages_say_which_setting_to_change():
    from stopexp.training.data import _empty_split

    meta = {"plan": [{"index": 0, "split": "train", "prompts": 5},
                     {"index": 1, "split": "val", "prompts": 3}],
            "shards": {"shard-00000-r000": {"rows": 40, "splits": {"train": 40}},
                       "shard-00001-r000": {"rows": 0, "splits": {}}}}
    assert _empty_split(meta, "test", 5).startswith(
        "collect.prompts.test: the trace bank holds no test prompts (0 were collected)")
    # a bank whose shard records do not count the prompts left out by cause names both causes
    assert _empty_split(meta, "val", 5) == (
        "train: the trace bank holds no val path: all 3 val prompts were left out, by "
        "model.long_prompts=skip (longer than model.max_prompt_tokens) or by the difficulty "
        "filter collect.keep_correct")
    meta["shards"]["shard-00001-r000"].update(too_long=0, filtered=3)
    assert _empty_split(meta, "val", 5) == (
        "train: the trace bank holds no val path: all 3 val prompts were left out: 3 outside "
        "the difficulty filter collect.keep_correct: widen it")
    assert _empty_split(meta, "train", 5).startswith(
        "train.checkpoint: none of the 40 train paths of the trace bank is still generating "
        "at checkpoint 5 tokens")


def test_damaged_predictor_is_named_and_train_rebuilds_it(copied, small_bank):
    from stopexp.stages.scorers import build_scorers
    from stopexp.store.features import spec_of

    _, root = copied
    cfg = validate(compose("train", [*small_bank, f"paths.output_dir={root.parents[2]}",
                                     "predictor=linear", "train.epochs=2"]))
    first = train(cfg, progress=False)
    ckpt = predictor_dir(cfg, build.features(cfg))
    weights = (ckpt / "predictor.safetensors").read_bytes()
    spec = spec_of(cfg.tap.layers, bank.read_meta(root))
    os.truncate(ckpt / "predictor.safetensors", 100)
    with pytest.raises(CheckpointDamaged, match=rf"{ckpt}: predictor.safetensors has 100 bytes, "
                                                rf"{len(weights)} recorded.*python -m stopexp.train"):
        load_predictor(ckpt, spec, cfg.predictor)
    with pytest.raises(CheckpointDamaged, match=r"; rebuild it with: python -m stopexp.train"):
        build_scorers(cfg, ["linear"], spec, build.features(cfg))
    assert train(cfg, progress=False)["val"] == first["val"]  # rebuilt, not refused
    assert (ckpt / "predictor.safetensors").read_bytes() == weights
    other = validate(compose("train", [*small_bank, f"paths.output_dir={root.parents[2]}",
                                       "predictor=linear", "train.epochs=2", "train.seed=7"]))
    train(other, progress=False)  # the same features and spec, another config
    for damage in ("truncate_json", "drop_json", "other_features", "other_config"):
        meta_path = ckpt / "predictor.json"
        meta = json.loads(meta_path.read_text())
        if damage == "truncate_json":
            meta_path.write_text(meta_path.read_text()[:50])
            with pytest.raises(CheckpointDamaged, match=f"file {meta_path} is missing or unreadable"):
                load_predictor(ckpt, spec, cfg.predictor)
        elif damage == "drop_json":  # before: retrained, then dropped beside the old dir, forever
            meta_path.unlink()
        elif damage == "other_features":  # before: "retrain it", and train refused the same checkpoint again
            meta["feature_spec"]["hidden_size"] = 64
            meta_path.write_text(json.dumps(meta))
            with pytest.raises(CheckpointMismatch, match="hidden_size=64.*python -m stopexp.train"):
                load_predictor(ckpt, spec, cfg.predictor)
        else:  # before: loaded, its spec is the same
            shutil.rmtree(ckpt)
            shutil.copytree(predictor_dir(other, build.features(other)), ckpt)
            with pytest.raises(CheckpointMismatch, match=rf"^predictor checkpoint {ckpt} does not fit "
                                                         rf"this config: its predictor.json records "
                                                         rf"key='{predictor_dir(other, build.features(other)).name}', this "
                                                         rf"config expects '{ckpt.name}'"):
                load_predictor(ckpt, spec, cfg.predictor)
            with pytest.raises(CheckpointMismatch, match=r"; rebuild it with: python -m stopexp.train"):
                build_scorers(cfg, ["linear"], spec, build.features(cfg))
        assert train(cfg, progress=False)["val"] == first["val"]
        predictor, saved = load_predictor(ckpt, spec, cfg.predictor)
        assert saved["weights"]["size"] == len(weights)
        assert (ckpt / "predictor.safetensors").read_bytes() == weights


def test_super_token_checkpoint_damage_is_named(tmp_path):
    from stopexp.models.super_token import checkpoint_meta
    from stopexp.signals.checkpoint import load_weights
    from stopexp.signals.features import FeatureSpec

    (tmp_path / "predictor.json").write_text('{"predictor": {"name": "super_token"}, "feat')
    spec = FeatureSpec("toy", 96, [2], ("a",))
    with pytest.raises(CheckpointDamaged, match=f"{tmp_path / 'predictor.json'} is missing or unreadable"):
        checkpoint_meta(tmp_path, spec, compose("train", ["predictor=super_token"]).predictor)
    (tmp_path / "predictor.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")
    with pytest.raises(CheckpointDamaged, match=f"file {tmp_path / 'predictor.safetensors'} cannot be read"):
        load_weights(tmp_path)


def test_damaged_toy_lm_is_named_and_never_loaded(tmp_path, caplog):
    from stopexp.models.toy_lm import COMMITTED, ensure_toy_lm, toy_key, toy_lm_problem

    cfg = compose("collect", [f"paths.output_dir={tmp_path}"])
    key = toy_key(cfg.model.toy, cfg.task)
    committed = COMMITTED / f"toy-{key}"
    assert toy_lm_problem(committed) is None
    cached = tmp_path / "cache" / "toy_lm" / key
    shutil.copytree(committed, cached)
    assert ensure_toy_lm(cfg.model.toy, cfg.task, cfg.paths.cache_dir) == cached
    size = (cached / "model.safetensors").stat().st_size
    os.truncate(cached / "model.safetensors", 1000)
    assert toy_lm_problem(cached) == (f"model.safetensors has 1000 bytes, {size} recorded "
                                      "(truncated or replaced)")
    with caplog.at_level("WARNING"):
        assert ensure_toy_lm(cfg.model.toy, cfg.task, cfg.paths.cache_dir) == committed  # the damaged copy is deleted, the committed one used
    assert "cached toy LM" in caplog.text and "model.safetensors has 1000 bytes" in caplog.text
    assert not cached.exists() and [p.name for p in cached.parent.iterdir()] == [f".{key}.lock"]
    # a directory saved before the record: its weights' header must cover the file
    shutil.copytree(committed, cached)
    info = json.loads((cached / "toy_lm.json").read_text())
    del info["files"]
    (cached / "toy_lm.json").write_text(json.dumps(info))
    assert toy_lm_problem(cached) is None
    os.truncate(cached / "model.safetensors", 1000)
    assert toy_lm_problem(cached).startswith(
        "model.safetensors cannot be read (Error while deserializing header")


def test_a_damaged_job_file_of_a_sweep_is_named(tmp_path):
    from omegaconf import OmegaConf

    from stopexp.runtime import sweeps

    job = tmp_path / "sweep" / "0"
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose("pipeline"), job / ".hydra" / "config.yaml")
    (job / "metrics.json").write_text('{"methods": {"no_pr')
    with pytest.raises(ValueError, match=rf"job {job}: metrics.json or .hydra/config.yaml is "
                                         r"unreadable \(JSONDecodeError.*or delete"):
        sweeps.dir_runs(job.parent)


def test_an_array_job_may_end_incomplete_and_says_which_ranks_owe_shards(copied, caplog):
    cfg, root = copied
    shutil.rmtree(root / shard_of(root, "test"))  # shard 3: rank 1's of 2
    with caplog.at_level("INFO"):
        result = collect(build.collection(cfg), 0, 2)
    assert result == {"bank": str(root), "complete": False, "rank": 0, "world": 2,
                      "shards_written": 0, "paths_written": 0, "shards_total": 4, "shards_done": 3}
    assert "1 of 4 shards missing (indices 3), of ranks 1" in caplog.text
    meta = bank.read_meta(root)
    assert not meta["complete"] and meta["missing"] == [3] and len(meta["shards"]) == 3
    with pytest.raises(bank.BankMissing, match="incomplete"):
        bank.require_bank(build.bank(cfg))
