"""A replica's log as its launcher serves it, and reading it: byte ranges and tails, never the
whole file.

`ReplicaLog` is the launcher's log interface (`Launcher.log`): the server reads logs only
through it, so a launcher whose files live on another machine can serve them. `FileLog` is
the local one: the shim's files (`RankFiles.log`, `RankFiles.index`).

Logs are stored byte-exact (invariant 2) and may be many GiB, so every helper here costs
what it returns, not what the file holds. Text is decoded only in `tail_text`, for display.

A log held to `resources.log_limit` has dropped ranges: holes in the file, recorded in its
`LogDrops` (`muster.launch.log_limit`), that read as NUL bytes from the file itself. Every
reader reads through `open_log`, whose stream skips them (offsets stay those of the file),
and the helpers here that walk a log backward skip them too.
"""

from __future__ import annotations

import abc
import errno
import io
import os
import re
from collections.abc import Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

from muster.atomic import open_regular
from muster.launch.log_limit import LogDrops, read_drops

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["BLOCK_BYTES", "MAX_OFFSET", "NO_DROPS", "FileLog", "LogPart", "MaskedLog",
           "ReplicaLog", "blocks_backward", "drops_of", "log_size", "masked", "masked_stream",
           "open_log",
           "pread", "read_range", "tail_offset", "tail_text"]

BLOCK_BYTES = 64 * 1024
# The largest byte offset there is (a signed 64-bit off_t). A file system refuses to seek far
# short of it (ext4: past 16 TiB), so readers never seek past a log's end.
MAX_OFFSET = 2**63 - 1
# A log under a path that is not a directory (an attempt directory that could not be made)
# does not exist either.
_NO_FILE = (FileNotFoundError, NotADirectoryError)


class LogPart(str, Enum):
    LOG = "log"  # the replica's merged stdout and stderr, byte-exact, append-only
    INDEX = "index"  # one "<log offset> <unix time>" line per chunk: when each part arrived


NO_DROPS = LogDrops(limit=0)


class ReplicaLog(abc.ABC):
    """One replica's log and its index, wherever its launcher keeps them.

    Contract: both parts only grow; `open` never waits for a part to appear (None while
    it does not exist) and returns a binary stream that can seek, of the bytes as stored
    (a dropped range reads as NULs: read the log through `open_log`); `size` is what a
    stream opened now would hold; `drops` is the log's record of its dropped ranges as it
    is now. None has side effects.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank

    @abc.abstractmethod
    def open(self, part: LogPart) -> BinaryIO | None:
        """`part`, open for reading; None while it does not exist. Close it when done."""

    def size(self, part: LogPart = LogPart.LOG) -> int:
        """`part`'s size in bytes; 0 while it does not exist."""
        stream = self.open(part)
        if stream is None:
            return 0
        with stream:
            return stream.seek(0, os.SEEK_END)

    def drops(self) -> LogDrops:
        """What was dropped from the log to hold it to its limit (`NO_DROPS`: nothing)."""
        return NO_DROPS


class FileLog(ReplicaLog):
    """A replica's log, index and record of dropped ranges as local files."""

    def __init__(self, rank: int, log: Path, index: Path | None = None,
                 dropped: Path | None = None) -> None:
        super().__init__(rank)
        self.log = log
        self.index = index if index is not None else log.with_suffix(".index")
        self.dropped = dropped if dropped is not None else log.with_name(f"{log.name}.dropped")
        self._drops: tuple[bytes, LogDrops] = (b"", NO_DROPS)  # the record read last

    def __repr__(self) -> str:
        return f"FileLog({self.rank}, {str(self.log)!r})"

    def open(self, part: LogPart) -> BinaryIO | None:
        """The file, or None while there is none. A link or anything but a regular file in
        its place (a job under `run_as` owns the directory) is no log: None too."""
        try:
            return os.fdopen(open_regular(self._path(part)), "rb", buffering=0)
        except _NO_FILE:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EINVAL):
                return None
            raise

    def size(self, part: LogPart = LogPart.LOG) -> int:
        try:
            return os.lstat(self._path(part)).st_size
        except _NO_FILE:
            return 0

    def drops(self) -> LogDrops:
        """Read anew at every call (a reader asks after each read), parsed only when changed."""
        data, drops = read_drops(self.dropped)
        if not data:
            return NO_DROPS
        if data != self._drops[0]:
            self._drops = (data, drops or NO_DROPS)
        return self._drops[1]

    def _path(self, part: LogPart) -> Path:
        return self.log if part is LogPart.LOG else self.index


