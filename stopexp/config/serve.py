"""The serve section (conf/serve.yaml, `python -m stopexp.serve`): the OpenAI-compatible
server over the configured engine (stopexp/serve/), and its checks."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from stopexp.config.ranges import at_least, fail, within
from stopexp.core.limits import count
from stopexp.core.names import ALWAYS_METHODS, ORACLE_METHODS, lookup, method_name, names, predictor_names, runs_the_lm

# stopping methods that run inside the paths but not in a server, and why
NOT_SERVED = {"step": "it reads the states at each step's end, which the server does not tap"}


@dataclass
class ServeConfig:
    """The server (docs/serve.md): where it listens, what each request runs, its limits."""
    host: str = "127.0.0.1"
    port: int = 8000                  # 0: any free port (the one taken is printed)
    model_name: Optional[str] = None  # what clients send as `model`; null: model.name
    # what prunes each request's paths: learned (the exp's predictor, as train made it),
    # another predictor, a baseline or random (Launch-Check-Resume at search.check_at with
    # the policy), a stopping method that runs inside the paths (deepconf_online), or no_prune
    method: str = "learned"
    max_concurrent: int = 64          # requests in the engine at once; later ones wait in turn
    max_n: int = 64                   # the most paths (`paths`) a request may ask for
    # the most `max_tokens` a request may ask (below the model's positions, with room for a
    # prompt); null: search.max_new_tokens
    max_tokens: Optional[int] = field(default=None, metadata=count("positions", below=True))
    # /v1/completions wraps the prompt in the model's chat template as the stages do (the
    # paths the predictor learned on); false: the prompt is encoded as it is
    completions_template: bool = True
    # POST /v1/feedback updates the predictor from a response's outcome (the adapt update,
    # with adapt.lr, adapt.weight_decay, adapt.steps and adapt.buffer)
    feedback: bool = False
    remember: int = 1024              # responses kept for their feedback (the oldest go first)
    # the key every route but /health and /metrics asks for (Authorization: Bearer KEY);
    # null: the environment's STOPEXP_API_KEY, else VLLM_API_KEY, else none (open)
    api_key: Optional[str] = None
    max_body_mb: int = 4              # a larger request body is refused (HTTP 413)


def api_key(serve) -> str | None:
    """The key the server asks for: serve.api_key, else STOPEXP_API_KEY, else VLLM_API_KEY
    (a vLLM user's key protects this server too); None (or empty): none asked."""
    return serve.api_key or os.environ.get("STOPEXP_API_KEY") or os.environ.get("VLLM_API_KEY") or None


def served_method(cfg) -> str:
    """serve.method as the server runs it: `learned` is the configured predictor."""
    return method_name(cfg.serve.method, cfg.predictor.name)


def check_serve(cfg) -> None:
    """serve.* and what the server needs of the other groups: one Launch-Check-Resume
    (search=parallel), a policy that needs no calibration, a method it can run."""
    s = cfg.serve
    within("serve.port", s.port, 0, 65535)
    for key in ("max_concurrent", "max_n", "remember", "max_body_mb"):
        at_least(f"serve.{key}", s[key], 1)
    if s.max_tokens is not None:
        at_least("serve.max_tokens", s.max_tokens, 1)
    if s.api_key is not None and not (s.api_key.isascii() and s.api_key.isprintable()
                                      and s.api_key.strip() == s.api_key != ""):
        fail("serve.api_key", "the key is empty, has spaces at its ends or is not printable ASCII; "
                              "give printable ASCII, or null for none (or the environment's "
                              "STOPEXP_API_KEY / VLLM_API_KEY)")
    method = served_method(cfg)
    scoring = {"random", *names("baseline"), *predictor_names()}
    inside = [m for m in names("stopping") if lookup("stopping", m).inside and m not in NOT_SERVED]
    if method in NOT_SERVED:
        fail("serve.method", f"{method!r} is not served: {NOT_SERVED[method]}")
    if method not in {"no_prune", *scoring, *inside}:
        other = " (it reads the outcomes)" if method in (*ORACLE_METHODS, *ALWAYS_METHODS) else ""
        fail("serve.method", f"{method!r} cannot run in the server{other}; allowed: learned, "
                             f"no_prune, random, {', '.join(sorted({*scoring, *inside} - {'random'}))}")
    if cfg.search.name != "parallel":
        fail("search.name", f"the server runs Launch-Check-Resume (search=parallel), not {cfg.search.name!r}")
    if cfg.policy.name == "risk":
        fail("policy.name", "risk calibrates its thresholds on the validation prompts, which the "
                            "server has none of: serve with policy=topk or another policy")
    if not cfg.search.n_paths <= s.max_n:
        fail("serve.max_n", f"{s.max_n} is below search.n_paths ({cfg.search.n_paths}), the paths "
                            "of a request that does not say `n`")
    if s.feedback and (method not in predictor_names() or runs_the_lm(method)):
        fail("serve.feedback", f"feedback updates a predictor of stored features "
                               f"({', '.join(names('predictor'))}); serve.method is {method!r}")
    if s.feedback and cfg.predictor.centre_prompts:
        fail("predictor.centre_prompts", "feedback learns from the paths a response kept, whose "
                                         "mean is not that of the live paths it was scored with; "
                                         "leave it false under serve.feedback")
