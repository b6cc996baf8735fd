"""What a vLLM user relies on besides the completions, on the toy's server: every error in
OpenAI's shape, /metrics under vLLM's names (each counter equal to what the responses
report), X-Request-Id, /v1/models' max_model_len, the API key (the openai client with the
right key, a wrong one, none), the body limit, feedback refused on an open address without
a key, and streaming that sends a committed path's text as it is generated."""
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conftest import run_stage
from stopexp.config import validate
from stopexp.config.serve import api_key
from stopexp.core.errors import ConfigError
from stopexp.serve.app import make_app
from stopexp.serve.streaming import safe_prefix
from test_serve import compose, error_of, prompts_of, running, trained, wait_for  # noqa: F401

KEY = "sk-stopexp-test"


@pytest.fixture(scope="module")
def served(trained):  # noqa: F811
    with running(trained) as s:
        yield s


def shape(r: httpx.Response, status: int, param=None, code=None) -> str:
    """The message of an error body in OpenAI's shape, with its status."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    assert (error["param"], error["code"]) == (param, code)
    return error["message"]


def test_every_error_is_in_openai_shape(served, monkeypatch):
    url = served.url
    assert shape(httpx.post(f"{url}/v1/nothing", json={}), 404) == (
        "POST /v1/nothing: no such route (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
        "GET /health, GET /metrics)")
    wrong = httpx.get(f"{url}/v1/completions")
    assert shape(wrong, 405) == "GET /v1/completions: the route takes POST" and wrong.headers["allow"] == "POST"
    app = make_app(served.service)

    @app.get("/typed")
    async def typed(k: int):
        return {"k": k}
    with TestClient(app) as local:
        assert shape(local.get("/typed", params={"k": "x"}), 422, "k").startswith("k: ")
    monkeypatch.setattr(served.service, "status", lambda: 1 / 0)
    assert shape(httpx.get(f"{url}/health"), 500) == "the server failed: division by zero"
    assert httpx.get(f"{url}/health").json()["error"]["type"] == "server_error"


def test_request_ids_are_echoed_and_name_the_response(served):
    body = {"model": "toy", "prompt": "3+4?", "n": 2, "seed": 0}
    r = httpx.post(f"{served.url}/v1/completions", json=body, headers={"X-Request-Id": "job-17.a"})
    assert r.headers["x-request-id"] == "job-17.a" and r.json()["id"] == "cmpl-job-17.a"
    chat = httpx.post(f"{served.url}/v1/chat/completions", headers={"X-Request-Id": "c1"},
                      json={"model": "toy", "messages": [{"role": "user", "content": "3+4?"}], "n": 2})
    assert chat.json()["id"] == "chatcmpl-c1"
    fresh = httpx.post(f"{served.url}/v1/completions", json=body)
    assert fresh.json()["id"] == f"cmpl-{fresh.headers['x-request-id']}" and len(fresh.headers["x-request-id"]) == 24
    assert httpx.get(f"{served.url}/health", headers={"X-Request-Id": "h"}).headers["x-request-id"] == "h"
    assert shape(httpx.post(f"{served.url}/v1/completions", json=body, headers={"X-Request-Id": "x" * 257}),
                 400, "X-Request-Id") == "X-Request-Id: 1..256 visible ASCII characters are expected"


def test_models_lists_max_model_len_and_max_tokens_names_its_limit(served):
    card = served.client.models.list().data[0]
    assert card.id == "toy" and card.model_extra["max_model_len"] == 256  # the toy LM's positions
    with pytest.raises(openai.BadRequestError, match=r"max_tokens: must lie in 1\.\.64 \(serve\.max_tokens\), got 256"):
        served.client.completions.create(model="toy", prompt="3+4?", max_tokens=256)


def samples(url: str) -> dict:
    """name{labels} -> value of every sample /metrics shows."""
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_count_what_the_responses_report(served):
    """Six requests, a list of two prompts and a prompt scored without generating: nine
    prompts, each counted as vLLM's engine counts a request."""
    before = samples(served.url)
    create = served.client.completions.create
    answers = [create(model="toy", prompt=p, seed=k, extra_body={"paths": 4}) for k, p in enumerate(prompts_of(5))]
    answers.append(create(model="toy", prompt=prompts_of(1)[0], n=3, extra_body={"paths": 3, "prune": False}))
    answers.append(create(model="toy", prompt=prompts_of(2), seed=7, extra_body={"paths": 2}))
    answers.append(create(model="toy", prompt="3+4?", echo=True, max_tokens=0, logprobs=0))
    after = samples(served.url)
    grew = lambda name, **labels: after.get((name, tuple(sorted(labels.items()))), 0) - before.get(
        (name, tuple(sorted(labels.items()))), 0)
    info = [i for a in answers for i in (lambda x: x if isinstance(x, list) else [x])(a.model_extra["stopexp"])]
    assert len(info) == 9 and info[-1]["paths_launched"] == 0
    assert grew("vllm:generation_tokens_total") == sum(a.usage.completion_tokens for a in answers)
    assert grew("vllm:prompt_tokens_total") == sum(a.usage.prompt_tokens for a in answers)
    assert grew("stopexp:paths_launched_total") == sum(i["paths_launched"] for i in info) == 27
    # top-K keeps round(3 x 4 / 8) = 2 of 4 paths; of 2, one
    assert grew("stopexp:paths_pruned_total") == sum(i.get("paths_pruned", 0) for i in info) == 12
    assert grew("stopexp:tokens_saved_total") == sum(i.get("tokens_saved", 0) for i in info)
    assert grew("stopexp:check_seconds_count") == sum(len(i.get("checks", [])) for i in info) == 7
    assert grew("stopexp:requests_total", outcome="answered") == 9
    first = [a.choices[0] for a in answers[:6]] + answers[6].choices + answers[7].choices
    for reason in ("stop", "length"):  # each prompt's first choice; the scored one's: "length"
        assert grew("vllm:request_success_total", finished_reason=reason) == sum(c.finish_reason == reason for c in first)
    assert grew("vllm:e2e_request_latency_seconds_count") == grew("vllm:time_to_first_token_seconds_count") == 9
    assert after[("vllm:num_requests_running", ())] == after[("vllm:num_requests_waiting", ())] == 0


