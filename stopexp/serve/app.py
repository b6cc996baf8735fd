"""The routes (FastAPI): /v1/completions, /v1/chat/completions, /v1/models, /health,
/metrics and, with serve.feedback, /v1/feedback. Every error is OpenAI's error body: a bad
request 400 naming the field, an unknown model 404 (`model_not_found`), an unknown route
404, a wrong method 405, 401 without the API key and 413 past the body limit
(stopexp.serve.access), 500 for the server's own failure. A request whose client goes away
before its answer has its paths aborted (`until_answered`; a streamed one when its stream
is cancelled). `X-Request-Id` names the request (its response id is `cmpl-<it>`) and is
echoed; without one the server makes one."""
from __future__ import annotations

import asyncio
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from stopexp.serve.access import AccessCheck, BodyTooLarge, RequestIds
from stopexp.serve.bodies import BadRequest, error_body, read_json
from stopexp.serve.loop import Closed
from stopexp.serve.metrics import CONTENT_TYPE
from stopexp.serve.responses import body, chunk, events
from stopexp.serve.service import Service
from stopexp.serve.streaming import TokenFeed, streams_as_generated

log = logging.getLogger(__name__)


def make_app(service: Service) -> FastAPI:
    app = FastAPI(title="stopexp", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(AccessCheck, access=service.access)
    app.add_middleware(RequestIds)  # the last added is the outermost: a 401 or 413 carries the id too
    errors(app)

    @app.get("/health")
    async def health():
        return service.status()

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": service.model_name, "object": "model", "created": int(service.started),
            "owned_by": "stopexp", "root": service.model_name, "parent": None,
            "max_model_len": service.limits.positions}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(service, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(service, request, chat=True)

    if service.served.adapter is not None:
        @app.post("/v1/feedback")
        async def feedback(request: Request):
            return await learn(service, request)

    return app


def errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape."""
    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, e: BadRequest):
        return JSONResponse(error_body(str(e), e.param, code=e.code), status_code=e.status)

    @app.exception_handler(Closed)
    async def closed(request: Request, e: Closed):
        return JSONResponse(error_body(str(e), kind="server_error"), status_code=503)

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, e: BodyTooLarge):
        return JSONResponse(error_body(str(e), "body"), status_code=413)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        where = f"{request.method} {request.url.path}"
        allow = {k.lower(): v for k, v in (e.headers or {}).items()}.get("allow", "")
        message = {404: f"{where}: no such route (POST /v1/completions, POST /v1/chat/completions, "
                        "GET /v1/models, GET /health, GET /metrics)",
                   405: f"{where}: the route takes {allow}"}
        return JSONResponse(error_body(message.get(e.status_code, f"{where}: {e.detail}")),
                            status_code=e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = (e.errors() or [{}])[0]
        field = ".".join(str(x) for x in first.get("loc", ())[1:]) or "body"
        return JSONResponse(error_body(f"{field}: {first.get('msg', 'invalid')}", field), status_code=422)

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception):
        log.exception("the server failed on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"the server failed: {e}", kind="server_error"), status_code=500)


async def generate(service: Service, request: Request, chat: bool):
    arrived = time.perf_counter()
    rid = request.scope["state"]["request_id"]
    gens = service.reader.read(await request.body(), chat, rid)  # one per prompt
    feed = TokenFeed(asyncio.get_running_loop(), service.texts.decode, gens[0]) \
        if streams_as_generated(gens[0]) else None
    futures: list = []
    try:
        for gen in gens:
            futures.append(service.submit(gen, feed and feed.push))
    except Closed as e:
        for future in futures:
            service.loop.cancel(future)
        return JSONResponse(error_body(str(e), kind="server_error"), status_code=503)
    if gens[0].stream:  # one prompt (the reader refuses a streamed list)
        return StreamingResponse(stream(service, gens[0], futures[0], feed, arrived), media_type="text/event-stream")
    answered = await until_answered(service, request, futures)
    if answered is None:  # the client went away; nobody reads this
        return Response(status_code=499)
    try:
        answers = [a.result() for a in answered]
    except Exception as e:  # noqa: BLE001  (the request's own failure, one line)
        return JSONResponse(error_body(f"the request failed: {e}", kind="server_error"), status_code=500)
    done = time.perf_counter() - arrived
    for _ in gens:
        service.metrics.timed(done, done)
    return JSONResponse(body(gens, answers, service.model_name))


async def until_answered(service: Service, request: Request, futures: list):
    """The answered asyncio futures of `futures` (a request's prompts), or None when the
    client disconnected first (its runs are cancelled: their paths are aborted between two
    engine steps)."""
    answered = [asyncio.wrap_future(f) for f in futures]
    everything = asyncio.gather(*answered, return_exceptions=True)
    gone = asyncio.ensure_future(disconnected(request))
    done, _ = await asyncio.wait({everything, gone}, return_when=asyncio.FIRST_COMPLETED)
    if everything in done:
        gone.cancel()
        return answered
    for future, a in zip(futures, answered):
        service.loop.cancel(future)
        a.cancel()  # nobody reads its answer
    return None


async def disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read: the server
    then only has the disconnect to tell)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def stream(service: Service, gen, future, feed: TokenFeed | None, arrived: float):
    """The committed path's text as it is generated where `feed` shows it
    (stopexp.serve.streaming), then the answer's events once the vote is decided;
    cancelled with the stream when the client goes away, which cancels the request."""
    answered, first = asyncio.wrap_future(future), None
    try:
        while feed is not None and (text := await feed.next_text(answered)) is not None:
            delta = {"content": text} if first else {"role": "assistant", "content": text}
            first = first or time.perf_counter()
            yield f"data: {json.dumps(chunk(gen, service.model_name, delta))}\n\n"
        answer = await answered
    except asyncio.CancelledError:
        service.loop.cancel(future)
        raise
    except Exception as e:  # noqa: BLE001
        yield f"data: {json.dumps(error_body(f'the request failed: {e}', kind='server_error'))}\n\n"
        yield "data: [DONE]\n\n"
        return
    sent = feed.sent_before(answer["choices"][0]["text"]) if feed is not None else ""
    for event in events(gen, answer, service.model_name, sent):
        first = first or time.perf_counter()
        yield event
    service.metrics.timed(first - arrived, time.perf_counter() - arrived)


async def learn(service: Service, request: Request):
    """POST /v1/feedback {"id": response id, "correct": bool} or {"id", "answer": reference}:
    one adapt update of the served predictor, run in the engine loop between steps."""
    data = read_json(await request.body())
    if not isinstance(data.get("id"), str):
        raise BadRequest("id", "the id of a response of this server is expected")
    correct, answer = data.get("correct"), data.get("answer")
    if (correct is None) == (answer is None):  # the field given (a null one too), else correct
        field = "answer" if "answer" in data and (answer is not None or "correct" not in data) else "correct"
        raise BadRequest(field, "give one of correct (true or false) and answer (the reference)")
    if correct is not None and not isinstance(correct, bool):
        raise BadRequest("correct", f"true or false is expected, got {correct!r}")
    if answer is not None and (not isinstance(answer, (str, int, float)) or isinstance(answer, bool)
                               or not str(answer).strip()):
        raise BadRequest("answer", f"the reference answer, a non-empty string, is expected, got {answer!r}")
    adapter = service.served.adapter
    done = service.loop.call(lambda: adapter.update(data["id"], correct, None if answer is None else str(answer)))
    return await asyncio.wrap_future(done)  # a BadRequest reaches the handler above
