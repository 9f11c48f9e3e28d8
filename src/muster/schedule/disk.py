"""The disk guard: nothing new launches while the run directories' file system is low."""

from __future__ import annotations

import shutil
from pathlib import Path

from muster.sizes import format_size


def free_bytes(path: Path) -> int:
    """Free bytes (for unprivileged users) on the file system holding `path`."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def disk_shortfall(path: Path, min_free: int) -> str | None:
    """A sentence saying why launches wait, or None when there is enough room."""
    free = free_bytes(path)
    if free >= min_free:
        return None
    return (f"waiting for disk: {format_size(free)} free < {format_size(min_free)} "
            f"on the file system of {path}")
