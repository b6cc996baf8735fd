"""Can the super token's check (stopexp.models.super_token, the STOP design) run inside vLLM,
and what does each way of running it cost? Measured in one run on SmolLM2-135M-Instruct
(float32, eager, vLLM's CPU build in this process, one thread), 16 paths of one prompt of
the task (wordprob), checked at 30 and 60 generated tokens (--checks):

  hf re-encode     what a check on engine=vllm does today (stopexp/search/vllm_steps.py
                   `inputs`, lcr.check_batch without "lm_state"): the super token re-encodes
                   prompt + prefix of every path with the HF model, then scores [STOP]
                   (SuperTokenPredictor.forward on "prompt" / "tokens" / "prefix_len");
  hf live cache    the hf engine's check, for reference: [STOP] only, on a cache that holds
                   the prefixes (SuperTokenPredictor.score_cache; the encode is not timed);
  vllm ids         a request of prompt + prefix + 4 placeholder token ids for [STOP],
                   max_tokens=1, sent to the engine that runs the paths (prefix caching
                   shares the paths' full blocks), the last [STOP] state read by the
                   in-engine tap (stopexp/search/vllm_workers.py) and scored by the head. No
                   LoRA and not the learned [STOP] embedding: NOT the trained predictor, only
                   the least a check inside vLLM can cost;
  vllm lora        the same request with the super token's LoRA as a vLLM LoRARequest
                   (enable_lora), [STOP]'s learned embedding folded into the adapter as an
                   embed_tokens LoRA on the placeholder id. vLLM applies an adapter to every
                   token of its request and keys every cached block by it, so the prefix is
                   recomputed, and with the adapter on: another model than the trained one
                   (whose adapter sees only [STOP]); the script checks the score against HF
                   with the adapter on every position;
  vllm embeds      [STOP] as its learned embedding in a mixed token-ids / prompt_embeds
                   request (enable_prompt_embeds; no LoRA): every block of such a request is
                   keyed by its embeddings, so the prefix is recomputed too;
  vllm lora+patch  vllm lora with vLLM's LoRA block-hash key patched away
                   (kv_cache_utils._gen_lora_extra_hash_keys -> []): what an adapter active
                   only after the prefix (aLoRA-like) would cost. NOT correct: the uncached
                   tail of the prefix gets the adapter and its blocks enter the base cache;
  vllm lora+embeds both in one request: tried last, it crashes vLLM 0.32's CPU LoRA
                   embedding (the engine is lost).

The LoRA engine has max_loras=2: with max_loras=1, vLLM 0.32's CPU LoRA ops
(vllm/lora/ops/torch_ops/lora_ops.py) index the weights of a request without LoRA (-1) as
the last slot, which is the adapter, so the paths batched with a LoRA check get it too.

A vLLM check runs in one engine step together with one decode step of the 16 paths: its
cost is that step's time less the median of the five plain decode steps before it. The
generation time is that of the 16 paths to the last check + 4 tokens (no EOS, no stop
strings, so every path reaches every check), less the checks' costs, on the plain engine
and on the engine with LoRA and prompt embeddings enabled. Each timing is the median of
--runs runs (the plain engine's after one warm-up run); the prefix cache is reset before
each run. The LoRA is the untrained super token's with B drawn at random (peft starts it
at 0), which is all timing needs.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_super_token_vllm.py
    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_super_token_vllm.py --runs 5 --checks 30 60

About 4-5 minutes on 2 cores. Run it on an idle machine: it prints the load average.
"""
from __future__ import annotations

import os
import shutil

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: one thread for HF and vLLM alike

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OVERRIDES = ["+exp=smollm2_contrastive", "engine=vllm", "engine.dtype=float32",
             "engine.enforce_eager=true", "engine.max_model_len=1024",
             "engine.cpu_kvcache_space=1", "logger=none", "predictor=super_token"]
TAP = 29  # SmolLM2's last decoder layer: the super token reads the last layer
FIRST = {"checkpoints": [1], "stride": None, "separator": None}  # the one state a check reads


def config():
    from hydra.core.global_hydra import GlobalHydra

    from stopexp.runtime.overrides import stage_config

    GlobalHydra.instance().clear()
    return stage_config("collect", OVERRIDES)


