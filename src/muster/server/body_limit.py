"""A cap on every request body but the upload's, applied before anything reads it.

FastAPI reads a JSON body (a priority, a review) before a route's dependencies run, the
token check among them, so without a cap anyone who can reach the port could make the
server read a body of any size. The upload route (`POST /experiments`) reads its own body
after the token check, with its own limits (`muster.server.upload_form`).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MAX_BODY_BYTES", "BodyLimit"]

MAX_BODY_BYTES = 64 * 1024
_MESSAGE = ("the request body is larger than {limit:,} bytes (or its Content-Length is not a "
            "number); this route takes a small JSON object")


class _TooLarge(HTTPException):
    """Raised from `receive` past the limit. An HTTPException, because FastAPI turns any
    other error met reading a body into a 400; the app's handler then answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _MESSAGE.format(limit=limit))


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes is a 413 (announced: before it is read;
    sent without a length: as soon as the count passes the limit)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES,
                 exempt: tuple[tuple[str, str], ...] = ()) -> None:
        self.app, self.limit, self.exempt = app, limit, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) in self.exempt:
            await self.app(scope, receive, send)
            return
        announced = dict(scope["headers"]).get(b"content-length", b"0")
        if not announced.isdigit() or int(announced) > self.limit:
            await _refuse(send, self.limit)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started |= message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except _TooLarge:
            if started:
                raise
            await _refuse(send, self.limit)


async def _refuse(send: Send, limit: int) -> None:
    body: dict[str, Any] = {"error": "PayloadTooLarge", "message": _MESSAGE.format(limit=limit)}
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
