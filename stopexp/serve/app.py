"""The routes (FastAPI): /v1/completions, /v1/chat/completions, /v1/models, /health and,
with serve.feedback, /v1/feedback. A bad request is HTTP 400 with OpenAI's error body, its
message one line naming the field; a request whose client goes away before its answer has
its paths aborted (`until_answered`; a streamed one when its stream is cancelled)."""
from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from stopexp.serve.loop import Closed
from stopexp.serve.bodies import BadRequest, read_json
from stopexp.serve.responses import body, error, events
from stopexp.serve.service import Service


def make_app(service: Service) -> FastAPI:
    app = FastAPI(title="stopexp", docs_url=None, redoc_url=None)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, e: BadRequest):
        return JSONResponse(error(str(e), e.param), status_code=400)

    @app.get("/health")
    async def health():
        return service.status()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_name, "object": "model",
                                            "created": int(service.started), "owned_by": "stopexp"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(service, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(service, request, chat=True)

    if service.adapter is not None:
        @app.post("/v1/feedback")
        async def feedback(request: Request):
            return await learn(service, request)

    return app


async def generate(service: Service, request: Request, chat: bool):
    gens = service.reader.read(await request.body(), chat)  # one per prompt
    futures: list = []
    try:
        for gen in gens:
            futures.append(service.submit(gen))
    except Closed as e:
        for future in futures:
            service.loop.cancel(future)
        return JSONResponse(error(str(e), kind="server_error"), status_code=503)
    if gens[0].stream:  # one prompt (the reader refuses a streamed batch)
        return StreamingResponse(stream(service, gens[0], futures[0]), media_type="text/event-stream")
    answered = await until_answered(service, request, futures)
    if answered is None:  # the client went away; nobody reads this
        return Response(status_code=499)
    try:
        answers = [a.result() for a in answered]
    except Exception as e:  # noqa: BLE001  (the request's own failure, one line)
        return JSONResponse(error(f"the request failed: {e}", kind="server_error"), status_code=500)
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


async def stream(service: Service, gen, future):
    """The chosen path's events once the vote is decided; cancelled with the stream when the
    client goes away, which cancels the request."""
    try:
        answer = await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        service.loop.cancel(future)
        raise
    except Exception as e:  # noqa: BLE001
        yield f"data: {json.dumps(error(f'the request failed: {e}', kind='server_error'))}\n\n"
        yield "data: [DONE]\n\n"
        return
    for event in events(gen, answer, service.model_name):
        yield event


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
    adapter = service.adapter
    done = service.loop.call(lambda: adapter.update(data["id"], correct, None if answer is None else str(answer)))
    return await asyncio.wrap_future(done)  # a BadRequest reaches the handler above
