"""The decode engine against HF `generate` on a GPU: a randomly initialised ~1B Llama in
bfloat16 (no weights needed), tokens/s and peak memory of each, measured in one run.

    python scripts/bench_gpu.py              # ~1.1B Llama, bf16, on CUDA
    python scripts/bench_gpu.py --tiny       # a tiny model on CPU: checks the script runs

Rows: HF `generate(do_sample=True, num_return_sequences=N)`; the engine with the same N
paths; the engine with taps on two layers; Launch-Check-Resume (N paths to the check, K
kept to the end). Random weights never emit EOS by chance often, so every path runs to
`max_new_tokens`; the comparison is per generated token either way.
"""
from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stopexp.search.decode import Engine, SamplingParams
from stopexp.search.taps import Taps


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(fn, device, repeats: int):
    """(best seconds, generated tokens, peak memory GiB) over `repeats` runs after a warm-up."""
    fn()
    best, n = float("inf"), 0
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        n = fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return best, n, peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU (a dry run)")
    ap.add_argument("--prompts", type=int, default=1, help="distinct prompts, N paths each")
    ap.add_argument("--paths", type=int, default=64)
    ap.add_argument("--keep", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--check", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    if a.tiny:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=128, max_position_embeddings=1024)
        dtype, a.paths, a.keep, a.prompt_tokens, a.new_tokens, a.check = torch.float32, 8, 2, 16, 24, 6
        a.prompts = min(a.prompts, 2)
    else:  # Llama-3.2-1B-like shapes
        cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, num_hidden_layers=16,
                          num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                          max_position_embeddings=4096, tie_word_embeddings=True)
        dtype = torch.bfloat16
    cfg.eos_token_id, cfg.pad_token_id = 0, 0
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 0, 0
    n_params = sum(p.numel() for p in model.parameters())
    prompts = torch.randint(1, cfg.vocab_size, (a.prompts, a.prompt_tokens)).tolist()
    launched = [p for p in prompts for _ in range(a.paths)]  # N paths per prompt, in order
    params = SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0)
    seeds = list(range(len(launched)))
    kept = torch.tensor([i * a.paths + j for i in range(a.prompts) for j in range(a.keep)])

    def hf():
        enc = torch.tensor(prompts, device=device)
        out = model.generate(enc, attention_mask=torch.ones_like(enc), do_sample=True,
                             temperature=1.0, top_k=None, max_new_tokens=a.new_tokens,
                             min_new_tokens=a.new_tokens, num_return_sequences=a.paths,
                             pad_token_id=0, eos_token_id=0)
        return int(out[:, enc.shape[1]:].numel())

    def engine(taps=None):
        eng = Engine(model, 0, 0, params, taps, (a.check,) if taps else ())
        state = eng.run(eng.launch(launched, seeds))
        return int(state.lengths.sum())

    def lcr():  # Launch-Check-Resume: N paths to the check, K of each prompt's to the end
        eng = Engine(model, 0, 0, params)
        state = eng.run(eng.launch(launched, seeds), until=a.check)
        state.keep_paths(kept)
        return int(eng.run(state).lengths.sum())

    rows = [("HF generate", *measure(hf, device, a.repeats)),
            ("engine", *measure(engine, device, a.repeats))]
    with Taps(model, [cfg.num_hidden_layers // 2, cfg.num_hidden_layers - 1], "last") as taps:
        rows.append(("engine + taps", *measure(lambda: engine(taps), device, a.repeats)))
    rows.append((f"LCR {a.paths}->{a.keep}", *measure(lcr, device, a.repeats)))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"Llama {n_params / 1e9:.2f}B random init, {dtype}, {name}; {a.prompts} prompts x N={a.paths} paths, "
          f"prompt {a.prompt_tokens} + {a.new_tokens} new tokens, check at {a.check}, keep {a.keep}")
    print(f"{'':<16}{'tokens':>9}{'seconds':>10}{'tokens/s':>11}{'peak GiB':>10}")
    for label, t, n, peak in rows:
        print(f"{label:<16}{n:>9}{t:>10.3f}{n / t:>11.0f}{peak:>10.2f}")
    hf_rate = rows[0][2] / rows[0][1]
    print(f"ratio engine / HF generate (tokens/s): {rows[1][2] / rows[1][1] / hf_rate:.2f}")
    print(f"taps cost: {rows[2][1] / rows[1][1]:.3f}x the engine's time")
    print(f"LCR wall vs full engine run: {rows[3][1] / rows[1][1]:.3f} "
          f"(tokens {rows[3][2] / rows[1][2]:.3f})")


if __name__ == "__main__":
    main()
