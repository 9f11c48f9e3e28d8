"""Sharded checkpoints: how every rank's metadata and files combine into one checkpoint.

Pure functions over what each rank contributed (the list index is the rank); the collectives
that gather those contributions are `CheckpointContext`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def merge_metadata(by_rank: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One metadata object from every rank's: objects under the same key merge, any other
    value must be the same wherever it is given.

    Raises:
        RuntimeError: ranks give different values for a key (each conflict named, with the
            ranks that gave it).
    """
    merged: dict[str, Any] = {}
    givers: dict[str, list[int]] = {}
    conflicts: dict[str, list[int]] = {}
    for rank, metadata in enumerate(by_rank):
        _merge_into(merged, metadata, rank, "", givers, conflicts)
    if conflicts:
        shown = "; ".join(f"{key} from ranks {ranks}" for key, ranks in sorted(conflicts.items()))
        raise RuntimeError(f"ranks gave different checkpoint metadata: {shown}")
    return merged


def _merge_into(merged: dict[str, Any], metadata: Mapping[str, Any], rank: int, prefix: str,
                givers: dict[str, list[int]], conflicts: dict[str, list[int]]) -> None:
    for key, value in metadata.items():
        where = f"{prefix}/{key}"
        givers.setdefault(where, []).append(rank)
        if isinstance(value, Mapping) and isinstance(merged.get(key, {}), dict):
            _merge_into(merged.setdefault(key, {}), value, rank, where, givers, conflicts)
        elif key not in merged:
            merged[key] = value
        elif merged[key] != value:
            conflicts[where] = givers[where]


def file_owners(by_rank: Sequence[Mapping[str, str]]) -> dict[str, int]:
    """Which rank copies each file: the lowest that has it. Every rank's files map their
    relative path to their sha256.

    Raises:
        RuntimeError: ranks hold different contents under one path (each named, with them).
    """
    owners: dict[str, int] = {}
    digests: dict[str, set[str]] = {}
    holders: dict[str, list[int]] = {}
    for rank, files in enumerate(by_rank):
        for path, digest in files.items():
            owners.setdefault(path, rank)
            digests.setdefault(path, set()).add(digest)
            holders.setdefault(path, []).append(rank)
    conflicts = sorted(path for path, seen in digests.items() if len(seen) > 1)
    if conflicts:
        shown = "; ".join(f"{path} from ranks {holders[path]}" for path in conflicts)
        raise RuntimeError(f"ranks hold different files under one name: {shown}")
    return owners
