"""The disk guard: nothing new launches while the run directories' file system is low."""

from __future__ import annotations

import shutil
from pathlib import Path


def format_bytes(n: float) -> str:
    """`5368709120` → `5.0 GiB`: sizes as people read them."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while abs(n) >= 1024 and power < len(units) - 1:
        n /= 1024
        power += 1
    return f"{n:.0f} B" if power == 0 else f"{n:.1f} {units[power]}"


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
    return (f"waiting for disk: {format_bytes(free)} free < {format_bytes(min_free)} "
            f"on the file system of {path}")
