"""In-engine taps on vLLM on a GPU, checked in one run (never a test dependency). It prints
the model runner vLLM built (V1 or V2, from the runner's class), its compile and CUDA-graph
modes, the vLLM and torch versions and the device's memory, then checks:

1. taps = teacher-forced: the states vLLM taps while it generates, in its default mode
   (compiled, with CUDA graphs on a GPU), against Hugging Face's teacher-forced forward on
   the same paths, at every generated position of two layers (bfloat16 tolerance, below);
2. the memory share with an HF model loaded: vLLM's fraction is the requested one less what
   the HF model holds (stopexp.search.vllm_memory), the engine starts beside it, and the
   process keeps within the requested share;
3. a changed layer set: a second engine tapping other layers, in the same compile-cache
   dir, reads its layers right (against the teacher-forced forward again);
4. tokens/s with taps against the same engine without them, and against eager mode
   (`enforce_eager=True`, no compilation, no CUDA graphs), on the same requests;
5. Launch-Check-Resume 64 -> 8 (hidden_norm, top-k): the wall ratio against the token ratio.

The model is a random-init Llama of ~1B parameters (no download) with the embedded toy
LM's tokenizer and arithmetic prompts: the states and the timing are what is checked, not
the text. Under 10 minutes on one H100. Exit 0 when every check passes, 1 when one does not.

    python scripts/check_gpu_vllm.py          # needs CUDA and vllm
    python scripts/check_gpu_vllm.py --dry    # the same checks, a tiny Llama, on the CPU

The dry form runs every check's code on vLLM's CPU build in float32 with the memory reader
stubbed (a CPU has no device memory to share); its speed targets are reported, not judged.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import vllm.envs
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from gpu_checks import Verdict, run_checks
from stopexp.core.errors import ConfigError
from stopexp.core.policies import TopK
from stopexp.models.extract import StepEnds, extract, path_positions, position_filter
from stopexp.search.decode import SamplingParams
from stopexp.search.lcr import launch_check_resume
from stopexp.search.sample import path_seeds, prompt_ids
from stopexp.search.stepping import Running
from stopexp.search.taps import Taps
from stopexp.search.vllm_engine import VllmEngine, VllmSettings, build_llm, shutdown, vllm_package
from stopexp.search.vllm_memory import GIB, DeviceMemory, read_device_memory, release_device_memory, vllm_fraction
from stopexp.search.vllm_steps import Stepper, VllmSteps
from stopexp.search.vllm_workers import WorkerTaps
from stopexp.signals.methods import BASELINES
from stopexp.tasks import ArithTask

SIZES = {  # hidden, layers, heads, KV heads, MLP
    "1b": (2048, 16, 32, 8, 5632),
    "tiny": (256, 4, 4, 2, 704),
}
SHARE = 0.6             # engine.gpu_memory_utilization asked of every engine here
SLACK = GIB             # allocations outside torch's allocator (cuBLAS, NCCL), beyond the share
EVERY = {"checkpoints": [], "stride": 1, "separator": None}


def random_llama(out: Path, size: str, dtype: torch.dtype) -> Path:
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
    return out


def tolerance(layer: int, hidden: int, dtype: torch.dtype) -> float:
    """The relative (L2) difference allowed between a layer's state tapped in the engine and
    the teacher-forced one. float32: each layer adds two matrix products whose rounding grows
    as sqrt(H) u (u = 2^-24), and the layers' errors add: 2 (layer + 1) sqrt(H) u. bfloat16
    (u = 2^-8): each of a layer's two blocks reads rounded inputs and weights, rounds its
    output and the residual sum, so adds <= 4u, and the layers' errors add: 8 (layer + 1) u.
    A state read at the wrong position or layer differs by ~1."""
    if dtype == torch.float32:
        return 2 * (layer + 1) * math.sqrt(hidden) * 2.0 ** -24
    return 8 * (layer + 1) * 2.0 ** -8


@dataclass
class Run:
    """What every check shares: the model, its numerics, the requests and what was measured."""
    model: Path
    dtype: torch.dtype
    gpu: bool
    problems: list
    params: SamplingParams
    n_paths: int
    keep: int
    check_at: int
    layers: tuple[int, ...]
    other_layers: tuple[int, ...]
    hidden: int
    measured: dict

    @property
    def device(self) -> str:
        return "cuda" if self.gpu else "cpu"

    def settings(self, layers: tuple[int, ...], eager: bool = False) -> VllmSettings:
        return VllmSettings(model=str(self.model), dtype=str(self.dtype).removeprefix("torch."),
                            max_model_len=1024, gpu_memory_utilization=SHARE,
                            cpu_kvcache_space=None if self.gpu else 1.0, tensor_parallel_size=1,
                            max_num_batched_tokens=None, enable_prefix_caching=True,
                            block_size=16 if self.gpu else 32, enforce_eager=eager, seed=0,
                            max_logprobs=5, in_process=True, tap_layers=layers)

    def engine(self, layers: tuple[int, ...] = (), eager: bool = False, positions=EVERY) -> VllmEngine:
        s = self.settings(layers, eager)
        return self.engine_on(build_llm(s), s, positions)

    def engine_on(self, llm, s: VllmSettings, positions) -> VllmEngine:
        """An engine on `llm`, its taps (if it has tap layers) armed for `positions`."""
        tok = AutoTokenizer.from_pretrained(self.model)
        taps = WorkerTaps(llm, s.tap_layers, "last", "float32", positions) if s.tap_layers else None
        wanted = position_filter(positions, StepEnds(tok, None)) if s.tap_layers else None
        return VllmEngine(llm, s, self.params, (tok.eos_token_id,), tok, taps, wanted)


def decode(eng: VllmEngine, problems, n: int) -> tuple[list[Running], float]:
    """`n` seeded paths of each problem, stepped to their end; the seconds it took."""
    tok = AutoTokenizer.from_pretrained(eng.settings.model)
    paths = [Running((i, j), prompt_ids(tok, p.prompt), s) for i, p in enumerate(problems)
             for j, s in enumerate(path_seeds(0, p.prompt, n))]
    start = time.perf_counter()
    stepper = Stepper(eng, paths)
    while stepper.running:
        stepper.step()
    return paths, time.perf_counter() - start


def runner_class(worker) -> str:
    """The model runner's class, in the worker (sent by collective_rpc)."""
    kind = type(worker.model_runner)
    return f"{kind.__module__}.{kind.__qualname__}"


