"""Trial logs by cursor, by tail, and followed live until the trial ends.

One rank's log is served as its bytes, unchanged; decoding is the reader's business. Its
cursor is (attempt, offset). When no rank is named, an attempt with one replica is served
the same way, so a single-replica trial looks as it always did, and an attempt with several
is served merged (`merged_logs`): whole lines in time order, each prefixed `[rank r] `, with
a cursor of one offset per rank. Following starts at one attempt and moves on to the next
attempt of the trial when one ends, so a follower sees every restart. One rank's whole log
is also served as a file (`open_raw_log`): its bytes as they were when it was opened.
Logs the cluster config's retention removed are `Gone` (410) with when and by which rule,
never an empty log.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from sqlalchemy import select

from muster import job_secrets
from muster.checkpoint_storage.retention import logs_gone
from muster.errors import Conflict, Gone, InvalidRequest, NotFound
from muster.home import Home
from muster.launch.base import Launcher
from muster.launch.logs import (
    FileLog,
    ReplicaLog,
    drops_of,
    log_size,
    masked,
    open_log,
    read_range,
    tail_offset,
)
from muster.services.experiments import trial_or_404
from muster.services.merged_logs import LogCursor, merged_page, tail_cursor
from muster.store import Attempt, Replica, Store

MAX_LIMIT = 16 * 1024**2
DEFAULT_LIMIT = 1024**2
RAW_CHUNK_BYTES = 1024**2  # what a download of a whole log reads at a time
# A follower looks at the log file often (cheap: one read) and asks the store for new
# attempts and the trial's end less often (a query on a worker thread).
FOLLOW_POLL_SECONDS = 0.05
FOLLOW_FILE_POLL_SECONDS = 0.01


@dataclass(frozen=True)
class LogSlice:
    """Bytes of one rank's log, from `offset` to `next_offset`."""

    data: bytes
    attempt: int
    offset: int
    next_offset: int
    rank: int = 0

    @property
    def next_cursor(self) -> LogCursor:
        return LogCursor({self.rank: self.next_offset})


@dataclass(frozen=True)
class MergedSlice:
    """Whole lines of several ranks' logs, merged; `next_cursor` is where to go on."""

    data: bytes
    attempt: int
    next_cursor: LogCursor


@dataclass(frozen=True)
class AttemptLogs:
    """Where one attempt's logs are (its launcher serves them), and whether they are
    complete."""

    number: int
    run_dir: Path
    ranks: tuple[int, ...]
    ended: bool  # its replicas are gone: no byte will be added
    launcher: Launcher
    masks: tuple[bytes, ...] = ()  # the trial's secrets, shown as *s (`job_secrets`)

    def source(self, rank: int) -> ReplicaLog:
        return masked(self.launcher.log(self.run_dir, rank), self.masks)

    def sources(self) -> list[ReplicaLog]:
        return [self.source(rank) for rank in self.ranks]


@dataclass(frozen=True)
class TrialLogs:
    """Where a trial's logs are, by attempt number, and whether more can come."""

    attempts: dict[int, AttemptLogs]
    ended: bool

    @property
    def latest(self) -> int:
        return max(self.attempts) if self.attempts else 0


def locate(store: Store, launcher: Launcher, trial_id: int,
           home: Home | None = None) -> TrialLogs:
    """Where the trial's logs are; with `home`, read with its secrets masked.

    Raises:
        NotFound: no such trial.
        Gone: retention removed its logs.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        gone = logs_gone(trial_id, trial.logs_removed_at, trial.files_removed_at,
                         trial.experiment.ended_at)
        if gone is not None:
            raise Gone(gone)
        ended = trial.state.is_at_rest()
        declared = (trial.experiment.config.get("environment") or {}).get("secrets") or {}
        masks = () if home is None or not declared else tuple(job_secrets.masked_values(
            declared, home, trial.experiment.uuid))
        attempts = s.execute(select(Attempt.id, Attempt.number, Attempt.run_dir, Attempt.state)
                             # a warm standby's log is empty until it is promoted
                             .where(Attempt.trial_id == trial_id, Attempt.standby.is_(False))
                             ).all()
        replicas = s.execute(select(Replica.attempt_id, Replica.rank).join(Attempt)
                             .where(Attempt.trial_id == trial_id)).all()
    recorded: dict[int, list[int]] = defaultdict(list)
    for attempt_id, rank in replicas:
        recorded[attempt_id].append(rank)
    return TrialLogs(attempts={
        a.number: AttemptLogs(a.number, Path(a.run_dir),
                              _ranks(launcher, Path(a.run_dir), recorded[a.id]),
                              ended or a.state.is_terminal(), launcher, masks)
        for a in attempts
    }, ended=ended)


def _ranks(launcher: Launcher, run_dir: Path, recorded: list[int]) -> tuple[int, ...]:
    """The attempt's ranks: its replica rows, else the ranks that have logged, else rank 0."""
    if recorded:
        return tuple(sorted(set(recorded)))
    return tuple(launcher.logged_ranks(run_dir)) or (0,)


