"""Which rows of a vLLM forward hold which request's tokens, at which positions: one small
reader per model runner of the pinned vLLM (0.32), both reading host arrays only.

vLLM builds one of two model runners, and the taps (stopexp.search.vllm_taps) read
whichever it built:
- V1, `vllm/v1/worker/gpu_model_runner.py` (the CPU build's: the V2 runner needs Triton):
  the persistent `runner.input_batch` (`req_ids`, `num_reqs`, `num_computed_tokens_cpu`)
  and `runner.query_start_loc.np`.
- V2, `vllm/v1/worker/gpu/model_runner.py` (a GPU's default: `VllmConfig.use_v2_model_runner`):
  a new `InputBatch` dataclass per step, kept in `runner.execute_model_state.input_batch`
  from the forward until `sample_tokens` (`req_ids`, `query_start_loc_np`,
  `num_computed_tokens_np`). Its `positions` live on the device only.

In both, request k's scheduled tokens are rows starts[k]..starts[k+1]-1 at consecutive
positions from its computed tokens, its draft tokens (speculative decoding) last; both
compute the positions from these host values. They are exact while the scheduler is
synchronous (`async_scheduling=False`, which the in-process engine sets): asynchronous
scheduling makes the computed tokens an optimistic guess under speculative decoding.
A draft row's state is valid only if the draft was accepted, which `sample_tokens` tells
(`sampled`: the tokens sampled per request, accepted drafts + 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepRows:
    """A forward's rows in the runner's batch order: request `req_ids[k]` owns rows
    starts[k]..starts[k+1]-1 at positions first[k], first[k]+1, ...; its last drafts[k]
    rows are speculative tokens (drafts None: none this step)."""
    req_ids: list[str]
    starts: np.ndarray
    first: np.ndarray
    drafts: np.ndarray | None = None


def _drafts(req_ids: list[str], scheduler_output) -> np.ndarray | None:
    """Draft tokens scheduled per request (the scheduler's, whatever the runner)."""
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None)
    if not spec:
        return None
    return np.array([len(spec.get(r, ())) for r in req_ids], dtype=np.int64)


class V1Rows:
    """The V1 model runner (vllm/v1/worker/gpu_model_runner.py and the CPU one built on it)."""
    name = "V1"

    @staticmethod
    def rows(runner, scheduler_output) -> StepRows:
        batch = runner.input_batch
        n = batch.num_reqs
        req_ids = list(batch.req_ids[:n])
        return StepRows(req_ids, np.array(runner.query_start_loc.np[: n + 1], dtype=np.int64),
                        np.array(batch.num_computed_tokens_cpu[:n], dtype=np.int64),
                        _drafts(req_ids, scheduler_output))

    @staticmethod
    def sampled(output, rows: StepRows) -> np.ndarray:
        """Tokens sampled per request of `rows` (a synchronous ModelRunnerOutput)."""
        index, tokens = output.req_id_to_index, output.sampled_token_ids
        return np.array([len(tokens[index[r]]) for r in rows.req_ids], dtype=np.int64)


class V2Rows:
    """The V2 model runner (vllm/v1/worker/gpu/model_runner.py)."""
    name = "V2"

    @staticmethod
    def rows(runner, scheduler_output) -> StepRows:
        batch = runner.execute_model_state.input_batch
        n = batch.num_reqs
        req_ids = list(batch.req_ids[:n])
        return StepRows(req_ids, np.array(batch.query_start_loc_np[: n + 1], dtype=np.int64),
                        np.array(batch.num_computed_tokens_np[:n], dtype=np.int64),
                        _drafts(req_ids, scheduler_output))

    @staticmethod
    def sampled(output, rows: StepRows) -> np.ndarray:
        """Tokens sampled per request of `rows`, in batch order (V2's AsyncOutput, once its
        copy to the host is done: the engine core waits for it next anyway)."""
        output.copy_event.synchronize()
        return np.array(output.num_sampled_tokens_np[: len(rows.req_ids)], dtype=np.int64)


def runner_rows(runner):
    """The row reader of `runner`'s model runner, or a RuntimeError naming what it cannot
    read exactly."""
    modules = {c.__module__ for c in type(runner).__mro__}
    if "vllm.v1.worker.gpu.model_runner" in modules:
        rows = V2Rows
        # both rearrange the batch on the device only (the host layout is not the forward's)
        for feature in ("adaptive_verification", "pcp_manager"):
            if getattr(runner, feature, None) is not None:
                raise RuntimeError(f"in-engine taps cannot read vLLM's V2 model runner with "
                                   f"{feature} on; set engine.taps=false")
    elif "vllm.v1.worker.gpu_model_runner" in modules:
        rows = V1Rows
    else:
        raise RuntimeError(f"in-engine taps read vLLM's V1 and V2 model runners, not "
                           f"{type(runner).__qualname__}; set engine.taps=false")
    scheduler = getattr(getattr(runner, "vllm_config", None), "scheduler_config", None)
    if getattr(scheduler, "async_scheduling", False):
        raise RuntimeError("in-engine taps need vLLM's synchronous scheduler "
                           "(async_scheduling=False, as the in-process engine sets)")
    return rows
