"""A trial's artifacts: the files its final attempt left in its working directory that its
config names (`artifacts` globs, and `verify.outputs`), copied into an artifact set that the
storage worker stores as it stores a checkpoint (sha256 of each file, metadata.json last).

The server makes the copy, and the working directory is the job's: whatever is in it was put
there by code muster does not trust. So the copy never follows a link (the tree is walked
with `os.fwalk`, every file opened beneath its directory's descriptor with `O_NOFOLLOW`),
takes regular files only, and, when jobs run as their owners' accounts (`run_as: owner`),
only files that account owns: a file the job could not have written (a hard link to one of
the server's) is named and left. Only files written during the final attempt are taken (their
modification time is at or after its start): a stale file a killed attempt left is not the
final attempt's result. Everything the walk can be made to cost is bounded: the depth, the
entries looked at, the files taken and their bytes (`artifacts_limit`); over the limit
nothing is stored and the sizes are named.

Patterns are globs relative to the working directory: `*` and `?` stay within one path
part, `**` spans any number of them, `[...]` is a set; a pattern that ends with `/`
(`plots/`) takes everything under that directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from muster.atomic import atomic_write_bytes, fsync_dir, json_bytes
from muster.checkpoint_files import METADATA_FILE
from muster.errors import MusterError
from muster.sizes import format_size
from muster.words import count

__all__ = ["ArtifactsTooLarge", "Collected", "collect", "matcher"]

SET_PREFIX = "attempt-"  # a published set: artifacts/attempt-<n>/
TMP_PREFIX = ".tmp-attempt-"
MAX_DEPTH = 32  # path parts below the working directory
MAX_ENTRIES = 200_000  # directory entries looked at
MAX_FILES = 10_000  # files taken
MAX_SKIPPED_SHOWN = 20
_CHUNK = 1 << 20


class ArtifactsTooLarge(MusterError):
    """The files the patterns match hold more than the trial may store."""

    http_status = 413


@dataclass(frozen=True)
class Collected:
    """A published artifact set (`path`, with its metadata.json), or only why files were
    left (`path` None: no file matched)."""

    path: Path | None
    files: dict[str, str]  # relative POSIX path -> sha256 hex
    sizes: dict[str, int]  # relative POSIX path -> bytes
    size: int  # bytes, every file's
    skipped: tuple[str, ...]  # "<path>: <why it was not taken>", the first MAX_SKIPPED_SHOWN
    skipped_count: int


def matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether a relative POSIX path is one of `patterns` (see the module's notes)."""
    compiled = [re.compile(_regex(pattern)) for pattern in patterns]
    return lambda path: any(c.fullmatch(path) for c in compiled)


def _regex(pattern: str) -> str:
    if pattern.endswith("/"):
        pattern += "**"
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[" and (end := pattern.find("]", i + 2)) != -1:
            inner = pattern[i + 1:end]
            negated = inner.startswith("!")
            body = re.escape(inner[1:] if negated else inner).replace("\\-", "-")
            out.append(f"[{'^' if negated else ''}{body}]")
            i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


def collect(workdir: Path, patterns: Sequence[str], into: Path, *, trial_id: int,
            attempt: int, since: float, limit: int, owner: int | None = None) -> Collected:
    """Copy the files of `workdir` that `patterns` match, written at or after `since` (the
    final attempt's start), into `into/attempt-<attempt>/` with a metadata.json listing
    each file's sha256, published whole (a temporary directory renamed) and fsynced. With
    `owner`, only files that uid owns are taken. Nothing matched: no set, `path` None.

    Raises:
        ArtifactsTooLarge: the files to take hold more than `limit` bytes, or are more than
            MAX_FILES; nothing is stored.
        OSError: the working directory cannot be read, or the copy cannot be written.
    """
    wanted = matcher(patterns)
    skipped: list[str] = []
    taken: list[tuple[str, int]] = []  # (relative path, size when listed)
    looked = 0
    for dirpath, dirnames, filenames, dirfd in os.fwalk(workdir, follow_symlinks=False):
        relative_dir = os.path.relpath(dirpath, workdir)
        prefix = "" if relative_dir == "." else relative_dir.replace(os.sep, "/") + "/"
        looked += len(dirnames) + len(filenames)
        if looked > MAX_ENTRIES:
            skipped.append(f"{prefix or './'}: the walk stopped after {MAX_ENTRIES:,} entries")
            break
        if prefix.count("/") >= MAX_DEPTH:
            dirnames.clear()
        for name in sorted(filenames):
            relative = prefix + name
            if not wanted(relative):
                continue
            why = _why_not(dirfd, name, since, owner)
            if isinstance(why, str):
                skipped.append(f"{relative}: {why}")
            else:
                taken.append((relative, why))
    total = sum(size for _, size in taken)
    if len(taken) > MAX_FILES or total > limit:
        over = (f"the {MAX_FILES:,} files" if len(taken) > MAX_FILES
                else f"artifacts_limit ({format_size(limit)})")
        raise ArtifactsTooLarge(
            f"the artifacts hold {count(len(taken), 'file')} of {format_size(total)}, more than "
            f"{over} a trial may store: nothing was stored; raise artifacts_limit or name "
            "fewer files")
    if not taken:
        return Collected(None, {}, {}, 0, tuple(skipped[:MAX_SKIPPED_SHOWN]), len(skipped))
    return _publish(workdir, taken, into, trial_id=trial_id, attempt=attempt, limit=limit,
                    owner=owner, since=since, skipped=skipped)


