"""The audit trail as it is recorded, for the pages that stay live (issue 33, deliverable 2).

`GET /api/v1/events/stream` answers server-sent events (`text/event-stream`): every event
recorded after the caller's point, of one experiment, one trial, or the whole server, as
an `event: muster` message whose `id:` is the event's id and whose `data:` is its JSON
(`muster.api.AuditEvent`). The point is `Last-Event-ID` (what a browser's EventSource
sends when it reconnects, so a stream resumes where it broke off), else `after_id`, else
the newest event now. First comes `event: ready` (the point), so a client knows it is
connected; a stream that is more than `MAX_BACKLOG` events behind its point gets
`event: reset` (reload what you show) and goes on from the newest.

One task per server (`EventFeed`) watches the newest event id, one indexed query every
`POLL_SECONDS`; a stream queries its own events only when that moved. Ids are handed out
before their transactions commit, so on PostgreSQL a smaller id can become visible after a
larger one: each query looks `LOOKBACK` ids behind the stream's last and skips what it
sent. A stream counts as one of its user's follows (`FollowLimit`: a 429 past the limit),
ends when its credential stops working, and sends a comment every `HEARTBEAT_SECONDS`, so
proxies keep it open and a client that went away is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import anyio.to_thread

from muster import api
from muster.errors import MusterError
from muster.services import audit
from muster.store import Store

__all__ = ["HEARTBEAT_SECONDS", "MAX_BACKLOG", "EventFeed", "StreamScope", "stream_events"]

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25  # how often the feed reads the newest event id
HEARTBEAT_SECONDS = 15.0  # a comment line this often when nothing happened
RETRY_MS = 2000  # what a browser waits before it reconnects (the `retry:` field)
MAX_BACKLOG = 1000  # events a resumed stream catches up on; beyond, `reset`
LOOKBACK = 64  # ids behind the last one sent that each query looks at again
BATCH = 200  # events one query reads


@dataclass(frozen=True)
class StreamScope:
    """What one stream follows: an experiment's events, a trial's, or (both None) all."""

    experiment_id: int | None = None
    trial_id: int | None = None


class EventFeed:
    """The newest event id of the store, watched by one task on the server's event loop
    (started by the first stream, stopped by `close`)."""

    def __init__(self, store: Store, poll_s: float = POLL_SECONDS) -> None:
        self._store = store
        self._poll_s = poll_s
        self.newest = 0
        self._moved: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """The newest event id now, the watch started if it was not."""
        if self._task is None:
            self.newest = await anyio.to_thread.run_sync(audit.last_event_id, self._store)
            self._moved = asyncio.Event()
            self._task = asyncio.create_task(self._watch(), name="muster-event-feed")
            self._task.add_done_callback(_said_if_broken)
        return self.newest

    async def wait_past(self, seen: int, timeout: float) -> bool:
        """True once the newest event id is past `seen`; False after `timeout` seconds."""
        while self.newest <= seen:
            moved = self._moved
            assert moved is not None, "wait_past before start"
            try:
                await asyncio.wait_for(moved.wait(), timeout)
            except TimeoutError:
                return False
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        failing = False
        while True:
            try:
                newest = await anyio.to_thread.run_sync(audit.last_event_id, self._store)
            except MusterError as exc:  # the store is away: streams wait, said once
                if not failing:
                    log.warning("the event feed cannot read the store (%s); live pages "
                                "wait for it", exc)
                failing = True
            else:
                failing = False
                if newest != self.newest:
                    self.newest = newest
                    assert self._moved is not None
                    moved, self._moved = self._moved, asyncio.Event()
                    moved.set()
            await asyncio.sleep(self._poll_s)


def _said_if_broken(task: asyncio.Task[None]) -> None:
    """The feed's watch never ends but by `close`: anything else that ended it is a bug, and
    the live pages fall back to their polls from then on; the log says so at once."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the event feed stopped: live pages fall back to polling",
                  exc_info=task.exception())


async def stream_events(store: Store, feed: EventFeed, scope: StreamScope,
                        after_id: int | None) -> AsyncGenerator[bytes, None]:
    """The stream's bytes: `ready`, then each event of `scope` after `after_id` (None: from
    the newest now) as it is recorded, with heartbeats, until the client goes away."""
    await feed.start()
    # The store's newest, not the feed's (up to POLL_SECONDS old): a point past it is no
    # event's, and the client is told where it starts instead.
    newest = await anyio.to_thread.run_sync(audit.last_event_id, store)
    point = newest if after_id is None else min(after_id, newest)
    yield f"retry: {RETRY_MS}\n\n".encode()
    yield _message("ready", {"after_id": point})
    sent: set[int] = set()
    if after_id is not None and await _behind(store, scope, point):
        yield _message("reset", {"after_id": newest, "behind": f"more than {MAX_BACKLOG}"})
        point = newest
    floor = point  # what the client has: never sent, however late it became visible
    checked = point  # the feed's newest id when this stream last looked
    while True:
        if not await feed.wait_past(checked, HEARTBEAT_SECONDS):
            yield b": still here\n\n"
            continue
        checked = feed.newest
        events = await anyio.to_thread.run_sync(_read, store, scope, point)
        for event in events:
            if event["id"] <= floor or event["id"] in sent:
                continue
            sent.add(event["id"])
            yield _message("muster", event, event["id"])
        if events:
            point = max(point, events[-1]["id"])
            sent = {i for i in sent if i > point - LOOKBACK}
        if len(events) == BATCH:
            checked = point  # more to read: look again at once


def _read(store: Store, scope: StreamScope, point: int) -> list[api.AuditEvent]:
    return audit.list_events(store, experiment_id=scope.experiment_id,
                             trial_id=scope.trial_id, after_id=max(0, point - LOOKBACK),
                             limit=BATCH)


async def _behind(store: Store, scope: StreamScope, point: int) -> bool:
    missed = await anyio.to_thread.run_sync(lambda: audit.list_events(
        store, experiment_id=scope.experiment_id, trial_id=scope.trial_id, after_id=point,
        limit=MAX_BACKLOG + 1))
    return len(missed) > MAX_BACKLOG


def _message(kind: str, data: object, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
