"""The server (python -m stopexp.serve) under load, pruned against unpruned, in one run: one
server in this process over the exp's engine and predictor, and 1, 8 and 32 concurrent
clients (the real `openai` client over 127.0.0.1), each sending its share of `--requests`
requests one after another. Both arms send the same requests (the task's test prompts,
request k with seed k, `paths` = search.n_paths): the pruned arm runs serve.method, the
unpruned one the same paths to their end (`prune: false`). Before measuring, every prompt is sent
once with max_tokens=1, so that both arms find the prompts in vLLM's prefix cache alike.
Per cell: requests/s, p50 and p95 latency (seconds from sending to the answer), generated
tokens per request and the vote's accuracy; then the ratios pruned / unpruned.

    scripts/main.sh +exp=smollm2_contrastive           # the predictor it serves
    python scripts/bench_serve.py +exp=smollm2_contrastive engine=vllm --requests 64
    python scripts/bench_serve.py +exp=toy_contrastive --requests 64   # the toy, hf engine
"""
from __future__ import annotations

import argparse
import queue
import sys
import threading
import time

import numpy as np
import openai

from stopexp.core.errors import reported
from stopexp.serve.app import make_app
from stopexp.serve.http import bind, serving_in_thread
from stopexp.stages.serve import serving
from stopexp.tasks import build_task
from stopexp.runtime.overrides import stage_config

ARMS = {"pruned": {}, "unpruned": {"prune": False}}


def load(client, model: str, problems, clients: int, extra: dict, task) -> dict:
    """Every problem asked once (request k: seed k) by `clients` clients at a time."""
    todo: queue.Queue = queue.Queue()
    for k in range(len(problems)):
        todo.put(k)
    latency, tokens, correct = [0.0] * len(problems), [0] * len(problems), [False] * len(problems)
    errors: list = []

    def client_loop():
        while True:
            try:
                k = todo.get_nowait()
            except queue.Empty:
                return
            tic = time.perf_counter()
            try:
                r = client.completions.create(model=model, prompt=problems[k].prompt, seed=k, extra_body=extra)
            except Exception as e:  # noqa: BLE001  (counted, shown after the table)
                errors.append(f"request {k}: {e}")
                continue
            latency[k] = time.perf_counter() - tic
            tokens[k] = r.usage.completion_tokens
            correct[k] = bool(task.grade(problems[k], r.choices[0].text))

    start = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, the first: {errors[0]}")
    return {"rps": len(problems) / wall, "p50": float(np.percentile(latency, 50)),
            "p95": float(np.percentile(latency, 95)), "tokens": float(np.mean(tokens)),
            "accuracy": float(np.mean(correct)), "wall": wall}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64, help="requests per cell (test prompts)")
    parser.add_argument("--clients", default="1,8,32", help="concurrent clients, comma-separated")
    args, overrides = parser.parse_known_args(argv)
    cfg = stage_config("serve", [*overrides, "serve.port=0"])
    task = build_task(cfg.task, cfg.model.get("thinking"))
    problems = task.problems("test", args.requests)
    levels = [int(c) for c in args.clients.split(",")]
    sock = bind("127.0.0.1", 0)
    with serving(cfg) as service, serving_in_thread(make_app(service), sock):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="none",
                               max_retries=0, timeout=3600)
        model = service.model_name
        for p in problems:  # the prompts into the prefix cache, for both arms alike
            client.completions.create(model=model, prompt=p.prompt, n=1, max_tokens=1, seed=0)
        cells = {(c, arm): load(client, model, problems, c, extra, task)
                 for c in levels for arm, extra in ARMS.items()}
    method = service.served.method
    print(f"stopexp serve under load: engine={cfg.engine.name}, model {model}, method "
          f"{method.name} (check at {method.checks}), paths={cfg.search.n_paths}, "
          f"{args.requests} test prompts per cell")
    print(f"{'clients':>7} {'arm':<9}{'req/s':>8}{'p50 s':>8}{'p95 s':>8}{'tokens/req':>11}{'accuracy':>9}{'wall s':>8}")
    for (c, arm), r in cells.items():
        print(f"{c:>7} {arm:<9}{r['rps']:>8.3f}{r['p50']:>8.2f}{r['p95']:>8.2f}{r['tokens']:>11.1f}"
              f"{r['accuracy']:>9.3f}{r['wall']:>8.1f}")
    print("pruned / unpruned:")
    for c in levels:
        p, u = cells[(c, "pruned")], cells[(c, "unpruned")]
        print(f"{c:>7} clients: req/s x{p['rps'] / u['rps']:.2f}, p50 x{p['p50'] / u['p50']:.2f}, "
              f"p95 x{p['p95'] / u['p95']:.2f}, tokens x{p['tokens'] / u['tokens']:.2f}, "
              f"accuracy {p['accuracy'] - u['accuracy']:+.3f}")


if __name__ == "__main__":
    with reported():  # a user error (a missing predictor, a bad key) is one line
        main(sys.argv[1:])
