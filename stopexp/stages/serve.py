"""`python -m stopexp.serve +exp=NAME`: the OpenAI-compatible server over the exp's engine
(docs/serve.md). Every request runs N paths (`paths`, default search.n_paths) with the served
method (serve.method: the predictor train made for this config, found by its key as
evaluate finds it, pruning at search.check_at by the policy; or a baseline, a stopping
method inside the paths, or no_prune), and answers with the `n` best distinct answers of the vote.

    python -m stopexp.serve +exp=toy_contrastive                 # http://127.0.0.1:8000
    python -m stopexp.serve +exp=smollm2_contrastive engine=vllm serve.port=8001

Before any compute: the config is validated, the port bound and the predictor found (a
missing one is refused with the train command that makes it), each an `error:` line and
exit 2; feedback on an address other machines reach needs an API key. SIGTERM drains:
every connection accepted before it is answered (one that comes while the model loads is
held until the server runs), then the stage writes its metrics.json (requests answered,
cancelled, failed) and exits 0.
"""
from __future__ import annotations

import ipaddress
import logging
import time
from contextlib import closing, contextmanager
from dataclasses import replace

from stopexp.config.serve import api_key, served_method
from stopexp.core.errors import ConfigError
from stopexp.core.names import predictor_names
from stopexp.core.policies import check_policies
from stopexp.core.protocol import check_plan
from stopexp.engines import Sections, backend
from stopexp.serve.app import make_app
from stopexp.serve.feedback import Adapter
from stopexp.serve.access import Access
from stopexp.serve.http import HeldSigterm, bind
from stopexp.serve.requests import Limits
from stopexp.serve.run import Method
from stopexp.serve.service import Served, Service, open_service
from stopexp.signals import methods as M
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.stages.scorers import build_scorers, load_trained
from stopexp.stopping.replay import trace_methods
from stopexp.store import bank
from stopexp.store.feature_sets import spec_of
from stopexp.tasks import build_task
from stopexp.training.losses import build_loss

log = logging.getLogger(__name__)


def served_scorer(cfg, method: str, overrides: list[str]):
    """(scorer, predictor, its artifact {"name", "key"}) of serve.method: a predictor as
    train saved it for this config (NotFound names the train command when it is missing),
    else a baseline or random (predictor None), or (None, None, None) for a method without
    a check (no_prune, a stopping method inside the paths)."""
    if method == "no_prune" or method in trace_methods([method]):
        return None, None, None
    feats = build.feature_set(cfg)
    if method not in predictor_names():
        return build_scorers(cfg, [method], None, feats, overrides)[method], None, None
    sub = cfg if method == cfg.predictor.name else build.with_predictor(cfg, method)
    ckpt = build.predictor_dir(sub, feats)
    # the bank's record of the LM is read for a predictor that exists: a missing one is
    # refused by load_trained first, with the train command that makes it
    spec = spec_of(cfg.tap.layers, bank.read_meta(bank.require_bank(feats.bank, overrides))) \
        if (ckpt / "predictor.json").exists() else None
    predictor = load_trained(sub, spec, feats, overrides).eval()
    return M.learned(predictor), predictor, {"name": method, "key": ckpt.name}


def positions_of(engine, lm) -> int | None:
    """Prompt + generated tokens a request may span: engine.max_model_len where set, else
    the LM's positions (None: it states none)."""
    if engine.get("max_model_len") is not None:
        return int(engine.max_model_len)
    config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    return getattr(config, "max_position_embeddings", None)


def request_policies(policy, plan: list[tuple[int, int]], n_paths: int):
    """`policies(n)`: one policy per check for a request of n paths. Top-K keeps the exp's
    share, round(K n / N) of a request's n paths (at least 1; K of N at n = N); a threshold
    policy is the same for every n, and one instance serves all requests (the adaptive
    one moves its threshold over them as over evaluate's prompts)."""
    shared = check_policies(policy, plan)
    if policy.name != "topk":
        return lambda n: shared
    made = {n_paths: shared}

    def policies(n: int) -> list:
        if n not in made:
            made[n] = check_policies(policy, [(c, max(1, round(k * n / n_paths))) for c, k in plan])
        return made[n]
    return policies


