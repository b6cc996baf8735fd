"""An OpenAI request body read into what the engine runs (`Generation`), or refused with
one line naming the field (`BadRequest`: HTTP 400), before anything is queued.

`n` is the number of paths (default search.n_paths), not of returned choices: the response
holds one choice, the path the vote chose. `prune: false` (beside the OpenAI fields) runs
the request's paths unpruned."""
from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass, replace

from stopexp.config import MIN_TEMPERATURE
from stopexp.search.decode import SamplingParams
from stopexp.search.sample import prompt_ids
from stopexp.serve.bodies import BadRequest, ModelNotFound, read_json

# the fields that would change the output, which this server does not serve: field -> the
# values that leave the output as it makes it (others, user, metadata, ..., are ignored)
UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False),
               "best_of": (None, 1), "suffix": (None, ""), "logit_bias": (None, {}),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
               "tools": (None, []), "functions": (None, []), "response_format": (None, {"type": "text"})}
MAX_STOPS = 4  # as OpenAI's API


@dataclass(frozen=True)
class Limits:
    """What a request may ask: the served model's name, paths, tokens, the model's positions
    (prompt + max_tokens; None: unbounded) and the exp's defaults."""
    model_name: str
    max_n: int
    default_n: int
    max_tokens: int
    positions: int | None
    params: SamplingParams  # the exp's sampling (search section, the task's stop strings)


@dataclass
class Generation:
    """One request as the engine runs it: its paths' prompt and sampling, and how to answer."""
    id: str
    chat: bool
    prompt: str            # the text the prompt ids encode (it names the paths' streams)
    prompt_ids: list[int]
    n: int
    params: SamplingParams  # the exp's, with the request's max_tokens, temperature, top_p, stop
    seed: int              # the paths' streams: stream_seed(seed, prompt, path)
    stream: bool = False
    include_usage: bool = False
    prune: bool = True
    created: int = 0


class RequestReader:
    """Reads request bodies with the model's tokenizer (used under `lock`, which the engine
    loop's decoding shares: a fast tokenizer is not safe across threads). `template`: the
    completions prompt goes through the chat template, as the stages encode a task prompt."""

    def __init__(self, tokenizer, limits: Limits, template: bool, lock: threading.Lock):
        self.tokenizer, self.limits, self.template, self.lock = tokenizer, limits, template, lock

    def read(self, raw: bytes, chat: bool) -> Generation:
        body = read_json(raw)
        lim = self.limits
        model = body.get("model")
        if model != lim.model_name:
            raise ModelNotFound("model", f"{model!r} is not served here; this server serves "
                                         f"{lim.model_name!r} (GET /v1/models)")
        for key, fine in UNSUPPORTED.items():
            if body.get(key) not in fine:
                raise BadRequest(key, f"{body[key]!r} is not supported by this server")
        n = _integer(body, "n", lim.default_n, 1, lim.max_n, "serve.max_n")
        tokens_key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        max_tokens = _integer(body, tokens_key, lim.params.max_new_tokens, 1, lim.max_tokens,
                              "serve.max_tokens")
        field, text, ids = self._prompt(body, chat)
        if lim.positions is not None and len(ids) + max_tokens > lim.positions:
            raise BadRequest(field, f"{len(ids)} prompt tokens + {max_tokens} max_tokens exceed the "
                                    f"model's {lim.positions} positions")
        seed = _integer(body, "seed", None, 0, 2 ** 63 - 1, None)
        params = self._params(body, max_tokens)
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise BadRequest("stream_options", "an object is expected")
        include_usage = _flag(options, "include_usage", False, "stream_options.")
        return Generation(
            id=f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}", chat=chat, prompt=text,
            prompt_ids=ids, n=n, params=params,
            seed=secrets.randbits(63) if seed is None else seed,  # no seed: fresh streams
            stream=_flag(body, "stream", False), include_usage=include_usage,
            prune=_flag(body, "prune", True), created=int(time.time()))

    def _prompt(self, body: dict, chat: bool) -> tuple[str, str, list[int]]:
        """(field, prompt text, prompt ids)."""
        if chat:
            messages = body.get("messages")
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
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            with self.lock:
                vocab = len(self.tokenizer)
                if not all(0 <= t < vocab for t in prompt):  # before decode, which overflows on them
                    raise BadRequest("prompt", f"token ids must lie in 0..{vocab - 1}")
                text = self.tokenizer.decode(prompt)
            return "prompt", text, list(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt", "one non-empty string (or a list of token ids) is expected")
        with self.lock:
            ids = prompt_ids(self.tokenizer, prompt) if self.template else self.tokenizer(prompt)["input_ids"]
        return "prompt", prompt, _nonempty("prompt", ids)

    def _params(self, body: dict, max_tokens: int) -> SamplingParams:
        base = self.limits.params
        temperature = _number(body, "temperature", base.temperature if base.do_sample else 0.0, 0.0)
        if 0 < temperature < MIN_TEMPERATURE:
            raise BadRequest("temperature", f"0 (greedy) or at least {MIN_TEMPERATURE}, got {temperature}")
        top_p = _number(body, "top_p", base.top_p, 0.0, 1.0, low_open=True)
        stop = body.get("stop")
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or len(stops) > MAX_STOPS or \
                not all(isinstance(s, str) and s for s in stops):
            raise BadRequest("stop", f"a non-empty string or a list of up to {MAX_STOPS} is expected")
        return replace(base, max_new_tokens=max_tokens, temperature=temperature or 1.0,
                       do_sample=temperature > 0, top_p=top_p,
                       stop=tuple(dict.fromkeys((*base.stop, *stops))))


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


def _integer(body: dict, key: str, default, low: int, high: int, setting: str | None):
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(key, f"an integer is expected, got {value!r}")
    if not low <= value <= high:
        where = f" ({setting})" if setting else ""
        raise BadRequest(key, f"must lie in {low}..{high}{where}, got {value}")
    return value


def _number(body: dict, key: str, default: float, low: float, high: float = math.inf,
            low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return float(default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300 \
        and (value > low if low_open else value >= low) and value <= high  # a huge int: no float
    if not ok:
        raise BadRequest(key, f"must be a number in {'(' if low_open else '['}{low}, {high}], got {value!r}")
    return float(value)


def _flag(body: dict, key: str, default: bool, within: str = "") -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(within + key, f"true or false is expected, got {value!r}")
    return value
