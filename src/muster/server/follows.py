"""How many log follows each caller has open (at most `MAX_FOLLOWS_PER_TOKEN` at once), and
how a follow ends when its credential stops working.

A follow (`GET /trials/{id}/logs?follow=true`) holds a connection and a poll loop for as
long as its trial runs, so one script in a loop could hold every one the server has. The
count is kept per user (all of a user's tokens and sessions together); the follow past the
limit is refused with a 429 before any stream starts, and a
stream gives its place back however it ends: its trial ended, its client went away, or
the server broke it off.

A follow's credential is checked again every `RECHECK_SECONDS` (at most 30 s; the
environment's `MUSTER_FOLLOW_RECHECK_SECONDS` sets it shorter), and at once when a route
revokes a token, ends a session or deactivates a user (`FollowLimit.recheck`): once its
token is revoked or expired, its web session ended, or its user deactivated, the stream ends
as if its trial had (the bytes sent stay whole), and the client's next request is told why
with a 401.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Mapping

import anyio
import anyio.to_thread
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from muster.errors import ConfigError, TooManyRequests, Unauthorized

__all__ = ["MAX_FOLLOWS_PER_TOKEN", "RECHECK_SECONDS", "RETRY_AFTER_SECONDS", "FollowLimit",
           "FollowStream", "FollowTicket", "recheck_seconds"]

MAX_FOLLOWS_PER_TOKEN = 32
RETRY_AFTER_SECONDS = 5  # what a refused follow is told to wait (the Retry-After header)
RECHECK_SECONDS = 30.0  # a follow's credential is checked again at least this often
RECHECK_ENV = "MUSTER_FOLLOW_RECHECK_SECONDS"


def recheck_seconds() -> float:
    """`MUSTER_FOLLOW_RECHECK_SECONDS`, by default (and at most) `RECHECK_SECONDS`.

    Raises:
        ConfigError: it is no number of seconds from 0.05 to `RECHECK_SECONDS`.
    """
    text = os.environ.get(RECHECK_ENV)
    if text is None:
        return RECHECK_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.05 <= seconds <= RECHECK_SECONDS:
        raise ConfigError(f"{RECHECK_ENV} must be seconds from 0.05 to {RECHECK_SECONDS:g}, "
                          f"got {text!r}; unset it for the default {RECHECK_SECONDS:g}")
    return seconds


class FollowTicket:
    """One open follow of one caller; `release` gives its place back (idempotent).
    `on_recheck` registers what `FollowLimit.recheck` of its caller calls (from any
    thread), until the release."""

    def __init__(self, limit: FollowLimit, key: str) -> None:
        self._limit: FollowLimit | None = limit
        self.key = key

    def on_recheck(self, wake: Callable[[], object]) -> None:
        if self._limit is not None:
            self._limit._listen(self, wake)

    def release(self) -> None:
        if self._limit is not None:
            limit, self._limit = self._limit, None
            limit._give_back(self)


class FollowLimit:
    """The open follows of each caller (keyed by its user's name), and how often each
    checks its credential again (`recheck_s`, default `recheck_seconds()`). Safe to use
    from any thread."""

    def __init__(self, limit: int = MAX_FOLLOWS_PER_TOKEN, recheck_s: float | None = None
                 ) -> None:
        if limit < 1:
            raise ValueError(f"a follow limit must be at least 1, but got {limit=}.")
        self.limit = limit
        self.recheck_s = recheck_s if recheck_s is not None else recheck_seconds()
        self._open: Counter[str] = Counter()
        self._wakes: dict[FollowTicket, Callable[[], object]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> FollowTicket:
        """A place for one more follow of `key`.

        Raises:
            TooManyRequests: `key` already holds `limit` follows.
        """
        with self._lock:
            if self._open[key] >= self.limit:
                raise TooManyRequests(
                    f"{self.limit} streams (log follows and live pages) already open for "
                    f"{key}, the most one user may hold at once; close one (a browser tab, "
                    "or Ctrl-C a `muster trial logs -f`) and retry",
                    retry_after=RETRY_AFTER_SECONDS,
                )
            self._open[key] += 1
        return FollowTicket(self, key)

    def recheck(self, key: str) -> None:
        """Have every open follow of `key` check its credential now, not at its next
        `recheck_s`: one of that user's tokens or sessions ended, or the user was
        deactivated."""
        with self._lock:
            wakes = [wake for ticket, wake in self._wakes.items() if ticket.key == key]
        for wake in wakes:
            wake()

    def _listen(self, ticket: FollowTicket, wake: Callable[[], object]) -> None:
        with self._lock:
            self._wakes[ticket] = wake

    def _give_back(self, ticket: FollowTicket) -> None:
        with self._lock:
            self._wakes.pop(ticket, None)
            self._open[ticket.key] -= 1
            if self._open[ticket.key] <= 0:
                del self._open[ticket.key]


class FollowStream(StreamingResponse):
    """A follow's response: when it ends, whatever ended it, the stream is closed and the
    ticket released (a client that went away cancels the response mid-send, where the
    stream's own `finally` would wait for the garbage collector). Every `recheck_s` it calls
    `recheck` (in a thread), which raises Unauthorized once the credential no longer works:
    then the response ends there."""

    def __init__(self, stream: AsyncGenerator[bytes, None], ticket: FollowTicket,
                 recheck: Callable[[], object], recheck_s: float,
                 media_type: str = "application/octet-stream",
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(stream, media_type=media_type, headers=headers)
        self._stream, self._ticket = stream, ticket
        self._recheck, self._recheck_s = recheck, recheck_s
        self._started = self._finished = self._refused = False

    async def stream_response(self, send: Send) -> None:
        async def sent(message: Message) -> None:
            await send(message)
            self._started = True
            self._finished = not message.get("more_body", True)

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch, group.cancel_scope)
                await super().stream_response(sent)
                group.cancel_scope.cancel()
        except BaseExceptionGroup as errors:
            # The stream's own error, unwrapped, as Starlette and the server expect it.
            if len(errors.exceptions) == 1:
                raise errors.exceptions[0] from None
            raise
        if self._refused and self._started and not self._finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self, scope: anyio.CancelScope) -> None:
        """Cancel `scope` (the stream) once the credential no longer works."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        self._ticket.on_recheck(lambda: loop.call_soon_threadsafe(woken.set))
        while True:
            with anyio.move_on_after(self._recheck_s):
                await woken.wait()
            woken.clear()
            try:
                await anyio.to_thread.run_sync(self._recheck)
            except Unauthorized:
                self._refused = True
                scope.cancel()
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ticket.release()
            await self._stream.aclose()