class MaskedLog(ReplicaLog):
    """A log whose reads show each of `values` (secrets) as `*`s of the same length, so
    every offset, cursor and size stays that of the bytes on disk. A value is masked where
    it lies whole in the file, however a read cuts it: each read also looks at the bytes
    around it (the longest value's length less one, on each side)."""

    def __init__(self, inner: ReplicaLog, values: Sequence[bytes]) -> None:
        super().__init__(inner.rank)
        self.inner = inner
        self.values = sorted({v for v in values if v}, key=len, reverse=True)

    def __repr__(self) -> str:
        return f"MaskedLog({self.inner!r}, {len(self.values)} values)"

    def open(self, part: LogPart) -> BinaryIO | None:
        stream = self.inner.open(part)
        if stream is None or part is not LogPart.LOG or not self.values:
            return stream
        return _as_binary(_MaskedStream(stream, self.values))

    def size(self, part: LogPart = LogPart.LOG) -> int:
        return self.inner.size(part)

    def drops(self) -> LogDrops:
        return self.inner.drops()


def masked(log: ReplicaLog, values: Sequence[bytes]) -> ReplicaLog:
    """`log`, masking `values` when there are any."""
    return MaskedLog(log, values) if values else log


def masked_stream(stream: BinaryIO, values: Sequence[bytes]) -> BinaryIO:
    """`stream` read as `MaskedLog` reads a log: each of `values` shown as `*`s of the
    same length (for other files muster serves that a job wrote, e.g. its evidence)."""
    kept = sorted({v for v in values if v}, key=len, reverse=True)
    return _as_binary(_MaskedStream(stream, kept)) if kept else stream


def _as_binary(stream: io.RawIOBase) -> BinaryIO:
    # A raw stream is a binary file in all but name: typeshed's BinaryIO is a nominal
    # class that io's streams are not declared to be.
    return cast(BinaryIO, stream)


