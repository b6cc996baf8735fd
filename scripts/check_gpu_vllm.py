"""In-engine taps on vLLM on a GPU, in one run (never a test dependency):

1. the states vLLM taps while it generates, under its default mode (torch.compile and
   CUDA graphs), against Hugging Face's teacher-forced forward over the same paths, at
   every generated position of two layers (tolerance: bfloat16 rounding, below);
2. Launch-Check-Resume 64 -> 8 (hidden_norm, top-k) against no pruning: the wall ratio
   against the token ratio;
3. tokens/s with taps against an engine without taps, on the same requests.

The model is a random-init Llama of ~1B parameters (no download) with the embedded toy
LM's tokenizer and its arithmetic prompts: the states and the timing are what is checked,
not the text.

    python scripts/check_gpu_vllm.py          # needs CUDA and vllm
    python scripts/check_gpu_vllm.py --dry    # the same checks, a tiny Llama, on the CPU
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from stopexp.core.policies import TopK
from stopexp.models.extract import StepEnds, extract, path_positions, position_filter
from stopexp.search.decode import SamplingParams
from stopexp.search.sample import path_seeds, prompt_ids
from stopexp.search.taps import Taps
from stopexp.search.vllm_engine import VllmEngine, VllmSettings, build_llm, shutdown
from stopexp.search.lcr import launch_check_resume
from stopexp.search.stepping import Running
from stopexp.search.vllm_steps import Stepper, VllmSteps
from stopexp.search.vllm_workers import WorkerTaps
from stopexp.signals.methods import BASELINES
from stopexp.tasks import ArithTask

SIZES = {  # hidden, layers, heads, KV heads, MLP
    "1b": (2048, 16, 32, 8, 5632),
    "tiny": (256, 4, 4, 2, 704),
}


def random_llama(out: Path, size: str, dtype: torch.dtype) -> tuple[Path, int]:
    """A random-init Llama of `size` with the toy LM's tokenizer, saved to `out`."""
    toy = next((Path(__file__).resolve().parent.parent / "stopexp" / "models" / "pretrained").iterdir())
    tok = AutoTokenizer.from_pretrained(toy)
    hidden, layers, heads, kv, mlp = SIZES[size]
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=mlp,
                         max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(dtype).save_pretrained(out)
    tok.save_pretrained(out)
    return out, layers


def engine(model: Path, dtype: str, gpu: bool, layers: tuple[int, ...], params, positions):
    s = VllmSettings(model=str(model), dtype=dtype, max_model_len=1024,
                     gpu_memory_utilization=0.6, cpu_kvcache_space=None if gpu else 1.0,
                     tensor_parallel_size=1, max_num_batched_tokens=None,
                     enable_prefix_caching=True, block_size=16 if gpu else 32,
                     enforce_eager=False, seed=0, max_logprobs=5, in_process=True, tap_layers=layers)
    llm = build_llm(s)
    taps = WorkerTaps(llm, layers, "last", "float32", positions) if layers else None
    tok = AutoTokenizer.from_pretrained(model)
    wanted = position_filter(positions, StepEnds(tok, None)) if layers else None
    return VllmEngine(llm, s, params, (tok.eos_token_id,), tok, taps, wanted), tok


