"""Several ranks' logs read as one: whole lines, each prefixed `[rank r] `, in time order.

A line sorts by the time its first byte was read (`log_index`), then by rank, then by
offset; each rank's lines keep their order. The position of a reader is a `LogCursor`, one
byte offset per rank, always at a line start, so pages never split or repeat a line. Lines
that arrive after later lines of another rank were served (the live end of a running
trial) come in the next page: order is exact for what is on disk when a page is read.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from itertools import islice

from muster.errors import InvalidRequest
from muster.launch.log_index import IndexWalker
from muster.launch.log_lines import LineStartsBackward, LogLine, lines_from
from muster.launch.logs import MAX_OFFSET, ReplicaLog
from muster.store import MAX_INTEGER

__all__ = ["LogCursor", "merged_page", "tail_cursor"]

# At most 19 digits each (2**63 - 1 has 19), so a number is never too long to be read.
_CURSOR_PART = re.compile(r"([0-9]{1,19}):([0-9]{1,19})")
# Line starts whose times a tail looks up at once: a short tail costs a short read, and a
# tail of millions of lines does not keep millions of offsets.
_KEY_BATCH = 4096


@dataclass(frozen=True)
class LogCursor:
    """Where a merged read goes on: rank → byte offset in its log (0 for a rank not named).

    Written `0:1234,1:88`; the empty string is the start of every log.
    """

    offsets: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> LogCursor:
        """The cursor written `text`; InvalidRequest unless it is rank:offset pairs, each
        rank once, every number in range (a rank an INTEGER, an offset a file offset)."""
        offsets: dict[int, int] = {}
        for part in filter(None, text.split(",")):
            match = _CURSOR_PART.fullmatch(part.strip())
            rank, offset = (int(match[1]), int(match[2])) if match else (-1, -1)
            if match is None or rank in offsets or rank > MAX_INTEGER or offset > MAX_OFFSET:
                raise InvalidRequest(
                    f"cursor must be rank:offset pairs like '0:1234,1:88', each rank once, "
                    f"ranks up to {MAX_INTEGER} and offsets up to {MAX_OFFSET}, got "
                    f"{text[:200]!r}; pass the X-Muster-Next-Cursor of the previous read"
                )
            offsets[rank] = offset
        return cls(offsets)

    def at(self, rank: int) -> int:
        return self.offsets.get(rank, 0)

    def __str__(self) -> str:
        return ",".join(f"{rank}:{offset}" for rank, offset in sorted(self.offsets.items()))


def merged_page(
    sources: Sequence[ReplicaLog], cursor: LogCursor, limit: int, final: bool
) -> tuple[bytes, LogCursor]:
    """The next merged lines from `cursor`, up to `limit` bytes (but at least one line), and
    the cursor after them. Only complete lines, unless `final` (no rank will write again):
    then a partial last line comes too, with a newline added."""
    offsets = {source.rank: cursor.at(source.rank) for source in sources}
    page = bytearray()
    with ExitStack() as stack:
        streams = [stack.enter_context(closing(lines_from(s, offsets[s.rank], final)))
                   for s in sources]
        for line in heapq.merge(*streams, key=LogLine.key):
            rendered = line.rendered()
            if page and len(page) + len(rendered) > limit:
                break
            page += rendered
            offsets[line.rank] = line.end
    return bytes(page), LogCursor(offsets)


def tail_cursor(sources: Sequence[ReplicaLog], count: int, final: bool) -> LogCursor:
    """The cursor from which the rest of the logs are their last `count` merged lines.

    Each rank's lines are read from the end of its log back, newest first, and merged the
    same way until `count` are taken; a rank with none of them starts at its end. Memory
    does not grow with `count`: only where each rank's taken lines start is kept.
    """
    offsets: dict[int, int] = {}
    with ExitStack() as stack:
        newest_first = []
        for source in sources:
            starts = stack.enter_context(closing(LineStartsBackward(source, final)))
            offsets[source.rank] = starts.end
            newest_first.append(_keyed(source, iter(starts), min(count, _KEY_BATCH)))
        for _, rank, start in islice(heapq.merge(*newest_first, reverse=True), count):
            offsets[rank] = min(offsets[rank], start)
    return LogCursor(offsets)


def _keyed(
    source: ReplicaLog, starts: Iterator[int], batch: int
) -> Iterator[tuple[float, int, int]]:
    """The merge keys (`LogLine.key`) of lines starting at `starts` (newest first), newest
    first. Times are looked up a batch at a time, walking the index forward over it."""
    while lines := list(islice(starts, batch)):
        times = IndexWalker(source, lines[-1])
        try:
            keys = [(times.time_at(start), source.rank, start) for start in reversed(lines)]
        finally:
            times.close()
        yield from reversed(keys)
