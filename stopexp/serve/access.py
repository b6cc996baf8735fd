"""Who may call the server, how much they may send and what the request is called, as pure
ASGI middleware in front of every route. With a key (serve.api_key, STOPEXP_API_KEY or
VLLM_API_KEY), every path but /health and /metrics (as vLLM's server leaves them open to
probes and scrapers) asks for `Authorization: Bearer KEY`, compared in constant time; a
request body past the limit is refused before the route reads it (401, 413, in OpenAI's
error shape). `X-Request-Id` (as vLLM's) names the request and is echoed on its response;
without one the server makes one."""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from stopexp.serve.bodies import error_body

OPEN_PATHS = ("/health", "/metrics")
MAX_ID = 256  # characters of an X-Request-Id


async def send_error(send, status: int, body: dict, headers: list | None = None) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": raw})


class BodyTooLarge(Exception):
    """A request body past the limit, found while it streams in (no content-length)."""

    def __init__(self, limit: int):
        super().__init__(f"body: the request body exceeds {limit} bytes (serve.max_body_mb)")
        self.limit = limit


@dataclass(frozen=True)
class Access:
    """Who may call the server and how much they may send: the API key (None: anyone) and
    the largest request body, in bytes."""
    key: str | None = None
    max_body: int = 4 << 20


class AccessCheck:
    """The ASGI app `app` behind `access`'s key check and body limit."""

    def __init__(self, app, access: Access):
        self.app, self.max_body = app, access.max_body
        self.digest = None if access.key is None else hashlib.sha256(access.key.encode()).digest()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope["headers"]}
        if self.digest is not None and scope["path"] not in OPEN_PATHS and not self.allowed(headers):
            return await send_error(send, 401, error_body(
                "a valid API key is required: send it as 'Authorization: Bearer KEY'",
                code="invalid_api_key"), [(b"www-authenticate", b"Bearer")])
        length = headers.get(b"content-length", b"").decode("latin-1").strip()
        if length.isdigit() and int(length) > self.max_body:
            return await send_error(send, 413, self.too_large())
        return await self.app(scope, self.bounded(receive), send)

    def allowed(self, headers: dict) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        given = hashlib.sha256(token.strip().encode("latin-1")).digest()  # equal lengths: no timing by length
        return scheme.lower() == "bearer" and hmac.compare_digest(given, self.digest)

    def too_large(self) -> dict:
        return error_body(str(BodyTooLarge(self.max_body)), "body")

    def bounded(self, receive):
        """`receive`, raising BodyTooLarge once more than the limit has come in (a chunked
        body that states no length)."""
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message
        return counted


class RequestIds:
    """The request's id, `X-Request-Id` or a fresh one, in scope["state"]["request_id"] and
    on the response's headers. An id past MAX_ID characters, or with other than visible
    ASCII, is refused (400)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id")
        rid = secrets.token_hex(12) if given is None else given.decode("latin-1")
        if not (0 < len(rid) <= MAX_ID and rid.isascii() and rid.isprintable() and " " not in rid):
            return await send_error(send, 400, error_body(
                f"X-Request-Id: 1..{MAX_ID} visible ASCII characters are expected", "X-Request-Id"))
        scope.setdefault("state", {})["request_id"] = rid

        async def echoed(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", rid.encode())]}
            await send(message)
        return await self.app(scope, receive, echoed)