def read_log(
    store: Store, launcher: Launcher, trial_id: int, *, attempt: int | None = None,
    rank: int | None = None,
    offset: int = 0, limit: int = DEFAULT_LIMIT, tail: int | None = None,
    cursor: str | None = None, home: Home | None = None,
) -> LogSlice | MergedSlice:
    """One slice of an attempt's log (default: the latest attempt): the named rank's bytes,
    or with no rank named, the only rank's bytes or every rank's lines merged."""
    if not 0 < limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    logs = locate(store, launcher, trial_id, home)
    number = _pick_attempt(logs, trial_id, attempt)
    if number == 0:
        return LogSlice(b"", 0, 0, 0, rank or 0)
    where = logs.attempts[number]
    start = _parse_cursor(cursor, where, rank, offset)
    one = _single_rank(where, rank)
    if one is not None:
        begin = _rank_start(where, one, start.at(one) if start else offset, tail)
        data, next_offset = read_range(where.source(one), begin, limit)
        # Past a range dropped to hold the log to its limit, the bytes start after it.
        return LogSlice(data, number, next_offset - len(data) if data else begin,
                        next_offset, one)
    page_start = _merged_start(where, offset, start, tail)
    data, next_cursor = merged_page(where.sources(), page_start, limit, final=where.ended)
    return MergedSlice(data, number, next_cursor)


@dataclass
class RawLog:
    """One replica's whole log, open: its first `size` bytes, what it held when opened (a
    log only grows, so bytes added later are left for another download). A log held to its
    limit is sent without its dropped ranges: `size` does not count them (and should one
    more range be dropped while it is sent, the bytes after it make up the count)."""

    stream: BinaryIO
    size: int
    trial_id: int
    attempt: int
    rank: int

    @property
    def filename(self) -> str:
        return f"trial-{self.trial_id}-attempt-{self.attempt}-rank-{self.rank}.log"

    def chunks(self) -> Iterator[bytes]:
        """The `size` bytes, RAW_CHUNK_BYTES at a time; the stream is closed at the end.

        Raises:
            Conflict: the file ended before `size` bytes (it was replaced meanwhile): the
                download is cut short rather than completed with other bytes.
        """
        with self.stream:
            self.stream.seek(0)
            left = self.size
            while left:
                data = self.stream.read(min(RAW_CHUNK_BYTES, left))
                if not data:
                    raise Conflict(f"{self.filename} ended after {self.size - left:,} of its "
                                   f"{self.size:,} bytes: the log was replaced while it was "
                                   "being sent; download it again")
                left -= len(data)
                yield data

    def close(self) -> None:
        self.stream.close()


def open_raw_log(
    store: Store, launcher: Launcher, trial_id: int, *, attempt: int | None = None,
    rank: int = 0, home: Home | None = None,
) -> RawLog:
    """One rank's whole log (default: the latest attempt's), open as it is now; with
    `home`, its secrets masked as `read_log` masks them (the size stays the file's).

    Raises:
        NotFound: no such trial, attempt or rank, or the replica has written no log yet.
    """
    logs = locate(store, launcher, trial_id, home)
    number = _pick_attempt(logs, trial_id, attempt)
    if number == 0:
        raise NotFound(f"trial {trial_id} has not started an attempt yet, so it has no log; "
                       "download it once it runs (`muster trial describe "
                       f"{trial_id}` shows its state)")
    where = logs.attempts[number]
    if rank not in where.ranks:
        raise NotFound(f"attempt {number} of trial {trial_id} has no rank {rank}; pass rank= "
                       f"one of its ranks: {', '.join(map(str, where.ranks))}")
    stream = open_log(where.source(rank))
    if stream is None:
        raise NotFound(f"rank {rank} of attempt {number} of trial {trial_id} has written no "
                       "log yet; download it again once the replica has started")
    size = stream.seek(0, os.SEEK_END)
    return RawLog(stream, size - drops_of(stream).dropped_within(size), trial_id, number, rank)


