"""Decode engine vs HF `generate`: tokens/s for the same model, batch, sampling settings
and max length, measured in one run; plus the cost of the taps (engine with taps on/off).

    python scripts/bench_decode.py                 # the embedded toy LM
    python scripts/bench_decode.py model=qwen      # any model config (GPU when present)
"""
from __future__ import annotations

import sys
import time

import torch
from hydra import compose, initialize_config_dir

from stopexp.config import project_root, validate
from stopexp.models import load_lm
from stopexp.search.decode import Engine, SamplingParams
from stopexp.search.sample import path_seeds
from stopexp.taps import Taps
from stopexp.tasks import build_task


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(overrides: list[str], batch: int = 32, repeats: int = 5) -> None:
    with initialize_config_dir(str(project_root() / "conf"), version_base="1.3"):
        cfg = validate(compose("collect", ["logger=none", *overrides]))
    model, tok = load_lm(cfg)
    device = next(model.parameters()).device
    p = SamplingParams.from_config(cfg.search)
    problem = build_task(cfg.task).problems("test", 1)[0]
    ids = tok(problem.prompt)["input_ids"]
    seeds = path_seeds(0, problem.prompt, batch)

    def engine_run(taps=None):
        eng = Engine(model, tok.eos_token_id, tok.pad_token_id, p, taps,
                     (max(1, p.max_new_tokens // 10),) if taps else ())
        state = eng.run(eng.launch([ids] * batch, seeds))
        return int(state.lengths.sum())

    def hf_run():
        enc = torch.tensor([ids] * batch, device=device)
        out = model.generate(enc, attention_mask=torch.ones_like(enc), do_sample=True,
                             temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or None,
                             max_new_tokens=p.max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)[:, enc.shape[1]:]
        # tokens up to and including EOS: what the paths really generated
        ended = (out == tok.eos_token_id).int().cumsum(-1)
        return int(((ended == 0) | ((ended == 1) & (out == tok.eos_token_id))).sum())

    torch.manual_seed(0)
    t_hf, n_hf = timed(hf_run, repeats)
    t_eng, n_eng = timed(engine_run, repeats)
    with Taps(model, list(cfg.tap.layers), cfg.tap.pooling) as taps:
        t_tap, n_tap = timed(lambda: engine_run(taps), repeats)
    rows = [("HF generate", n_hf, t_hf), ("engine", n_eng, t_eng), ("engine + taps", n_tap, t_tap)]
    print(f"model={cfg.model.name} batch={batch} max_new_tokens={p.max_new_tokens} "
          f"temperature={p.temperature} device={device} threads={torch.get_num_threads()}")
    print(f"{'':<16}{'tokens':>8}{'seconds':>10}{'tokens/s':>11}")
    for name, n, t in rows:
        print(f"{name:<16}{n:>8}{t:>10.3f}{n / t:>11.0f}")
    print(f"ratio engine / HF generate (tokens/s): {(n_eng / t_eng) / (n_hf / t_hf):.2f}  (target >= 0.9)")
    print(f"taps cost: engine+taps takes {t_tap / t_eng:.3f}x the time of the engine alone")
    if torch.cuda.is_available():
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main(sys.argv[1:])
