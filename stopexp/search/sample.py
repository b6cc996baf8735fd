"""Plain parallel sampling: N paths per prompt, no pruning, in chunks of whole prompts."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from stopexp.core.errors import UserError
from stopexp.core.seeds import stream_seed
from stopexp.core.token_text import text_of
from stopexp.search.decode import Engine
from stopexp.search.stepping import prompt_chunks

log = logging.getLogger(__name__)


@dataclass
class SampledPath:
    problem_index: int
    path_id: int
    tokens: list[int]
    text: str
    correct: bool


def path_seeds(seed: int, prompt: str, n_paths: int) -> list[int]:
    return [stream_seed(seed, prompt, j) for j in range(n_paths)]


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """A prompt's token ids: through the tokenizer's chat template when it has one (instruct
    and reasoning models expect their turn markers), else plain (the toy LM)."""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]  # the template has the BOS
    return tokenizer(prompt)["input_ids"]


class PromptTooLong(UserError, ValueError):
    """A prompt longer than the model can take (model.max_prompt_tokens)."""


def prompt_limit(model, search, engine, lm) -> int | None:
    """The longest prompt in tokens for the loaded `lm`: model.max_prompt_tokens, else the
    LM's max_position_embeddings (engine.max_model_len where the engine has it and it is
    set) minus search.max_new_tokens (None when the LM states none)."""
    if model.max_prompt_tokens is not None:
        return int(model.max_prompt_tokens)
    config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    positions = getattr(config, "max_position_embeddings", None)
    if engine is not None and engine.get("max_model_len") is not None:
        positions = int(engine.max_model_len)  # an engine refuses a request longer than that
    return None if positions is None else max(0, positions - search.max_new_tokens)


def fit_prompts(tokenizer, problems: list, limit: int | None, mode: str = "error") -> list:
    """The problems whose encoded prompt has at most `limit` tokens, checked before any
    forward (a 1 MB question would otherwise ask for a KV cache of terabytes). mode `error`
    raises PromptTooLong naming the first long prompt (split, prompt id, source row) and its
    length; `skip` drops the long ones and logs how many."""
    if limit is None:
        return list(problems)
    kept, long = [], []
    for p in problems:
        n = len(prompt_ids(tokenizer, p.prompt))
        (kept if n <= limit else long).append((p, n))
    if long and mode != "skip":
        p, n = long[0]
        row = f", source row {p.source_row}" if hasattr(p, "source_row") else ""
        raise PromptTooLong(
            f"model.max_prompt_tokens: prompt {p.split}/{p.prompt_id}{row} is {n} tokens, longer "
            f"than the {limit} allowed (the model's positions minus search.max_new_tokens, or "
            f"model.max_prompt_tokens); {len(long)} of {len(problems)} prompts are too long. "
            "Shorten them, or set model.long_prompts=skip to leave them out")
    if long:
        log.warning("model.long_prompts=skip: left out %d of %d prompts longer than %d tokens "
                    "(%s)", len(long), len(problems), limit,
                    ", ".join(f"{p.split}/{p.prompt_id}: {n}" for p, n in long[:5]))
    return [p for p, _ in kept]


def row_cap(search, model, tokenizer, problems) -> int:
    """Rows per forward: search.max_batch_rows, lowered so that rows x (longest prompt +
    max_new_tokens) stays within model.max_batch_tokens (the KV cache of a batch)."""
    rows, budget = search.max_batch_rows, model.max_batch_tokens
    if budget is None or not problems:
        return rows
    longest = max(len(prompt_ids(tokenizer, p.prompt)) for p in problems)
    return max(1, min(rows, budget // (longest + search.max_new_tokens)))


def launch_lists(tokenizer, problems, chunk, n_paths: int, seed: int):
    """For the problems in `chunk`: every path's prompt ids, stream seed and
    (problem index, path id), N paths per problem, in that order."""
    prompts, seeds, owners = [], [], []
    for i in chunk:
        prompts += [prompt_ids(tokenizer, problems[i].prompt)] * n_paths
        seeds += path_seeds(seed, problems[i].prompt, n_paths)
        owners += [(i, j) for j in range(n_paths)]
    return prompts, seeds, owners


def path_labels(problems, owners) -> list[str]:
    """A name per launched path, for the engine's error messages."""
    return [f"prompt {problems[i].prompt_id} ({problems[i].split}) path {j}" for i, j in owners]


def sample_paths(engine: Engine, tokenizer, task, problems, n_paths: int, seed: int,
                 max_rows: int = 1024) -> list[SampledPath]:
    """Sample `n_paths` completions per problem and check them."""
    out = []
    for chunk in prompt_chunks(len(problems), n_paths, max_rows):
        prompts, seeds, owners = launch_lists(tokenizer, problems, chunk, n_paths, seed)
        state = engine.run(engine.launch(prompts, seeds, path_labels(problems, owners)))
        tok, *_, lengths = state.tensors(engine.pad_id)
        for row, (i, j) in enumerate(owners):
            ids = tok[row, : lengths[row]].tolist()
            text = text_of(tokenizer, ids)
            out.append(SampledPath(i, j, ids, text, task.grade(problems[i], text)))
    return out
