"""The search code on a GPU gives the paths it gives on the CPU: the embedded toy LM runs
collection (with Monte Carlo rollouts), Launch-Check-Resume and pruned beam search on
both devices, and the script prints how many paths agree token for token.

    python scripts/check_gpu.py            # needs CUDA; compares with a CPU run

Sampling draws every token by inverse CDF from the path's own uniform stream, so paths
agree across devices unless a draw falls within float error of a CDF boundary (rare);
every stage must at least run on the GPU without a device mismatch.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stopexp.core.policies import TopK
from stopexp.search.beam import beam_search
from stopexp.search.decode import SamplingParams, eos_ids, make_engine
from stopexp.search.decode_steps import DecodeSteps
from stopexp.search.lcr import launch_check_resume
from stopexp.search.sample import prompt_ids
from stopexp.search.taps import Taps
from stopexp.search.trace import trace_problems
from stopexp.signals.methods import BASELINES
from stopexp.tasks import ArithTask

N, CHECK, KEEP, PROMPTS = 16, 5, 4, 24


def run_on(device: str, model_dir, problems, task) -> dict:
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval().requires_grad_(False)
    eos = eos_ids(model, tok)
    params = SamplingParams(max_new_tokens=48, temperature=1.0)
    out, t = {}, time.perf_counter()
    with Taps(model, [-1], "last") as taps:
        engine = make_engine(model, tok, params)  # collect runs without taps
        cols, _ = trace_problems(engine.steps(), tok, task, problems, N, 0, [CHECK, 12], 2)
        out["collect"] = [tuple(x) for x in cols["tokens"]]
        out["mc"] = [tuple(round(float(v), 3) for v in m) for m in cols["mc"]]
        engine = make_engine(model, tok, params, taps, (CHECK,))
        runs, _ = launch_check_resume(DecodeSteps(engine), tok, task, problems, N, 0, CHECK,
                                      {"confidence": (BASELINES["confidence"], lambda: TopK(KEEP))}, 8)
        out["lcr"] = sorted((k, v) for k, v in runs["confidence"].text.items())
        out["beam"] = [tuple(beam_search(model, prompt_ids(tok, p.prompt), beam_width=4,
                                         max_new_tokens=48, eos_ids=eos, pad_id=tok.pad_token_id,
                                         scorer=BASELINES["confidence"], policy=TopK(2),
                                         patience=1, taps=taps).tokens) for p in problems[:8]]
    out["seconds"] = time.perf_counter() - t
    return out


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("check_gpu.py needs CUDA")
    model_dir = next((Path(__file__).resolve().parent.parent / "stopexp" / "models" / "pretrained").iterdir())
    task = ArithTask()
    problems = task.problems("test", PROMPTS)
    cpu, gpu = run_on("cpu", model_dir, problems, task), run_on("cuda", model_dir, problems, task)
    print(f"{'stage':<10}{'items':>7}{'agree':>7}{'share':>8}")
    for key in ("collect", "mc", "lcr", "beam"):
        agree = sum(a == b for a, b in zip(cpu[key], gpu[key]))
        print(f"{key:<10}{len(cpu[key]):>7}{agree:>7}{agree / len(cpu[key]):>8.3f}")
    print(f"seconds: cpu {cpu['seconds']:.1f}, cuda {gpu['seconds']:.1f}")


if __name__ == "__main__":
    main()
