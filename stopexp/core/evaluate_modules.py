"""Hugging Face `evaluate` modules by local path or by name from the user's `evaluate`
cache, never from the hub (reward=evaluate, reward.module). `evaluate` is imported on first
use: it imports `datasets`, which takes seconds, and only this reward needs it.

A name (`bleu`, `owner/metric`) is looked up where `evaluate.load` keeps the modules it once
fetched (HF_MODULES_CACHE, by default ~/.cache/huggingface/modules/evaluate_modules/metrics:
evaluate-metric--bleu, evaluate-comparison--..., evaluate-measurement--..., owner--metric),
the newest copy first, as `evaluate` itself does offline."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

# the inputs reward=evaluate gives a module: the path's text and the task's references
INPUTS = ("predictions", "references")
_CANONICAL = ("metric", "comparison", "measurement")


def module_script(spec: str) -> Path:
    """The script of the module `spec`: a local .py file, a directory holding <dir>/<dir>.py,
    or a name cached by `evaluate`; ValueError saying where it looked otherwise."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        script = path / f"{path.name}.py"
        if script.is_file():
            return script
        raise ValueError(f"{spec!r} is a directory without {path.name}.py, the script evaluate.load reads")
    if spec.endswith(".py") or spec.count("/") > 1 or spec.startswith((".", "~", "/")):
        raise ValueError(f"{spec!r}: no such file or directory")
    from evaluate import config

    root = Path(config.HF_MODULES_CACHE) / config.MODULE_NAME_FOR_DYNAMIC_MODULES / "metrics"
    dirs = [root / spec.replace("/", "--")] if "/" in spec else \
        [root / f"evaluate-{kind}--{spec}" for kind in _CANONICAL]
    name = spec.rpartition("/")[2]
    scripts = [s for d in dirs if d.is_dir() for s in d.glob(f"*/{name}.py")]
    if not scripts:
        raise ValueError(f"{spec!r} is neither a local file or directory nor in the evaluate cache "
                         f"({root}); give a local path, or run evaluate.load({spec!r}) once online "
                         "to cache it")
    return max(scripts, key=lambda s: s.stat().st_mtime)


def load_module(spec: str):
    """The loaded `evaluate` module `spec` (`module_script`), checked to read no input but
    INPUTS and to read `predictions`; ValueError in one line otherwise. Loaded once per
    content of its script: an edited module is loaded again, also in a long-lived process
    (a notebook), as the bank's key (its module_sha256) says."""
    script = module_script(spec)
    return _load_module(spec, script, hashlib.sha256(script.read_bytes()).hexdigest())


@functools.lru_cache(maxsize=8)
def _load_module(spec: str, script: Path, sha256: str):
    import evaluate

    try:
        module = evaluate.load(str(script), keep_in_memory=True)
    except Exception as e:  # noqa: BLE001  (any error of the module's script)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{spec!r} ({script}) cannot be loaded: {type(e).__name__}: {first}") from None
    inputs = set(input_features(module))
    if "predictions" not in inputs or inputs - set(INPUTS):
        raise ValueError(f"{spec!r} reads the inputs {', '.join(sorted(inputs))}; a reward module "
                         f"reads predictions (the path's text) and optionally references (the task's)")
    return module


def _formats(module) -> list:
    features = module.features
    return list(features) if isinstance(features, list) else [features]


def input_features(module) -> dict:
    """The module's input features, name -> feature (its first format where it has several)."""
    return dict(_formats(module)[0])


def takes_reference_lists(module) -> bool:
    """Whether some input format of the module takes a list of references per prediction
    (multi-reference BLEU, ...) rather than one string."""
    import datasets

    return any("references" in f and not isinstance(f["references"], datasets.Value)
               for f in _formats(module))
