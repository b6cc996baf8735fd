"""The OpenAI-compatible server (python -m stopexp.serve) on the toy LM and the hf engine,
through the real `openai` client over 127.0.0.1: it decides as evaluate's online
Launch-Check-Resume, its requests share the engine, bad requests are one-line 400s, a
client that goes away has its paths aborted, SIGTERM drains, feedback updates the
predictor."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import pytest
import torch

from conftest import ROOT, compose, run_stage
from stopexp.config import validate
from stopexp.core.policies import check_policies
from stopexp.core.protocol import check_plan
from stopexp.engines.hf import run_launch_check_resume
from stopexp.search.cohorts import CohortStepper
from stopexp.search.decode import SamplingParams, make_engine
from stopexp.search.decode_steps import DecodeSteps
from stopexp.search.inpath import run_in_path
from stopexp.search.sample import path_seeds, prompt_ids
from stopexp.search.stepping import Running
from stopexp.serve.app import make_app
from stopexp.serve.http import bind, serving_in_thread
from stopexp.stages import build
from stopexp.stages.serve import served_scorer, serving
from stopexp.stages.train import train
from stopexp.stopping.replay import trace_methods
from stopexp.tasks import build_task

TRAIN = ["train.epochs=3"]


@pytest.fixture(scope="module")
def trained(small_bank):
    """The small bank's overrides, once its mlp predictor is trained."""
    train(validate(compose("train", [*small_bank, *TRAIN])))
    return [*small_bank, *TRAIN]


@pytest.fixture(scope="module")
def served(trained):
    """The server of the embedded default (toy LM, its mlp predictor) in this process."""
    with running(trained) as s:
        yield s


class running:
    """A server of `overrides` in this process, on a free port, for the block."""

    def __init__(self, overrides, *extra):
        self.cfg = validate(compose("serve", [*overrides, "serve.port=0", *extra]))

    def __enter__(self):
        self._service = serving(self.cfg)
        service = self._service.__enter__()
        sock = bind("127.0.0.1", 0)
        port = sock.getsockname()[1]
        self._http = serving_in_thread(make_app(service), sock)
        self._http.__enter__()
        url = f"http://127.0.0.1:{port}"
        return SimpleNamespace(service=service, url=url, cfg=self.cfg,
                               client=openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0))

    def __exit__(self, *exc):
        self._http.__exit__(*exc)
        self._service.__exit__(*exc)


def prompts_of(n: int) -> list[str]:
    """The first n test prompts of the toy task."""
    return [p.prompt for p in build_task(compose("serve").task).problems("test", n)]


def test_a_request_decides_as_evaluates_online_run(served):
    """Same seed, same prompt: the served paths are those of online Launch-Check-Resume
    (stopexp.search.lcr) with the same predictor and policy, pruned at the same prefix, and
    the answer is the vote's path; usage counts every generated token."""
    cfg = served.cfg
    task = build_task(cfg.task)
    problems = task.problems("test", 3)
    lm, tokenizer = build.lm(cfg, progress=False)
    scorer, _, artifact = served_scorer(cfg, "mlp", [])
    plan = check_plan(cfg.search, cfg.policy)
    runs, _ = run_launch_check_resume(
        lm, tokenizer, task, problems, {"mlp": (scorer, lambda: check_policies(cfg.policy, plan)[0])},
        plan[0][0], build.sampling(cfg), cfg.search, cfg.tap, cfg.seed, 256)
    run = runs["mlp"]
    for i, problem in enumerate(problems):
        r = served.client.completions.create(model="toy", prompt=problem.prompt, seed=cfg.seed)
        info = r.model_extra["stopexp"]
        paths = {p["id"]: p for p in info["paths"]}
        assert info["paths_launched"] == cfg.search.n_paths == len(paths)
        assert {j: p["pruned_at"] for j, p in paths.items() if p["pruned_at"] is not None} == {
            j: at for (g, j), at in run.pruned_at.items() if g == i}
        assert {j: p["tokens"] for j, p in paths.items() if p["pruned_at"] is None} == {
            j: n for (g, j), n in run.length.items() if g == i and (g, j) not in run.pruned_at}
        chosen = info["vote"]["chosen_path"]
        assert r.choices[0].text == run.text[(i, chosen)]
        assert info["vote"]["winner"] == task.answer_of(r.choices[0].text)
        assert info["paths_kept"] == cfg.search.n_paths - len([1 for k in run.pruned_at if k[0] == i])
        assert r.usage.completion_tokens == info["tokens_generated"] == sum(p["tokens"] for p in paths.values())
        assert r.usage.prompt_tokens == len(prompt_ids(tokenizer, problem.prompt))
        assert info["predictor"] == {**artifact, "version": 0}
        check = info["checks"][0]
        assert check["at"] == plan[0][0] and len(check["kept"]) == plan[0][1]
        assert check["scores"] == pytest.approx({str(j): s for (g, j), s in run.signal.items() if g == i})
        pruned = [p for p in paths.values() if p["pruned_at"] is not None]
        assert 0 <= info["tokens_saved"] <= info["tokens_saved_max"] == sum(
            cfg.search.max_new_tokens - p["tokens"] for p in pruned)


