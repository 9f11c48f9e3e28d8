"""The data manifest: what the data directory holds, counted apart from the training code.

Verification compares the samples a training run reports against this count (invariant 1),
so the count must come from the files themselves and not from the code under test. The walk
uses `os.scandir`, whose entries carry the file type from the directory listing, so only
counted files cost a `stat`. A walk is bounded: it stops at a deadline and past
`MAX_SCAN_FILES` counted files (the fingerprint keeps one entry per file). The supervisor
runs it in a child process (`python -m muster.supervise.manifest`, see
`muster.supervise.scans`), never in its pass.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from muster.errors import ConfigError

__all__ = ["LabelMode", "Manifest", "empty_data_problem", "first_counted_file", "scan_manifest"]

LabelMode = Literal["from_dirs", "none"]

PATH_KEY = "data.path"
EXTENSIONS_KEY = "data.manifest.extensions"
LABELS_KEY = "data.manifest.labels"
ALLOW_EMPTY_KEY = "data.allow_empty"
MAX_NOTES = 20  # a directory of 10,000 dangling links needs a count, not 10,000 lines
MAX_SCAN_FILES = 5_000_000
MAX_CHECK_ENTRIES = 20_000  # a submission's look for one counted file, in the request


@dataclass(frozen=True)
class Manifest:
    """The counted files of a data directory.

    `classes` (labels `from_dirs`) maps the name of each counted file's first-level
    subdirectory under `path` to its file count; files directly in `path` count under "".
    `fingerprint` is a sha256 over the sorted (relative path, size, mtime_ns) of the counted
    files: equal between scans when nothing changed, different after a file is added,
    removed, resized or touched. `notes` say what the scan left out and why.
    """

    path: str
    file_count: int
    total_bytes: int
    by_extension: dict[str, int]
    classes: dict[str, int] | None
    fingerprint: str
    scanned_at: float
    scan_seconds: float
    extensions: tuple[str, ...] | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "file_count": self.file_count,
            "total_bytes": self.total_bytes,
            "by_extension": dict(self.by_extension),
            "classes": None if self.classes is None else dict(self.classes),
            "fingerprint": self.fingerprint,
            "scanned_at": self.scanned_at,
            "scan_seconds": self.scan_seconds,
            "extensions": None if self.extensions is None else list(self.extensions),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        extensions = data.get("extensions")
        classes = data.get("classes")
        return cls(
            path=str(data["path"]),
            file_count=int(data["file_count"]),
            total_bytes=int(data["total_bytes"]),
            by_extension={str(k): int(v) for k, v in data["by_extension"].items()},
            classes=None if classes is None else {str(k): int(v) for k, v in classes.items()},
            fingerprint=str(data["fingerprint"]),
            scanned_at=float(data["scanned_at"]),
            scan_seconds=float(data["scan_seconds"]),
            extensions=None if extensions is None else tuple(str(e) for e in extensions),
            notes=tuple(str(n) for n in data.get("notes", ())),
        )


@dataclass
class _Tally:
    """What the walk has counted so far; `files` holds (relative path, size, mtime_ns)."""

    root: str
    extensions: tuple[str, ...] | None
    deadline: float | None = None  # time.monotonic() past which the walk gives up
    # Set for `first_counted_file`: the walk stops at the first counted file, or once it
    # has looked at this many entries (then `undecided`).
    entries_left: int | None = None
    undecided: bool = False
    files: list[tuple[str, int, int]] = field(default_factory=list)
    by_extension: Counter[str] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)
    left_out: list[str] = field(default_factory=list)

    def add(self, relative: str, label: str, extension: str, stat: os.stat_result) -> None:
        if len(self.files) >= MAX_SCAN_FILES:
            raise ConfigError(f"the data directory {self.root} holds more than "
                              f"{MAX_SCAN_FILES:,} files to count; point {PATH_KEY} at the data "
                              f"set itself, or narrow {EXTENSIONS_KEY}")
        self.files.append((relative, stat.st_size, stat.st_mtime_ns))
        self.by_extension[extension] += 1
        self.classes[label] += 1

    def note(self, relative: str, why: str) -> None:
        self.left_out.append(f"{relative}: {why}")

    def notes(self) -> tuple[str, ...]:
        """The first MAX_NOTES left-out files by path, then how many more (a stable list)."""
        ordered = sorted(self.left_out)
        more = len(ordered) - MAX_NOTES
        return tuple(ordered[:MAX_NOTES] + ([f"... {more} more left out"] if more > 0 else []))


def scan_manifest(
    path: Path, extensions: Sequence[str] | None, labels: LabelMode,
    seconds: float | None = None,
) -> Manifest:
    """Count the files under `path` whose extension is in `extensions` (None: every file).

    Symlinked directories are not followed. A symlinked file counts with its target's size
    when the target lies inside `path`; otherwise it is left out with a note.

    Raises:
        ConfigError: `path` is missing, not a directory, or a directory under it is
            unreadable; `extensions` holds a name without a leading dot; `labels` is
            neither "from_dirs" nor "none"; the walk took longer than `seconds` or found
            more than MAX_SCAN_FILES files to count.
    """
    started, scanned_at = time.perf_counter(), time.time()
    if labels not in ("from_dirs", "none"):
        raise ConfigError(f"labels must be 'from_dirs' or 'none', got {labels!r} ({LABELS_KEY})")
    root = _data_root(path)
    deadline = None if seconds is None else time.monotonic() + seconds
    tally = _Tally(root, _normalize_extensions(extensions), deadline)
    _walk(tally)
    return Manifest(
        path=root,
        file_count=len(tally.files),
        total_bytes=sum(size for _, size, _ in tally.files),
        by_extension=dict(sorted(tally.by_extension.items())),
        classes=dict(sorted(tally.classes.items())) if labels == "from_dirs" else None,
        fingerprint=_fingerprint(tally.files),
        scanned_at=scanned_at,
        scan_seconds=time.perf_counter() - started,
        extensions=tally.extensions,
        notes=tally.notes(),
    )


def first_counted_file(path: Path, extensions: Sequence[str] | None,
                       max_entries: int = MAX_CHECK_ENTRIES) -> bool | None:
    """Whether a scan of `path` would count at least one file, found by the same walk and
    stopping at the first: True at once for any data set, False for one with no file to
    count, None when it looked at `max_entries` entries without deciding (the scan before
    the launch then decides).

    Raises:
        ConfigError: as `scan_manifest`, for a path it cannot walk.
    """
    tally = _Tally(_data_root(path), _normalize_extensions(extensions),
                   entries_left=max_entries)
    _walk(tally)
    if tally.files:
        return True
    return None if tally.undecided else False


def empty_data_problem(where: str, extensions: Sequence[str] | None) -> str:
    """What is wrong with a data path whose manifest counts no file, and the two fixes."""
    matching = (", ".join(f"*{e}" for e in extensions) + f" ({EXTENSIONS_KEY})" if extensions
                else f"* (every file counts: {EXTENSIONS_KEY} is not set)")
    return (f"{PATH_KEY}: {where} holds no file matching {matching}, so a run over it would "
            f"train on nothing; add the data files there (or fix the path), or set "
            f"{ALLOW_EMPTY_KEY}: true if the script brings its own data")


def _data_root(path: Path) -> str:
    resolved = path.expanduser().resolve()
    if not resolved.exists():
        raise ConfigError(f"the data directory {path} does not exist ({PATH_KEY})")
    if not resolved.is_dir():
        raise ConfigError(f"the data path {path} is not a directory ({PATH_KEY})")
    return str(resolved)


def _normalize_extensions(extensions: Sequence[str] | None) -> tuple[str, ...] | None:
    if extensions is None:
        return None
    for extension in extensions:
        if not extension.startswith(".") or len(extension) < 2:
            raise ConfigError(
                f"an extension must look like '.png', got {extension!r} ({EXTENSIONS_KEY})"
            )
    # longest first, so that a file matches '.tar.gz' before '.gz'
    return tuple(sorted({e.lower() for e in extensions}, key=lambda e: (-len(e), e)))


def _extension_of(name: str, extensions: tuple[str, ...] | None) -> str | None:
    """The extension `name` is counted under, or None when the filter leaves it out."""
    lowered = name.lower()
    if extensions is None:
        return os.path.splitext(lowered)[1]
    for extension in extensions:
        if lowered.endswith(extension):
            return extension
    return None


def _walk(tally: _Tally) -> None:
    """Depth-first over the tree with an explicit stack (no recursion limit on deep trees)."""
    root = tally.root
    prefix_length = len(root.rstrip(os.sep)) + 1
    stack: list[tuple[str, str]] = [(root, "")]
    while stack:
        if tally.deadline is not None and time.monotonic() > tally.deadline:
            raise ConfigError(f"the scan of the data directory {root} did not finish in time "
                              f"({len(tally.files):,} files counted so far); point {PATH_KEY} "
                              "at the data set itself")
        directory, label = stack.pop()
        for entry in _list_directory(directory, root, tally.entries_left):
            if _enough(tally):
                return
            relative = entry.path[prefix_length:]
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, entry.name if directory == root else label))
            elif entry.is_symlink() and _is_dir(entry):
                tally.note(relative, "a symlink to a directory, not followed")
            elif (extension := _extension_of(entry.name, tally.extensions)) is not None:
                _count_entry(tally, entry, relative, label, extension)


def _enough(tally: _Tally) -> bool:
    """Whether a bounded walk (`entries_left` set) stops here: it found a file, or used up
    its entries (undecided)."""
    if tally.entries_left is None:
        return False
    if tally.files:
        return True
    tally.entries_left -= 1
    tally.undecided = tally.entries_left < 0
    return tally.undecided


def _list_directory(directory: str, root: str,
                    limit: int | None = None) -> list[os.DirEntry[str]]:
    """The entries of `directory`; at most `limit` + 1 of them when a limit is set (a bounded
    walk must not list a folder of millions to look at a few)."""
    try:
        with os.scandir(directory) as entries:
            return list(entries if limit is None else itertools.islice(entries, limit + 1))
    except FileNotFoundError:
        if directory == root:
            raise ConfigError(f"the data directory {root} vanished during the scan "
                              f"({PATH_KEY})") from None
        return []  # removed while we walked: it holds nothing now
    except OSError as exc:
        raise ConfigError(f"cannot read the directory {directory} under the data path: "
                          f"{exc.strerror} ({PATH_KEY})") from exc


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False  # a link loop or an unreadable target: counted or noted as a file


def _count_entry(
    tally: _Tally, entry: os.DirEntry[str], relative: str, label: str, extension: str
) -> None:
    try:
        if entry.is_symlink():
            _count_link(tally, entry.path, relative, label, extension)
        elif entry.is_file(follow_symlinks=False):
            tally.add(relative, label, extension, entry.stat(follow_symlinks=False))
        else:
            tally.note(relative, "not a regular file (a socket, FIFO or device)")
    except FileNotFoundError:
        pass  # removed while we walked: not part of the data any more


def _count_link(tally: _Tally, link: str, relative: str, label: str, extension: str) -> None:
    target = os.path.realpath(link)
    if os.path.commonpath([tally.root, target]) != tally.root:
        tally.note(relative, f"a symlink to {target}, outside the data directory")
    elif not os.path.isfile(target):
        tally.note(relative, f"a symlink to {target}, which is missing or not a file")
    else:
        tally.add(relative, label, extension, os.stat(target))


def _fingerprint(files: list[tuple[str, int, int]]) -> str:
    # NUL separates the fields: it is the one byte a file name cannot hold.
    text = "".join(f"{name}\0{size}\0{mtime}\0" for name, size, mtime in sorted(files))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def main(argv: list[str]) -> int:
    """`python -m muster.supervise.manifest PATH [--extension .png ...] [--labels MODE]
    [--seconds S]`: prints `{"manifest": ...}`, or `{"error": ...}` for a problem with the
    data the trial's message should name (anything else is a crash, with its traceback)."""
    parser = argparse.ArgumentParser(prog="python -m muster.supervise.manifest")
    parser.add_argument("path", type=Path)
    parser.add_argument("--extension", action="append", dest="extensions")
    parser.add_argument("--labels", choices=("from_dirs", "none"), default="none")
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        manifest = scan_manifest(args.path, args.extensions, args.labels, args.seconds)
    except ConfigError as exc:
        json.dump({"error": str(exc)}, sys.stdout)
    else:
        json.dump({"manifest": manifest.to_json()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