def save_adapter(st, directory: Path, base: str, pred_cfg, stop_id: int) -> None:
    """The super token's LoRA as a PEFT adapter directory, which vLLM's LoRARequest loads,
    with the learned [STOP] embedding folded in as a rank-1 LoRA of embed_tokens that moves
    the row of `stop_id` (a token no prompt or path holds) onto it: a LoRA request then
    feeds [STOP] as that token id, with no prompt embeddings."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from stopexp.models.super_token import ADAPTER

    state = get_peft_model_state_dict(st.lm, adapter_name=ADAPTER)
    emb = st.lm.get_input_embeddings().weight
    a, b = torch.zeros(pred_cfg.lora_rank, emb.shape[0]), torch.zeros(emb.shape[1], pred_cfg.lora_rank)
    a[0, stop_id] = 1.0  # peft: delta = (B @ A).T * alpha / r
    b[:, 0] = (st.stop.detach().float() - emb[stop_id].detach().float()) \
        * pred_cfg.lora_rank / pred_cfg.lora_alpha
    state["model.embed_tokens.lora_embedding_A"], state["model.embed_tokens.lora_embedding_B"] = a, b
    save_file({f"base_model.model.{k}": v.detach().contiguous() for k, v in state.items()},
              str(directory / "adapter_model.safetensors"))
    LoraConfig(r=pred_cfg.lora_rank, lora_alpha=pred_cfg.lora_alpha,
               target_modules=[*pred_cfg.lora_targets, "embed_tokens"], lora_dropout=0.0,
               base_model_name_or_path=base).save_pretrained(str(directory))


@contextlib.contextmanager
def llm_args(**extra):
    """stopexp's build_llm with `extra` arguments for vllm.LLM (enable_lora, ...)."""
    import vllm

    plain = vllm.LLM
    vllm.LLM = lambda *a, **k: plain(*a, **k, **extra)
    try:
        yield
    finally:
        vllm.LLM = plain


class Bench:
    """One in-process engine (tapping layer TAP) running 16 paths, checked at `checks`."""

    def __init__(self, llm, taps, prompt, seeds, checks, gen_tokens, st, norm):
        self.llm, self.core, self.taps = llm, llm.llm_engine, taps
        self.prompt, self.seeds, self.checks, self.gen_tokens = prompt, seeds, checks, gen_tokens
        self.st, self.norm = st, norm
        self.ids = None  # the paths' tokens of the last run

    def _path_params(self, seed):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(n=1, temperature=0.7, top_p=1.0, top_k=0, seed=seed,
                              max_tokens=self.gen_tokens, ignore_eos=True, logprobs=20,
                              output_kind=RequestOutputKind.DELTA)

    def run(self, ways: dict | None = None) -> dict:
        """The 16 paths from the launch to gen_tokens. `ways`: name -> check(c, prefixes),
        which returns the check requests (request id, prompt, LoRA, tapped prompt length);
        once every path holds c tokens (c in `checks`), each way's requests are added and
        stepped to their end, one way after the other (ways whose cache blocks could meet
        belong in separate runs)."""
        from vllm.inputs import TokensPrompt

        assert not self.core.has_unfinished_requests()
        if not self.core.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache")
        tokens = {f"path{j}": [] for j in range(len(self.seeds))}
        for j, s in enumerate(self.seeds):
            self.core.add_request(f"path{j}", TokensPrompt(prompt_token_ids=list(self.prompt)),
                                  self._path_params(s))
        steps, out = [], {name: {} for name in ways or {}}
        pending = list(self.checks) if ways else []
        start = time.perf_counter()
        while self.core.has_unfinished_requests():
            if pending and min(map(len, tokens.values())) >= pending[0]:
                c = pending.pop(0)
                for name, check in ways.items():
                    out[name][c] = self._check(check(c, [t[:c] for t in tokens.values()]), tokens,
                                               statistics.median(steps[-5:]))
                continue
            tic = time.perf_counter()
            for o in self.core.step():
                tokens[o.request_id] += list(o.outputs[0].token_ids)
            steps.append(time.perf_counter() - tic)
        self.ids = list(tokens.values())
        wall = time.perf_counter() - start
        # the paths' own time: less each check's cost beyond the decode step it replaced
        return {"wall_s": wall, "checks": out,
                "gen_s": wall - sum(x["net_s"] for way in out.values() for x in way.values())}

    def _check(self, reqs, tokens, plain: float) -> dict:
        """Add the check requests, step until they end (the paths step along), read the last
        [STOP] state each one's tap kept and score it with the super token's head."""
        from vllm import SamplingParams

        tic = time.perf_counter()
        watches = {}
        for rid, prompt, lora, tapped in reqs:
            watches[rid] = self.taps.watch(rid, tapped, lambda k: k == 1)
        self.taps.flush()
        for rid, prompt, lora, tapped in reqs:
            self.core.add_request(rid, prompt, SamplingParams(max_tokens=1, temperature=0.0),
                                  lora_request=lora)
        n_steps, cached = 0, {}
        while len(cached) < len(watches):
            n_steps += 1
            for o in self.core.step():
                if o.request_id in watches:
                    if o.finished:
                        cached[o.request_id] = o.num_cached_tokens
                else:
                    tokens[o.request_id] += list(o.outputs[0].token_ids)
            self.taps.collect()
        hidden = torch.from_numpy(np.stack([watches[rid].states[1][0] for rid, *_ in reqs]))
        with torch.no_grad():
            scores = self.st.head(self.norm(hidden)).squeeze(-1)
        raw = time.perf_counter() - tic
        for rid in watches:
            self.taps.forget(rid)
        return {"raw_s": raw, "steps": n_steps, "net_s": raw - n_steps * plain,
                "plain_step_s": plain, "cached": [cached[rid] for rid, *_ in reqs],
                "length": [len(p["prompt_token_ids"]) for _, p, *_ in reqs],
                "scores": scores.tolist(), "hidden": hidden, "first": reqs[0][1]}

    def repeat(self, runs: int, ways=None) -> list[dict]:
        return [self.run(ways) for _ in range(runs)]


