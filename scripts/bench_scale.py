"""Scale-out of collection: the same work (the shards of one collection plan) traced by one
process and by two, each process taking the shards whose index % world == rank as under
torchrun; paths/s and tokens/s over the makespan, and the ratio to one process.

    python scripts/bench_scale.py                  # the embedded toy LM on CPU
    python scripts/bench_scale.py model=qwen       # a real model on GPU: peak memory too

On CPU every process gets one thread; on a GPU both processes share the GPUs there are
(LOCAL_RANK picks one). Shards are traced, not written: this measures the LM, not the disk.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.multiprocessing as mp

from stopexp.runtime.overrides import stage_config

WORK = ["logger=none", "search.n_paths=16", "collect.prompts.train=0", "collect.prompts.val=0",
        "collect.prompts.test=32", "collect.shard_prompts=2", "collect.mc_rollouts=0"]


def worker(rank: int, world: int, threads: int | None, overrides: list[str], repeats: int,
           start, results) -> None:
    from stopexp.stages import build
    from stopexp.search.decode import make_engine
    from stopexp.search.sample import row_cap
    from stopexp.search.trace import trace_problems
    from stopexp.store.bank_plan import plan
    from stopexp.tasks import build_task

    if threads:
        torch.set_num_threads(threads)
    os.environ["LOCAL_RANK"] = str(rank)  # device=auto: one GPU per rank where there are several
    cfg = stage_config("collect", [*WORK, *overrides])
    task = build_task(cfg.task)
    shards = plan(cfg.collect, task)[rank::world]
    model, tok = build.lm(cfg, progress=False)
    checkpoints = build.bank(cfg).checkpoints
    # collect runs without taps: features are extracted afterwards
    engine = make_engine(model, tok, build.sampling(cfg))

    def trace(problems):
        steps = engine.steps(row_cap(cfg.search, cfg.model, tok, problems))
        cols, _ = trace_problems(steps, tok, task, problems, cfg.search.n_paths, cfg.seed,
                                 checkpoints, 0)
        return len(cols["length"]), int(sum(cols["length"]))

    trace(shards[0][:1])  # warm-up: lazy initialisation stays out of the timing
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    walls = []
    for _ in range(repeats):
        start.wait()  # every process starts the clock together
        t0, paths, tokens = time.perf_counter(), 0, 0
        for shard in shards:
            p, t = trace(shard)
            paths, tokens = paths + p, tokens + t
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    results.put((paths, tokens, walls, peak))


def measure(world: int, threads: int | None, overrides: list[str], repeats: int) -> dict:
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    start, results = ctx.Barrier(world), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, threads, overrides, repeats, start, results))
             for r in range(world)]
    for p in procs:
        p.start()
    out = [results.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a worker failed (exit code {p.exitcode})")
    # per repeat the makespan (the collection is done when the last rank is); the best repeat,
    # as a shared machine only ever adds time
    wall = min(max(o[2][i] for o in out) for i in range(repeats))
    peaks = [o[3] for o in out if o[3] is not None]
    return {"paths": sum(o[0] for o in out), "tokens": sum(o[1] for o in out), "wall": wall,
            "peak": max(peaks) if peaks else None}


def main(overrides: list[str], repeats: int = 3) -> None:
    gpu = torch.cuda.is_available()
    settings = ([("1 process", 1, None), ("2 processes", 2, None)] if gpu else
                [("1 process x 1 thread", 1, 1), ("2 processes x 1 thread", 2, 1)])
    rows = [(name, measure(world, threads, overrides, repeats)) for name, world, threads in settings]
    base = rows[0][1]["paths"] / rows[0][1]["wall"]
    print(f"overrides: {' '.join([*WORK, *overrides])}; best of {repeats} repeats")
    print(f"device: {torch.cuda.get_device_name() if gpu else 'cpu'}; {os.cpu_count()} CPUs visible")
    print(f"{'':<26}{'paths':>7}{'tokens':>9}{'wall s':>9}{'paths/s':>10}{'tok/s':>10}"
          f"{'ratio':>7}" + (f"{'peak GiB':>10}" if gpu else ""))
    for name, r in rows:
        line = (f"{name:<26}{r['paths']:>7}{r['tokens']:>9}{r['wall']:>9.2f}"
                f"{r['paths'] / r['wall']:>10.1f}{r['tokens'] / r['wall']:>10.0f}"
                f"{r['paths'] / r['wall'] / base:>7.2f}")
        print(line + (f"{r['peak']:>10.2f}" if gpu else ""))
    print("ratio: paths/s over the first row" + ("; peak GiB: the largest of one process" if gpu else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
