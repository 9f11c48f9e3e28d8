"""The code part's tree hash: what a submitted context snapshot holds, as one digest.

A context snapshot never changes once its experiment is recorded, so its hash is computed
once per process and kept (the last `KEPT` snapshots).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TypedDict

__all__ = ["KEPT", "CodeTree", "tree_of"]

KEPT = 256


class CodeTree(TypedDict):
    """A context snapshot's digest: the code part's (and the outside part's) `code`."""

    tree_sha256: str  # of the relative paths and file hashes, sorted
    files: int


_trees: OrderedDict[Path, CodeTree] = OrderedDict()
_lock = threading.Lock()


def tree_of(root: Path) -> CodeTree:
    """The sha256 of the relative paths and file hashes
    under `root`, sorted (links and what is not a regular file left out)."""
    with _lock:
        known = _trees.get(root)
    if known is not None:
        return known
    found = _digest(root)
    with _lock:
        _trees[root] = found
        while len(_trees) > KEPT:
            _trees.popitem(last=False)
    return found


def _digest(root: Path) -> CodeTree:
    digest, files = hashlib.sha256(), 0
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            with path.open("rb") as stream:
                content = hashlib.file_digest(stream, "sha256").hexdigest()
            digest.update(f"{path.relative_to(root).as_posix()}\0{content}\n".encode())
            files += 1
    return CodeTree(tree_sha256=digest.hexdigest(), files=files)
