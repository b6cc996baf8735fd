"""engine=hf|vllm as a config group: the schema's checks, what engine=vllm refuses before
any model loads, and the bank keys (engine=hf keeps every existing key)."""
import importlib.util

import pytest

from stopexp.config import validate
from stopexp.core.errors import ConfigError
from stopexp.stages import build
from tests.conftest import compose

# pinned bank keys: engine=hf, the default, is left out of them, so no cached bank moves
PINNED_KEYS = {(): "0a385b2c1fa3", ("+exp=smollm2_contrastive",): "216e7d1e891d"}


@pytest.mark.parametrize("overrides", list(PINNED_KEYS))
def test_engine_hf_keeps_existing_bank_keys(overrides):
    assert build.bank(compose("collect", list(overrides))).key == PINNED_KEYS[overrides]
    assert build.bank(compose("collect", [*overrides, "engine=hf"])).key == PINNED_KEYS[overrides]


def test_engine_vllm_keys_another_bank_and_memory_knobs_do_not():
    vllm = ["+exp=smollm2_contrastive", "engine=vllm"]
    key = build.bank(compose("collect", vllm)).key
    assert key != PINNED_KEYS[("+exp=smollm2_contrastive",)]
    # memory sizes change no path, nor does STEP's budget (an evaluation's)
    assert build.bank(compose("collect", [*vllm, "engine.cpu_kvcache_space=2",
                                        "engine.gpu_memory_utilization=0.5",
                                        "engine.kv_budget=0.5"])).key == key
    # what the paths depend on does
    for override in ("engine.max_logprobs=10", "engine.dtype=bfloat16", "engine.enforce_eager=true"):
        assert build.bank(compose("collect", [*vllm, override])).key != key, override


def test_engine_vllm_dtype_follows_model_dtype():
    cfg = compose("collect", ["+exp=smollm2_contrastive", "engine=vllm", "model.dtype=bfloat16"])
    assert cfg.engine.dtype == "bfloat16"


def test_engine_vllm_serves_monte_carlo_rollouts():
    """Rollouts are new requests from each live prefix (stopexp.search.trace.rollout_rewards)."""
    cfg = validate(compose("collect", ["+exp=smollm2_contrastive", "engine=vllm",
                                       "collect.mc_rollouts=2"]))
    assert cfg.collect.mc_rollouts == 2


@pytest.mark.parametrize("overrides,key", [
    (["engine=gpu"], None),  # not an option of the group: Hydra refuses it when composing
    (["engine.max_logprobs=10"], "engine.max_logprobs"),  # read only under engine=vllm
    (["engine.enforce_eager=true"], "engine.enforce_eager"),
    (["engine=vllm", "search.top_p=0.9"], "search.top_p"),
    (["engine=vllm", "search.top_k=5"], "search.top_k"),
    (["engine=vllm", "engine.max_logprobs=3"], "engine.max_logprobs"),  # < search.conf_topk
    (["engine=vllm", "engine.max_model_len=64"], "engine.max_model_len"),  # = max_new_tokens
    (["engine=vllm", "engine.gpu_memory_utilization=0"], "engine.gpu_memory_utilization"),
    (["engine=vllm", "engine.gpu_memory_utilization=1.5"], "engine.gpu_memory_utilization"),
    (["engine=vllm", "engine.cpu_kvcache_space=0"], "engine.cpu_kvcache_space"),
    (["engine.kv_budget=1.5"], "engine.kv_budget"),  # neither blocks nor a share
    (["engine.kv_budget=0"], "engine.kv_budget"),
    (["engine.block_size=0"], "engine.block_size"),
    (["engine=vllm", "engine.tensor_parallel_size=0"], "engine.tensor_parallel_size"),
    (["engine=vllm", "engine.seed=-1"], "engine.seed"),
    (["engine=vllm", "engine.dtype=int8"], "engine.dtype"),
])
def test_what_engine_vllm_cannot_serve_fails_at_validate_naming_the_key(overrides, key):
    if key is None:
        from hydra.errors import MissingConfigException

        with pytest.raises(MissingConfigException, match="engine"):
            compose("pipeline", overrides)
        return
    with pytest.raises(ConfigError, match=f"^{key}: ") as err:
        validate(compose("pipeline", overrides))
    assert "\n" not in str(err.value)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.parametrize("stage", ["collect", "train", "evaluate", "pipeline"])
