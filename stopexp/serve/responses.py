"""What a request's runs become in OpenAI's schema: a completion or chat completion whose
choices are the vote's best paths (prompt-major in a batch: index = prompt * n + choice),
`usage` counting every generated token of every path, summed over the prompts, and a
`stopexp` field (a list of them, one per prompt, in a batch); the same as server-sent event
chunks when the request streams.

Tokens saved against no pruning: a pruned path's length had it run on is never seen, so
`tokens_saved` estimates it by the mean final length of the request's paths that ran to
their end (at least what it had generated), and `tokens_saved_max` bounds it by max_tokens:
saved = sum over pruned paths of (estimated final length - tokens it generated).
"""
from __future__ import annotations

import json

import numpy as np

from stopexp.serve.requests import Generation


def outcome(gen: Generation, run, ballot, predictor: dict | None, choices: list[dict]) -> dict:
    """The run's answer: its `choices` ({text, finish_reason, logprobs} each, the vote's
    first), usage, and the `stopexp` field."""
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
                 "choice_paths": [p.key[1] for p in ballot.picks],
                 "answers": {str(j): a for j, a in ballot.answers.items()}, "counts": ballot.counts},
        "paths": [{"id": p.key[1], "tokens": len(p.tokens),
                   "pruned_at": run.record.pruned_at.get(p.key), "finish_reason": p.finish_reason}
                  for p in paths],
        "seed": gen.seed}
    if predictor is not None:
        info["predictor"] = {**predictor, "version": run.versions[-1] if run.versions else m.version()}
    return {"choices": choices, "usage": usage(gen, generated), "stopexp": info}


def scored(gen: Generation, choice: dict) -> dict:
    """The answer of a request that generates nothing (echo with max_tokens 0): its `n`
    choices are the echoed prompt."""
    return {"choices": [choice] * gen.choices, "usage": usage(gen, 0),
            "stopexp": {"paths_launched": 0, "tokens_generated": 0, "seed": gen.seed}}


def usage(gen: Generation, generated: int) -> dict:
    return {"prompt_tokens": len(gen.prompt_ids), "completion_tokens": generated,
            "total_tokens": len(gen.prompt_ids) + generated}


def completion_logprobs(tokens: list[str], scores: list, offset: int = 0) -> dict:
    """OpenAI's completions `logprobs` of token texts `tokens` and their `scores`
    ((log-prob, [(token text, log-prob)] alternatives) each; None: the first prompt token
    of an echo, which has no context), text offsets counted from `offset`."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [None if s is None else s[0] for s in scores],
            "top_logprobs": [None if s is None else dict(s[1]) for s in scores],
            "text_offset": offsets}


def body(gens: list[Generation], answers: list[dict], model: str) -> dict:
    """The response of a request that does not stream: each prompt's choices in turn."""
    gen, choices = gens[0], []
    for answer in answers:
        for c in answer["choices"]:
            choice = {"index": len(choices), "finish_reason": c["finish_reason"], "logprobs": c["logprobs"]}
            if gen.chat:
                choice["message"] = {"role": "assistant", "content": c["text"]}
            else:
                choice["text"] = c["text"]
            choices.append(choice)
    total = {k: sum(a["usage"][k] for a in answers) for k in answers[0]["usage"]}
    info = answers[0]["stopexp"] if gen.batch == 1 else [a["stopexp"] for a in answers]
    return {"id": gen.id, "object": "chat.completion" if gen.chat else "text_completion",
            "created": gen.created, "model": model, "choices": choices, "usage": total, "stopexp": info}


def chunk(gen: Generation, model: str, delta: dict, finish=None, index: int = 0, logprobs=None,
          **extra) -> dict:
    """One server-sent event's chunk of choice `index` (`delta`: the chat delta; a
    completion's text is its content)."""
    choice = {"index": index, "finish_reason": finish, "logprobs": logprobs}
    choice.update({"delta": delta} if gen.chat else {"text": delta.get("content", "")})
    return {"id": gen.id, "object": "chat.completion.chunk" if gen.chat else "text_completion",
            "created": gen.created, "model": model, "choices": [choice], **extra}


def events(gen: Generation, answer: dict, model: str, sent: str = "") -> list[str]:
    """The server-sent events of a streamed request once its vote is decided: each choice's
    text (of a request of one choice, only the text past `sent`, what went out as it was
    generated: stopexp.serve.streaming), each choice's end (the first with the `stopexp`
    field), usage if asked, and [DONE]."""
    choices = answer["choices"]
    if sent:
        rest = choices[0]["text"][len(sent):]
        out = [chunk(gen, model, {"content": rest})] if rest else []
    else:
        out = [chunk(gen, model, {"role": "assistant", "content": c["text"]}, index=i, logprobs=c["logprobs"])
               for i, c in enumerate(choices)]
    out += [chunk(gen, model, {}, c["finish_reason"], index=i, **({"stopexp": answer["stopexp"]} if i == 0 else {}))
            for i, c in enumerate(choices)]
    if gen.include_usage:
        out.append({**chunk(gen, model, {}), "choices": [], "usage": answer["usage"]})
    return [f"data: {json.dumps(c)}\n\n" for c in out] + ["data: [DONE]\n\n"]