def test_32_clients_with_4_requests_each_are_all_answered_each_with_its_own_prompt(served):
    """128 requests, 32 at a time: every one answered, by a path that works on its own prompt
    (a toy completion writes the prompt's operations in order: the first always, all of
    them in 127 of these 128 alone), the same path as the same request sent alone; their
    paths were in flight together."""
    prompts = prompts_of(128)
    before = served.service.loop.status()

    def ask(k: int):
        r = served.client.completions.create(model="toy", prompt=prompts[k], seed=k, extra_body={"paths": 4})
        return k, r

    with ThreadPoolExecutor(32) as pool:
        answers = dict(pool.map(ask, range(128)))
    assert sorted(answers) == list(range(128))
    assert len({r.id for r in answers.values()}) == 128
    ops = {k: (re.findall(r"[-+*]\d", prompts[k]), re.findall(r"[-+*]\d", r.choices[0].text))
           for k, r in answers.items()}
    assert all(asked[0] == wrote[0] for asked, wrote in ops.values())
    assert sum(asked == wrote for asked, wrote in ops.values()) >= 120
    for k, r in answers.items():
        info = r.model_extra["stopexp"]
        assert info["paths_launched"] == 4 and info["seed"] == k
        assert len(info["checks"][0]["kept"]) == 2  # top-K's share: 3 of 8, round(1.5) of 4
    after = served.service.loop.status()
    assert after["answered"] - before.get("answered", 0) == 128 and after.get("failed", 0) == 0
    assert after["peak_active"] >= 8  # requests from many clients shared the engine's steps
    assert after["completion_tokens"] - before.get("completion_tokens", 0) == \
        sum(r.usage.completion_tokens for r in answers.values())
    for k in (0, 57, 127):  # alone, the same request gives the same answer
        assert ask(k)[1].choices[0].text == answers[k].choices[0].text


def error_of(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert "\n" not in message
    return message


@pytest.mark.parametrize("body, field", [
    (b'{"model": "toy", "prompt": "3+4?",', "body"),
    ({"model": "toy", "prompt": "3+4?", "n": 0}, "n"),
    ({"model": "toy", "prompt": "3+4?", "paths": 65}, "paths"),
    ({"model": "toy", "prompt": "3+4?", "max_tokens": -1}, "max_tokens"),
    ({"model": "toy", "prompt": "3+4?" * 60}, "prompt"),
    ({"model": "toy", "prompt": "3+4?", "temperature": "hot"}, "temperature"),
    ({"model": "toy", "prompt": "3+4?", "logprobs": 21}, "logprobs"),
    ({"model": "toy"}, "prompt"),
])
def test_a_bad_request_is_a_400_naming_the_field_and_the_server_goes_on(served, body, field):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{served.url}/v1/completions", content=raw,
                   headers={"content-type": "application/json"})
    assert error_of(r).startswith(f"{field}: ")
    assert r.json()["error"]["param"] == field
    ok = served.client.completions.create(model="toy", prompt="3+4?", n=2, seed=0)
    assert ok.choices[0].text


def test_the_bad_request_messages(served):
    post = lambda **b: error_of(httpx.post(f"{served.url}/v1/completions", json={"model": "toy", **b}))
    assert post(prompt="1+2?", n=65) == "n: must lie in 1..64 (serve.max_n), got 65"
    assert post(prompt="1+2?", n=5, paths=4) == "n: must lie in 1..4 (the paths sampled: `paths`), got 5"
    assert post(prompt="1+2?", max_tokens=-1) == "max_tokens: must lie in 1..64 (serve.max_tokens), got -1"
    assert post(prompt="9" * 200) == (  # 200 characters and the BOS token
        "prompt: 201 prompt tokens + 64 max_tokens exceed the model's 256 positions")
    unknown = httpx.post(f"{served.url}/v1/completions", json={"model": "x", "prompt": "1+2?"})
    assert error_of(unknown, 404).startswith("model: 'x' is not served here; this server serves 'toy'")
    assert unknown.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError, match="model: 'gpt-4' is not served here") as e:
        served.client.completions.create(model="gpt-4", prompt="1+2?")
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.BadRequestError, match="n: must lie in 1..64"):
        served.client.completions.create(model="toy", prompt="1+2?", n=0)