def decode(eng: VllmEngine, tok, problems, n: int) -> tuple[list[Running], float]:
    paths = [Running((i, j), prompt_ids(tok, p.prompt), s) for i, p in enumerate(problems)
             for j, s in enumerate(path_seeds(0, p.prompt, n))]
    start = time.perf_counter()
    stepper = Stepper(eng, paths)
    while stepper.running:
        stepper.step()
    return paths, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry", action="store_true", help="a tiny Llama on the CPU")
    args = parser.parse_args()
    gpu = not args.dry
    if gpu and not torch.cuda.is_available():
        raise SystemExit("check_gpu_vllm.py needs CUDA (or --dry on the CPU)")
    dtype = torch.bfloat16 if gpu else torch.float32
    name = str(dtype).removeprefix("torch.")
    device = "cuda" if gpu else "cpu"
    n_prompts, n_paths, keep, check, new = (16, 64, 8, 32, 128) if gpu else (4, 16, 4, 8, 24)
    task = ArithTask()
    problems = task.problems("test", n_prompts)
    params = SamplingParams(max_new_tokens=new, temperature=1.0)
    every = {"checkpoints": [], "stride": 1, "separator": None}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, n_layers = random_llama(Path(tmp) / "llama", "1b" if gpu else "tiny", dtype)
        layers = (n_layers // 2, n_layers - 1)
        print(f"random Llama {'1b' if gpu else 'tiny'} ({n_layers} layers) in {name} on {device}; "
              f"{n_prompts} prompts x {n_paths} paths, {new} tokens")

        # 1 and 3: taps against the teacher-forced forward; tokens/s with and without taps
        eng, tok = engine(model_dir, name, gpu, layers, params, every)
        tapped, _ = decode(eng, tok, problems[:4], 8)
        tapped_again, tapped_again_s = decode(eng, tok, problems, n_paths)
        shutdown(eng.llm)
        hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        seqs = [(p.prompt, p.tokens, path_positions(p.tokens, every, {})) for p in tapped]
        with Taps(hf, list(layers), "last", sequence=True) as taps:
            want = extract(hf, taps, seqs, tok.pad_token_id)
        del hf
        u = 2.0 ** -24 if dtype == torch.float32 else 2.0 ** -8
        # float32: the matrix products' rounding, sqrt(H) u per product, two per layer,
        # adding up over the layers; bfloat16: every layer's output is rounded to 8 bits
        # of mantissa, and those roundings add up as a random walk over the layers
        hidden = SIZES["1b" if gpu else "tiny"][0]
        limits = [2 * (lay + 1) * math.sqrt(hidden) * u if dtype == torch.float32
                  else 4 * math.sqrt(lay + 1) * u for lay in layers]
        worst = np.zeros(len(layers))
        for p, (ref, _) in zip(tapped, want):
            positions = path_positions(p.tokens, every, {})
            if not positions:  # ended at its first token
                continue
            got = np.stack([p.watch.states[c] for c in positions])
            rel = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
            worst = np.maximum(worst, rel.max(axis=0))
        ok = all(w <= lim for w, lim in zip(worst, limits))
        print(f"1. taps against teacher-forced, layers {list(layers)}: largest relative difference "
              f"{[f'{w:.2e}' for w in worst]} (allowed {[f'{x:.2e}' for x in limits]}): "
              f"{'PASS' if ok else 'FAIL'}")
        plain, _ = engine(model_dir, name, gpu, (), params, every)
        untapped, untapped_s = decode(plain, tok, problems, n_paths)
        shutdown(plain.llm)
        tokens = sum(len(p.tokens) for p in untapped)
        same = [p.tokens for p in untapped] == [p.tokens for p in tapped_again]
        ratio = (sum(len(p.tokens) for p in tapped_again) / tapped_again_s) / (tokens / untapped_s)
        print(f"3. tokens/s with taps / without: {ratio:.3f} (target >= 0.95); the same tokens: {same}")

        # 2: Launch-Check-Resume 64 -> 8 on the tapped engine
        checks = {"checkpoints": [check], "stride": None, "separator": None}
        eng, tok = engine(model_dir, name, gpu, layers, params, checks)
        methods = {"hidden_norm": (BASELINES["hidden_norm"], lambda: TopK(keep))}
        runs, _ = launch_check_resume(VllmSteps(eng), tok, task, problems, n_paths, 0, check, methods, 8)
        shutdown(eng.llm)
        full, pruned = runs["no_prune"], runs["hidden_norm"]
        tok_ratio = sum(pruned.length.values()) / sum(full.length.values())
        wall_ratio = pruned.wall_s / full.wall_s
        print(f"2. Launch-Check-Resume {n_paths} -> {keep} at {check} tokens: token ratio "
              f"{tok_ratio:.3f}, wall ratio {wall_ratio:.3f}, wall - token {wall_ratio - tok_ratio:+.3f} "
              f"(target <= 0.10); check {100 * pruned.check_s / max(pruned.prefix_s + pruned.resume_s, 1e-9):.2f}% "
              "of generation time")


if __name__ == "__main__":
    main()
