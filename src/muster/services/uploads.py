"""Safe extraction of an uploaded context directory (a tar.gz).

Rejects, with a message naming the member: absolute paths, `..` components, links that
leave the directory, device files and FIFOs, and archives whose content exceeds the limit
(a "tar bomb"). Checks run over every member before anything is written.
"""

from __future__ import annotations

import posixpath
import shutil
import tarfile
from pathlib import Path

from muster.errors import InvalidRequest

MAX_UPLOAD_BYTES = 256 * 1024**2  # the compressed archive
MAX_EXTRACTED_BYTES = 1024**3  # the sum of member sizes


def extract_context(archive: Path, dest: Path, max_bytes: int = MAX_EXTRACTED_BYTES) -> int:
    """Extract `archive` into the new directory `dest`; returns the number of files."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            members = tar.getmembers()
            _check_members(members, max_bytes)
            dest.mkdir(parents=True, exist_ok=False)
            try:
                tar.extractall(dest, members=members, filter="data")
            except BaseException:
                # The data filter also resolves links through links already on disk, which
                # the checks above cannot see: leave no half-extracted directory behind.
                shutil.rmtree(dest, ignore_errors=True)
                raise
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, tarfile.FilterError):
            raise InvalidRequest(f"context archive rejected: {exc}") from exc
        raise InvalidRequest(
            f"the context upload is not a readable tar.gz archive ({exc}); "
            "upload the directory with `muster experiment create CONFIG DIR`"
        ) from exc
    return sum(1 for m in members if m.isfile() or m.islnk())


def _check_members(members: list[tarfile.TarInfo], max_bytes: int) -> None:
    total = 0
    for member in members:
        _check_name(member.name)
        if member.issym() or member.islnk():
            _check_link(member)
        elif not (member.isfile() or member.isdir()):
            raise InvalidRequest(
                f"context archive member {member.name!r} is a device file or FIFO; "
                "only regular files, directories and links inside the directory are allowed"
            )
        total += member.size
        if total > max_bytes:
            raise InvalidRequest(
                f"context archive expands to more than {_size(max_bytes)} (at member "
                f"{member.name!r}); keep data sets out of the context directory and read them "
                "from a path"
            )


def _size(n: int) -> str:
    return f"{n // 1024**2} MiB" if n >= 1024**2 else f"{n} bytes"


def _check_name(name: str) -> None:
    if name.startswith("/") or posixpath.isabs(name):
        raise InvalidRequest(f"context archive member {name!r} has an absolute path")
    if ".." in name.split("/"):
        raise InvalidRequest(f"context archive member {name!r} leaves the directory (..)")


def _check_link(member: tarfile.TarInfo) -> None:
    target = member.linkname
    base = posixpath.dirname(member.name) if member.issym() else ""
    resolved = posixpath.normpath(posixpath.join(base, target))
    if posixpath.isabs(target) or resolved == ".." or resolved.startswith("../"):
        raise InvalidRequest(
            f"context archive member {member.name!r} links to {target!r}, "
            "outside the context directory"
        )
