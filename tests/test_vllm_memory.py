"""vLLM's share of a GPU (stopexp.search.vllm_memory), decided where vLLM starts
(stopexp.search.vllm_engine.build_llm) from what this process holds, on the CPU with the
device's memory stubbed: vLLM refuses to start when less than gpu_memory_utilization x
total is free (vllm/v1/worker/utils.py: request_memory)."""
import pytest
import torch

from stopexp.core.errors import ConfigError
from stopexp.search import vllm_engine
from stopexp.search.vllm_engine import VllmSettings, hold, open_llm
from stopexp.search.vllm_memory import GIB, DeviceMemory, gpu_memory_fraction, vllm_fraction

TOTAL = 80 * GIB
CONTEXT = GIB // 2  # what the CUDA context and other processes' small change take


def device(free_gib: float, held_gib: float = 0.0, index: int = 0) -> DeviceMemory:
    return DeviceMemory(index, int(free_gib * GIB), TOTAL, int(held_gib * GIB))


def test_an_empty_device_gives_vllm_the_whole_share():
    assert vllm_fraction(0.9, [device(79.5)]) == 0.9
    assert vllm_fraction(0.25, [device(79.5)]) == 0.25  # a share given is kept to the bit


def test_a_model_held_beside_vllm_is_taken_off_its_share():
    """An HF model of 16 GiB on an 80 GiB device (taps off): vLLM gets 0.9 - 16/80, so the
    two leave the device's last tenth free, as vLLM alone would."""
    assert vllm_fraction(0.9, [device(63.5, held_gib=16)]) == 0.7
    # tensor parallel: each rank's device; the HF model sits on cuda:0 only
    assert vllm_fraction(0.9, [device(63.5, 16, 0), device(79.5, 0, 1)]) == 0.7


def test_a_share_the_process_already_holds_is_refused_with_the_numbers():
    with pytest.raises(ConfigError) as e:
        vllm_fraction(0.9, [device(4.5, held_gib=75)])
    assert str(e.value) == (
        "engine.gpu_memory_utilization: 0.9 of cuda:0's 80.0 GiB is 72.0 GiB, and this process "
        "already holds 75.0 GiB there (a model loaded beside vLLM, or an engine held open); give "
        "more than 0.94, or load the model on another device")


def test_other_processes_leaving_too_little_is_refused_with_the_numbers():
    """16 GiB held here, 30 GiB by another job: 34 GiB free, vLLM's part is 56 GiB."""
    with pytest.raises(ConfigError) as e:
        vllm_fraction(0.9, [device(79.5, 0, 0), device(34, 16, 1)])
    assert str(e.value) == (
        "engine.gpu_memory_utilization: 0.9 of cuda:1's 80.0 GiB asks 56.0 GiB for vLLM (this "
        "process holds 16.0 GiB there), and 34.0 GiB is free (other processes hold 30.0 GiB); "
        "give at most 0.62, or free the device")
    assert vllm_fraction(0.62, [device(34, 16)]) == 0.42  # the share it names fits


class FakeGPU:
    """One 80 GiB device as torch.cuda reports it: this process's allocated and cached bytes
    (memory_reserved is both; empty_cache gives the cached back), the rest CONTEXT."""

    def __init__(self, monkeypatch):
        self.allocated, self.cached, self.calls = 0, 0, []
        for name in ("is_available", "is_initialized"):
            monkeypatch.setattr(torch.cuda, name, lambda: True)
        monkeypatch.setattr(torch.cuda, "mem_get_info", self.mem_get_info)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i=None: self.allocated + self.cached)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)

    def mem_get_info(self, index=None):
        self.calls.append("mem_get_info")
        return TOTAL - CONTEXT - self.allocated - self.cached, TOTAL

    def empty_cache(self):
        self.calls.append("empty_cache")
        self.cached = 0

    def free(self, nbytes: int):  # tensors dropped: torch keeps them cached
        self.allocated -= nbytes
        self.cached += nbytes


@pytest.fixture
def gpu(monkeypatch):
    return FakeGPU(monkeypatch)


def test_the_cache_is_given_back_before_the_memory_is_read(gpu):
    gpu.allocated, gpu.cached = 16 * GIB, 20 * GIB  # an HF model, and a stage's freed tensors
    assert gpu_memory_fraction(0.9, 1) == 0.7
    assert gpu.calls == ["empty_cache", "mem_get_info"]


def test_on_a_cpu_nothing_is_decided(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_memory_fraction(0.9, 1) == 0.9


class FakeLLM:
    """vllm.LLM on the fake GPU: it allocates its share of the device, and its engine core's
    shutdown drops it (vLLM's in-process shutdown releases the model runner's tensors)."""
    started: list = []

    def __init__(self, gpu, **kwargs):
        self.gpu, self.nbytes = gpu, int(kwargs["gpu_memory_utilization"] * TOTAL)
        FakeLLM.started.append(kwargs["gpu_memory_utilization"])
        gpu.allocated += self.nbytes
        self.llm_engine = type("Engine", (), {"engine_core": self})()

    def shutdown(self):
        self.gpu.free(self.nbytes)


@pytest.fixture
def fake_llm(gpu, monkeypatch):
    import vllm

    FakeLLM.started = []
    monkeypatch.setattr(vllm, "LLM", lambda **kw: FakeLLM(gpu, **kw))
    return FakeLLM


def settings(**changes) -> VllmSettings:
    base = dict(model="m", dtype="bfloat16", max_model_len=256, gpu_memory_utilization=0.9,
                cpu_kvcache_space=None, tensor_parallel_size=1, max_num_batched_tokens=None,
                enable_prefix_caching=True, block_size=32, enforce_eager=True, seed=0,
                max_logprobs=20)
    return VllmSettings(**{**base, **changes})


def test_engines_one_after_another_in_one_process_each_find_the_device_free(gpu, fake_llm):
    """collect's engine, then evaluate's (a pipeline): the first one's memory is back on the
    device when the second starts."""
    with open_llm(settings()):
        assert gpu.allocated == int(0.9 * TOTAL)
    assert gpu.allocated == 0 and gpu.cached == 0
    with open_llm(settings(in_process=True)):
        pass
    assert fake_llm.started == [0.9, 0.9]


def test_an_hf_model_beside_the_engine_lowers_its_share(gpu, fake_llm):
    gpu.allocated = 16 * GIB  # taps off: the HF model reads the states
    with open_llm(settings(in_process=True)):
        pass
    assert fake_llm.started == [0.7]


def test_a_second_engine_beside_a_held_one_is_refused_before_it_loads(gpu, fake_llm):
    with hold(settings()):
        with pytest.raises(ConfigError, match=r"^engine.gpu_memory_utilization: 0.9 of cuda:0's "
                                              r"80.0 GiB is 72.0 GiB, and this process already "
                                              r"holds 72.0 GiB there"):
            with open_llm(settings(seed=1)):
                pass
    assert fake_llm.started == [0.9]  # the second never started
    assert gpu.allocated == 0
    with open_llm(settings(seed=1, gpu_memory_utilization=0.4)):  # after it: the whole share
        pass
    assert fake_llm.started == [0.9, 0.4]


def test_shutdown_gives_the_cache_back(gpu, fake_llm):
    llm = vllm_engine.build_llm(settings())
    vllm_engine.shutdown(llm)
    assert gpu.calls[-1] == "empty_cache" and gpu.cached == 0
