"""An OpenAI request body read into what the engine runs (`Generation`, one per prompt of
the body), or refused with one line naming the field (`BadRequest`: HTTP 400), before
anything is queued.

As OpenAI's and vLLM's servers: `n` is the number of choices returned; the paths sampled
per prompt are `paths` (an extension field beside the OpenAI fields; default the larger of
search.n_paths and `n`, at most serve.max_n), of which the choices are the best distinct
answers by the vote. `prompt` is a string, a list of token ids, or a list of either (a
batch: one Generation per prompt). `prune: false` runs the request's paths unpruned. The
sampling fields are read by stopexp.serve.sampling."""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

from stopexp.search.decode import SamplingParams
from stopexp.search.sample import prompt_ids
from stopexp.serve.bodies import BadRequest, ModelNotFound, read_json
from stopexp.serve.fields import flag, integer
from stopexp.serve.sampling import read_sampling

# the fields that would change the output, which this server does not serve: field -> the
# values that leave the output as it makes it (others, user, metadata, ..., are ignored)
UNSUPPORTED = {"best_of": (None, 1), "suffix": (None, ""),
               "tools": (None, []), "functions": (None, []), "response_format": (None, {"type": "text"})}
CHAT_ONLY_OFF = {"logprobs": (None, False), "top_logprobs": (None, 0)}  # chat: not served
MAX_LOGPROBS = 20  # as vLLM's default max_logprobs


@dataclass(frozen=True)
class Limits:
    """What a request may ask: the served model's name, paths, tokens, the model's positions
    (prompt + max_tokens; None: unbounded), the exp's defaults, the prompts of one body, and
    whether the engine scores tokens (logprobs, echo)."""
    model_name: str
    max_n: int
    default_n: int
    max_tokens: int
    positions: int | None
    params: SamplingParams  # the exp's sampling (search section, the task's stop strings)
    max_prompts: int = 64
    scores: bool = True


@dataclass
class Generation:
    """One prompt of a request as the engine runs it: its paths' prompt and sampling, and
    how to answer."""
    id: str
    chat: bool
    prompt: str            # the text the prompt ids encode (it names the paths' streams)
    prompt_ids: list[int]
    paths: int             # paths sampled
    params: SamplingParams  # the exp's, with the request's sampling fields
    seed: int              # the paths' streams: stream_seed(seed, prompt, path)
    choices: int = 1       # `n`: the choices returned, at most `paths`
    stream: bool = False
    include_usage: bool = False
    prune: bool = True
    created: int = 0
    include_stop: bool = False   # the stop string stays at the end of a choice's text
    logprobs: int | None = None  # per-token log-probs with this many alternatives
    echo: bool = False           # the prompt before each choice's text (and its log-probs)
    index: int = 0               # its prompt's place in the body's batch
    batch: int = 1               # the prompts of the body

    @property
    def feedback_id(self) -> str:
        """What POST /v1/feedback names it by: the response id (`id:index` in a batch)."""
        return self.id if self.batch == 1 else f"{self.id}:{self.index}"


