"""A request's sampling, as OpenAI's and vLLM's servers read it, into the engine's
SamplingParams: OpenAI's ranges (temperature 0..2, top_p in (0, 1], presence and frequency
penalties -2..2, up to 4 stop strings, logit_bias -100..100 by token id) and vLLM's extras
(top_k, min_p, repetition_penalty, min_tokens, ignore_eos). Both engines honour every one
(stopexp.search.logits on the hf engine, vLLM's own SamplingParams on vLLM)."""
from __future__ import annotations

from dataclasses import replace

from stopexp.config import MIN_TEMPERATURE
from stopexp.search.decode import SamplingParams
from stopexp.serve.bodies import BadRequest
from stopexp.serve.fields import flag, integer, number

MAX_STOPS = 4  # as OpenAI's API
MAX_TEMPERATURE = 2.0  # as OpenAI's API


def read_sampling(body: dict, base: SamplingParams, max_tokens: int, vocab: int) -> SamplingParams:
    """The sampling of request `body`: the exp's `base` with the request's fields, for
    `max_tokens` tokens; token ids (logit_bias) lie below `vocab`."""
    temperature = number(body, "temperature", base.temperature if base.do_sample else 0.0, 0.0,
                         MAX_TEMPERATURE)
    if 0 < temperature < MIN_TEMPERATURE:
        raise BadRequest("temperature", f"0 (greedy) or at least {MIN_TEMPERATURE}, got {temperature}")
    top_k = integer(body, "top_k", base.top_k, -1, vocab, "-1 or 0: every token")
    return replace(
        base, max_new_tokens=max_tokens, temperature=temperature or 1.0, do_sample=temperature > 0,
        top_p=number(body, "top_p", base.top_p, 0.0, 1.0, low_open=True), top_k=max(top_k, 0),
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=number(body, "repetition_penalty", 1.0, 0.0, 2.0 ** 32, low_open=True),
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        min_tokens=integer(body, "min_tokens", 0, 0, max_tokens, "max_tokens"),
        ignore_eos=flag(body, "ignore_eos", False),
        logit_bias=logit_bias(body.get("logit_bias"), vocab),
        stop=tuple(dict.fromkeys((*base.stop, *stop_strings(body.get("stop"))))))


def stop_strings(stop) -> list[str]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop", f"a non-empty string or a list of up to {MAX_STOPS} is expected")
    return stops


def logit_bias(value, vocab: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias {"token id": bias in -100..100} as (id, bias) pairs in id order."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise BadRequest("logit_bias", 'an object {"token id": bias} is expected')
    out = {}
    for key, bias in value.items():
        if not (key.isdigit() and int(key) < vocab):
            raise BadRequest(f"logit_bias.{key}", f"token ids must lie in 0..{vocab - 1}")
        field = f"logit_bias.{key}"
        out[int(key)] = number({field: bias}, field, 0.0, -100.0, 100.0)
    return tuple(sorted(out.items()))
