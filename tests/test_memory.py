"""KV-cache memory: bytes per token from the config, the schedule estimate by hand, and
the estimate equal to what the online Launch-Check-Resume run holds."""
import copy

import numpy as np
import torch

from stopexp.search.memory import KVMeter, kv_bytes_per_token, memory_summary, schedule_peaks


def test_bytes_per_token_from_the_model_config(tiny_lm):
    model, _ = tiny_lm
    # 2 (K, V) x 2 layers x 2 kv heads x head_dim 32/4 x 4 bytes (float32)
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 8 * 4 == 256
    assert kv_bytes_per_token(copy.deepcopy(model).to(torch.bfloat16)) == 128


def test_schedule_peaks_by_hand():
    # one prompt, 3 paths of a 2-token prompt: full lengths 6, 6, 1; the second pruned at 2
    group, prompt_len = np.zeros(3, int), np.full(3, 2)
    length, spent = np.array([6, 6, 1]), np.array([6, 2, 1])
    # held after step t: t=0: 2+2+2; t=1: 3+3 (the third ended); t=2: 4+4; t=3..5: path 1
    assert schedule_peaks(group, prompt_len, length, spent).tolist() == [8]
    # one wave per path: the longest alone, 2 + 5
    assert schedule_peaks(group, prompt_len, length, spent, np.arange(3)).tolist() == [7]
    # a path never launched (spent 0) holds nothing; two prompts are counted apart
    two = schedule_peaks(np.array([0, 0, 1]), np.array([2, 2, 5]), length, np.array([6, 0, 1]))
    assert two.tolist() == [7, 5]
    s = memory_summary(np.array([7, 5]), 256, estimated=True)
    assert s == {"peak_kv_bytes": 7 * 256.0, "mean_peak_kv_bytes": 6 * 256.0, "kv_estimated": True}


def test_meter_sums_the_cached_tokens_of_each_prompt():
    meter = KVMeter()
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])  # left padding is not counted
    meter.observe(mask.sum(-1), ["a", "a", "b"])
    meter.observe(mask[:1].sum(-1), ["a"])
    assert meter.peak == {"a": 5, "b": 1}


def test_meter_counts_the_engine_queue_as_request_seconds():
    meter = KVMeter()
    assert meter.queue_summary() == {}  # an engine without a queue (hf)
    meter.queue(2.0, running=3, waiting=1, preempted=0)
    meter.queue(1.0, running=2, waiting=2, preempted=1)
    assert meter.queue_summary() == {"waiting_share": 4.0 / 12.0, "waiting_request_s": 4.0,
                                     "preemptions": 1}


def test_online_meter_equals_the_schedule_estimate(tiny_lm):
    from stopexp.core.policies import TopK
    from stopexp.search.decode import SamplingParams, make_engine
    from stopexp.search.decode_steps import DecodeSteps
    from stopexp.search.lcr import launch_check_resume
    from stopexp.search.sample import prompt_ids
    from stopexp.search.taps import Taps
    from stopexp.tasks import ArithTask

    model, tok = tiny_lm
    task = ArithTask(n_steps=2)
    problems = task.problems("test", 3)
    N, K, check, T = 6, 2, 3, 12
    methods = {"first": (lambda b: b["signals"][:, 0], lambda: TopK(K))}
    with Taps(model, [-1]) as taps:
        engine = make_engine(model, tok, SamplingParams(max_new_tokens=T), taps, (check,))
        # 12 rows per forward: two prompts per chunk
        runs, batch = launch_check_resume(DecodeSteps(engine, 12), tok, task, problems, N, 0, check,
                                          methods, 4)
    lengths = np.array([[runs["no_prune"].length[(i, j)] for j in range(N)] for i in range(3)])
    assert (lengths < T).any() and (lengths == T).any()  # some paths end early
    for name, run in runs.items():
        for i, p in enumerate(problems):
            alive = np.array([(i, j) in batch["row"] for j in range(N)])
            kept = np.array([run.kept[(i, j)] for j in range(N)])
            spent = np.where(alive & ~kept, check, lengths[i])
            est = schedule_peaks(np.zeros(N, int), np.full(N, len(prompt_ids(tok, p.prompt))),
                                 lengths[i], spent)
            assert run.kv.peak[i] == est[0], (name, i)
    # cached tokens at the peak, per prompt (pinned): pruning 6 -> 2 at token 3 lowers it
    assert runs["no_prune"].kv.peak == {0: 72, 1: 72, 2: 90}
    assert runs["first"].kv.peak == {0: 60, 1: 48, 2: 50}