def test_the_api_key_is_asked_on_every_route_but_health_and_metrics(trained, monkeypatch):  # noqa: F811
    monkeypatch.delenv("STOPEXP_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", KEY)  # a vLLM user's key protects this server too
    with running(trained, "serve.feedback=true") as s:
        assert s.service.access.key == KEY
        base = f"{s.url}/v1"
        right = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
        first = right.completions.create(model="toy", prompt="3+4?", n=2, seed=0)
        assert first.choices[0].text and [m.id for m in right.models.list()] == ["toy"]
        with pytest.raises(openai.AuthenticationError) as wrong:
            openai.OpenAI(base_url=base, api_key=KEY + "x", max_retries=0).completions.create(
                model="toy", prompt="3+4?")
        assert wrong.value.code == "invalid_api_key"
        for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                             ("POST", "/v1/feedback"), ("GET", "/v1/nothing")):
            none = httpx.request(method, f"{s.url}{path}", json={"id": first.id, "correct": True})
            assert shape(none, 401, code="invalid_api_key") == (
                "a valid API key is required: send it as 'Authorization: Bearer KEY'")
            assert none.headers["www-authenticate"] == "Bearer"
        assert s.service.served.adapter.version == 0  # no feedback taken without the key
        score = {"model": "toy", "prompt": "3+4?", "echo": True, "max_tokens": 0, "logprobs": 0}
        answered = s.service.loop.status()["answered"]
        assert shape(httpx.post(f"{base}/completions", json=score), 401, code="invalid_api_key")
        assert s.service.loop.status()["answered"] == answered  # nothing scored without the key
        assert right.completions.create(**score).choices[0].logprobs.token_logprobs[0] is None
        assert httpx.get(f"{s.url}/health").status_code == httpx.get(f"{s.url}/metrics").status_code == 200
        fed = httpx.post(f"{base}/feedback", json={"id": first.id, "correct": True},
                         headers={"Authorization": f"Bearer {KEY}"})
        assert fed.json()["predictor_version"] == 1


