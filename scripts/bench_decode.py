"""Decode engine vs HF `generate` in one run, on the same model, prompts, sampling settings
and max length: tokens/s of HF `generate(do_sample=True, num_return_sequences=N)`, of the
engine (N paths per prompt, no pruning), of the engine with taps, and of Launch-Check-Resume
(N paths to the check prefix search.check_at, then K of N per prompt finished; the kept
paths are the first K, since only the decode cost is measured here); plus peak memory.

    python scripts/bench_decode.py                                   # the embedded toy LM
    python scripts/bench_decode.py model=smollm2 search.n_paths=16 search.max_new_tokens=128
    python scripts/bench_decode.py model=qwen --prompts 8 --keep 4 --repeats 3
    python scripts/bench_decode.py +exp=smollm2_contrastive engine=vllm --prompts 8 --repeats 1

With engine=vllm it compares instead vLLM through stopexp (the engine collect uses), raw
vLLM on the same requests, stopexp's engine and HF generate (`compare_vllm`).

Options (before or after the Hydra overrides): --prompts P (test prompts, default 4),
--keep K (paths kept per prompt at the check, default N/4), --repeats R (best of R timed
runs after one warm-up, default 3). Both sides stop at every EOS id of the model and at
search.stop. Tokens count what the paths really generated (up to and including their end).
"""
from __future__ import annotations

import argparse
import resource
import sys
import time

import torch

from stopexp.core.protocol import checkpoint_tokens
from stopexp.stages import build
from stopexp.search.decode import eos_ids, make_engine
from stopexp.search.sample import launch_lists
from stopexp.search.stepping import run_paths
from stopexp.search.taps import Taps
from stopexp.tasks import build_task
from stopexp.runtime.overrides import stage_config


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_rss_gib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(fn, repeats: int):
    fn()  # warm-up
    best, out = float("inf"), None
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best, out


def generated_tokens(out: torch.Tensor, ends: torch.Tensor) -> int:
    """Tokens of HF's padded output rows up to and including each row's first end token."""
    ended = torch.isin(out, ends).int().cumsum(-1)
    return int(((ended == 0) | ((ended == 1) & torch.isin(out, ends))).sum())


def hf_generate(model, tok, prompts: list, n_paths: int, n_problems: int, p,
                ends: torch.Tensor) -> int:
    """HF `generate` on the same requests: each problem's prompt once, n_paths sequences of
    it, the sampling settings and stops of `p`; returns the tokens generated."""
    distinct = tok.pad([{"input_ids": prompts[i * n_paths]} for i in range(n_problems)],
                       return_tensors="pt").to(ends.device)
    stop = {"stop_strings": list(p.stop), "tokenizer": tok} if p.stop else {}
    out = model.generate(**distinct, do_sample=True, num_return_sequences=n_paths,
                         temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                         max_new_tokens=p.max_new_tokens, pad_token_id=tok.pad_token_id,
                         eos_token_id=ends.tolist(), **stop)
    return generated_tokens(out[:, distinct["input_ids"].shape[1]:], ends)


def peak_rss_of(pid: int) -> float:
    """Peak resident memory (VmHWM) of process `pid` in GiB, 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 2**20
    except (OSError, StopIteration):
        return 0.0


def children_peak_rss_gib() -> float:
    """Summed peak RSS of this process's live descendants (vLLM's engine core and worker)."""
    import psutil

    return sum(peak_rss_of(c.pid) for c in psutil.Process().children(recursive=True))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--keep", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args, overrides = parser.parse_known_args(argv)
    cfg = stage_config("collect", overrides)
    if cfg.engine.name == "vllm":
        return compare_vllm(cfg, args)
    rss_start = peak_rss_gib()
    model, tok = build.lm(cfg)
    rss_model = peak_rss_gib()
    device = next(model.parameters()).device
    p = build.sampling(cfg)
    N, K = cfg.search.n_paths, args.keep or max(1, cfg.search.n_paths // 4)
    check = checkpoint_tokens(cfg.search.check_at, p.max_new_tokens)
    problems = build_task(cfg.task).problems("test", args.prompts)
    prompts, seeds, owners = launch_lists(tok, problems, range(len(problems)), N, cfg.seed)
    ends = torch.tensor(eos_ids(model, tok), device=device)
    peaks = {}

    def measure(name, fn):
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t, n = timed(fn, args.repeats)
        peaks[name] = (peak_rss_gib(), torch.cuda.max_memory_allocated() / 2**30
                       if torch.cuda.is_available() else None)
        return name, n, t

    def engine_run(taps=None):
        eng = make_engine(model, tok, p, taps, (check,) if taps else ())
        return int(eng.run(eng.launch(prompts, seeds)).lengths.sum())

    def pruned_run():
        eng = make_engine(model, tok, p)
        state = eng.run(eng.launch(prompts, seeds), until=check)
        state.keep_paths(torch.tensor([r for r, (_, j) in enumerate(owners) if j < K]))
        return int(eng.run(state).lengths.sum())

    def hf_run():
        return hf_generate(model, tok, prompts, N, len(problems), p, ends)

    torch.manual_seed(0)
    rows = [measure("HF generate", hf_run), measure("engine", engine_run)]
    with Taps.from_config(model, cfg.tap) as taps:
        rows.append(measure("engine + taps", lambda: engine_run(taps)))
    rows.append(measure(f"LCR {N}->{K}", pruned_run))

    print(f"model={cfg.model.name} prompts={len(problems)} paths/prompt={N} "
          f"max_new_tokens={p.max_new_tokens} temperature={p.temperature} stop={list(p.stop)} "
          f"check={check} keep={K} device={device} dtype={cfg.model.dtype} "
          f"threads={torch.get_num_threads()} repeats={args.repeats}")
    print(f"{'':<16}{'tokens':>8}{'seconds':>10}{'tokens/s':>11}{'peak RSS GiB':>14}"
          + (f"{'peak GPU GiB':>14}" if torch.cuda.is_available() else ""))
    for name, n, t in rows:
        rss, gpu = peaks[name]
        print(f"{name:<16}{n:>8}{t:>10.3f}{n / t:>11.0f}{rss:>14.2f}"
              + (f"{gpu:>14.2f}" if gpu is not None else ""))
    (_, n_hf, t_hf), (_, n_eng, t_eng), (_, _, t_tap), (_, n_lcr, t_lcr) = rows
    print(f"ratio engine / HF generate (tokens/s): {(n_eng / t_eng) / (n_hf / t_hf):.2f}  (target >= 0.9)")
    print(f"ratio LCR / HF generate (tokens/s): {(n_lcr / t_lcr) / (n_hf / t_hf):.2f}  (target >= 1.0); "
          f"wall {t_lcr / t_hf:.2f}x HF's for {n_lcr / n_hf:.2f}x its tokens")
    print(f"taps cost: engine+taps takes {t_tap / t_eng:.3f}x the time of the engine alone")
    print(f"peak RSS: {rss_start:.2f} GiB before loading, {rss_model:.2f} GiB after loading the "
          f"model, {peak_rss_gib():.2f} GiB at the end (peaks are cumulative, in run order)")


def generated(steps, prompts, seeds) -> int:
    """Tokens of whole paths on an engine's stepper, with their per-token columns."""
    stepper, paths = run_paths(steps, prompts, seeds)
    stepper.columns(paths)
    return sum(len(p.tokens) for p in paths)