def describe(llm, taps: WorkerTaps) -> str:
    """The model runner, compile and CUDA-graph modes, versions and memory of a started engine."""
    compilation = llm.llm_engine.vllm_config.compilation_config
    memory = "CPU (no device memory)"
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        memory = f"{torch.cuda.get_device_name()}: {free / GIB:.1f} of {total / GIB:.1f} GiB free"
    return (f"model runner {taps.runner} ({llm.collective_rpc(runner_class)[0]}); compile mode "
            f"{compilation.mode.name}, CUDA graphs {compilation.cudagraph_mode.name}; "
            f"{'-'.join(vllm_package())}, torch {torch.__version__}; {memory}")


def against_teacher_forced(paths: list[Running], layers, hf, pad_id: int, run: Run) -> tuple[list, list]:
    """The largest relative difference per layer between the tapped states of `paths` and
    the HF model's teacher-forced ones, and the allowed ones."""
    seqs = [(p.prompt, p.tokens, path_positions(p.tokens, EVERY, {})) for p in paths]
    with Taps(hf, list(layers), "last", sequence=True) as taps:
        want = extract(hf, taps, seqs, pad_id)
    worst = np.zeros(len(layers))
    for p, (_, _, positions), (ref, _) in zip(paths, seqs, want):
        if positions:  # a path that ended at its first token has none
            got = np.stack([p.watch.states[c] for c in positions])
            rel = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
            worst = np.maximum(worst, rel.max(axis=0))
    return list(worst), [tolerance(lay, run.hidden, run.dtype) for lay in layers]


def verdict_of(name: str, layers, worst, limits) -> Verdict:
    ok = all(w <= lim for w, lim in zip(worst, limits))
    return Verdict(ok, f"{name} layers {list(layers)}: largest relative difference "
                       f"{', '.join(f'{w:.2e}' for w in worst)} (allowed "
                       f"{', '.join(f'{x:.2e}' for x in limits)})")


