"""The lines of one replica's log, read forward from an offset or counted back from the end.

Lines end at b"\\n" and keep their bytes. One rule bounds the memory of a reader: a line
holds at most `MAX_LINE_BYTES` before its newline, and a longer one (a progress bar redrawn
with b"\\r" for an hour) is cut into pieces of that size, each a line of its own. The rule
counts from the line's start, so reading forward and counting back cut in the same places.
A line is complete once its newline (or its full size) has been written; the last, partial
line of a log is only a line when the log is final (its replica has ended). A range dropped
to hold the log to its limit (`muster.launch.log_limit`) is never read, and ends the line
before it: the bytes after it start a line.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import BinaryIO

from muster.launch.log_index import IndexWalker
from muster.launch.log_limit import LogDrops
from muster.launch.logs import ReplicaLog, blocks_backward, drops_of, open_log

__all__ = ["MAX_LINE_BYTES", "LineStartsBackward", "LogLine", "lines_from"]

MAX_LINE_BYTES = 1024**2
_BLOCK_BYTES = 64 * 1024


@dataclass(frozen=True)
class LogLine:
    rank: int
    offset: int  # where the line starts in its rank's log
    time: float  # when the chunk holding its first byte was read (see `log_index`)
    data: bytes  # the line's bytes, with its newline when it has one

    @property
    def end(self) -> int:
        return self.offset + len(self.data)

    def key(self) -> tuple[float, int, int]:
        """The merge order: by time, then rank, then offset."""
        return self.time, self.rank, self.offset

    def rendered(self) -> bytes:
        """`[rank r] ` and the line, ending in a newline (added to a cut or final line)."""
        newline = b"" if self.data.endswith(b"\n") else b"\n"
        return b"[rank %d] %b%b" % (self.rank, self.data, newline)


def lines_from(
    source: ReplicaLog, start: int, final: bool
) -> Generator[LogLine, None, None]:
    """The complete lines from `start` (a line start) on, each with its chunk's time; with
    `final`, the partial last line too."""
    times = IndexWalker(source, start)
    try:
        for offset, data in _split(source, start, final):
            yield LogLine(source.rank, offset, times.time_at(offset), data)
    finally:
        times.close()


def _split(source: ReplicaLog, start: int, final: bool) -> Iterator[tuple[int, bytes]]:
    log = open_log(source)
    if log is None:
        return
    with log:
        if start >= log.seek(0, os.SEEK_END):  # nothing there yet (never seek past the end)
            return
        log.seek(start)
        pending, base = bytearray(), start  # base: the offset of pending[0]
        while block := log.read(_BLOCK_BYTES):
            if (at := log.tell() - len(block)) != base + len(pending):  # past a dropped range
                if pending:
                    yield base, bytes(pending)
                pending, base = bytearray(), at
            pending += block
            cut = 0
            while (end := _line_end(pending, cut)) is not None:
                yield base + cut, bytes(pending[cut:end])
                cut = end
            del pending[:cut]
            base += cut
        if final and pending:
            yield base, bytes(pending)


def _line_end(data: bytearray, start: int) -> int | None:
    """Where the line that starts at data[start] ends; None while it is incomplete."""
    newline = data.find(b"\n", start, start + MAX_LINE_BYTES + 1)
    if newline != -1:
        return newline + 1
    if len(data) - start > MAX_LINE_BYTES:
        return start + MAX_LINE_BYTES
    return None


class LineStartsBackward:
    """The start offsets of a log's complete lines, last first (with `final`, the partial
    last line counts), and `end`, the offset where those lines end.

    Blocks are read backward from the end as the starts are asked for, so the cost is that
    of the lines counted (and, for a line longer than `MAX_LINE_BYTES`, of finding its
    start), not of the file. Close it when done.
    """

    def __init__(self, source: ReplicaLog, final: bool) -> None:
        self.end = 0
        self._starts: Iterator[int] = iter(())
        self._stream = open_log(source)
        if self._stream is None:
            return
        size = self._stream.seek(0, os.SEEK_END)
        newlines = _newlines_backward(self._stream, size)
        line_end = next(newlines, -1)  # the newline that ends the last whole line
        drops = drops_of(self._stream)
        partial = _piece_starts(drops.skip(line_end + 1), size)
        self.end = partial.pop() if partial and not final else size  # still being written
        self._starts = chain(reversed(partial), _whole_lines_backward(newlines, line_end, drops))

    def __iter__(self) -> Iterator[int]:
        return self._starts

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _whole_lines_backward(newlines: Iterator[int], line_end: int,
                          drops: LogDrops) -> Iterator[int]:
    """The starts of the lines ending at the newline `line_end` and at those before it. A
    line that runs into a dropped range starts where the range ends (the bytes before the
    range ended their line, at the marker's newline)."""
    while line_end >= 0:
        newline = next(newlines, -1)
        line_start = drops.skip(newline + 1)
        yield from reversed(_piece_starts(line_start, max(line_start + 1, line_end)))
        line_end = newline


def _piece_starts(start: int, end: int) -> list[int]:
    """Where the lines of the stretch [start, end) without a newline start (its newline, if
    any, not counted); none for an empty stretch."""
    return list(range(start, end, MAX_LINE_BYTES))


def _newlines_backward(stream: BinaryIO, end: int) -> Iterator[int]:
    """The offsets of the newlines before `end`, last first (none in a dropped range)."""
    for start, block in blocks_backward(stream, end):
        pos = len(block)
        while (pos := block.rfind(b"\n", 0, pos)) != -1:
            yield start + pos
