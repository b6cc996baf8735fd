"""What a request's run becomes in OpenAI's schema: a completion or chat completion whose
one choice is the chosen path, `usage` counting every generated token of every path, and
a `stopexp` field; the same as server-sent event chunks when the request streams.

Tokens saved against no pruning: a pruned path's length had it run on is never seen, so
`tokens_saved` estimates it by the mean final length of the request's paths that ran to
their end (at least what it had generated), and `tokens_saved_max` bounds it by max_tokens:
saved = sum over pruned paths of (estimated final length - tokens it generated).
"""
from __future__ import annotations

import json

import numpy as np

from stopexp.serve.requests import Generation


def outcome(gen: Generation, run, ballot, predictor: dict | None) -> dict:
    """The run's answer: the chosen path's text and end, usage, and the `stopexp` field."""
    paths = run.launched
    pruned = [p for p in paths if p.key in run.record.pruned_at]
    ended = [len(p.tokens) for p in paths if p.key not in run.record.pruned_at]
    mean_end = float(np.mean(ended)) if ended else 0.0
    generated = sum(len(p.tokens) for p in paths)
    m = run.method
    info = {
        "method": "no_prune" if not run.schedule.checks and run.controller is None else m.name,
        "paths_launched": len(paths), "paths_pruned": len(pruned),
        "paths_kept": len(paths) - len(pruned),
        "tokens_generated": generated,
        "tokens_saved": int(round(sum(max(mean_end - len(p.tokens), 0.0) for p in pruned))),
        "tokens_saved_max": sum(gen.params.max_new_tokens - len(p.tokens) for p in pruned),
        "checks": run.checks,
        "vote": {"rule": ballot.rule, "winner": ballot.winner, "chosen_path": ballot.chosen.key[1],
                 "answers": {str(j): a for j, a in ballot.answers.items()}, "counts": ballot.counts},
        "paths": [{"id": p.key[1], "tokens": len(p.tokens),
                   "pruned_at": run.record.pruned_at.get(p.key), "finish_reason": p.finish_reason}
                  for p in paths],
        "seed": gen.seed}
    if predictor is not None:
        info["predictor"] = {**predictor, "version": run.versions[-1] if run.versions else m.version()}
    return {"text": ballot.text, "finish_reason": ballot.chosen.finish_reason or "stop",
            "usage": {"prompt_tokens": len(gen.prompt_ids), "completion_tokens": generated,
                      "total_tokens": len(gen.prompt_ids) + generated},
            "stopexp": info}


def body(gen: Generation, answer: dict, model: str) -> dict:
    """The response of a request that does not stream."""
    choice = {"index": 0, "finish_reason": answer["finish_reason"], "logprobs": None}
    if gen.chat:
        choice["message"] = {"role": "assistant", "content": answer["text"]}
    else:
        choice["text"] = answer["text"]
    return {"id": gen.id, "object": "chat.completion" if gen.chat else "text_completion",
            "created": gen.created, "model": model, "choices": [choice],
            "usage": answer["usage"], "stopexp": answer["stopexp"]}


def chunk(gen: Generation, model: str, delta: dict, finish=None, **extra) -> dict:
    """One server-sent event's chunk of choice 0 (`delta`: the chat delta; a completion's
    text is its content)."""
    choice = {"index": 0, "finish_reason": finish, "logprobs": None}
    choice.update({"delta": delta} if gen.chat else {"text": delta.get("content", "")})
    return {"id": gen.id, "object": "chat.completion.chunk" if gen.chat else "text_completion",
            "created": gen.created, "model": model, "choices": [choice], **extra}


def events(gen: Generation, answer: dict, model: str, sent: str = "") -> list[str]:
    """The server-sent events of a streamed request once its vote is decided: the chosen
    path's text (past `sent`, what went out as it was generated: stopexp.serve.streaming),
    its end (with the `stopexp` field), usage if asked, and [DONE]."""
    rest = answer["text"][len(sent):]
    out = [chunk(gen, model, {"content": rest})] if sent and rest else [] if sent else \
        [chunk(gen, model, {"role": "assistant", "content": rest})]
    out.append(chunk(gen, model, {}, answer["finish_reason"], stopexp=answer["stopexp"]))
    if gen.include_usage:
        out.append({**chunk(gen, model, {}), "choices": [], "usage": answer["usage"]})
    return [f"data: {json.dumps(c)}\n\n" for c in out] + ["data: [DONE]\n\n"]