def _why_not(dirfd: int, name: str, since: float, owner: int | None) -> str | int:
    """Why the file `name` (in `dirfd`) is not taken, or its size when it is."""
    try:
        info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return _judged(info, since, owner)


def _judged(info: os.stat_result, since: float, owner: int | None) -> str | int:
    if stat.S_ISLNK(info.st_mode):
        return "a link, not followed"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if owner is not None and info.st_uid != owner:
        return f"owned by uid {info.st_uid}, not by the job's account: not copied"
    if info.st_mtime < since:
        return "not written by the final attempt (older than its start): a stale file"
    return info.st_size


def _publish(workdir: Path, taken: list[tuple[str, int]], into: Path, *, trial_id: int,
             attempt: int, limit: int, owner: int | None, since: float,
             skipped: list[str]) -> Collected:
    into.mkdir(parents=True, exist_ok=True)
    final = into / f"{SET_PREFIX}{attempt}"
    tmp = into / f"{TMP_PREFIX}{attempt}-{secrets.token_hex(4)}"
    tmp.mkdir()
    files: dict[str, str] = {}
    sizes: dict[str, int] = {}
    try:
        root = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for relative, _ in taken:
                copied = _copy_beneath(root, relative, tmp / relative, since, owner,
                                       limit - sum(sizes.values()))
                if isinstance(copied, str):
                    skipped.append(f"{relative}: {copied}")  # changed since it was listed
                    continue
                files[relative], sizes[relative] = copied
        finally:
            os.close(root)
        if not files:
            shutil.rmtree(tmp)
            return Collected(None, {}, {}, 0, tuple(skipped[:MAX_SKIPPED_SHOWN]), len(skipped))
        size = sum(sizes.values())
        document = {"kind": "artifacts", "trial_id": trial_id, "attempt": attempt,
                    "time": time.time(), "files": files, "size": size}
        atomic_write_bytes(tmp / METADATA_FILE, json_bytes(document))
        fsync_dir(tmp)
        if final.exists():  # an earlier collection of this attempt: the new one replaces it
            shutil.rmtree(final)
        tmp.rename(final)
        fsync_dir(into)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Collected(final, files, sizes, size, tuple(skipped[:MAX_SKIPPED_SHOWN]),
                     len(skipped))


def _copy_beneath(root: int, relative: str, target: Path, since: float, owner: int | None,
                  room: int) -> tuple[str, int] | str:
    """Copy `relative` (below the directory `root`) to `target`, opening every part of its
    path without following a link; its sha256 and size, or why it was not copied."""
    parts = relative.split("/")
    fds: list[int] = []
    try:
        at = root
        for part in parts[:-1]:
            at = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=at)
            fds.append(at)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=at)
        fds.append(fd)
    except OSError as exc:
        for opened in fds:
            os.close(opened)
        return f"cannot be opened without following a link ({exc.strerror or exc})"
    try:
        judged = _judged(os.fstat(fd), since, owner)
        if isinstance(judged, str):
            return judged
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        written = 0
        with open(target, "xb") as out:
            while chunk := os.read(fd, _CHUNK):
                written += len(chunk)
                if written > room:
                    raise ArtifactsTooLarge(f"{relative} grew while it was copied, past "
                                            "artifacts_limit: nothing was stored")
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        return digest.hexdigest(), written
    finally:
        for opened in fds:
            os.close(opened)
