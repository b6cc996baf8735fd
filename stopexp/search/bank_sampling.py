"""The collect loop: an open engine (stopexp.engines) samples the N paths of every prompt
of a trace bank's shards (stopexp.search.trace), shard by shard, and hands each back as the
bank's columns with its token count and time, for the store to write
(stopexp.store.bank.write_shard). Every prompt is measured against the model's limit
before any is generated."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

from tqdm import tqdm

from stopexp.search.memory import kv_bytes_per_token
from stopexp.search.sample import PromptTooLong, fit_prompts, prompt_limit, row_cap
from stopexp.search.trace import trace_problems


@dataclass
class SampledShard:
    index: int       # in the bank's plan
    problems: list   # its prompts that fit (model.long_prompts=skip leaves the others out)
    cols: dict       # the bank's columns (trace_problems'), "states" too when the engine taps
    tokens: int      # generated: the paths and their Monte Carlo rollouts
    seconds: float
    clipped: int     # reward values clipped into [0, 1] (rounding: stopexp.metrics.bounds)


def engine_facts(engine, model) -> dict:
    """What every shard's record says about the LM and the engine that sampled it."""
    text_cfg = model.config.get_text_config()
    return {"lm_parameters": sum(p.numel() for p in model.parameters()),
            "hidden_size": text_cfg.hidden_size, "num_layers": text_cfg.num_hidden_layers,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "kv_bytes_per_token": kv_bytes_per_token(model), "engine": engine.record()}


def sample_shards(engine, model, tokenizer, task, shards: dict[int, list], job,
                  checkpoints: list[int], reward=None) -> Iterator[SampledShard]:
    """Each of `shards` (plan index -> problems) sampled by `engine` (`Backend.open`'s,
    with its `model` and `tokenizer`), in order, as the collect `job` says (its model,
    search, engine, collect sections and seed: stopexp.stages.build.Collection), with
    Monte Carlo rollouts at `checkpoints`; `reward` None: the outcome. Raises PromptTooLong
    before generating anything when no prompt fits."""
    limit = prompt_limit(job.model, job.search, job.engine, model)
    fitted = {i: fit_prompts(tokenizer, problems, limit, job.model.long_prompts)
              for i, problems in shards.items()}
    n_prompts = sum(map(len, shards.values()))
    if not any(fitted.values()):
        raise PromptTooLong(
            f"model.max_prompt_tokens: all {n_prompts} prompts are longer than the {limit} "
            "tokens allowed (model.max_prompt_tokens, else the model's positions minus "
            "search.max_new_tokens), and model.long_prompts=skip leaves every one out: "
            "nothing to collect. Allow longer prompts or shorten them")
    paths = tokens = 0
    start = time.time()  # the rates shown leave out loading the LM (or starting vLLM)
    with tqdm(total=n_prompts, unit="prompt", desc="collect") as bar:
        for i, problems in fitted.items():
            shard_start = time.time()
            clipped_before = reward.clipped if reward is not None else 0
            steps = engine.steps(row_cap(job.search, job.model, tokenizer, problems))
            cols, mc_tokens = trace_problems(steps, tokenizer, task, problems, job.search.n_paths,
                                             job.seed, checkpoints, job.collect.mc_rollouts, reward)
            shard = SampledShard(i, problems, cols, int(sum(cols["length"])) + mc_tokens,
                                 time.time() - shard_start,
                                 reward.clipped - clipped_before if reward is not None else 0)
            paths, tokens = paths + len(cols["length"]), tokens + shard.tokens
            yield shard
            bar.update(len(shards[i]))
            rate = time.time() - start
            bar.set_postfix(paths_s=f"{paths / rate:.0f}", tok_s=f"{tokens / rate:.0f}")
