"""Reading replica logs for the log API: byte ranges and tails, never the whole file.

Logs are stored byte-exact (invariant 2) and may be many GiB, so every helper here costs
what it returns, not what the file holds. Text is decoded only in `tail_text`, for display.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["BLOCK_BYTES", "log_size", "read_range", "tail_offset", "tail_text"]

BLOCK_BYTES = 64 * 1024
# A log under a path that is not a directory (an attempt directory that could not be made)
# does not exist either.
_NO_LOG = (FileNotFoundError, NotADirectoryError)


def log_size(path: Path) -> int:
    """The log's size in bytes; 0 while it does not exist yet."""
    try:
        return path.stat().st_size
    except _NO_LOG:
        return 0


def read_range(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """Up to `limit` bytes from `offset`, and the offset to continue from.

    A missing file, or an offset at or past the end, gives b"" and the same offset, so a
    follower can poll with the returned offset until more arrives.
    """
    if offset < 0 or limit < 0:
        raise ValueError(f"offset and limit must be >= 0, but got {offset=} and {limit=}.")
    try:
        with path.open("rb") as log:
            log.seek(offset)
            data = log.read(limit)
    except _NO_LOG:
        return b"", offset
    return data, offset + len(data)


def tail_offset(path: Path, lines: int) -> int:
    """The byte offset where the last `lines` lines start (0 when the file has fewer).

    A final line without a trailing newline counts as a line. Blocks are read backward from
    the end, so the cost depends on the tail's length, not the file's.
    """
    if lines < 0:
        raise ValueError(f"lines must be >= 0, but got {lines=}.")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except _NO_LOG:
        return 0
    try:
        return _tail_offset_fd(fd, os.fstat(fd).st_size, lines)
    finally:
        os.close(fd)


def _tail_offset_fd(fd: int, size: int, lines: int) -> int:
    if lines == 0 or size == 0:
        return size
    # The newline that ends the last line does not start a line: search before it.
    end = size - 1 if os.pread(fd, 1, size - 1) == b"\n" else size
    wanted = lines
    while end > 0:
        start = max(0, end - BLOCK_BYTES)
        block = os.pread(fd, end - start, start)
        pos = len(block)
        while (pos := block.rfind(b"\n", 0, pos)) != -1:
            wanted -= 1
            if wanted == 0:
                return start + pos + 1
        end = start
    return 0


def tail_text(path: Path, lines: int) -> str:
    """The last `lines` lines, decoded for display (invalid bytes become U+FFFD)."""
    offset = tail_offset(path, lines)
    data, _ = read_range(path, offset, max(0, log_size(path) - offset))
    return data.decode("utf-8", errors="replace")
