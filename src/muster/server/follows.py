"""How many log follows each caller has open: at most `MAX_FOLLOWS_PER_TOKEN` at once.

A follow (`GET /trials/{id}/logs?follow=true`) holds a connection and a poll loop for as
long as its trial runs, so one script in a loop could hold every one the server has. The
count is kept per user (all of a user's tokens and sessions together); the follow past the
limit is refused with a 429 before any stream starts, and a
stream gives its place back however it ends: its trial ended, its client went away, or
the server broke it off.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncGenerator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from muster.errors import TooManyRequests

__all__ = ["MAX_FOLLOWS_PER_TOKEN", "RETRY_AFTER_SECONDS", "FollowLimit", "FollowStream",
           "FollowTicket"]

MAX_FOLLOWS_PER_TOKEN = 32
RETRY_AFTER_SECONDS = 5  # what a refused follow is told to wait (the Retry-After header)


class FollowTicket:
    """One open follow of one caller; `release` gives its place back (idempotent)."""

    def __init__(self, give_back: Callable[[], None]) -> None:
        self._give_back: Callable[[], None] | None = give_back

    def release(self) -> None:
        if self._give_back is not None:
            give_back, self._give_back = self._give_back, None
            give_back()


class FollowLimit:
    """The open follows of each caller (keyed by its user's name). Safe to use from any
    thread."""

    def __init__(self, limit: int = MAX_FOLLOWS_PER_TOKEN) -> None:
        if limit < 1:
            raise ValueError(f"a follow limit must be at least 1, but got {limit=}.")
        self.limit = limit
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, key: str) -> FollowTicket:
        """A place for one more follow of `key`.

        Raises:
            TooManyRequests: `key` already holds `limit` follows.
        """
        with self._lock:
            if self._open[key] >= self.limit:
                raise TooManyRequests(
                    f"{self.limit} log streams already open for {key}, the most one user may "
                    "hold at once; close one (Ctrl-C a `muster trial logs -f`) and retry",
                    retry_after=RETRY_AFTER_SECONDS,
                )
            self._open[key] += 1
        return FollowTicket(lambda: self._give_back(key))

    def _give_back(self, key: str) -> None:
        with self._lock:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]


class FollowStream(StreamingResponse):
    """A follow's response: when it ends, whatever ended it, the stream is closed and the
    ticket released (a client that went away cancels the response mid-send, where the
    stream's own `finally` would wait for the garbage collector)."""

    def __init__(self, stream: AsyncGenerator[bytes, None], ticket: FollowTicket) -> None:
        super().__init__(stream, media_type="application/octet-stream")
        self._stream, self._ticket = stream, ticket

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ticket.release()
            await self._stream.aclose()