def test_engine_vllm_validates_for_the_replay_stages(stage):
    cfg = compose(stage, ["+exp=smollm2_contrastive", "engine=vllm"])
    assert validate(cfg) is cfg
    # greedy decoding reads no top-k / top-p filter
    validate(compose(stage, ["engine=vllm", "search.do_sample=false", "search.top_k=5"]))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_online_launch_check_resume_validates_on_vllm_and_online_adapt_does_not():
    validate(compose("evaluate", ["+exp=smollm2_contrastive", "engine=vllm", "evaluate.mode=online"]))
    with pytest.raises(ConfigError, match="^evaluate.mode: 'online' adapt forks") as err:
        validate(compose("adapt", ["+exp=toy_shift", "engine=vllm", "evaluate.mode=online"]))
    assert "\n" not in str(err.value)


def test_engine_vllm_without_vllm_installed_names_the_key(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match="^engine.name: vllm is not installed"):
        validate(compose("collect", ["+exp=smollm2_contrastive", "engine=vllm"]))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.parametrize("beam", [["search=beam", "search.beam_checks=null", "policy=quantile",
                                   "search.check_at=14", "policy.keep=4",
                                   "evaluate.methods=[no_prune,confidence,conf_features,learned]"],
                                  ["evaluate.compare_beam=true"]])
def test_beam_search_under_engine_vllm_reads_the_predictor_of_the_vllm_bank(beam):
    """vLLM is asked for no beam: the beams run on stopexp's engine (the hidden states of
    every step), with the predictor trained on the vLLM bank of the same sampling."""
    sampled = compose("evaluate", ["+exp=smollm2_multistep"])
    cfg = validate(compose("evaluate", ["+exp=smollm2_multistep", *beam]))
    assert cfg.engine.name == "vllm"
    assert build.predictor_dir(cfg, build.feature_set(cfg)) == build.predictor_dir(sampled, build.feature_set(sampled))
    hf = compose("evaluate", ["+exp=smollm2_multistep", *beam, "engine=hf"])
    assert build.bank(hf).key != build.bank(cfg).key


SMOL_VLLM = ["model=smollm2", "task=wordprob", "model.chat_template=false", "engine=vllm"]


@pytest.fixture
def machine(monkeypatch):
    """A machine of 2 CPU cores, 16 GiB and no CUDA device, whatever runs the tests."""
    from stopexp.config import machine as m

    monkeypatch.setattr(m, "cuda_devices", lambda: 0)
    monkeypatch.setattr(m, "cpu_cores", lambda: 2)
    monkeypatch.setattr(m, "memory_gib", lambda: 16.0)
    return monkeypatch, m


# SmolLM2-135M (its GGUF header): 8192 positions, 30 layers, 9 heads, 3 KV heads of 64, so
# one float32 token's KV is 2 x 30 x 3 x 64 x 4 = 46080 bytes: 8192 tokens 0.352 GiB
@pytest.mark.parametrize("overrides,key,msg", [
    (["engine.tensor_parallel_size=3"], "engine.tensor_parallel_size",
     "3 is more than the 2 CPU cores this process may use (no CUDA device); allowed: 1..2"),
    (["engine.tensor_parallel_size=2"], "engine.tensor_parallel_size",
     "2 does not divide the 9 attention heads of 'smollm2-135m-instruct'"),
    (["engine.cpu_kvcache_space=100000"], "engine.cpu_kvcache_space",
     "100000 GiB leaves nothing of this machine's 16.0 GiB of memory for the model"),
    (["engine.cpu_kvcache_space=16"], "engine.cpu_kvcache_space", "16 GiB leaves nothing"),
    (["engine.cpu_kvcache_space=0.001"], "engine.cpu_kvcache_space",
     "0.001 GiB cannot hold one request of 8192 tokens of 'smollm2-135m-instruct' (float32): "
     "that needs 0.352 GiB"),
    (["engine.cpu_kvcache_space=0.04", "engine.max_model_len=1024"], "engine.cpu_kvcache_space",
     "0.04 GiB cannot hold one request of 1024 tokens of 'smollm2-135m-instruct' (float32): "
     "that needs 0.0439 GiB"),
    (["engine.max_model_len=8193"], "engine.max_model_len",
     "8193 is more than the 8192 positions of model 'smollm2-135m-instruct'"),
    (["engine.max_num_batched_tokens=8191"], "engine.max_num_batched_tokens",
     "8191 is below the 8192 tokens of a request"),
])
def test_what_vllm_would_refuse_at_start_up_fails_at_validate(machine, overrides, key, msg):
    with pytest.raises(ConfigError, match=f"^{key}: ") as err:
        validate(compose("collect", [*SMOL_VLLM, *overrides]))
    assert msg in str(err.value)
    # a config for another machine (a SLURM sweep's jobs) validates without the machine's checks
    validate(compose("collect", [*SMOL_VLLM, *overrides]), machine=False)


