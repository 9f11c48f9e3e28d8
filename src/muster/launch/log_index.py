"""When each part of a replica's log arrived, from its index (`RankFiles.index`).

The shim writes one line `"<log offset> <unix time>"` per chunk it copies into the log: the
offset where the chunk starts and the time it was read. Offsets only grow, so the entry for
any log offset is found by bisecting the file; a reader pays for the entries it walks over,
not for the whole index (which grows with the log).

The index only orders lines between ranks; it is never needed to read a log. A damaged
line (a write cut short by a full disk) is skipped, so its chunk takes the previous chunk's
time, and so does a chunk whose line has not been written yet (the log is written first).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import BinaryIO

from muster.launch.logs import LogPart, ReplicaLog, pread

__all__ = ["IndexWalker"]

Entry = tuple[int, float]  # (log offset where a chunk starts, unix time it was read)

_BLOCK_BYTES = 64 * 1024
# An index line is about 30 bytes; a probe reads enough to hold two whole lines.
_PROBE_BYTES = 256


class IndexWalker:
    """The chunk time of log offsets visited in increasing order, from one starting offset.

    An offset before the first entry takes the first entry's time, and with no index at all
    every offset has time 0.0: such lines then sort by rank and offset alone.
    """

    def __init__(self, log: ReplicaLog, start: int) -> None:
        self._entries = _entries_from(log, start)
        first = next(self._entries, None)
        self._time = first[1] if first else 0.0
        self._next = next(self._entries, None)

    def time_at(self, offset: int) -> float:
        """The time of the chunk that holds `offset` (offsets must not decrease)."""
        while self._next is not None and self._next[0] <= offset:
            self._time = self._next[1]
            self._next = next(self._entries, None)
        return self._time

    def close(self) -> None:
        self._entries.close()


def _entries_from(log: ReplicaLog, start: int) -> Generator[Entry, None, None]:
    """The last entry at or before `start` (or the first entry), then every later one."""
    stream = log.open(LogPart.INDEX)
    if stream is None:
        return
    with stream:
        before: Entry | None = None
        size = stream.seek(0, os.SEEK_END)
        for entry in _parse_from(stream, _bisect(stream, size, start)):
            if entry[0] <= start:
                before = entry
                continue
            if before is not None:
                yield before
                before = None
            yield entry
        if before is not None:
            yield before


def _bisect(stream: BinaryIO, size: int, target: int) -> int:
    """A position in the index at or before the line of the last entry at or before
    `target`: the start of a line, close enough that the walk from it is short."""
    lo, hi = 0, size
    while hi - lo > _PROBE_BYTES:
        mid = (lo + hi) // 2
        found = _line_after(stream, mid)
        if found is None or found[0] >= hi or found[1][0] > target:
            hi = mid
        else:
            lo = found[0]
    return lo


def _line_after(stream: BinaryIO, pos: int) -> tuple[int, Entry] | None:
    """The first whole line that starts at or after `pos` (> 0): its position and entry."""
    data = pread(stream, _PROBE_BYTES, pos - 1)
    start = data.find(b"\n") + 1  # a line starts after a newline; data[0] is byte pos - 1
    end = data.find(b"\n", start)
    if start == 0 or end == -1:
        return None
    entry = _parse(data[start:end])
    return (pos - 1 + start, entry) if entry is not None else None


def _parse_from(stream: BinaryIO, pos: int) -> Iterator[Entry]:
    """The entries of the whole lines from `pos` (a line start) to the end of the file."""
    pending = b""
    while block := pread(stream, _BLOCK_BYTES, pos):
        pos += len(block)
        lines = (pending + block).split(b"\n")
        pending = lines.pop()  # the part after the last newline: not a whole line yet
        for line in lines:
            if (entry := _parse(line)) is not None:
                yield entry


def _parse(line: bytes) -> Entry | None:
    """`b"<offset> <time>"` as numbers; None for a damaged line."""
    fields = line.split(b" ")
    if len(fields) != 2:
        return None
    try:
        return int(fields[0]), float(fields[1])
    except ValueError:
        return None
