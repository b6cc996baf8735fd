"""Artifact keys from the numerics a run uses: model.dtype=auto / model.device=auto resolved
on the machine (stopexp.store.keys.numerics_section), so a GPU's bfloat16 bank, its features
and its predictors never share a key with a CPU's float32 ones, and every CPU key stays
(tests/test_engine_config.py::PINNED_KEYS and tests/test_config_schemas.py pin them)."""
import pytest
import torch

from stopexp.config import validate
from stopexp.stages import build
from stopexp.store.keys import numerics_section
from tests.conftest import compose
from tests.test_engine_config import PINNED_KEYS


def keys(overrides=()) -> tuple[str, str, str]:
    """(bank, features, predictor) keys of the pipeline's config with `overrides`."""
    cfg = validate(compose("pipeline", list(overrides)))
    features = build.feature_set(cfg)
    return features.bank.key, features.key, build.predictor_dir(cfg, features).name


@pytest.fixture
def gpu(monkeypatch):
    """A machine whose torch sees one CUDA device (bfloat16 unless set otherwise)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    return monkeypatch


LLAMA = ["+exp=llama_contrastive"]  # model.dtype=auto, model.device=auto


@pytest.mark.parametrize("overrides", [(), LLAMA, ("+exp=smollm2_contrastive",),
                                       (*LLAMA, "model.dtype=bfloat16"),
                                       (*LLAMA, "model.dtype=float32", "model.device=cpu"),
                                       (*LLAMA, "engine=vllm")])
def test_a_cpu_run_adds_nothing_to_its_keys(overrides):
    cfg = compose("collect", list(overrides))
    assert numerics_section(cfg.model, cfg.engine) is None
    for pinned, key in PINNED_KEYS.items():
        assert build.bank(compose("collect", list(pinned))).key == key


def test_auto_on_a_gpu_keys_other_banks_features_and_predictors(gpu):
    gpu.undo()
    cpu = keys(LLAMA)
    gpu.setattr(torch.cuda, "is_available", lambda: True)
    gpu.setattr(torch.cuda, "device_count", lambda: 1)
    gpu.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    bf16 = keys(LLAMA)
    assert all(g != c for g, c in zip(bf16, cpu)), (bf16, cpu)
    cfg = compose("collect", LLAMA)
    assert numerics_section(cfg.model, cfg.engine) == {"dtype": "bfloat16", "device": "cuda"}
    gpu.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a GPU without bfloat16
    assert numerics_section(cfg.model, cfg.engine) == {"dtype": "float16", "device": "cuda"}
    assert keys(LLAMA)[0] not in (bf16[0], cpu[0])


def test_a_gpu_run_that_says_its_numerics(gpu):
    """float32 on the GPU is other numerics than on the CPU; the CPU named on a GPU machine
    (the toy LM's model.device=cpu) is the CPU's bank."""
    smollm2 = compose("collect", ["+exp=smollm2_contrastive"])  # float32, device auto
    assert numerics_section(smollm2.model, smollm2.engine) == {"dtype": "float32", "device": "cuda"}
    assert build.bank(smollm2).key != PINNED_KEYS[("+exp=smollm2_contrastive",)]
    assert numerics_section(compose("collect").model) is None
    assert build.bank(compose("collect")).key == PINNED_KEYS[()]
    explicit = compose("collect", [*LLAMA, "model.dtype=bfloat16", "model.device=cuda"])
    assert numerics_section(explicit.model, explicit.engine) is None  # the config says it all


def test_vllm_keys_its_own_device_and_dtype(gpu):
    """vLLM runs on the GPU whatever model.device says; engine.dtype is what it computes in."""
    vllm = [*LLAMA, "engine=vllm"]
    cfg = compose("collect", vllm)
    assert numerics_section(cfg.model, cfg.engine) == {"dtype": "bfloat16", "device": "cuda"}
    cpu_model = compose("collect", [*vllm, "model.device=cpu"])
    assert numerics_section(cpu_model.model, cpu_model.engine) == {"dtype": "float32", "device": "cuda"}
    gpu.undo()
    assert numerics_section(cfg.model, cfg.engine) is None


def test_features_made_by_the_hf_forward_key_its_numerics(gpu):
    """vLLM in float32 makes one bank on any GPU; featurize's HF forward (model.dtype=auto)
    runs in bfloat16 where the GPU has it, else float16: other features. Tapped inside vLLM,
    the features are the bank's numerics."""
    off = [*LLAMA, "engine=vllm", "engine.dtype=float32", "engine.taps=false"]
    bf16 = build.feature_set(compose("pipeline", off))
    assert bf16.numerics == {"dtype": "bfloat16", "device": "cuda"}
    gpu.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    fp16 = build.feature_set(compose("pipeline", off))
    assert fp16.bank.key == bf16.bank.key and fp16.key != bf16.key
    tapped = build.feature_set(compose("pipeline", [*LLAMA, "engine=vllm"]))
    assert tapped.in_engine and tapped.numerics is None
