"""A damaged, stale or incomplete trace bank is never used silently: it is checked against
what its shards and meta.json recorded when written; consumers name the damaged shard or
file and the command that repairs it, and collect recomputes only what is missing."""
import json
import os
import shutil

import numpy as np
import pytest

from conftest import compose, featurized
from stopexp.config import validate
from stopexp.stages import build
from stopexp.stages.collect import collect
from stopexp.stages.train import train_with_controls
from stopexp.store import bank, bank_records


COLUMNS = ("split", "prompt_id", "path_id", "text", "answer", "correct", "length", "tokens",
           "token_logprob", "mc")


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
        train_with_controls(validate(compose("train", [*small_bank, f"paths.output_dir={root.parents[2]}"])),
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
    ("garble_record", "shard.json is missing, unreadable or malformed"),
    ("malformed_record", "shard.json is missing, unreadable or malformed"),
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
    elif damage == "garble_record":
        (root / bad / "shard.json").write_text("{\"rows\": ")
    else:  # valid JSON of another shape
        (root / bad / "shard.json").write_text(json.dumps({"rows": "many", "files": 7}))
    with pytest.raises(bank.BankDamaged, match=rf"damaged: {bad}: {named}"):
        bank.load_bank(root, "val")
    result = collect(build.collection(cfg))  # the damaged shard recomputed once, and kept
    assert result["complete"]
    assert bank.verify_bank(root, full=True)["complete"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # nothing half left
    assert_same_rows(root, reference)


# every field of a shard's record given each wrong shape: a string, a bool, a float, a
# negative count, null, a list, a map of non-records, a file name outside the shard
WRONG = ["many", True, 2.5, -1, None, [], {"x": 7}, {"../meta.json": {"size": 1, "sha256": "0" * 64}}]


def malformed_records(rec: dict):
    for field in ("rows", "splits", "files"):
        for bad in WRONG:
            if not (field == "splits" and bad == {"x": 7}):  # 7 rows of a split "x": a record
                yield {**rec, field: bad}
    for name in rec["files"]:  # each field of a file's record
        for key in ("size", "sha256"):
            for bad in WRONG:
                yield {**rec, "files": {**rec["files"], name: {**rec["files"][name], key: bad}}}
    yield {**rec, "splits": {"train": "6"}}
    yield [rec]


def test_every_malformed_record_is_named_and_a_valid_one_is_not(copied):
    cfg, root = copied
    name = shard_of(root, "train")
    rec = bank.read_record(root / name)
    assert bank_records.record_problem(rec) is None
    for bad in malformed_records(rec):
        assert bank_records.record_problem(bad), bad
        (root / name / "shard.json").write_text(json.dumps(bad))
        assert bank.read_record(root / name) is None
        assert bank.shard_problem(root / name) == "shard.json is missing, unreadable or malformed"
    assert bank_records.record_problem({**rec, "files": {"../x": rec["files"]["state.json"]}}) == \
        "it records a file '../x', which is no plain file name"
    assert bank_records.record_problem({"rows": "many", "files": 7}) == "it records rows='many', a whole number expected"


def test_a_malformed_meta_record_is_named_and_collect_rewrites_it(copied):
    cfg, root = copied
    original = bank.read_meta(root)
    name = shard_of(root, "val")
    for shards, named in [({**original["shards"], name: {"rows": "many", "files": 7}},
                           rf"its record of shard '{name}': it records rows='many'"),
                          (7, "its shards are int, a map of shard name -> record expected")]:
        (root / "meta.json").write_text(json.dumps({**original, "shards": shards}))
        with pytest.raises(bank.BankDamaged, match=rf"meta.json is malformed \({named}.*\); repair: "
                                                    r"python -m stopexp.collect"):
            bank.require_bank(build.bank(cfg))
        assert collect(build.collection(cfg))["complete"]
        assert bank.read_meta(root) == original


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
        train_with_controls(train_cfg, progress=False)  # refused by the record, not at a batch
    assert collect(build.collection(cfg))["complete"]
    assert bank.read_meta(root) == original and snapshot(root) == before  # nothing recomputed
    assert train_with_controls(featurized(train_cfg), progress=False)["val"]["paths"] > 0


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
    assert collect(build.collection(cfg))["complete"]  # recomputed, though it fits its own record
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


def test_an_array_job_may_end_incomplete_and_says_which_ranks_owe_shards(copied, caplog):
    cfg, root = copied
    shutil.rmtree(root / shard_of(root, "test"))  # shard 3: rank 1's of 2
    with caplog.at_level("INFO"):
        result = collect(build.collection(cfg), 0, 2)
    assert result == {"bank": str(root), "complete": False, "rank": 0, "world": 2,
                      "shards_written": 0, "paths_written": 0, "shards_linked": 0, "shards_total": 4,
                      "shards_done": 3}
    assert "1 of 4 shards missing (indices 3), of ranks 1" in caplog.text
    meta = bank.read_meta(root)
    assert not meta["complete"] and meta["missing"] == [3] and len(meta["shards"]) == 3
    with pytest.raises(bank.BankMissing, match="incomplete"):
        bank.require_bank(build.bank(cfg))


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
