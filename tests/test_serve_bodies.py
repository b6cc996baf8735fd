"""Every bad request body is a 400 in OpenAI's error shape naming the field, on every route
that reads a body, and the server stays up: the bodies are generated from a valid body of
each route (every field given NaN, Infinity, a number past a double, a lone surrogate and
each wrong type), plus nesting that would exhaust the JSON parser's stack."""
import json
import math

import httpx
import pytest

from stopexp.serve.app import make_app
from stopexp.serve.bodies import MAX_DEPTH, BadRequest, read_json
from test_serve import error_of, running, trained  # noqa: F401  (trained: the fixture)

PROMPT = "3+4*7?"
# what JSON can hold but Python's parser also takes, as the body's text
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]
WRONG = [[], {}, "", "x", True, None, -1, 1.5, 2 ** 70, [[["deep"]]], {"a": [1]}, "\ud800"]
STRICT = ["\ud800"]  # a wrong value that no field may take


@pytest.fixture(scope="module")
def served(trained):  # noqa: F811
    with running(trained, "serve.feedback=true") as s:
        yield s


def valid_bodies(served) -> dict:
    """route -> a body it answers with 200."""
    first = served.client.completions.create(model="toy", prompt=PROMPT, seed=0)
    return {
        "/v1/completions": {"model": "toy", "prompt": PROMPT, "n": 2, "max_tokens": 8, "seed": 0,
                            "temperature": 1.0, "top_p": 1.0, "stop": ["?"], "stream": False,
                            "stream_options": {"include_usage": False}, "prune": True},
        "/v1/chat/completions": {"model": "toy", "messages": [{"role": "user", "content": PROMPT}],
                                 "n": 2, "max_tokens": 8, "seed": 1, "temperature": 0.5},
        "/v1/feedback": {"id": first.id, "answer": "31"},
    }


def leaves(value, field=""):
    """(field, value) of every value in a body, containers included, as the server names them."""
    if field:
        yield field, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from leaves(item, f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}" if field else key)


def replaced(body, field: str, value):
    """`body` with `field` set to `value` (a copy)."""
    body = json.loads(json.dumps(body))
    parts = [int(p) if p.isdigit() else p for p in field.replace("[", ".").replace("]", "").split(".")]
    holder = body
    for p in parts[:-1]:
        holder = holder[p]
    holder[parts[-1]] = value
    return body


def raw_with(body, field: str, literal: str) -> bytes:
    """The text of `body` with `field`'s value written as the JSON-like `literal`."""
    return json.dumps(replaced(body, field, "@@")).replace('"@@"', literal).encode()


def post(url: str, raw: bytes) -> httpx.Response:
    return httpx.post(url, content=raw, headers={"content-type": "application/json"}, timeout=60)


def refused(r: httpx.Response, field: str) -> str:
    """The message of a refusal of `field`: 400, or 404 for a model not served (OpenAI's)."""
    unknown_model = r.status_code == 404 and field == "model"
    message = error_of(r, 404 if unknown_model else 400)
    assert r.json()["error"] == {"message": message, "type": "invalid_request_error", "param": field,
                                 "code": "model_not_found" if unknown_model else None}
    assert message.startswith(f"{field}: ")
    return message


def test_every_route_refuses_every_bad_body_naming_the_field_and_stays_up(served):
    bodies = valid_bodies(served)
    posted = {r.path for r in make_app(served.service).routes if "POST" in getattr(r, "methods", ())}
    assert posted == set(bodies)  # a route that reads a body has its battery here
    for route, body in bodies.items():
        url = f"{served.url}{route}"
        assert post(url, json.dumps(body).encode()).status_code == 200
        for raw in (b"[" * 200_000, b'{"a":' * 100_000, b"{" * (MAX_DEPTH + 1), b"\xff\xfe{", b"[1, 2]", b""):
            refused(post(url, raw), "body")
        for field, _ in leaves(body):
            for literal in NON_FINITE:
                assert "no finite number" in refused(post(url, raw_with(body, field, literal)), field)
            for value in WRONG:
                r = post(url, raw_with(body, field, json.dumps(value)))
                assert r.status_code in (200, 400, 404), (route, field, value, r.text)
                if r.status_code in (400, 404) or value in STRICT:  # the field, one above it, or one inside
                    param = refused(r, r.json()["error"]["param"]) and r.json()["error"]["param"]
                    assert param and (field.startswith(param) or param.startswith(field)), (route, field, r.text)
    assert served.client.completions.create(model="toy", prompt=PROMPT, seed=0).choices[0].text


def test_the_reported_bodies(served):
    url = f"{served.url}/v1/completions"
    deep = f"body: arrays and objects nest deeper than {MAX_DEPTH} levels"
    assert refused(post(url, b"[" * 200_000), "body") == deep
    assert refused(post(f"{served.url}/v1/feedback", b"[" * 200_000), "body") == deep
    vocab = len(served.service.reader.tokenizer)
    assert refused(post(url, json.dumps({"model": "toy", "prompt": [-1, 5]}).encode()), "prompt") == \
        f"prompt: token ids must lie in 0..{vocab - 1}"
    assert refused(post(url, json.dumps({"model": "toy", "prompt": [5, 2 ** 70]}).encode()), "prompt") == \
        f"prompt: token ids must lie in 0..{vocab - 1}"
    assert refused(post(url, raw_with({"model": "toy", "prompt": PROMPT}, "temperature", str(10 ** 400))),
                   "temperature").startswith("temperature: must be a number in [0, 2], got 1000")
    first = served.client.completions.create(model="toy", prompt=PROMPT, seed=0)
    version = served.service.served.adapter.version
    assert refused(post(f"{served.url}/v1/feedback", raw_with({"id": first.id}, "answer", "NaN")), "answer") == (
        "answer: NaN is no finite number (JSON has no NaN or Infinity, and a double reaches about 1.8e308)")
    for answer in ("", "  ", True):
        refused(httpx.post(f"{served.url}/v1/feedback", json={"id": first.id, "answer": answer}), "answer")
    assert served.service.served.adapter.version == version  # no update learnt from them
    assert refused(post(url, raw_with({"model": "toy", "prompt": PROMPT, "stream": True}, "stream_options",
                                      '{"include_usage": "yes"}')), "stream_options.include_usage")
    assert refused(post(url, json.dumps({"model": "toy", "prompt": "a\ud800b"}).encode()), "prompt") == \
        "prompt: holds a lone UTF-16 surrogate, which encodes no character"


@pytest.mark.parametrize("text, field", [
    ('{"a": [1, {"b": NaN}]}', "a[1].b"), ('{"a": Infinity}', "a"), ('{"a": [1e999]}', "a[0]"),
    ('{"a": {"\\udc00": 1}}', "a"), ('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', None),
])
def test_read_json_names_the_field_and_counts_no_bracket_inside_a_string(text, field):
    if field is None:
        assert read_json(text.encode())["a"].startswith("[[")
        return
    with pytest.raises(BadRequest) as e:
        read_json(text.encode())
    assert e.value.param == field
    assert math.isfinite(read_json(b'{"a": 1.7e308}')["a"])