def compare_vllm(cfg, args) -> None:
    """engine=vllm: tokens/s and peak memory of vLLM through stopexp (collect's stepper:
    one request per path, the bank's per-token columns computed), of raw vLLM on the same
    requests (LLM.generate only), of stopexp's own engine and of HF generate, each after one
    warm-up; vLLM runs first and is shut down before the HF model loads."""
    from vllm.inputs import TokensPrompt

    from stopexp.models.vllm_lm import vllm_settings
    from stopexp.search.vllm_engine import VllmEngine, open_llm

    p = build.sampling(cfg)
    N = cfg.search.n_paths
    settings, skeleton, tok = vllm_settings(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task)
    problems = build_task(cfg.task).problems("test", args.prompts)
    prompts, seeds, _ = launch_lists(tok, problems, range(len(problems)), N, cfg.seed)
    rows, peaks = [], {}
    start = time.perf_counter()
    with open_llm(settings) as llm:
        started = time.perf_counter() - start
        engine = VllmEngine(llm, settings, p, eos_ids(skeleton, tok), tok)
        requests = [TokensPrompt(prompt_token_ids=x) for x in prompts]
        params = [engine.request(s) for s in seeds]

        def raw():
            return sum(len(d.outputs[0].token_ids)
                       for d in llm.generate(requests, params, use_tqdm=False))

        for name, fn in (("vLLM, stopexp", lambda: generated(engine.steps(), prompts, seeds)),
                         ("vLLM, raw", raw)):
            t, n = timed(fn, args.repeats)
            rows.append((name, n, t))
            peaks[name] = peak_rss_gib() + children_peak_rss_gib()
    model, hf_tok = build.lm(cfg)
    device = next(model.parameters()).device
    ends = torch.tensor(eos_ids(model, hf_tok), device=device)

    def ours():
        return generated(make_engine(model, hf_tok, p).steps(), prompts, seeds)

    def hf_run():
        return hf_generate(model, hf_tok, prompts, N, len(problems), p, ends)

    torch.manual_seed(0)
    for name, fn in (("stopexp engine", ours), ("HF generate", hf_run)):
        t, n = timed(fn, args.repeats)
        rows.append((name, n, t))
        peaks[name] = peak_rss_gib()
    print(f"model={cfg.model.name} prompts={len(problems)} paths/prompt={N} "
          f"max_new_tokens={p.max_new_tokens} temperature={p.temperature} stop={list(p.stop)} "
          f"dtype={settings.dtype} vllm enforce_eager={settings.enforce_eager} "
          f"threads={torch.get_num_threads()} repeats={args.repeats}; vLLM started in {started:.0f}s")
    print(f"{'':<16}{'tokens':>8}{'seconds':>10}{'tokens/s':>11}{'peak RSS GiB':>14}")
    for name, n, t in rows:
        print(f"{name:<16}{n:>8}{t:>10.3f}{n / t:>11.0f}{peaks[name]:>14.2f}")
    rate = {name: n / t for name, n, t in rows}
    print(f"ratio vLLM through stopexp / raw vLLM (tokens/s): "
          f"{rate['vLLM, stopexp'] / rate['vLLM, raw']:.2f}  (target >= 0.9)")
    print(f"ratio vLLM through stopexp / stopexp engine (tokens/s): "
          f"{rate['vLLM, stopexp'] / rate['stopexp engine']:.2f}  (target >= 1.3)")
    print(f"ratio stopexp engine / HF generate (tokens/s): "
          f"{rate['stopexp engine'] / rate['HF generate']:.2f}")
    print("peak RSS of the vLLM rows: this process plus vLLM's engine processes; of the HF rows: "
          "this process (cumulative, in run order)")


if __name__ == "__main__":
    main(sys.argv[1:])
