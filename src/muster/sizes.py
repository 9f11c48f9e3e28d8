"""Byte counts as people read them: `format_size(4 << 30)` → "4 GiB", `4.2 GiB`, `150 MiB`.

One format for every message that shows a size (memory limits and peaks, free disk), with
no dependencies: the shim imports it.
"""

from __future__ import annotations

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_size(size: float) -> str:
    """One decimal, dropped when it is 0: "4 GiB", "4.2 GiB", "150 MiB", "512 B"."""
    for unit, scale in _UNITS:
        if abs(size) >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size:.0f} B"
