"""Whether a path is inside a directory, judged as written and where its links lead.

A path a client names is checked twice: normalised as written (`/data/../etc` is `/etc`),
and resolved (`/data/link` may lead to `/etc`); it is inside only if both are. Stdlib only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["inside"]


def inside(path: str, roots: Iterable[str]) -> bool:
    """Whether the absolute `path`, as written (normalised) and where it leads (links
    resolved), is one of `roots` or under one."""
    roots = list(roots)
    written, real = os.path.normpath(path), os.path.realpath(path)
    return (any(_under(written, os.path.normpath(root)) for root in roots)
            and any(_under(real, os.path.realpath(root)) for root in roots))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
