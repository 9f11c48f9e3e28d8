"""Atomic files (invariant 6): write to a temp name, fsync, os.replace, fsync the directory.

Never through a link: the temp file is created new (O_EXCL | O_NOFOLLOW), and renaming it
replaces whatever stands at the name (a link itself, not what it points at); `read_json`
does not follow a link either. Under `run_as` a job owns its attempt's directory, and a link
it planted there must not make muster (root) write or read elsewhere.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644, *,
                       exact_mode: bool = False) -> None:
    """Write `data` to `path` so readers see either the old file or the whole new one.

    Args:
        mode: the new file's mode, less the umask (the whole `mode` with `exact_mode`).
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, _NEW, mode)
    except FileExistsError:  # left by a writer that died, or planted: it goes, unread
        os.unlink(tmp)
        fd = os.open(tmp, _NEW, mode)
    try:
        if exact_mode:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def json_bytes(obj: Any) -> bytes:
    """`obj` as the JSON files muster writes hold it: indented, keys sorted, a final newline."""
    return json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"


def atomic_write_json(path: Path, obj: Any, mode: int = 0o644, *,
                      exact_mode: bool = False) -> None:
    atomic_write_bytes(path, json_bytes(obj), mode, exact_mode=exact_mode)


def read_json(path: Path) -> Any | None:
    """The parsed JSON at `path`, or None when the file does not exist (yet), also when a
    directory on its path is missing or is not a directory.

    Raises:
        OSError: the file is a link (ELOOP) or not a regular file, or unreadable.
        ValueError: it is not JSON.
    """
    try:
        return json.loads(read_regular(path))
    except (FileNotFoundError, NotADirectoryError):
        return None


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of the regular file at `path`, opened without following a
    link as its last part (ELOOP) and refusing anything but a regular file (a FIFO would
    block its reader). The caller closes it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def read_regular(path: Path | str) -> bytes:
    """The bytes of the regular file at `path` (see `open_regular`)."""
    with os.fdopen(open_regular(path), "rb") as file:
        return file.read()
