"""A run directory on a small file system of its own: the disk-full drill's (`muster
drill --faults disk-full`, `muster.drill`).

The supervisor mounts it at a drill run's run directory before its first launch (the
experiment's `drill_fs_bytes`); the drill fills it mid-run (`fill`: never a real disk, only
a tmpfs mounted here) and, once the run has ended, puts every file the run wrote back on the
real file system at the same path (`release_small_fs`). Linux, root (mount(2)).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

from muster.atomic import fsync_dir
from muster.errors import InjectionError
from muster.sizes import format_size

__all__ = ["BALLAST", "fill", "mount_small_fs", "release_small_fs"]

MiB = 1 << 20
BALLAST = ".muster-drill-ballast"  # what `fill` writes on the drill's file system
_MNT_DETACH = 2
_LIBC = ctypes.CDLL(None, use_errno=True)


def mount_small_fs(path: Path, size_bytes: int) -> str:
    """Mount a tmpfs of `size_bytes` at `path` (an empty directory, made if missing), mode
    0700, owned as the directory is; returns what was done.

    Raises:
        InjectionError: not root, `path` not empty or mounted on already, the mount failed.
    """
    if os.geteuid() != 0:
        raise InjectionError(f"disk-full needs root to mount a tmpfs for the drill (running "
                             f"as uid {os.geteuid()})")
    path.mkdir(parents=True, exist_ok=True)
    if _mount_type(path) is not None or any(path.iterdir()):
        raise InjectionError(f"{path} is not an empty directory: the drill's tmpfs would "
                             "hide what is there")
    owner = path.stat()
    options = f"size={size_bytes},mode=0700,uid={owner.st_uid},gid={owner.st_gid}"
    try:
        _call("mount", b"tmpfs", os.fsencode(path), b"tmpfs", 0, options.encode())
    except OSError as exc:
        raise InjectionError(f"could not mount a tmpfs at {path} for the drill: "
                             f"{exc.strerror}") from exc
    return f"mounted a {format_size(size_bytes)} tmpfs at {path}"


def fill(path: Path) -> int:
    """Fill the drill's tmpfs at `path` to its last byte (`BALLAST`); returns the bytes
    written.

    Raises:
        InjectionError: `path` is not a tmpfs mount point (a real disk is never filled).
    """
    if _mount_type(path) != "tmpfs":
        raise InjectionError(f"{path} is not the drill's tmpfs (mount_small_fs): a drill "
                             "never fills a real file system")
    zeros, chunk, written = memoryview(bytes(MiB)), MiB, 0
    fd = os.open(path / BALLAST, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    try:
        while chunk:
            try:
                written += os.write(fd, zeros[:chunk])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return written


def release_small_fs(path: Path) -> None:
    """Put what the run wrote on the drill's tmpfs at `path` back on the real file system,
    at the same path, and unmount the tmpfs (lazily while a process holds it).

    A copy beside `path` is made first (`.<name>.drill-copy`, renamed from `.partial` once
    whole), then the tmpfs is unmounted and the copy renamed into place: a call after one
    that was killed midway redoes or finishes its work. Idempotent.

    Raises:
        InjectionError: something other than a tmpfs is mounted at `path`, or a step failed.
    """
    partial = path.with_name(f".{path.name}.drill-copy.partial")
    copy = path.with_name(f".{path.name}.drill-copy")
    mounted = _mount_type(path)
    if mounted is None:
        if copy.exists():  # unmounted by a call that was killed before it finished
            _move_into_place(copy, path)
        return
    if mounted != "tmpfs":
        raise InjectionError(f"{path} has a {mounted} mounted, not the drill's tmpfs")
    (path / BALLAST).unlink(missing_ok=True)
    for stale in (partial, copy):
        if stale.exists():
            shutil.rmtree(stale)
    _copy_tree(path, partial)
    os.rename(partial, copy)
    _unmount(path)
    _move_into_place(copy, path)


def _copy_tree(source: Path, target: Path) -> None:
    """`target`: `source` copied byte-exact with its modes, owners, times and links, synced."""
    done = subprocess.run(["cp", "-a", "--", f"{source}/.", str(target)], check=False,
                          capture_output=True)
    if done.returncode != 0:
        raise InjectionError(f"could not copy the drill's tmpfs {source} to {target}: "
                             f"{done.stderr.decode(errors='replace').strip()}")
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _call("syncfs", fd)
    finally:
        os.close(fd)


def _unmount(path: Path) -> None:
    try:
        _call("umount2", os.fsencode(path), 0)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise InjectionError(f"could not unmount the drill's tmpfs at {path}: "
                                 f"{exc.strerror}") from exc
        _call("umount2", os.fsencode(path), _MNT_DETACH)  # a process still holds it


def _move_into_place(copy: Path, path: Path) -> None:
    """Rename the copy onto `path`, the directory the tmpfs was mounted on (left empty)."""
    os.rename(copy, path)
    fsync_dir(path.parent)


def _call(name: str, *args: object) -> None:
    """Call libc's `name`; OSError with errno when it fails."""
    if getattr(_LIBC, name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _mount_type(path: Path) -> str | None:
    """The type of the file system mounted at `path` (the last, where several are), or None
    when `path` is no mount point."""
    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            left, _, right = line.partition(" - ")
            if _unescape(left.split()[4]) == target:
                found = right.split()[0]
    return found


def _unescape(field: str) -> str:
    """A mountinfo field, its spaces and such written as octal escapes (`\\040`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)