def check_taps(run: Run) -> Verdict:
    """1, and the tapped engine's share of 4 and 5 (one engine start)."""
    eng = run.engine(run.layers)
    try:
        print(describe(eng.llm, eng.taps), flush=True)
        run.measured["tapped"], _ = decode(eng, run.problems[:4], 8)
        run.measured["tapped_rate"] = decode(eng, run.problems, run.n_paths)
        run.measured["lcr"] = lcr(run, eng)
    finally:
        shutdown(eng.llm)
    hf, tok = hf_model(run)
    worst, limits = against_teacher_forced(run.measured["tapped"], run.layers, hf, tok.pad_token_id, run)
    del hf
    release_device_memory()
    return verdict_of("compiled", run.layers, worst, limits)


def lcr(run: Run, eng: VllmEngine) -> dict:
    """Launch-Check-Resume n_paths -> keep at check_at tokens on the tapped engine."""
    checks = {"checkpoints": [run.check_at], "stride": None, "separator": None}
    s = eng.settings
    eng = run.engine_on(eng.llm, s, checks)
    tok = AutoTokenizer.from_pretrained(run.model)
    methods = {"hidden_norm": (BASELINES["hidden_norm"], lambda: TopK(run.keep))}
    runs, _ = launch_check_resume(VllmSteps(eng), tok, ArithTask(), run.problems, run.n_paths, 0,
                                  run.check_at, methods, 8)
    return runs


def hf_model(run: Run):
    return (LlamaForCausalLM.from_pretrained(run.model, dtype=run.dtype).to(run.device).eval(),
            AutoTokenizer.from_pretrained(run.model))


def device_memory(run: Run, hf) -> DeviceMemory:
    """Device 0's memory as vLLM's share reads it; on the CPU an 80 GiB device, 2 GiB used
    by others, on which this process holds the HF model's weights."""
    if run.gpu:
        release_device_memory()
        return read_device_memory(0)
    held = sum(p.numel() * p.element_size() for p in hf.parameters())
    total = 80 * GIB
    return DeviceMemory(0, total - held - 2 * GIB, total, held)


def check_memory_and_layers(run: Run) -> list[Verdict]:
    """2 and 3: an engine tapping other layers, started beside the HF model in the same
    compile-cache dir."""
    hf, tok = hf_model(run)
    d = device_memory(run, hf)
    fraction = vllm_fraction(SHARE, [d])
    expected = math.floor((SHARE - d.held / d.total) * 10_000) / 10_000
    try:  # a share below what the HF model holds is refused before loading
        vllm_fraction(d.held / d.total / 2, [d])
        refused = "not refused"
    except ConfigError as e:
        refused = "refused" if str(e).startswith("engine.gpu_memory_utilization") else f"refused: {e}"
    used_before = d.total - d.free - d.held
    eng = run.engine(run.other_layers)
    try:
        paths, _ = decode(eng, run.problems[:4], 8)
        if run.gpu:
            free, total = torch.cuda.mem_get_info()
            process = total - free - used_before
        else:
            process = d.held + fraction * d.total
    finally:
        shutdown(eng.llm)
    worst, limits = against_teacher_forced(paths, run.other_layers, hf, tok.pad_token_id, run)
    del hf
    release_device_memory()
    aot = Path(os.environ["VLLM_CACHE_ROOT"]) / "torch_compile_cache" / "torch_aot_compile"
    entries = len(list(aot.iterdir())) if aot.is_dir() else 0
    graphs_ok = entries == 2 or not vllm.envs.VLLM_USE_AOT_COMPILE  # one per layer set
    memory_ok = fraction == expected and refused == "refused" and process <= SHARE * d.total + SLACK
    stub = "" if run.gpu else " (a stubbed 80 GiB device)"
    memory = Verdict(memory_ok, f"HF model {d.held / GIB:.2f} GiB held{stub}: vLLM's share {fraction:.4f} "
                                f"(expected {expected:.4f}); a share below it {refused}; the process "
                                f"holds {process / GIB:.1f} GiB (allowed {SHARE * d.total / GIB:.1f} + "
                                f"{SLACK / GIB:.0f} GiB)")
    changed = verdict_of(f"{entries} compiled graphs in one cache dir (expected 2);",
                         run.other_layers, worst, limits)
    return [memory, Verdict(changed.passed and graphs_ok, changed.numbers)]


