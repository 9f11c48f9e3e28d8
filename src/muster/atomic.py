"""Atomic files (invariant 6): write to a temp name, fsync, os.replace, fsync the directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` so readers see either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
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


def atomic_write_json(path: Path, obj: Any, mode: int = 0o644) -> None:
    atomic_write_bytes(path, json_bytes(obj), mode)


def read_json(path: Path) -> Any | None:
    """The parsed JSON at `path`, or None when the file does not exist (yet), also when a
    directory on its path is missing or is not a directory."""
    try:
        return json.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