def test_the_key_comes_from_the_config_then_the_environment(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "v")
    monkeypatch.setenv("STOPEXP_API_KEY", "s")
    assert api_key(compose("serve", ["serve.api_key=c"]).serve) == "c"
    assert api_key(compose("serve").serve) == "s"
    monkeypatch.delenv("STOPEXP_API_KEY")
    assert api_key(compose("serve").serve) == "v"
    monkeypatch.delenv("VLLM_API_KEY")
    assert api_key(compose("serve").serve) is None
    for bad in ("''", "' k'", "'kéy'"):
        with pytest.raises(ConfigError, match="^serve.api_key: the key is empty, has spaces at its ends or is not "
                                              "printable ASCII; give printable ASCII, or null for none"):
            validate(compose("serve", [f"serve.api_key={bad}"]))


def test_a_body_past_the_limit_is_a_413(trained):  # noqa: F811
    with running(trained, "serve.max_body_mb=1") as s:
        url = f"{s.url}/v1/completions"
        big = json.dumps({"model": "toy", "prompt": "3+4?", "user": "x" * (1 << 20)}).encode()
        message = "body: the request body exceeds 1048576 bytes (serve.max_body_mb)"
        assert shape(httpx.post(url, content=big, headers={"content-type": "application/json"}), 413, "body") == message
        chunked = httpx.post(url, content=iter([big[:4096], big[4096:]]), headers={"content-type": "application/json"})
        assert "content-length" not in chunked.request.headers
        assert shape(chunked, 413, "body") == message
        scoring = json.dumps({"model": "toy", "prompt": [[5] * 300] * 3000, "echo": True, "max_tokens": 0}).encode()
        assert len(scoring) > 1 << 20
        assert shape(httpx.post(url, content=scoring, headers={"content-type": "application/json"}), 413,
                     "body") == message
        small = json.dumps({"model": "toy", "prompt": "3+4?", "n": 2, "user": "x" * 1000}).encode()
        assert httpx.post(url, content=small, headers={"content-type": "application/json"}).status_code == 200


