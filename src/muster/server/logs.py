"""Trial logs by byte cursor, by tail, and followed live until the trial ends.

The bytes are the log file's bytes, unchanged; decoding is the reader's business. A
cursor is (attempt, offset). Following starts at one attempt and moves on to the next
attempt of the trial when one ends, so a follower sees every restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from muster.errors import InvalidRequest, NotFound
from muster.launch.logs import read_range, tail_offset
from muster.server.experiments import trial_or_404
from muster.states import TrialState
from muster.store import Attempt, Store

MAX_LIMIT = 16 * 1024**2
DEFAULT_LIMIT = 1024**2
# A follower looks at the log file often (cheap: one read) and asks the store for new
# attempts and the trial's end less often (a query on a worker thread).
FOLLOW_POLL_SECONDS = 0.05
FOLLOW_FILE_POLL_SECONDS = 0.01


@dataclass(frozen=True)
class LogSlice:
    data: bytes
    attempt: int
    offset: int
    next_offset: int


@dataclass(frozen=True)
class TrialLogs:
    """Where a trial's logs for one rank are, and whether more can come."""

    paths: dict[int, Path]  # attempt number → log path
    ended: bool

    @property
    def latest(self) -> int:
        return max(self.paths) if self.paths else 0


def locate(store: Store, trial_id: int, rank: int) -> TrialLogs:
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        attempts = s.scalars(select(Attempt).where(Attempt.trial_id == trial_id))
        paths = {a.number: Path(a.run_dir) / f"rank-{rank}.log" for a in attempts}
        return TrialLogs(paths=paths, ended=TrialState(trial.state).is_settled())


def read_log(
    store: Store, trial_id: int, *, attempt: int | None = None, rank: int = 0,
    offset: int = 0, limit: int = DEFAULT_LIMIT, tail: int | None = None,
) -> LogSlice:
    """One slice of an attempt's log (default: the latest attempt)."""
    if not 0 < limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    logs = locate(store, trial_id, rank)
    number = _pick_attempt(logs, trial_id, attempt)
    if number == 0:
        return LogSlice(b"", 0, 0, 0)
    path = logs.paths[number]
    start = tail_offset(path, tail) if tail is not None else offset
    data, next_offset = read_range(path, start, limit)
    return LogSlice(data, number, start, next_offset)


def _pick_attempt(
    logs: TrialLogs, trial_id: int, attempt: int | None, *, upcoming: bool = False
) -> int:
    """The attempt to read: `attempt`, or the latest when None. With `upcoming`, the next
    attempt of a live trial is accepted before it starts (a follower started right after
    `create` asks for attempt 1 while the trial is still queued)."""
    if attempt is None:
        return logs.latest
    if attempt not in logs.paths and not (
        upcoming and not logs.ended and attempt == logs.latest + 1
    ):
        raise NotFound(f"trial {trial_id} has no attempt {attempt} "
                       f"(it has {len(logs.paths)} so far)")
    return attempt


async def follow_log(
    store: Store, trial_id: int, *, attempt: int | None, rank: int, offset: int,
    tail: int | None,
) -> AsyncIterator[bytes]:
    """The log as it grows, across attempts, until the trial has ended and every byte has
    been sent. The trial and attempt are checked here, before the stream (and its 200
    status) starts, so a wrong cursor is a 404 and not a broken stream."""
    logs = await asyncio.to_thread(locate, store, trial_id, rank)
    number = _pick_attempt(logs, trial_id, attempt, upcoming=True) or 1
    if tail is not None and number in logs.paths:
        offset = tail_offset(logs.paths[number], tail)
    return _follow(store, trial_id, rank, logs, number, offset)


async def _follow(
    store: Store, trial_id: int, rank: int, logs: TrialLogs, number: int, offset: int
) -> AsyncIterator[bytes]:
    next_locate = 0.0
    while True:
        path = logs.paths.get(number)
        data, offset = read_range(path, offset, DEFAULT_LIMIT) if path else (b"", offset)
        if data:
            yield data
            continue
        if not logs.ended and time.monotonic() < next_locate:
            await asyncio.sleep(FOLLOW_FILE_POLL_SECONDS)
            continue
        ended_before = logs.ended
        logs = await asyncio.to_thread(locate, store, trial_id, rank)
        next_locate = time.monotonic() + FOLLOW_POLL_SECONDS
        if number < logs.latest:
            number, offset = number + 1, 0
        elif ended_before and logs.ended:
            return
        elif not logs.ended:
            await asyncio.sleep(FOLLOW_FILE_POLL_SECONDS)