def test_what_vllm_can_run_here_passes(machine):
    monkeypatch, m = machine
    for overrides in (["engine.tensor_parallel_size=1", "engine.cpu_kvcache_space=15.9"],
                      ["engine.cpu_kvcache_space=0.044", "engine.max_model_len=1024"],
                      ["engine.max_model_len=8192", "engine.max_num_batched_tokens=8192"]):
        validate(compose("collect", [*SMOL_VLLM, *overrides]))
    # on 3 GPUs: the devices bound tensor_parallel_size, and the cache is vLLM's GPU one
    monkeypatch.setattr(m, "cuda_devices", lambda: 3)
    validate(compose("collect", [*SMOL_VLLM, "engine.tensor_parallel_size=3",
                                 "engine.cpu_kvcache_space=0.001"]))
    with pytest.raises(ConfigError, match=r"^engine.tensor_parallel_size: 9 is more than the 3 "
                                          r"CUDA devices of this machine; allowed: 1..3$"):
        validate(compose("collect", [*SMOL_VLLM, "engine.tensor_parallel_size=9"]))


def test_a_sweep_checks_this_machine_only_where_its_jobs_run(machine):
    from stopexp.runtime.overrides import check_overrides

    sweep = ["-m", *SMOL_VLLM, "engine.tensor_parallel_size=1,3"]
    for launcher in ([], ["hydra/launcher=joblib"]):  # jobs run here: refused before the first
        with pytest.raises(ConfigError, match=r"^engine.tensor_parallel_size: 3 is more than .* "
                                              r"\(sweep job 2 of 2: engine.tensor_parallel_size=3\)$"):
            check_overrides("collect", [*sweep, *launcher])
    # SLURM's jobs run on other nodes: each checks its own machine when it starts
    check_overrides("collect", [*sweep, "hydra/launcher=submitit_slurm"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_fraction_of_a_gib_of_cpu_kv_cache_reaches_vllm_in_bytes(monkeypatch):
    """VLLM_CPU_KVCACHE_SPACE takes whole GiB only (int() of it fails on 0.25) and overrides
    the engine's argument: engine.cpu_kvcache_space goes in bytes, the variable unset meanwhile."""
    import os
    from dataclasses import replace

    import vllm

    from stopexp.search import vllm_engine

    seen = {}

    class LLM:
        def __init__(self, **kwargs):
            seen.update(kwargs, env=os.environ.get("VLLM_CPU_KVCACHE_SPACE"))

    monkeypatch.setattr(vllm, "LLM", LLM)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    s = vllm_engine.VllmSettings(model="m", dtype="float32", max_model_len=512,
                                 gpu_memory_utilization=0.9, cpu_kvcache_space=0.25,
                                 tensor_parallel_size=1, max_num_batched_tokens=None,
                                 enable_prefix_caching=True, block_size=32, enforce_eager=True,
                                 seed=0, max_logprobs=20)
    vllm_engine.build_llm(s)
    assert seen["kv_cache_memory_bytes"] == 268435456 and seen["env"] is None
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"  # the user's setting, back afterwards
    seen.clear()
    vllm_engine.build_llm(replace(s, cpu_kvcache_space=None))
    assert "kv_cache_memory_bytes" not in seen and seen["env"] == "4"  # null: vLLM's own