def test_feedback_on_an_open_address_needs_a_key(trained, capsys, monkeypatch):  # noqa: F811
    for name in ("STOPEXP_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as e:
        run_stage("serve", [*trained, "logger=none", "serve.feedback=true", "serve.host=0.0.0.0", "serve.port=0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == (
        "error: serve.feedback: POST /v1/feedback changes the predictor every later request uses, and 0.0.0.0 "
        "is reachable from other machines; set serve.api_key (or STOPEXP_API_KEY), or serve on 127.0.0.1\n")


@pytest.mark.parametrize("text, stops, safe, kept", [
    ("4-7=7;7+8", (), "4-7=7;7+8", "4-7=7;7+8"),
    ("4-7=7;7+8", ("#0",), "4-7=7;7+8", "4-7=7;7+8"),  # no end of it starts "#0"
    ("4-7=7;7+8#", ("#0",), "4-7=7;7+8", "4-7=7;7+8#"),  # "#" may become "#0"
    ("4-7=7;7+8=", ("=5;", "8=5"), "4-7=7;7+", "4-7=7;7+8="),  # the longest end that starts one
    ("4-7=7;7+8", ("abc", ";"), "4-7=7", "4-7=7;"),  # a stop string ends the text
    ("1+2;3", ("2;3", ";"), "1+", "1+2;3"),  # the stop string that starts first
    ("x ab", ("abc",), "x", "x ab"), ("The answer ", (), "The answer", "The answer"),
    ("caf\ufffd", (), "caf", "caf"),
])
def test_a_running_path_sends_only_what_cannot_change(text, stops, safe, kept):
    """`kept`: with include_stop_str_in_output, which keeps a stop string in the text."""
    assert safe_prefix(text, stops) == safe and safe_prefix(text, stops, include_stop=True) == kept


def deltas(client, **body) -> tuple[list[str], str, float, float]:
    """(each content chunk's text, the whole text, seconds to the first text, seconds to the end)."""
    start, texts, first = time.perf_counter(), [], None
    for c in client.completions.create(model="toy", stream=True, **body):
        if c.choices and c.choices[0].text:
            first = first or time.perf_counter() - start
            texts.append(c.choices[0].text)
    return texts, "".join(texts), first, time.perf_counter() - start


def test_a_committed_path_streams_as_it_is_generated(served, monkeypatch):
    """Pruned to one path at the check (top-K's share of 2 paths is 1), the path's text goes out
    as it is generated; with two unpruned paths nothing goes out before the vote; one path
    unpruned streams from its first tokens. The text is the one the request gets unstreamed."""
    loop = served.service.loop
    real = loop.stepper.step
    monkeypatch.setattr(loop.stepper, "step", lambda: (time.sleep(0.01), real())[1])
    prompt = prompts_of(1)[0]
    for paths, prune in ((2, True), (2, False), (1, False)):
        body = {"prompt": prompt, "seed": 5, "extra_body": {"paths": paths, "prune": prune}}
        plain = served.client.completions.create(model="toy", **body)
        texts, whole, first, total = deltas(served.client, **body)
        assert whole == plain.choices[0].text
        if (paths, prune) == (2, False):
            assert len(texts) == 1  # the vote's path, once both ended
        else:
            assert len(texts) >= 5 and first < total / 2, (texts, first, total)


def test_a_streamed_path_never_sends_what_a_stop_string_cuts(served, monkeypatch):
    """A stop string whose first characters come earlier in the text: what streams is the
    text before it, chunk by chunk, never a character past it (with the stop string where
    the request keeps it)."""
    real = served.service.loop.stepper.step
    monkeypatch.setattr(served.service.loop.stepper, "step", lambda: (time.sleep(0.01), real())[1])
    prompt = "4-7+8-2-3*9*9?"
    whole = served.client.completions.create(model="toy", prompt=prompt, seed=0, extra_body={"paths": 1})
    text = whole.choices[0].text
    stop = next(text[k:k + 2] for k in range(len(text) // 2, len(text) - 1) if text[k] in text[:k]
                and text[k:k + 2] not in text[:k + 1])  # its first character came before
    cut = text[:text.index(stop)]
    for keep in (False, True):
        extra = {"paths": 1, "include_stop_str_in_output": keep}
        plain = served.client.completions.create(model="toy", prompt=prompt, seed=0, stop=stop, extra_body=extra)
        texts, streamed, _, _ = deltas(served.client, prompt=prompt, seed=0, stop=stop, extra_body=extra)
        assert plain.choices[0].text == streamed == cut + (stop if keep else "")
        assert len(texts) >= 3, texts


def test_several_choices_stream_once_the_vote_is_decided(served):
    """n = 2: each choice's text in one chunk, then each one's end (the first with the
    `stopexp` field), as the request answers them unstreamed; a list of prompts is answered
    whole."""
    body = {"model": "toy", "prompt": prompts_of(1)[0], "seed": 5, "n": 2, "extra_body": {"paths": 4}}
    plain = served.client.completions.create(**body)
    chunks = [c for c in served.client.completions.create(stream=True, **body) if c.choices]
    assert [(c.choices[0].index, c.choices[0].text, c.choices[0].finish_reason) for c in chunks] == [
        *((c.index, c.text, None) for c in plain.choices), *((c.index, "", c.finish_reason) for c in plain.choices)]
    assert chunks[2].model_extra["stopexp"]["vote"] == plain.model_extra["stopexp"]["vote"]
    with pytest.raises(openai.BadRequestError, match="stream: a list of prompts"):
        served.client.completions.create(model="toy", prompt=prompts_of(2), stream=True)
