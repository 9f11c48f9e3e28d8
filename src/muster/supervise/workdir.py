"""A trial's own working directory: a copy of its experiment's context (invariant 8).

The context is snapshotted once per experiment at submission (`experiments/<uuid>/context/`,
never run in). Before a trial's first launch it gets its own copy, `RunDir.workdir`, which
every attempt and rank of that trial runs in: a script that resumes from files it wrote in
its cwd (torchrun's snapshot style) finds its own after a restart, and never another
trial's. Files are cloned copy-on-write where the file system can (a reflink), copied where
it cannot; the files of the declared data path (`data.path` inside the context) are
hard-linked, since trials share the data read-only. The copy is made under a temporary name
and renamed into place whole, so a server killed in the middle leaves no half copy that a
later launch would take for the trial's directory.

Under `run_as` every file is hard-linked (`link_all`): a working directory is then its
directories alone, not an inode per file of the context (9,089 per trial for a 9,000-file
context, the audit saw). That is safe only because the job's account neither owns the
snapshot's files nor may write them (they stay root's and read-only:
`ownership.grant_trial`), and owns the directories: `open(path, "w")` on a shipped file
fails, and a job that must change one replaces it (a new file, renamed over it), which
breaks the link and leaves the snapshot and every other trial's file as they were. Without
`run_as` a job runs as the server's own uid, owns the snapshot's files and could `chmod`
one and write through the link into every trial's copy, so each trial gets its own copy.
The data path's links are shared either way: trials only read their data (without
`run_as`, nothing but that convention keeps them from writing it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

from muster.atomic import fsync_dir
from muster.errors import LaunchError

__all__ = ["prepare_workdir"]

_FICLONE = 0x40049409  # ioctl(dst, FICLONE, src): share the source's blocks until written
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}


def prepare_workdir(context: Path, workdir: Path, shared: Path | None = None, *,
                    link_all: bool = False) -> bool:
    """Make `workdir` a private copy of `context`, once; True when it was made now.

    Args:
        shared: a directory inside `context` whose files are linked, not copied (the data
            path: read-only for every trial).
        link_all: link every file (under `run_as` only: see the module's docstring); a file
            that cannot be linked (another file system, too many links) is copied.

    Raises:
        LaunchError: the copy could not be made (a full disk, say); nothing is left of it.
    """
    if workdir.is_dir():
        return False  # made for an earlier attempt: every attempt of the trial shares it
    tmp = workdir.with_name(f".{workdir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # a copy a killed server left unfinished
    linked = context.resolve() if link_all else (
        shared.resolve() if shared is not None and shared.is_dir() else None)
    try:
        workdir.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(context, tmp, symlinks=True,
                        copy_function=lambda src, dst: _place(Path(src), Path(dst), linked))
        tmp.rename(workdir)
        fsync_dir(workdir.parent)
    except (OSError, shutil.Error) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LaunchError(f"Could not give the trial its own copy of the context in "
                          f"{workdir}: {exc}") from exc
    return True


def _place(src: Path, dst: Path, linked: Path | None) -> None:
    """One file of the copy: linked when it is under `linked` (the data path, or the whole
    context under `link_all`), else cloned or copied."""
    if linked is not None and src.resolve().is_relative_to(linked):
        try:
            os.link(src, dst)
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
    if not _clone(src, dst):
        shutil.copyfile(src, dst)
    shutil.copystat(src, dst)


def _clone(src: Path, dst: Path) -> bool:
    """A copy-on-write clone of `src` at `dst`; False where the file system has none."""
    with src.open("rb") as source, dst.open("wb") as target:
        try:
            fcntl.ioctl(target.fileno(), _FICLONE, source.fileno())
        except OSError as exc:
            if exc.errno in _NO_CLONE:
                return False
            raise
    return True