def attempt_logs(
    store: Store, launcher: Launcher, trial_id: int, attempt: int | None = None,
    home: Home | None = None,
) -> AttemptLogs | None:
    """Where one attempt's logs are (default: the latest attempt's), read with the trial's
    secrets masked when `home` is given; None before the trial's first attempt.

    Raises:
        NotFound: no such trial or attempt.
    """
    logs = locate(store, launcher, trial_id, home)
    number = _pick_attempt(logs, trial_id, attempt)
    return logs.attempts[number] if number else None


def _pick_attempt(
    logs: TrialLogs, trial_id: int, attempt: int | None, *, upcoming: bool = False
) -> int:
    """The attempt to read: `attempt`, or the latest when None. With `upcoming`, the next
    attempt of a live trial is accepted before it starts (a follower started right after
    `create` asks for attempt 1 while the trial is still queued)."""
    if attempt is None:
        return logs.latest
    if attempt not in logs.attempts and not (
        upcoming and not logs.ended and attempt == logs.latest + 1
    ):
        raise NotFound(f"trial {trial_id} has no attempt {attempt} "
                       f"(it has {len(logs.attempts)} so far)")
    return attempt


def _parse_cursor(
    text: str | None, where: AttemptLogs, rank: int | None, offset: int
) -> LogCursor | None:
    """The cursor of a read without a rank, checked against the attempt's ranks."""
    if text is None:
        return None
    if rank is not None:
        raise InvalidRequest(f"cursor is for reads without a rank; to page rank {rank}'s "
                             "log pass offset (X-Muster-Next-Offset) instead")
    if offset:
        raise InvalidRequest("give offset or cursor, not both; a read without a rank pages "
                             "with cursor (X-Muster-Next-Cursor)")
    cursor = LogCursor.parse(text)
    if unknown := sorted(set(cursor.offsets) - set(where.ranks)):
        raise InvalidRequest(
            f"cursor names rank {unknown[0]}, but attempt {where.number} has ranks "
            f"{', '.join(map(str, where.ranks))}; start again without a cursor"
        )
    return cursor


def _single_rank(where: AttemptLogs, rank: int | None) -> int | None:
    """The one rank to serve as raw bytes: the one named, or the attempt's only one; None
    when the attempt's ranks are to be merged."""
    if rank is not None:
        return rank
    return where.ranks[0] if len(where.ranks) == 1 else None


def _rank_start(where: AttemptLogs, rank: int, offset: int, tail: int | None) -> int:
    return tail_offset(where.source(rank), tail) if tail is not None else offset


def _merged_start(
    where: AttemptLogs, offset: int, cursor: LogCursor | None, tail: int | None
) -> LogCursor:
    if offset:
        raise InvalidRequest(
            f"offset is a position in one rank's log, and attempt {where.number} has ranks "
            f"{', '.join(map(str, where.ranks))}: pass rank=R with it, or page the merged "
            "log with cursor (X-Muster-Next-Cursor)"
        )
    if tail is not None:
        return tail_cursor(where.sources(), tail, final=where.ended)
    return cursor or LogCursor()


class _Reader(Protocol):
    """What a follower reads one attempt with."""

    async def read(self, final: bool) -> bytes:
        """The next bytes, b"" when there are none yet. `final`: the attempt has ended."""
        ...


class _RankReader:
    """One rank's bytes, as they are."""

    def __init__(self, log: ReplicaLog, offset: int) -> None:
        self.log, self.offset = log, offset

    async def read(self, final: bool) -> bytes:
        data, self.offset = read_range(self.log, self.offset, DEFAULT_LIMIT)
        return data


class _MergedReader:
    """Several ranks' lines, merged. Pages are read on a worker thread (splitting lines is
    real work), and only when a log has grown since the last empty one: a partial line
    is not read again on every poll."""

    def __init__(self, sources: list[ReplicaLog], cursor: LogCursor) -> None:
        self.sources, self.cursor = sources, cursor
        self._idle_sizes: list[int] | None = None

    async def read(self, final: bool) -> bytes:
        sizes = [log_size(source) for source in self.sources]
        if not final and sizes == self._idle_sizes:
            return b""
        data, self.cursor = await asyncio.to_thread(
            merged_page, self.sources, self.cursor, DEFAULT_LIMIT, final)
        self._idle_sizes = None if data else sizes
        return data


# Returns once the file holds more than the bytes given, or after the seconds given.
WaitGrowth = Callable[[Path, int, float], Awaitable[None]]


