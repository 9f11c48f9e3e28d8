"""Linux's inotify, through ctypes: the few calls the server's wake-ups need.

`Inotify.open()` returns None where the kernel or libc has no inotify (another OS, a
sandbox that forbids it): callers then rely on polling alone. The descriptor is
non-blocking and close-on-exec; `read_events` drains what is queued now and never blocks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MODIFY = 0x00000002
CLOSE_WRITE = 0x00000008
MOVED_FROM = 0x00000040
MOVED_TO = 0x00000080
CREATE = 0x00000100
DELETE = 0x00000200
DELETE_SELF = 0x00000400
Q_OVERFLOW = 0x00004000  # the kernel's queue overflowed: events were lost
IGNORED = 0x00008000  # the watch is gone (removed, or its file deleted)
ONLYDIR = 0x01000000
DONT_FOLLOW = 0x02000000  # watch a link itself, never what it points at
ONESHOT = 0x80000000  # the watch goes after its first event (IGNORED follows)

_NONBLOCK = os.O_NONBLOCK
_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (of the name that follows)
_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class InotifyEvent:
    wd: int  # -1 for Q_OVERFLOW
    mask: int
    name: str  # the file's name inside a watched directory; "" for the watched path itself


class Inotify:
    """One inotify instance: add and remove watches, read what happened."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self.fd = fd

    @classmethod
    def open(cls) -> Inotify | None:
        """A new instance, or None where this system has no inotify."""
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            init = libc.inotify_init1
        except (OSError, AttributeError):
            return None
        libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        libc.inotify_rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)
        fd = init(_NONBLOCK | _CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            hint = ("; this user's fs.inotify.max_user_instances are all taken"
                    if code == errno.EMFILE else "")
            log.warning("inotify_init1: %s%s", os.strerror(code), hint)
            return None
        return cls(libc, fd)

    def add_watch(self, path: Path, mask: int) -> int:
        """Watch `path` for `mask` (replacing an earlier mask on the same path); its wd.

        Raises:
            OSError: the path is gone, is not a directory (with ONLYDIR), or the user's
                watch limit is reached (ENOSPC).
        """
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask))
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_add_watch: {os.strerror(code)}", str(path))
        return wd

    def remove_watch(self, wd: int) -> None:
        """Stop watching; a watch the kernel dropped already (its file deleted) is fine."""
        if self._libc.inotify_rm_watch(self.fd, wd) < 0:
            code = ctypes.get_errno()
            if code != errno.EINVAL:
                raise OSError(code, f"inotify_rm_watch: {os.strerror(code)}")

    def read_events(self) -> Iterator[InotifyEvent]:
        """Every event queued now (none: nothing happened since the last read)."""
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                return
            if not data:
                return
            yield from _parse(data)

    def close(self) -> None:
        os.close(self.fd)


def _parse(data: bytes) -> Iterator[InotifyEvent]:
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        raw = data[offset:offset + length].split(b"\0", 1)[0]
        offset += length
        yield InotifyEvent(wd, mask, os.fsdecode(raw))
