"""Recorded files are checked cheaply (sizes, sampled blocks) or fully, and content digests
key a bank by what its inputs hold: a task file, a local model's weights, tokenizer or chat
template, a GGUF file, however they were replaced (same size and mtime included)."""
import hashlib
import json
import os
import shutil

from conftest import ROOT, compose
from stopexp.runtime import integrity
from stopexp.stages import build
from stopexp.store.keys import task_content


GSM8K = ROOT / "tests" / "data" / "gsm8k_sample.jsonl"


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

    hub = key()  # a hub id: keyed by its id and revision
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