class _OverStream(io.RawIOBase):
    """A readable, seekable stream that shows `raw` its own way (its `readinto`), keeping
    its own position; closing it closes `raw`."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self.raw = raw
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.position = self.raw.seek(offset, whence)
        return self.position

    def tell(self) -> int:
        return self.position

    def close(self) -> None:
        self.raw.close()
        super().close()


class _MaskedStream(_OverStream):
    def __init__(self, raw: BinaryIO, values: Sequence[bytes]) -> None:
        super().__init__(raw)
        self.margin = max(map(len, values)) - 1
        self.pattern = re.compile(b"|".join(re.escape(v) for v in values))

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        want = len(view)
        start = max(0, self.position - self.margin)
        self.raw.seek(start)
        data = self.raw.read(self.position - start + want + self.margin)
        shown = self.pattern.sub(lambda m: b"*" * len(m.group()), data)
        piece = shown[self.position - start:self.position - start + want]
        view[:len(piece)] = piece
        self.position += len(piece)
        self.raw.seek(self.position)
        return len(piece)


def open_log(log: ReplicaLog) -> BinaryIO | None:
    """The log, open for reading without its dropped ranges: a read that starts in one
    starts at its end, and no read goes into one, so the bytes a read returns start at
    `tell() - len(data)` after it. None while the log does not exist. Close it when done.

    The record of dropped ranges is read again after every read: the shim records a range
    before it punches it out, so a range dropped while a read ran is seen, and the read is
    cut or made again; no punched byte is ever shown.
    """
    stream = log.open(LogPart.LOG)
    return None if stream is None else _as_binary(_KeptStream(stream, log))


class _KeptStream(_OverStream):
    def __init__(self, raw: BinaryIO, log: ReplicaLog) -> None:
        super().__init__(raw)
        self.log = log
        self.drops = log.drops()

    def fileno(self) -> int:
        return self.raw.fileno()

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        while True:
            start = self.drops.skip(self.position)
            room = self.drops.room(start)
            data = pread(self.raw, len(view) if room is None else min(room, len(view)), start)
            self.drops = self.log.drops()  # what was dropped while the read ran
            if self.drops.skip(start) != start:
                continue  # its start was dropped meanwhile: from that range's end
            room = self.drops.room(start)
            n = len(data) if room is None else min(len(data), room)
            view[:n] = data[:n]
            self.position = start + n
            return n


def drops_of(stream: BinaryIO) -> LogDrops:
    """The dropped ranges a stream from `open_log` skips (as of its last read)."""
    return stream.drops if isinstance(stream, _KeptStream) else NO_DROPS


def pread(stream: BinaryIO, size: int, offset: int) -> bytes:
    """Up to `size` bytes of `stream` from `offset` (fewer only at its end or, for a stream
    from `open_log`, at a dropped range; one that starts in a dropped range reads from its
    end)."""
    stream.seek(offset)
    return stream.read(size)


def blocks_backward(stream: BinaryIO, end: int) -> Iterator[tuple[int, bytes]]:
    """The bytes before `end`, last first, as (offset, block) of at most `BLOCK_BYTES`; for
    a stream from `open_log`, without its dropped ranges (no block spans one)."""
    while end > 0:
        drops = drops_of(stream)
        end = drops.back(end)
        if end <= 0:
            return
        start = max(drops.floor(end), end - BLOCK_BYTES)
        block = pread(stream, end - start, start)
        if stream.tell() - len(block) != start or len(block) != end - start:
            if drops_of(stream) == drops or not block:
                return  # the file is shorter than `end`: nothing more to read
            continue  # a range was dropped while it was read: again, around it
        yield start, block
        end = start


def log_size(log: ReplicaLog) -> int:
    """The log's size in bytes; 0 while it does not exist yet."""
    return log.size(LogPart.LOG)


def read_range(log: ReplicaLog, offset: int, limit: int) -> tuple[bytes, int]:
    """Up to `limit` bytes from `offset`, and the offset to continue from.

    A missing file, or an offset at or past the end, gives b"" and the same offset, so a
    follower can poll with the returned offset until more arrives.
    """
    if offset < 0 or limit < 0:
        raise ValueError(f"offset and limit must be >= 0, but got {offset=} and {limit=}.")
    stream = open_log(log)
    if stream is None:
        return b"", offset
    with stream:
        if offset >= stream.seek(0, os.SEEK_END):
            return b"", offset
        data = pread(stream, limit, offset)
        return data, stream.tell() if data else offset


def tail_offset(log: ReplicaLog, lines: int) -> int:
    """The byte offset where the last `lines` lines start (0 when the file has fewer).

    A final line without a trailing newline counts as a line. Blocks are read backward from
    the end, so the cost depends on the tail's length, not the file's.
    """
    if lines < 0:
        raise ValueError(f"lines must be >= 0, but got {lines=}.")
    stream = open_log(log)
    if stream is None:
        return 0
    with stream:
        return _tail_offset(stream, stream.seek(0, os.SEEK_END), lines)


def _tail_offset(stream: BinaryIO, size: int, lines: int) -> int:
    if lines == 0 or size == 0:
        return size
    # The newline that ends the last line does not start a line: search before it.
    end = size - 1 if pread(stream, 1, size - 1) == b"\n" else size
    wanted = lines
    for start, block in blocks_backward(stream, end):
        pos = len(block)
        while (pos := block.rfind(b"\n", 0, pos)) != -1:
            wanted -= 1
            if wanted == 0:
                return start + pos + 1
    return 0


def tail_text(log: ReplicaLog, lines: int) -> str:
    """The last `lines` lines, decoded for display (invalid bytes become U+FFFD); around a
    dropped range when they span one."""
    offset, end = tail_offset(log, lines), log_size(log)
    parts = []
    while offset < end:
        data, offset = read_range(log, offset, end - offset)
        if not data:
            break
        parts.append(data)
    return b"".join(parts).decode("utf-8", errors="replace")
