"""Searching one rank's log on the server: plain text or an RE2 expression, over the whole
file, in bounded time, answered as byte offsets a viewer can step through.

A search scans from `from` (a byte offset of the log, as `GET .../logs` uses them) forward
or backward and stops at the log's end or start, at `limit` matches, after `SEARCH_SECONDS`,
or after `max_bytes`; the answer says which, and where to go on (`next_from`), so paging
forward or backward from a match is "next" and "previous". The log is read through
`open_log` (its dropped ranges skipped, its secrets masked) in windows of whole lines of up
to `CHUNK_BYTES`, and each window is searched in one call of RE2, a linear-time engine:
no pattern can make a scan take longer than its bytes do, and the time budget is checked
between windows.

Lines end at b"\\n" and a match never spans one (RE2's `never_nl`); `^` and `$` are a
line's start and end. A line longer than `MAX_LINE_BYTES` (1 MiB) is searched in pieces of
at most that size, so a match across two pieces of such a line is not found. The bytes
after a dropped range start a line. A search covers the log as it was when it began
(`size`); a rank's log is searched alone: a multi-rank attempt's merged view has no byte
offsets of its own, so the answer lists the attempt's `ranks` to search each.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol, cast

import re2

from muster import api
from muster.errors import InvalidPattern, InvalidRequest, NotFound, TooManyRequests
from muster.home import Home
from muster.launch.base import Launcher
from muster.launch.log_lines import MAX_LINE_BYTES
from muster.launch.logs import blocks_backward, drops_of, open_log, pread
from muster.services.logs import AttemptLogs, attempt_logs
from muster.states import LogSearchDirection, LogSearchStop
from muster.store import Store

__all__ = ["CHUNK_BYTES", "DEFAULT_MATCHES", "MAX_MATCHES", "MAX_PATTERN_CHARS", "MAX_SCANS",
           "SCANS", "SEARCH_SECONDS", "SHOWN_BYTES", "LogScan", "Pattern", "ScanSlots",
           "SearchPlan", "compile_pattern", "search_log", "search_stream"]

MAX_PATTERN_CHARS = 1000
MAX_MATCHES = 1000
DEFAULT_MATCHES = 100
SEARCH_SECONDS = 2.0  # of scanning per request; the answer says where to go on
MAX_SCANS = 4  # searches scanning at once, server-wide (`ScanSlots`)
RETRY_AFTER_S = 1
CHUNK_BYTES = 4 * 1024**2  # read and searched at once (at least MAX_LINE_BYTES)
SHOWN_BYTES = 4096  # of a match's line in the answer, around the match
_FIRST_BACKWARD_BYTES = 64 * 1024
_MULTI_LINE = "(?m)"  # `^` and `$` at each line's start and end
_REGEX_MEMORY = 64 * 1024**2  # RE2's memory for one compiled pattern (its default: 8 MiB)


class _Match(Protocol):
    def start(self) -> int: ...

    def end(self) -> int: ...


class Pattern(Protocol):
    """A compiled RE2 expression, as this module uses it (google-re2 ships no types)."""

    def finditer(self, text: bytes, pos: int, endpos: int) -> Iterator[_Match]: ...


def compile_pattern(pattern: str, *, regex: bool, ignore_case: bool) -> Pattern:
    """`pattern` compiled for a search of bytes: as RE2 syntax, or (`regex` False) as the
    literal text; UTF-8, multi-line (`^`, `$` at each line), never matching a newline.

    Raises:
        InvalidRequest: the pattern is empty, longer than MAX_PATTERN_CHARS, or not text
            (a lone surrogate).
        InvalidPattern: `regex` and the pattern is not valid RE2 syntax.
    """
    if not 0 < len(pattern) <= MAX_PATTERN_CHARS:
        raise InvalidRequest(f"a search pattern has 1 to {MAX_PATTERN_CHARS} characters, "
                             f"got {len(pattern)}")
    try:
        text = ((_MULTI_LINE if regex else "") + pattern).encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"a search pattern is text: character {exc.start} of "
                             f"{pattern!r} is not (a lone surrogate)") from None
    options = re2.Options()
    options.never_nl = True
    options.literal = not regex
    options.case_sensitive = not ignore_case
    options.log_errors = False
    options.max_mem = _REGEX_MEMORY
    try:
        return cast(Pattern, re2.compile(text, options))
    except re2.error as exc:
        raise InvalidPattern(_pattern_error(pattern, exc)) from exc


def _pattern_error(pattern: str, exc: Exception) -> str:
    """What is wrong with `pattern`, where, and what to do (RE2 names the bad fragment)."""
    detail = str(exc.args[0].decode(errors="replace") if exc.args and isinstance(
        exc.args[0], bytes) else exc)
    what, _, fragment = detail.partition(": ")
    fragment = fragment.removeprefix(_MULTI_LINE)
    position = _python_position(pattern)
    if position is None:
        position = pattern.find(fragment) if fragment else -1
    else:
        fragment = pattern[position:position + 10]
    where = f" at position {position} ({fragment!r})" if position >= 0 else (
        f" ({fragment})" if fragment else "")
    return (f"pattern {pattern!r} is not a valid regular expression: {what}{where}. RE2 "
            "syntax has no backreferences or look-around; fix it, or search for the text "
            "as it is (regex=false, `--fixed`)")


def _python_position(pattern: str) -> int | None:
    """Where Python's `re` finds the same pattern wrong, when it does (RE2 names the whole
    pattern for an unclosed group; `re` names the group)."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return exc.pos
    except RecursionError:  # groups nested deeper than `re`'s parser goes: RE2 says why
        return None
    return None


