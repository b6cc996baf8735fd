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
    before = samples(served.url)
    answers = [served.client.completions.create(model="toy", prompt=p, n=4, seed=k)
               for k, p in enumerate(prompts_of(5))]
    answers.append(served.client.completions.create(model="toy", prompt=prompts_of(1)[0], n=3,
                                                    extra_body={"prune": False}))
    after = samples(served.url)
    grew = lambda name, **labels: after.get((name, tuple(sorted(labels.items()))), 0) - before.get(
        (name, tuple(sorted(labels.items()))), 0)
    info = [a.model_extra["stopexp"] for a in answers]
    assert grew("vllm:generation_tokens_total") == sum(a.usage.completion_tokens for a in answers)
    assert grew("vllm:prompt_tokens_total") == sum(a.usage.prompt_tokens for a in answers)
    assert grew("stopexp:paths_launched_total") == sum(i["paths_launched"] for i in info) == 23
    assert grew("stopexp:paths_pruned_total") == sum(i["paths_pruned"] for i in info) == 10  # 2 of 4, 5 times
    assert grew("stopexp:tokens_saved_total") == sum(i["tokens_saved"] for i in info)
    assert grew("stopexp:check_seconds_count") == sum(len(i["checks"]) for i in info) == 5
    assert grew("stopexp:requests_total", outcome="answered") == 6
    assert grew("vllm:request_success_total", finished_reason="stop") == 6
    assert grew("vllm:e2e_request_latency_seconds_count") == grew("vllm:time_to_first_token_seconds_count") == 6
    assert after[("vllm:num_requests_running", ())] == after[("vllm:num_requests_waiting", ())] == 0


def test_the_api_key_is_asked_on_every_route_but_health_and_metrics(trained, monkeypatch):  # noqa: F811
    monkeypatch.delenv("STOPEXP_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", KEY)  # a vLLM user's key protects this server too
    with running(trained, "serve.feedback=true") as s:
        assert s.service.access["key"] == KEY
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
        assert s.service.adapter.version == 0  # no feedback taken without the key
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


@pytest.mark.parametrize("text, stops, safe", [
    ("4-7=7;7+8", (), "4-7=7;7+8"), ("4-7=7;7+8", ("#0",), "4-7=7;7+"), ("4-7=7;7+8", ("abc", ";"), "4-7=7;7"),
    ("The answer ", (), "The answer"), ("caf\ufffd", (), "caf"),
])
def test_a_running_path_sends_only_what_cannot_change(text, stops, safe):
    assert safe_prefix(text, stops) == safe


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
    for n, prune in ((2, True), (2, False), (1, False)):
        body = {"prompt": prompt, "n": n, "seed": 5, "extra_body": {"prune": prune}}
        plain = served.client.completions.create(model="toy", **body)
        texts, whole, first, total = deltas(served.client, **body)
        assert whole == plain.choices[0].text
        tokens = max(p["tokens"] for p in plain.model_extra["stopexp"]["paths"])
        if (n, prune) == (2, False):
            assert len(texts) == 1  # the vote's path, once both ended
        else:
            assert len(texts) >= 5 and first < total / 2, (texts, first, total, tokens)