def placeholder_check(prompt, stop_id, n, lora=None):
    from vllm.inputs import TokensPrompt

    def check(c, prefixes):
        reqs = []
        for j, t in enumerate(prefixes):
            ids = list(prompt) + t + [stop_id] * n
            reqs.append((f"chk:{c}:{j}", TokensPrompt(prompt_token_ids=ids), lora, len(ids) - 1))
        return reqs
    return check


def embeds_check(prompt, stop, n, lora=None):
    """[STOP] as the learned embedding: a mixed request, prompt_embeds full length (zeros at the
    token-id positions, as vLLM requires one row per position)."""
    def check(c, prefixes):
        reqs = []
        for j, t in enumerate(prefixes):
            ids = list(prompt) + t
            emb = torch.zeros(len(ids) + n, stop.shape[0])
            emb[len(ids):] = stop
            p = {"prompt_embeds": emb, "prompt_token_ids": ids + [0] * n,
                 "prompt_is_token_ids": [True] * len(ids) + [False] * n}
            reqs.append((f"emb:{c}:{j}", p, lora, len(ids) + n - 1))
        return reqs
    return check


@torch.no_grad()
def reference(st, ids: list[int], n: int, adapter: bool) -> float:
    """HF's score of prompt + prefix `ids` + n [STOP] (its learned embedding), the adapter
    on every position (`adapter`) or on none."""
    lm = st.lm
    emb = lm.get_input_embeddings()(torch.tensor([ids]))
    x = torch.cat([emb, st.stop.to(emb.dtype).expand(1, n, -1)], 1)
    with st._adapter() if adapter else contextlib.nullcontext():
        hidden = lm.get_decoder()(inputs_embeds=x).last_hidden_state
    return float(st.head(hidden[:, -1].float()).squeeze())


