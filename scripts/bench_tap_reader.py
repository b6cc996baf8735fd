"""Host cost of the in-engine taps per engine step (stopexp.search.vllm_taps.EngineTaps),
under each of vLLM's model runners, on a synthetic decode batch: no engine, no model.

Each step, `--requests` running requests decode one token each; every one is watched and
(`at`) at a wanted position or (`none`) at none. The tap buffers (`--layers` of
`--hidden` in bfloat16, a GPU's dtype) are filled once; each runner's batch object is
built before the timed call, as the runner builds it in its own step. Timed: what the taps
add to a step (the wrapped execute_model and sample_tokens around runners that do
nothing): the row reader, the rows chosen, the buffer gather and its copy to the host (a
memory copy here), the states kept. Prints a table and the ratios of one run.

    python scripts/bench_tap_reader.py                  # 256 requests, 2 layers, H 2048
    python scripts/bench_tap_reader.py --requests 64 --hidden 4096
"""
import argparse
import dataclasses
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

TARGET_MS = 0.5  # a GPU decode step of a 1B model at 256 requests: ~10-20 ms


def v1_runner(n: int, prompt: int, step: int):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = type("BenchV1", (GPUModelRunner,), {"__init__": lambda self: None})()
    runner.input_batch = InputBatch(n, prompt + 8, n, torch.device("cpu"), 100, [16], [1])
    for k in range(n):
        runner.input_batch.add_request(CachedRequestState(
            req_id=f"r{k}", prompt_token_ids=[1] * prompt, mm_features=[],
            sampling_params=SamplingParams(), generator=None, block_ids=([],),
            num_computed_tokens=prompt + step, output_token_ids=[]))
    runner.query_start_loc = CpuGpuBuffer(n + 1, dtype=torch.int32, device=torch.device("cpu"),
                                          pin_memory=False)
    runner.query_start_loc.np[:] = np.arange(n + 1)
    return runner


def v2_runner(n: int, prompt: int, step: int):
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runner = type("BenchV2", (GPUModelRunner,), {"__init__": lambda self: None})()
    values = {"req_ids": [f"r{k}" for k in range(n)], "num_reqs": n,
              "query_start_loc_np": np.arange(n + 1, dtype=np.int32),
              "num_computed_tokens_np": np.full(n, prompt + step, np.int32)}
    fields = [f.name for f in dataclasses.fields(InputBatch) if f.default is dataclasses.MISSING]
    batch = InputBatch(**{name: values.get(name) for name in fields})
    runner.execute_model_state = SimpleNamespace(input_batch=batch)
    return runner


def next_step(runner, kind: str, n: int, computed: int) -> None:
    """The runner's batch for the next decode step: V1 updates its persistent batch in
    place, V2 builds a new one."""
    if kind == "V1":
        runner.input_batch.num_computed_tokens_cpu[:n] = computed
    else:
        runner.execute_model_state = v2_runner(n, computed, 0).execute_model_state


def per_step(kind: str, args, wanted: bool) -> tuple[list[float], int]:
    """The taps' milliseconds per step and the buffer reads over `args.steps` steps."""
    from stopexp.search.vllm_taps import EngineTaps

    make = {"V1": v1_runner, "V2": v2_runner}[kind]
    n, prompt = args.requests, 32
    runner = make(n, prompt, 0)
    reads = [0]
    buffers = [torch.randn(n, args.hidden).to(torch.bfloat16) for _ in range(args.layers)]

    def counted(buf):
        select = buf.index_select

        def index_select(dim, index):
            reads[0] += 1
            return select(dim, index)
        return SimpleNamespace(device=buf.device, index_select=index_select)

    model = SimpleNamespace(stopexp_tap_layers=tuple(range(args.layers)),
                            stopexp_tap_buffers=[counted(b) for b in buffers])
    runner.get_model = lambda: model
    runner.execute_model = runner.sample_tokens = lambda *a, **k: None
    taps = EngineTaps(runner, tuple(range(args.layers)))
    watches = [taps.watch(f"r{k}", prompt, (lambda c: True) if wanted else (lambda c: False))
               for k in range(n)]
    out = SimpleNamespace(total_num_scheduled_tokens=n, scheduled_spec_decode_tokens={})
    times = []
    for step in range(args.warmup + args.steps):
        next_step(runner, kind, n, prompt + step)  # the runner's own work, untimed
        for w in watches:
            w.states.clear()  # what the stepper takes away between steps
        if step == args.warmup:
            reads[0] = 0
        t = time.perf_counter()
        if taps._execute_model(out) is None:
            taps._sample_tokens(None)
        times.append((time.perf_counter() - t) * 1e3)
    assert not wanted or all(len(w.states) == 1 for w in watches)
    return times[args.warmup:], reads[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=2048)  # Llama-3.2-1B
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.requests} running requests, {args.layers} layers of {args.hidden} (bfloat16), "
          f"{args.steps} steps after {args.warmup}, one thread\n")
    print(f"| runner | requests at a wanted position | ms per step (median) | p90 | buffer reads per step |")
    print("|---|---|---|---|---|")
    medians = {}
    for kind in ("V1", "V2"):
        for wanted in (True, False):
            times, reads = per_step(kind, args, wanted)
            medians[kind, wanted] = statistics.median(times)
            p90 = float(np.percentile(times, 90))
            print(f"| {kind} | {'all' if wanted else 'none'} | {medians[kind, wanted]:.3f} | {p90:.3f} "
                  f"| {reads / args.steps:g} |")
    print()
    for kind in ("V1", "V2"):
        print(f"{kind}: {medians[kind, True] / TARGET_MS:.2f} of the {TARGET_MS} ms target with every "
              f"request watched; a step with none costs {medians[kind, False] / medians[kind, True]:.2f} of it")
    print(f"V2 / V1 with every request watched: {medians['V2', True] / medians['V1', True]:.2f}")


if __name__ == "__main__":
    main()
