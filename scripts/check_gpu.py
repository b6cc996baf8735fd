"""The hf engine in bfloat16 on a GPU, checked end to end (never a test dependency): the
whole pipeline (collect with Monte Carlo rollouts, featurize, train, evaluate online) runs
on CUDA in bfloat16; the features it stored equal a float32 teacher-forced forward on the
CPU within bfloat16 rounding; and the bank of that run has a key of its own, never a float32
run's. Exit 0 when every check passes, 1 when one does not; a summary table at the end.

    python scripts/check_gpu.py          # needs CUDA; torch and stopexp only, no vLLM
    python scripts/check_gpu.py --dry    # the same checks on the CPU, tiny sizes

The LM is the embedded toy LM (a 3-layer Llama of width 96 trained on the arith task,
loaded in bfloat16): random weights give no correct path, and train refuses labels that
cannot teach. The stages run as the user runs them (`python -m stopexp.pipeline`).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from gpu_checks import Verdict, run_checks
from stopexp.config import validate
from stopexp.models.extract import extract
from stopexp.search.sample import prompt_ids
from stopexp.search.taps import Taps
from stopexp.stages import build
from stopexp.store.bank import load_bank
from stopexp.store.feature_rows import load_features
from stopexp.store.keys import numerics_section

ROOT = Path(__file__).resolve().parent.parent

# a run's sizes: a GPU's, and the dry form's (each stage once, in about a minute on one core)
SIZES = {
    "gpu": ["search.n_paths=32", "collect.prompts.train=64", "collect.prompts.val=16",
            "collect.prompts.test=16", "collect.shard_prompts=16", "collect.mc_rollouts=4"],
    "dry": ["search.n_paths=8", "collect.prompts.train=12", "collect.prompts.val=6",
            "collect.prompts.test=6", "collect.shard_prompts=6", "collect.mc_rollouts=2"],
}
BFLOAT16_U = 2.0 ** -8  # bfloat16's unit roundoff (8 bits of significand)


def overrides(out: Path, device: str, dry: bool, dtype: str = "bfloat16") -> list[str]:
    return [f"paths.output_dir={out}", "logger=none", f"model.dtype={dtype}",
            f"model.device={device}", "evaluate.mode=online", *SIZES["dry" if dry else "gpu"]]


def compose(stage: str, args: list[str]):
    """The stage's config as its command line composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return validate(hydra_compose(config_name=stage, overrides=args))


def check_pipeline(args: list[str]) -> Verdict:
    """`python -m stopexp.pipeline` with `args`: it exits 0 and evaluate wrote its metrics."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "stopexp.pipeline", *args], cwd=ROOT,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return Verdict(False, f"exit {done.returncode} after {seconds:.0f} s: {lines[-1] if lines else ''}")
    cfg = compose("pipeline", args)
    metrics = sorted(Path(cfg.paths.output_dir).rglob("metrics.json"))
    return Verdict(bool(metrics), f"exit 0 in {seconds:.0f} s; {len(metrics)} metrics.json written")


def bfloat16_tolerance(layer: int) -> float:
    """The relative (L2) difference allowed between a layer's state computed in bfloat16 and
    in float32: each of a layer's two blocks (attention, MLP) reads bfloat16-rounded inputs
    and weights (u each), rounds its output (u) and the residual sum (u), so adds <= 4u;
    to first order the layers' errors add: 8 (layer + 1) u. A state read at the wrong
    position or layer differs by ~1."""
    return 8 * (layer + 1) * BFLOAT16_U


def check_features(args: list[str], rows: int = 64) -> Verdict:
    """The features the run stored (featurize's forward in the run's dtype and device)
    against a float32 teacher-forced forward on the CPU, on the first `rows` test paths."""
    cfg = compose("pipeline", args)
    feats = build.feature_set(cfg)
    stored = load_features(feats.root, "test")
    bank = load_bank(feats.bank.root, "test")
    cpu = compose("pipeline", [*args, "model.dtype=float32", "model.device=cpu"])
    model, tok = build.lm(cpu)
    layers = list(feats.tap.layers)
    n = min(rows, len(bank))
    seqs = [(prompt_ids(tok, bank["prompt"][r]), list(bank["tokens"][r]),
             list(stored.positions[stored.offsets[r]:stored.offsets[r + 1]])) for r in range(n)]
    with Taps(model, layers, feats.tap.pooling, sequence=True) as taps:
        want = extract(model, taps, seqs, tok.pad_token_id)
    worst = np.zeros(len(layers))
    for r, (ref, _) in enumerate(want):
        got = stored.hidden[stored.offsets[r]:stored.offsets[r + 1]].astype(np.float32)
        if len(got):
            rel = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
            worst = np.maximum(worst, rel.max(axis=0))
    n_layers = model.config.num_hidden_layers
    limits = [bfloat16_tolerance(lay % n_layers) for lay in layers]
    ok = all(w <= lim for w, lim in zip(worst, limits))
    return Verdict(ok, f"layers {layers}, {n} paths, {len(stored.positions)} positions: largest "
                       f"relative difference {', '.join(f'{w:.2e}' for w in worst)} (allowed "
                       f"{', '.join(f'{x:.2e}' for x in limits)})")


def check_keys(args: list[str], device: str) -> Verdict:
    """The bank of the bfloat16 run (written, under its key) against the same config in
    float32 on the CPU; `model.dtype=auto model.device=auto` here keys what it resolves to."""
    bf16 = build.bank(compose("pipeline", args))
    fp32 = build.bank(compose("pipeline", [*args, "model.dtype=float32", "model.device=cpu"]))
    auto = compose("pipeline", [*args, "model.dtype=auto", "model.device=auto"])
    resolved = numerics_section(auto.model)
    want = {"dtype": "bfloat16", "device": "cuda"} if device == "cuda" else None
    ok = bf16.key != fp32.key and bf16.root.is_dir() and resolved == want
    return Verdict(ok, f"bfloat16 bank {bf16.key} ({'written' if bf16.root.is_dir() else 'missing'}), "
                       f"float32 {fp32.key}; auto resolves to {resolved} (expected {want})")


def checks(out: Path, device: str, dry: bool) -> list[tuple[str, object]]:
    args = overrides(out, device, dry)
    return [("pipeline in bfloat16", partial(check_pipeline, args)),
            ("features = teacher-forced", partial(check_features, args)),
            ("bank key of the numerics", partial(check_keys, args, device))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry", action="store_true", help="the same checks on the CPU, tiny sizes")
    args = parser.parse_args(argv)
    if not args.dry and not torch.cuda.is_available():
        print("error: check_gpu.py needs CUDA; run it with --dry on a CPU", file=sys.stderr)
        return 2
    device = "cpu" if args.dry else "cuda"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if device == 'cuda' else 'CPU'}")
    with tempfile.TemporaryDirectory() as tmp:
        return run_checks(checks(Path(tmp) / "outputs", device, args.dry))


if __name__ == "__main__":
    sys.exit(main())