def median_of(runs: list[dict], name: str, c: int, key: str) -> float:
    """The median over runs of one way's `key` at check c (lists: their mean per path)."""
    values = [r["checks"][name][c][key] for r in runs]
    return statistics.median(sum(v) / len(v) if isinstance(v, list) else v for v in values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--checks", type=int, nargs="+", default=[30, 60])
    ap.add_argument("--paths", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"load average at start: {os.getloadavg()}", flush=True)

    from stopexp.models import load_lm
    from stopexp.models.super_token import SuperTokenPredictor
    from stopexp.models.vllm_lm import vllm_settings
    from stopexp.search.sample import path_seeds, prompt_ids
    from stopexp.search.vllm_engine import build_llm, shutdown, vllm_package
    from stopexp.search.vllm_workers import WorkerTaps
    from stopexp.tasks import build_task

    cfg = config()
    settings, _, _ = vllm_settings(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task)
    settings = replace(settings, in_process=True, tap_layers=(TAP,))
    lm, hf_tok = load_lm(cfg.model, cfg.paths.cache_dir, cfg.task)
    problem = build_task(cfg.task).problems("test", 1)[0]
    prompt = prompt_ids(hf_tok, problem.prompt)
    seeds = path_seeds(cfg.seed, problem.prompt, args.paths)
    n_stop = cfg.predictor.n_tokens
    gen_tokens = max(args.checks) + 4

    torch.manual_seed(0)
    st = SuperTokenPredictor(cfg.predictor, copy.deepcopy(lm), hf_tok).eval()
    for name, p in st.lora.items():  # peft starts B at 0: an adapter that changes nothing
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    norm = lm.model.norm
    adapter = Path(tempfile.mkdtemp(prefix="stop_lora_"))
    stop_id = lm.config.vocab_size - 1  # [STOP]'s placeholder id (checked unused below)
    save_adapter(st, adapter, settings.model, cfg.predictor, stop_id)
    print(f"prompt: {len(prompt)} tokens; {args.paths} paths to {gen_tokens} tokens; checks at "
          f"{args.checks}; vLLM {vllm_package()[1]}; torch threads {torch.get_num_threads()}",
          flush=True)

    # -- the plain engine: generation, and the [STOP] check as placeholder ids ---------------
    ids = placeholder_check(prompt, stop_id, n_stop)
    llm = build_llm(settings)
    taps = WorkerTaps(llm, (TAP,), positions=FIRST)
    b = Bench(llm, taps, prompt, seeds, args.checks, gen_tokens, st, norm)
    b.run()  # warm-up
    runs = {"vllm ids": b.repeat(args.runs, {"vllm ids": ids})}
    gen = statistics.median(r["gen_s"] for r in runs["vllm ids"])
    paths = b.ids
    assert stop_id not in prompt and not any(stop_id in t for t in paths)
    taps.close()
    shutdown(llm)

    # -- the HF re-encode, on the paths the engine generated ----------------------------------
    hf = {}
    for c in args.checks:
        batch = {"prompt": [problem.prompt] * args.paths,
                 "tokens": [torch.tensor(t[:c]) for t in paths],
                 "prefix_len": torch.full((args.paths,), float(c))}
        times, live = [], []
        with torch.no_grad():
            for _ in range(args.runs):
                tic = time.perf_counter()
                st(batch)
                times.append(time.perf_counter() - tic)
            cache, mask, pos = st.encode([prompt + t[:c] for t in paths])
            for _ in range(args.runs):
                tic = time.perf_counter()
                st.score_cache(cache, mask, pos)
                live.append(time.perf_counter() - tic)
            del cache
        hf[c] = {"reencode_s": statistics.median(times), "live_s": statistics.median(live)}

    # -- the engine with LoRA and prompt embeddings enabled -----------------------------------
    from vllm.lora.request import LoRARequest
    from vllm.v1.core import kv_cache_utils

    lora = LoRARequest("stop", 1, str(adapter))
    stop = st.stop.detach().float()
    with llm_args(enable_lora=True, max_lora_rank=cfg.predictor.lora_rank, max_loras=2,
                  enable_prompt_embeds=True):  # 2: see the docstring
        llm = build_llm(settings)
    taps = WorkerTaps(llm, (TAP,), positions=FIRST)
    b = Bench(llm, taps, prompt, seeds, args.checks, gen_tokens, st, norm)
    # LoRA-keyed and embedding-keyed blocks never meet: one run serves both
    both = b.repeat(args.runs, {"vllm lora": placeholder_check(prompt, stop_id, n_stop, lora),
                                "vllm embeds": embeds_check(prompt, stop, n_stop)})
    runs["vllm lora"] = runs["vllm embeds"] = both
    gen_lora = statistics.median(r["gen_s"] for r in both)
    same_paths = b.ids == paths
    keyed = kv_cache_utils._gen_lora_extra_hash_keys
    kv_cache_utils._gen_lora_extra_hash_keys = lambda request: []
    try:
        runs["vllm lora+patch"] = b.repeat(args.runs, {"vllm lora+patch": placeholder_check(
            prompt, stop_id, n_stop, lora)})
    finally:
        kv_cache_utils._gen_lora_extra_hash_keys = keyed
    # what the requests computed (path 0, first check), against HF on the same inputs: the
    # LoRA request = the adapter on prompt, prefix and [STOP]; the embeds request = no adapter
    c0 = args.checks[0]
    agree = {}
    for name, adapter_on in (("vllm lora", True), ("vllm embeds", False)):
        got = both[0]["checks"][name][c0]
        first = list(got["first"]["prompt_token_ids"])[:-n_stop]
        want = reference(st, first, n_stop, adapter_on)
        agree[name] = abs(got["scores"][0] - want)
    lora_acts = float((both[0]["checks"]["vllm lora"][c0]["hidden"]
                       - runs["vllm ids"][0]["checks"]["vllm ids"][c0]["hidden"]).abs().max())
    try:
        b.run({"vllm lora+embeds": embeds_check(prompt, stop, n_stop, lora)})
        crash = "ran"
    except Exception as e:  # noqa: BLE001 - what vLLM raises is the finding
        crash = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    taps.close()
    with contextlib.suppress(Exception):
        shutdown(llm)
    shutil.rmtree(adapter, ignore_errors=True)

    # -- the table -----------------------------------------------------------------------------
    print(f"\nload average at end: {os.getloadavg()}")
    print(f"\n{args.paths} paths, prompt {len(prompt)} tokens: generation to {gen_tokens} tokens "
          f"{gen:.3f} s on the plain engine, {gen_lora:.3f} s (x{gen_lora / gen:.3f}) on the engine "
          f"with enable_lora + enable_prompt_embeds (the same tokens: {same_paths})\n")
    head = f"{'check of 16 paths':<18}{'at':>4}{'s/check':>10}{'% of gen':>10}{'cached/path':>13}" \
           f"{'computed/path':>15}{'/ hf re-encode':>16}"
    print(head)
    print("-" * len(head))
    rows = []
    for c in args.checks:
        rows.append(("hf re-encode", c, hf[c]["reencode_s"], 0.0, len(prompt) + c))
        rows.append(("hf live cache", c, hf[c]["live_s"], len(prompt) + c, n_stop))
        for name, rs in runs.items():
            cached = median_of(rs, name, c, "cached")
            rows.append((name, c, median_of(rs, name, c, "net_s"), cached,
                         median_of(rs, name, c, "length") - cached))
    for name, c, sec, cached, computed in rows:
        print(f"{name:<18}{c:>4}{sec:>10.4f}{100 * sec / gen:>9.2f}%{cached:>13.1f}{computed:>15.1f}"
              f"{sec / hf[c]['reencode_s']:>16.3f}")
    print("\nvLLM check steps (raw, with one decode step of the paths; median of runs):")
    for name, rs in runs.items():
        print(f"  {name}: " + ", ".join(
            f"at {c}: {median_of(rs, name, c, 'raw_s'):.4f} s in {median_of(rs, name, c, 'steps'):.0f} "
            f"step(s), plain decode step {median_of(rs, name, c, 'plain_step_s'):.4f} s"
            for c in args.checks))
        print("    cached tokens per request, first run: " + "; ".join(
            f"at {c}: {rs[0]['checks'][name][c]['cached']}" for c in args.checks))
    print(f"\nthe LoRA changes the tapped [STOP] state by up to {lora_acts:.3g} (max abs)")
    print("|score - HF's| of path 0 at the first check: " + ", ".join(
        f"{k} {v:.2e}" for k, v in agree.items()) + " (HF: [STOP] as the learned embedding; "
        "vllm lora against the adapter on every position, vllm embeds against none)")
    print(f"LoRA + prompt embeds in one request: {crash}")
    if len(args.checks) > 1:
        print(f"(vllm lora / embeds after the first check: each request reuses the blocks of the "
              f"path's own previous check request, keyed as they are; a path's first check "
              f"recomputes its whole prefix: see at {args.checks[0]})")
    if args.json:
        results = {"gen_s": gen, "gen_lora_engine_s": gen_lora, "same_paths": same_paths,
                   "hf": hf, "lora_acts": lora_acts, "agree": agree, "lora+embeds": crash,
                   "prompt_tokens": len(prompt),
                   "rows": [dict(zip(("way", "check", "s", "cached", "computed"), r)) for r in rows]}
        args.json.write_text(json.dumps(results, indent=1))

if __name__ == "__main__":
    main()