@contextmanager
def serving(cfg, overrides: list[str] | None = None):
    """The service of `cfg` (stopexp.serve.service.Service) with its engine loop running;
    on exit every request taken is answered first. The predictor is found before the LM
    loads."""
    s, ov = cfg.serve, [o for o in overrides or [] if not o.startswith("serve.")]
    method = served_method(cfg)
    scorer, predictor, artifact = served_scorer(cfg, method, ov)
    task = build_task(cfg.task, cfg.model.get("thinking"))
    engine = backend(cfg.engine.name)
    lm, tokenizer = engine.load(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task, cfg.tap, False)
    params = build.sampling(cfg)
    most = s.max_tokens or params.max_new_tokens
    params = replace(params, max_new_tokens=min(params.max_new_tokens, most))
    plan = check_plan(cfg.search, cfg.policy)
    checks = [c for c, _ in plan] if scorer is not None else []
    inside = trace_methods([method], cfg.evaluate.stopping).get(method)
    controller = None if inside is None else (lambda n: inside.controller(
        n, cfg.search.group_window, task=task, predictor=cfg.predictor.name))
    pruning = Method(method, checks, cfg.search.group_window, cfg.search.score_rule, cfg.evaluate.vote,
                     cfg.evaluate.vote_top, scorer, request_policies(cfg.policy, plan, cfg.search.n_paths),
                     controller)
    limits = Limits(s.model_name or cfg.model.name, s.max_n, cfg.search.n_paths, most,
                    positions_of(cfg.engine, lm), params, max_prompts=s.max_concurrent)
    adapter = Adapter(predictor, build_loss(cfg.loss), cfg.adapt, task, s.remember) if s.feedback else None
    sections = Sections(cfg.model, cfg.engine, cfg.task, cfg.search, cfg.tap, cfg.seed, cfg.paths.cache_dir)
    served = Served(pruning, artifact, adapter)
    with engine.serve(lm, tokenizer, sections=sections, params=params, checks=tuple(checks),
                      max_rows=cfg.search.max_batch_rows) as stepper, \
            open_service(stepper, tokenizer, task, served, limits, max_concurrent=s.max_concurrent,
                         template=s.completions_template,
                         access=Access(api_key(s), s.max_body_mb << 20)) as service:
        yield service


@stage_main("serve", tracked=False)
def main(stage: Stage) -> dict:
    cfg, start = stage.cfg, time.time()
    sock = bind(cfg.serve.host, cfg.serve.port)  # a taken port is refused before the LM loads
    host, port = sock.getsockname()[:2]
    with closing(sock), HeldSigterm() as held:
        open_feedback_refused(cfg.serve, host)
        with serving(cfg, stage.overrides) as service:
            server = held.serve(make_app(service), sock,
                                ready=lambda: print(announce(service, host, port), flush=True))
            unasked = f"; {server.unasked} connection(s) closed without sending a request" \
                if server.unasked else ""
            log.info("drained: every request received was answered (%d taken from the backlog at "
                     "the signal)%s", server.adopted, unasked)
    return {"serve": {**service.status(), "closed_unasked": server.unasked},
            "wall_s": round(time.time() - start, 2)}


def open_feedback_refused(serve, host: str) -> None:
    """Feedback changes the predictor every later request uses: on an address that other
    machines reach it is served only behind an API key."""
    if serve.feedback and api_key(serve) is None and not ipaddress.ip_address(host.split("%")[0]).is_loopback:
        raise ConfigError(f"serve.feedback: POST /v1/feedback changes the predictor every later request "
                          f"uses, and {host} is reachable from other machines; set serve.api_key (or "
                          "STOPEXP_API_KEY), or serve on 127.0.0.1")


def announce(service: Service, host: str, port: int) -> str:
    served = service.served
    predictor = f", predictor {served.predictor['key']}" if served.predictor else ""
    return (f"stopexp serve: http://{host}:{port}/v1 (model {service.model_name!r}, method "
            f"{served.method.name}{predictor}); SIGTERM or Ctrl-C drains and stops")