@dataclass(frozen=True)
class SearchPlan:
    """What one request searches for, and how far it may go."""

    pattern: Pattern
    start: int | None = None  # `from`; None: the log's start (forward) or end (backward)
    direction: LogSearchDirection = LogSearchDirection.FORWARD
    limit: int = DEFAULT_MATCHES
    max_bytes: int | None = None  # of the log to scan; None: as many as the time allows
    seconds: float = SEARCH_SECONDS

    def __post_init__(self) -> None:
        if not 0 < self.limit <= MAX_MATCHES:
            raise InvalidRequest(f"limit must be between 1 and {MAX_MATCHES}, got "
                                 f"{self.limit}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise InvalidRequest(f"max_bytes must be at least 1, got {self.max_bytes}")


class ScanSlots:
    """How many searches may scan at once: each holds a worker thread (of the pool every
    blocking route shares) for up to SEARCH_SECONDS, so a flood of them is refused, not
    queued."""

    def __init__(self, most: int = MAX_SCANS) -> None:
        self.most = most
        self._free = threading.BoundedSemaphore(most)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """One slot while the block runs.

        Raises:
            TooManyRequests: every slot is held.
        """
        if not self._free.acquire(blocking=False):
            raise TooManyRequests(f"{self.most} log searches are already scanning on this "
                                  f"server, the most at once; retry after {RETRY_AFTER_S} s",
                                  retry_after=RETRY_AFTER_S)
        try:
            yield
        finally:
            self._free.release()


SCANS = ScanSlots()


def search_log(
    store: Store, launcher: Launcher, trial_id: int, plan: SearchPlan, *,
    attempt: int | None = None, rank: int | None = None, home: Home | None = None,
) -> api.LogSearchResult:
    """One page of a search of one rank's log (default: the latest attempt, its first
    rank), with the trial's secrets masked when `home` is given.

    Raises:
        NotFound: no such trial, attempt or rank.
        TooManyRequests: MAX_SCANS searches are scanning already (`SCANS`).
    """
    where = attempt_logs(store, launcher, trial_id, attempt, home)
    if where is None:
        return _empty(plan, 0, rank or 0, [])
    one = _rank(where, trial_id, rank)
    with SCANS.held():
        stream = open_log(where.source(one))
        if stream is None:
            return _empty(plan, where.number, one, list(where.ranks))
        with stream:
            scan = search_stream(stream, plan)
    return scan.result(plan.direction, where.number, one, list(where.ranks))


def _rank(where: AttemptLogs, trial_id: int, rank: int | None) -> int:
    if rank is None:
        return where.ranks[0]
    if rank not in where.ranks:
        raise NotFound(f"attempt {where.number} of trial {trial_id} has no rank {rank}; "
                       f"pass rank= one of its ranks: {', '.join(map(str, where.ranks))}")
    return rank


def _empty(plan: SearchPlan, attempt: int, rank: int, ranks: list[int]) -> api.LogSearchResult:
    return LogScan(0, 0, 0).result(plan.direction, attempt, rank, ranks)


@dataclass
class LogScan:
    """A scan's progress: the bytes looked at so far, what it found, why it stopped."""

    size: int
    low: int  # the bytes scanned: [low, high)
    high: int
    matches: list[api.LogMatch] = field(default_factory=list)
    stopped: LogSearchStop = LogSearchStop.END
    next_from: int | None = None  # where to go on, when not where the scan reached

    def result(self, direction: LogSearchDirection, attempt: int, rank: int,
               ranks: list[int]) -> api.LogSearchResult:
        forward = direction is LogSearchDirection.FORWARD
        reached = self.high if forward else self.low
        return api.LogSearchResult(
            attempt=attempt, rank=rank, ranks=ranks, direction=direction,
            matches=self.matches, complete=self.stopped is LogSearchStop.END,
            stopped=self.stopped,
            next_from=reached if self.next_from is None else self.next_from,
            scanned_from=self.low, scanned_to=self.high, size=self.size)


def search_stream(stream: BinaryIO, plan: SearchPlan,
                  clock: Callable[[], float] = time.monotonic) -> LogScan:
    """Search a log opened with `open_log`, as `plan` says (the service's pure core: no
    store, no launcher)."""
    size = stream.seek(0, os.SEEK_END)
    deadline = clock() + plan.seconds
    if plan.direction is LogSearchDirection.FORWARD:
        start = min(size, 0 if plan.start is None else plan.start)
        return _forward(stream, size, start, plan, lambda: clock() >= deadline)
    start = min(size, size if plan.start is None else plan.start)
    return _backward(stream, size, start, plan, lambda: clock() >= deadline)


def _forward(stream: BinaryIO, size: int, start: int, plan: SearchPlan,
             late: Callable[[], bool]) -> LogScan:
    pos = _line_start(stream, start)
    scan = LogScan(size, pos, pos)
    while pos < size:
        if (stop := _budget_stop(scan, plan, late)) is not None:
            scan.stopped = stop
            return scan
        data = pread(stream, min(CHUNK_BYTES, size - pos), pos)
        if not data:
            break  # the file is shorter than it was (replaced): nothing more to read
        at = stream.tell() - len(data)
        # A read ends at a line's end at the log's end and where a dropped range starts.
        whole = at + len(data) >= size or len(data) < min(CHUNK_BYTES, size - at)
        cut = _window_end(data, whole, _room(scan, plan))
        spans = itertools.islice(_spans(plan.pattern, data, max(0, start - at), cut),
                                 plan.limit - len(scan.matches))
        pos = scan.high = at + cut
        if _take(scan, [_shown(data, 0, cut, span, at) for span in spans], plan.limit):
            last = scan.matches[-1]
            scan.next_from = max(last["end"], last["offset"] + 1)
            return scan
    return scan


def _backward(stream: BinaryIO, size: int, start: int, plan: SearchPlan,
              late: Callable[[], bool]) -> LogScan:
    end = _line_end(stream, size, start)
    scan = LogScan(size, end, end)
    window = _FIRST_BACKWARD_BYTES  # grows: the nearest matches are found without
    while end > 0:  # splitting a whole chunk of dense matches
        if (stop := _budget_stop(scan, plan, late)) is not None:
            scan.stopped = stop
            return scan
        drops = drops_of(stream)
        end = drops.back(end)
        floor = drops.floor(end)
        low = max(floor, end - window)
        data = pread(stream, end - low, low)
        if stream.tell() - len(data) != low or len(data) != end - low:
            if drops_of(stream) == drops or not data:
                break  # the file is shorter than it was: nothing more to read
            continue  # a range was dropped while it was read: again, around it
        cut = _window_start(data, low == floor, _room(scan, plan))
        spans = [span for span in _spans(plan.pattern, data, cut, len(data))
                 if low + span[0] < start]
        wanted = spans[::-1][:plan.limit - len(scan.matches)]
        end = scan.low = low + cut
        window = min(CHUNK_BYTES, window * 4)
        if _take(scan, [_shown(data, cut, len(data), span, low) for span in wanted],
                 plan.limit):
            scan.next_from = scan.matches[-1]["offset"]
            return scan
    return scan


def _budget_stop(scan: LogScan, plan: SearchPlan, late: Callable[[], bool]
                 ) -> LogSearchStop | None:
    """Why the scan stops before its next window, if it does; the first window is always
    searched, so every request makes progress."""
    if scan.high == scan.low:
        return None
    if plan.max_bytes is not None and scan.high - scan.low >= plan.max_bytes:
        return LogSearchStop.BYTES
    return LogSearchStop.TIME if late() else None


def _room(scan: LogScan, plan: SearchPlan) -> int:
    """How many more bytes the scan may look at (at least 1: a window holds one line)."""
    if plan.max_bytes is None:
        return CHUNK_BYTES
    return max(1, plan.max_bytes - (scan.high - scan.low))


def _take(scan: LogScan, found: list[api.LogMatch], limit: int) -> bool:
    """Add what a window found, up to `limit` in all; whether the limit was reached."""
    scan.matches.extend(found[:limit - len(scan.matches)])
    if len(scan.matches) < limit:
        return False
    scan.stopped = LogSearchStop.LIMIT
    return True


def _window_end(data: bytes, whole: bool, room: int) -> int:
    """Where a forward window over `data` (starting at a line's start) ends: after the last
    line that fits in `room` (at least one line, at most MAX_LINE_BYTES of it); `whole`:
    `data` ends at a line's end."""
    if whole and len(data) <= room:
        return len(data)
    newline = data.rfind(b"\n", 0, min(len(data), room))
    if newline == -1:
        newline = data.find(b"\n", 0, MAX_LINE_BYTES)
    if newline != -1:
        return newline + 1
    return len(data) if whole and len(data) <= MAX_LINE_BYTES else min(len(data), MAX_LINE_BYTES)


def _window_start(data: bytes, whole: bool, room: int) -> int:
    """Where a backward window over `data` (ending at a line's end) starts: at the first
    line that starts within the last `room` bytes (at least the last line, at most
    MAX_LINE_BYTES of it); `whole`: `data` starts at a line's start."""
    if whole and len(data) <= room:
        return 0
    # The newline that ends `data` ends its last line: a line starts only after one before it.
    newline = data.find(b"\n", max(0, len(data) - room - 1), len(data) - 1)
    if newline == -1:
        newline = data.rfind(b"\n", 0, len(data) - 1)
    return max(newline + 1, len(data) - MAX_LINE_BYTES)


def _spans(pattern: Pattern, data: bytes, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The (start, end) of each match in data[start:end] (whole lines, or the rest of a
    line from `start`: RE2 sees the bytes around it, so `^` and `\\b` mean what they
    do in the whole log)."""
    # The window's last newline is left out, so that `^$` finds no empty line after it.
    stop = end - 1 if end > start and data[end - 1] == 0x0A else end
    last = (-1, -1)
    for match in pattern.finditer(data, start, stop):
        span = (match.start(), match.end())
        if span != last:  # google-re2 yields an empty match twice
            yield span
        last = span


def _shown(data: bytes, start: int, end: int, span: tuple[int, int], base: int
           ) -> api.LogMatch:
    """A match at `span` of data, with its line (within data[start:end]) around it."""
    first = data.rfind(b"\n", start, span[0]) + 1 or start
    last = data.find(b"\n", span[1], end)
    last = end if last == -1 else last
    text_end = min(span[1], span[0] + SHOWN_BYTES)
    room = max(0, SHOWN_BYTES - (text_end - span[0])) // 2
    shown_from, shown_to = max(first, span[0] - room), min(last, text_end + room)
    return api.LogMatch(
        offset=base + span[0], end=base + span[1], line_offset=base + first,
        before=_text(data[shown_from:span[0]]), text=_text(data[span[0]:text_end]),
        after=_text(data[span[1]:shown_to]) if text_end == span[1] else "",
        cut=(shown_from, shown_to) != (first, last) or text_end != span[1])


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _line_start(stream: BinaryIO, offset: int) -> int:
    """Where the line that holds byte `offset` starts, when it starts less than
    MAX_LINE_BYTES before it; else `offset` (a piece of a longer line starts there, so a
    search that goes on from a piece's end goes on). The bytes after a dropped range start
    a line."""
    floor = max(0, offset - MAX_LINE_BYTES + 1)
    starts = [0] if floor == 0 else []
    if (after_drop := drops_of(stream).floor(offset)) >= floor:
        starts.append(after_drop)
    for low, block in blocks_backward(stream, offset):
        newline = block.rfind(b"\n")
        if newline != -1 and low + newline + 1 >= floor:
            starts.append(low + newline + 1)
            break
        if low <= floor:
            break
    return max(starts, default=offset)


def _line_end(stream: BinaryIO, size: int, offset: int) -> int:
    """Where the line that holds the byte before `offset` ends (0 for offset 0), when it
    ends less than MAX_LINE_BYTES after it: after its newline, at the log's end, or where a
    dropped range starts; else `offset` (a piece of a longer line ends there)."""
    if offset == 0:
        return 0
    at = offset - 1
    limit = min(size, at + MAX_LINE_BYTES - 1)
    while at < limit:
        want = min(64 * 1024, limit - at)
        data = pread(stream, want, at)
        if not data or stream.tell() - len(data) != at:
            return at  # the log's end, or a dropped range starts here
        if (newline := data.find(b"\n")) != -1:
            return at + newline + 1
        at += len(data)
        if len(data) < want:
            return at  # a dropped range starts here
    return size if limit == size else offset