class RequestReader:
    """Reads request bodies with the model's tokenizer (used under `lock`, which the engine
    loop's decoding shares: a fast tokenizer is not safe across threads). `template`: the
    completions prompt goes through the chat template, as the stages encode a task prompt."""

    def __init__(self, tokenizer, limits: Limits, template: bool, lock: threading.Lock):
        self.tokenizer, self.limits, self.template, self.lock = tokenizer, limits, template, lock

    def read(self, raw: bytes, chat: bool, request_id: str | None = None) -> list[Generation]:
        """The Generations of a request body, one per prompt (chat: one); `request_id` (the
        X-Request-Id) names the response, `cmpl-<it>` (none: a fresh one)."""
        body = read_json(raw)
        lim = self.limits
        model = body.get("model")
        if model != lim.model_name:
            raise ModelNotFound("model", f"{model!r} is not served here; this server serves "
                                         f"{lim.model_name!r} (GET /v1/models)")
        for key, fine in {**UNSUPPORTED, **(CHAT_ONLY_OFF if chat else {})}.items():
            if body.get(key) not in fine:
                hint = "; the paths sampled per prompt are `paths`" if key == "best_of" else ""
                raise BadRequest(key, f"{body[key]!r} is not supported by this server{hint}")
        n = integer(body, "n", 1, 1, lim.max_n, "serve.max_n")
        paths = integer(body, "paths", max(lim.default_n, n), 1, lim.max_n, "serve.max_n")
        if n > paths:
            raise BadRequest("n", f"must lie in 1..{paths} (the paths sampled: `paths`), got {n}")
        echo = False if chat else flag(body, "echo", False)
        logprobs = None if chat else integer(body, "logprobs", None, 0, MAX_LOGPROBS)
        if (echo or logprobs is not None) and not lim.scores:
            raise BadRequest("echo" if echo else "logprobs", "not served by this engine (engine=hf scores tokens)")
        tokens_key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        max_tokens = integer(body, tokens_key, lim.params.max_new_tokens, 0 if echo else 1,
                             lim.max_tokens, "serve.max_tokens")
        prompts = self._prompts(body, chat)
        stream = flag(body, "stream", False)
        if stream and (len(prompts) > 1 or max_tokens == 0):
            raise BadRequest("stream", "a list of prompts and max_tokens 0 are answered whole; "
                                       "stream one prompt per request")
        for field, _, ids in prompts:
            if lim.positions is not None and len(ids) + max_tokens > lim.positions:
                raise BadRequest(field, f"{len(ids)} prompt tokens + {max_tokens} max_tokens exceed "
                                        f"the model's {lim.positions} positions")
        seed = integer(body, "seed", None, 0, 2 ** 63 - 1)
        with self.lock:
            vocab = len(self.tokenizer)
        params = read_sampling(body, lim.params, max_tokens, vocab)
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise BadRequest("stream_options", "an object is expected")
        shared = dict(
            id=f"{'chatcmpl' if chat else 'cmpl'}-{request_id or secrets.token_hex(12)}", chat=chat, paths=paths,
            choices=n, params=params, seed=secrets.randbits(63) if seed is None else seed,  # no seed: fresh streams
            stream=stream, include_usage=flag(options, "include_usage", False, "stream_options."),
            prune=flag(body, "prune", True), created=int(time.time()),
            include_stop=flag(body, "include_stop_str_in_output", False), logprobs=logprobs, echo=echo,
            batch=len(prompts))
        return [Generation(prompt=text, prompt_ids=ids, index=i, **shared)
                for i, (_, text, ids) in enumerate(prompts)]

    def _prompts(self, body: dict, chat: bool) -> list[tuple[str, str, list[int]]]:
        """(field, prompt text, prompt ids) of each prompt: chat's one, or completions' one or
        batch (a list of strings or of lists of token ids)."""
        if chat:
            return [self._messages(body.get("messages"))]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            if len(prompt) > self.limits.max_prompts:
                raise BadRequest("prompt", f"at most {self.limits.max_prompts} prompts per request "
                                           f"(serve.max_concurrent), got {len(prompt)}")
            return [self._prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        return [self._prompt(prompt, "prompt")]

    def _messages(self, messages) -> tuple[str, str, list[int]]:
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages", "a non-empty list of {role, content} is expected")
        turns = [_turn(m, i) for i, m in enumerate(messages)]
        with self.lock:
            if self.tokenizer.chat_template:
                text = self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            else:  # a model without a template (the toy LM) reads the last user turn
                users = [t["content"] for t in turns if t["role"] == "user"]
                if not users:
                    raise BadRequest("messages", "no user message (this model has no chat template)")
                text, ids = users[-1], self.tokenizer(users[-1])["input_ids"]
        return "messages", text, _nonempty("messages", ids)

    def _prompt(self, prompt, field: str) -> tuple[str, str, list[int]]:
        """One completions prompt: a string, or a list of token ids."""
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            with self.lock:
                vocab = len(self.tokenizer)
                if not all(0 <= t < vocab for t in prompt):  # before decode, which overflows on them
                    raise BadRequest(field, f"token ids must lie in 0..{vocab - 1}")
                text = self.tokenizer.decode(prompt)
            return field, text, list(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest(field, "one non-empty string or list of token ids, or a list of them, is expected")
        with self.lock:
            ids = prompt_ids(self.tokenizer, prompt) if self.template else self.tokenizer(prompt)["input_ids"]
        return field, prompt, _nonempty(field, ids)


def _turn(message, i: int) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest(f"messages[{i}]", "an object with a role and a content is expected")
    content = message.get("content")
    if isinstance(content, list):  # content parts: the text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise BadRequest(f"messages[{i}].content", "only text parts are supported")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content", "a string is expected")
    return {"role": message["role"], "content": content}


def _nonempty(field: str, ids: list[int]) -> list[int]:
    if not ids:
        raise BadRequest(field, "encodes to no token")
    return list(ids)