def check_speed(run: Run) -> Verdict:
    """4: tokens/s with taps against the compiled engine without them and against eager."""
    tapped, tapped_s = run.measured["tapped_rate"]
    rates = {"taps": sum(len(p.tokens) for p in tapped) / tapped_s}
    same = True
    for name, eager in (("no taps", False), ("eager", True)):
        eng = run.engine(eager=eager)
        try:
            paths, seconds = decode(eng, run.problems, run.n_paths)
        finally:
            shutdown(eng.llm)
        rates[name] = sum(len(p.tokens) for p in paths) / seconds
        same &= eager or [p.tokens for p in paths] == [p.tokens for p in tapped]
    with_taps, over_eager = rates["taps"] / rates["no taps"], rates["taps"] / rates["eager"]
    # on a GPU the taps cost <= 5% of a step and CUDA graphs beat eager decoding; on the CPU
    # a tiny model's step is the fixed host cost, so the ratios are reported, not judged
    fast = with_taps >= 0.95 and over_eager >= 1.0 if run.gpu else True
    return Verdict(same and fast, f"tokens/s {rates['taps']:.0f} with taps, {rates['no taps']:.0f} "
                                  f"without, {rates['eager']:.0f} eager: {with_taps:.3f}x without "
                                  f"(target >= 0.95), {over_eager:.3f}x eager (target >= 1.0"
                                  f"{'' if run.gpu else '; not judged on the CPU'}); the same "
                                  f"tokens with and without taps: {same}")


def check_lcr(run: Run) -> Verdict:
    """5: the pruned run's wall time follows its tokens."""
    runs = run.measured["lcr"]
    full, pruned = runs["no_prune"], runs["hidden_norm"]
    token_ratio = sum(pruned.length.values()) / sum(full.length.values())
    wall_ratio = pruned.wall_s / full.wall_s
    gap = wall_ratio - token_ratio
    ok = token_ratio < 1 and (gap <= 0.10 if run.gpu else True)
    return Verdict(ok, f"{run.n_paths} -> {run.keep} at {run.check_at} tokens: token ratio "
                       f"{token_ratio:.3f}, wall ratio {wall_ratio:.3f}, gap {gap:+.3f} (target <= 0.10"
                       f"{'' if run.gpu else '; not judged on the CPU'})")


def checks(run: Run) -> list:
    """The checks in the order they run; 2 and 3 share one engine."""
    shared: dict = {}

    def memory():
        shared["v"] = check_memory_and_layers(run)
        return shared["v"][0]

    def changed():
        if "v" not in shared:
            raise RuntimeError("the memory check did not run")
        return shared["v"][1]

    def after_taps(check):
        def go():
            if "tapped_rate" not in run.measured:
                raise RuntimeError("the tapped engine did not run")
            return check(run)
        return go

    return [("taps = teacher-forced", lambda: check_taps(run)), ("memory share beside HF", memory),
            ("changed layer set", changed), ("tokens/s", after_taps(check_speed)),
            ("Launch-Check-Resume", after_taps(check_lcr))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry", action="store_true", help="a tiny Llama on the CPU")
    args = parser.parse_args(argv)
    gpu = not args.dry
    if gpu and not torch.cuda.is_available():
        print("error: check_gpu_vllm.py needs CUDA; run it with --dry on a CPU", file=sys.stderr)
        return 2
    dtype, size = (torch.bfloat16, "1b") if gpu else (torch.float32, "tiny")
    n_prompts, n_paths, keep, check_at, new = (16, 64, 8, 32, 128) if gpu else (4, 16, 4, 8, 24)
    hidden, n_layers = SIZES[size][:2]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["VLLM_CACHE_ROOT"] = str(Path(tmp) / "vllm")  # one fresh compile cache
        os.environ.pop("VLLM_DISABLE_COMPILE_CACHE", None)
        run = Run(random_llama(Path(tmp) / "llama", size, dtype), dtype, gpu,
                  ArithTask().problems("test", n_prompts),
                  SamplingParams(max_new_tokens=new, temperature=1.0), n_paths, keep, check_at,
                  (n_layers // 2, n_layers - 1), (1, n_layers // 2), hidden, {})
        print(f"random Llama {size} ({n_layers} layers of {hidden}) in {str(dtype)[6:]} on "
              f"{run.device}; {n_prompts} prompts x {n_paths} paths, {new} tokens", flush=True)
        return run_checks(checks(run))


if __name__ == "__main__":
    sys.exit(main())