async def _idle(reader: _Reader | None, wait_growth: WaitGrowth | None) -> None:
    """A follower's wait before it reads again: until one local rank's log is written
    (`wait_growth`), never longer than the poll's interval."""
    if (wait_growth is not None and isinstance(reader, _RankReader)
            and isinstance(reader.log, FileLog)):
        await wait_growth(reader.log.log, reader.offset, FOLLOW_FILE_POLL_SECONDS)
    else:
        await asyncio.sleep(FOLLOW_FILE_POLL_SECONDS)


def _reader(where: AttemptLogs, rank: int | None, offset: int, tail: int | None) -> _Reader:
    one = _single_rank(where, rank)
    if one is not None:
        return _RankReader(where.source(one), _rank_start(where, one, offset, tail))
    return _MergedReader(where.sources(), _merged_start(where, offset, None, tail))


async def follow_log(
    store: Store, launcher: Launcher, trial_id: int, *, attempt: int | None,
    rank: int | None, offset: int, tail: int | None, one_attempt: bool = False,
    home: Home | None = None, wait_growth: WaitGrowth | None = None,
) -> AsyncGenerator[bytes, None]:
    """The log as it grows, across attempts (with `one_attempt`, only that attempt's), until
    the trial (or the attempt) has ended and every byte has been sent: one rank's bytes, or
    (no rank named) as `read_log` serves each attempt. The trial, attempt and start are
    checked here, before the stream (and its 200 status) starts, so a wrong cursor is an
    error status and not a broken stream. `wait_growth` (the server's `LogWatch`) lets a
    follower of one local rank's log wake when it is written instead of at its next poll."""
    logs = await asyncio.to_thread(locate, store, launcher, trial_id, home)
    number = _pick_attempt(logs, trial_id, attempt, upcoming=True) or 1
    where = logs.attempts.get(number)
    if where is not None:
        if tail is None:
            _check_follow_offset(where, rank, offset)
        reader: _Reader | None = _reader(where, rank, offset, tail)
    elif rank is None and offset:
        raise InvalidRequest(f"attempt {number} has not started, so its ranks are not known: "
                             "pass rank=R with offset")
    else:
        reader = None  # made when the attempt starts
    return _follow(store, launcher, trial_id, rank, offset, logs, number, reader, one_attempt,
                   home, wait_growth)


def _check_follow_offset(where: AttemptLogs, rank: int | None, offset: int) -> None:
    """A follower's offset is where an earlier read ended, never past the log's end: such
    an offset is a mistake, answered now rather than with a stream that skips bytes."""
    one = _single_rank(where, rank)
    size = log_size(where.source(one)) if one is not None else 0
    if one is not None and offset > size:
        raise InvalidRequest(
            f"offset {offset} is past the end of rank {one}'s log of attempt {where.number} "
            f"({size} bytes so far); pass an offset up to {size} (X-Muster-Next-Offset), or "
            "tail=N to follow from the end"
        )


async def _follow(
    store: Store, launcher: Launcher, trial_id: int, rank: int | None, offset: int,
    logs: TrialLogs, number: int, reader: _Reader | None, one_attempt: bool,
    home: Home | None, wait_growth: WaitGrowth | None,
) -> AsyncGenerator[bytes, None]:
    next_locate = 0.0
    while True:
        data = await reader.read(final=False) if reader else b""
        if data:
            yield data
            continue
        if not logs.ended and time.monotonic() < next_locate:
            await _idle(reader, wait_growth)
            continue
        ended_before = logs.ended
        logs = await asyncio.to_thread(locate, store, launcher, trial_id, home)
        next_locate = time.monotonic() + FOLLOW_POLL_SECONDS
        if reader is None:
            # The attempt it waits for, or the next that logs (a dropped standby has none).
            coming = [n for n in logs.attempts if n >= number]
            if coming:
                offset = offset if min(coming) == number else 0
                number = min(coming)
                reader = _reader(logs.attempts[number], rank, offset, None)
                continue
        elif number < logs.latest or (ended_before and logs.ended):
            # The attempt has ended: what it holds now is all it will ever hold.
            while data := await reader.read(final=True):
                yield data
            if number == logs.latest or one_attempt:
                return
            # The next attempt that logs: a dropped warm standby's number has none.
            number = min(n for n in logs.attempts if n > number)
            reader = _reader(logs.attempts[number], rank, 0, None)
            continue
        if ended_before and logs.ended:
            return
        if not logs.ended:
            await _idle(reader, wait_growth)