def test_chat_streaming_models_and_health(served):
    prompt = prompts_of(1)[0]
    plain = served.client.completions.create(model="toy", prompt=prompt, seed=3)
    chat = served.client.chat.completions.create(model="toy", messages=[{"role": "user", "content": prompt}],
                                                 seed=3)
    assert chat.choices[0].message.content == plain.choices[0].text  # the toy has no template
    assert chat.object == "chat.completion" and chat.usage == plain.usage
    chunks = list(served.client.completions.create(model="toy", prompt=prompt, seed=3, stream=True,
                                                   stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, plain.choices[0].finish_reason]
    streamed = list(served.client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": prompt}], seed=3, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == plain.choices[0].text
    raw = httpx.post(f"{served.url}/v1/completions", json={"model": "toy", "prompt": prompt, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n")
    assert [m.id for m in served.client.models.list()] == ["toy"]
    health = httpx.get(f"{served.url}/health").json()
    assert health["status"] == "ok" and health["method"] == "mlp" and health["predictor_version"] == 0
    unpruned = served.client.completions.create(model="toy", prompt=prompt, seed=3, extra_body={"prune": False})
    info = unpruned.model_extra["stopexp"]
    assert info["method"] == "no_prune" and info["paths_pruned"] == 0 and info["checks"] == []
    assert unpruned.usage.completion_tokens > plain.usage.completion_tokens


def test_a_client_that_goes_away_has_its_paths_aborted(served, monkeypatch):
    loop = served.service.loop
    real = loop.stepper.step
    monkeypatch.setattr(loop.stepper, "step", lambda: (time.sleep(0.02), real())[1])  # in flight for ~1 s
    body = json.dumps({"model": "toy", "prompt": prompts_of(1)[0], "paths": 16, "seed": 1,
                       "extra": "x"}).encode()
    before = loop.status().get("cancelled", 0)
    with socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        run = wait_for(lambda: next(iter(loop.active.values()), None))
        wait_for(lambda: any(len(p.tokens) >= 3 for p in run.launched))
    wait_for(lambda: loop.status()["cancelled"] == before + 1)
    assert not loop.active and loop.stepper.held() == [] and loop.stepper.cohorts == []
    assert any(p.pruned and not p.finished for p in run.launched)  # aborted while running
    assert all(p.finished or p.pruned for p in run.launched)


def wait_for(what, timeout: float = 20.0):
    end = time.time() + timeout
    while time.time() < end:
        value = what()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError("timed out")


def test_feedback_updates_the_predictor_and_every_response_names_its_version(trained):
    with running(trained, "serve.feedback=true") as s:
        prompt = prompts_of(1)[0]
        first = s.client.completions.create(model="toy", prompt=prompt, seed=0)
        assert first.model_extra["stopexp"]["predictor"]["version"] == 0
        predictor = s.service.served.adapter.predictor
        weights = [p.detach().clone() for p in predictor.parameters()]
        r = httpx.post(f"{s.url}/v1/feedback", json={"id": first.id, "correct": True})
        assert r.status_code == 200, r.text
        assert r.json()["predictor_version"] == 1 and r.json()["paths"] >= 1
        assert np.isfinite(r.json()["loss_last"])
        assert any(not torch.equal(a, b) for a, b in zip(weights, predictor.parameters()))
        second = s.client.completions.create(model="toy", prompt=prompt, seed=0)
        assert second.model_extra["stopexp"]["predictor"]["version"] == 1
        assert second.model_extra["stopexp"]["checks"][0]["predictor_version"] == 1
        answer = httpx.post(f"{s.url}/v1/feedback", json={"id": second.id, "answer": "3"})
        assert answer.json()["predictor_version"] == 2
        assert error_of(httpx.post(f"{s.url}/v1/feedback", json={"id": "cmpl-none", "correct": True})
                        ).startswith("id: 'cmpl-none' is no response of this server")
        assert error_of(httpx.post(f"{s.url}/v1/feedback", json={"id": first.id})).startswith("correct: ")


def test_deepconf_online_stops_as_evaluates_in_path_run(trained):
    """serve.method=deepconf_online: the warm-up paths first, then the rest stopped where
    evaluate's online run (stopexp.search.inpath) stops them; the voters weigh their confidence."""
    with running(trained, "serve.method=deepconf_online") as s:
        cfg = s.cfg
        lm, tokenizer = build.lm(cfg, progress=False)
        method = trace_methods(["deepconf_online"], cfg.evaluate.stopping)["deepconf_online"]
        stopped = 0
        for problem in build_task(cfg.task).problems("test", 4):  # one prompt per run: the same batches
            run = run_in_path(DecodeSteps(make_engine(lm, tokenizer, build.sampling(cfg)), 256), tokenizer,
                              [problem], cfg.search.n_paths, cfg.seed,
                              method.controller(cfg.search.n_paths, cfg.search.group_window))
            info = s.client.completions.create(model="toy", prompt=problem.prompt, seed=cfg.seed).model_extra["stopexp"]
            assert info["method"] == "deepconf_online" and info["vote"]["rule"] == "deepconf_weighted"
            assert {p["id"]: p["pruned_at"] for p in info["paths"] if p["pruned_at"] is not None} == {
                j: at for (_, j), at in run.pruned_at.items()}
            assert all(p["pruned_at"] is None for p in info["paths"][:2])  # the warm-up paths
            stopped += info["paths_pruned"]
        assert stopped > 0


def test_paths_added_while_others_run_draw_what_they_draw_alone(tiny_lm):
    """The hf engine's cohorts: a path launched while others run gets the tokens it gets
    alone (its own stream), and an abort takes its rows out."""
    model, tok = tiny_lm
    params = SamplingParams(max_new_tokens=12)
    prompts = [tok("1+2?")["input_ids"], tok("7*3-1?")["input_ids"]]
    seeds = [path_seeds(0, "a", 3), path_seeds(0, "b", 3)]

    def alone(prompt, seed):
        stepper = CohortStepper(lambda p: make_engine(model, tok, p))
        path = Running((0, 0), prompt, seed)
        stepper.add([path], params)
        while stepper.running:
            stepper.step()
        return path.tokens

    stepper = CohortStepper(lambda p: make_engine(model, tok, p))
    first = [Running((0, j), prompts[0], s) for j, s in enumerate(seeds[0])]
    stepper.add(first, params)
    for _ in range(4):
        stepper.step()
    later = [Running((1, j), prompts[1], s) for j, s in enumerate(seeds[1])]
    stepper.add(later, params)
    stepper.abort([first[2]])
    assert first[2] not in stepper.held() and len(stepper.cohorts) == 2
    while stepper.running:
        stepper.step()
    for p in [*first[:2], *later]:
        assert p.tokens == alone(p.prompt, p.seed)
    assert len(first[2].tokens) == 4 and first[2].pruned
    stepper.release([*first, *later])
    assert stepper.cohorts == [] and stepper.held() == []


def test_a_missing_predictor_is_refused_with_the_train_command(trained, capsys):
    with pytest.raises(SystemExit) as e:
        run_stage("serve", [*trained, "train.epochs=4", "logger=none", "serve.port=0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: no trained mlp predictor for this config at ")
    assert "python -m stopexp.train " in err and "train.epochs=4" in err and "serve.port" not in err


def test_a_bad_serve_key_is_one_error_line_before_any_compute(trained, capsys):
    with pytest.raises(SystemExit) as e:
        run_stage("serve", [*trained, "serve.method=oracle"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: serve.method: 'oracle' cannot run in the server (it reads the outcomes)")


def test_sigterm_drains_the_requests_in_flight_then_exits_0(trained, tmp_path):
    """A server process: requests in flight when SIGTERM comes are answered, then it exits 0
    and its metrics.json counts them."""
    run_dir, out = tmp_path / "run", tmp_path / "stdout"
    with open(out, "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stopexp.serve", *trained, "serve.port=0", "serve.max_tokens=200",
             "logger=none", f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=stdout, stderr=stderr,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = wait_for(lambda: next((x for x in out.read_text().splitlines()
                                      if x.startswith("stopexp serve: ")), None)
                        or (proc.poll() is not None and "exited"), timeout=120)
        assert line.startswith("stopexp serve: http://127.0.0.1:"), (tmp_path / "stderr").read_text()
        url = line.split()[2].removesuffix("/v1")
        # hot sampling, unpruned: the toy's 64 paths run long, so the requests are in flight
        body = {"model": "toy", "prompt": "3+4*7?", "paths": 64, "temperature": 2.0, "max_tokens": 200,
                "prune": False}
        results = []
        threads = [threading.Thread(target=lambda k=k: results.append(
            httpx.post(f"{url}/v1/completions", json={**body, "seed": k}, timeout=120)))
            for k in range(3)]
        for t in threads:
            t.start()
        taken = wait_for(lambda: (lambda h: h if h["active"] + h["waiting"] + h.get("answered", 0) == 3
                                  else None)(httpx.get(f"{url}/health").json()))
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join()
        assert proc.wait(timeout=60) == 0, (tmp_path / "stderr").read_text()
    finally:
        proc.kill()
    assert taken["active"] >= 1  # in flight when the signal came
    assert [r.status_code for r in results] == [200] * 3
    assert all(r.json()["stopexp"]["paths_launched"] == 64 for r in results)
    metrics = json.loads((run_dir / "metrics.json").read_text())["serve"]
    assert metrics["answered"] == 3 and metrics.get("failed", 0) == 0
