"""Who owns a venv while it is built under `run_as`: its account, root, then both.

The build (root) runs uv and the setup commands as the account (`isolation`), which
therefore owns the venv they write; but the build also writes into the venv itself (the
lower layers' `.pth`, stubs and scripts; the record in `.muster/`), and the server reads the
record later. Root never writes or reads where the account could swap a name for a link
while it does (a `.pth` written through a planted link would land wherever the account
chose): around its own writes the build takes the tree (`take`: root's, top-down, so every
directory is root's before it is listed), then gives it back (`give`: bottom-up, so a
directory becomes the account's only once all below it is done). After the last command,
`seal` makes the venv's top directory root's, checks that `bin/` and `lib/` are
directories, and replaces `.muster/` by root's own: what the account made below stays
its own (its trials alone run in this build: `request`), but nothing the server reads
can be moved under it.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from muster.launch.accounts import Account

__all__ = ["OwnershipError", "give", "require_directories", "seal", "take"]


class OwnershipError(Exception):
    """The venv holds what the build did not make: the message says what."""


def take(top: Path) -> None:
    """Make the tree under `top` root's (links not followed), refusing a hard link: the
    account's would be another file's name, and `give` would hand that file over."""
    info = os.lstat(top)
    if not stat.S_ISDIR(info.st_mode):
        raise OwnershipError(f"{top} is not a directory")
    os.lchown(top, 0, 0)
    with os.scandir(top) as entries:
        children = list(entries)
    for entry in children:
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            take(Path(entry.path))
            continue
        if not stat.S_ISLNK(info.st_mode) and info.st_nlink > 1:
            raise OwnershipError(f"{entry.path} is a hard link the build did not make")
        os.lchown(entry.path, 0, 0)


def give(top: Path, account: Account) -> None:
    """Make the tree under `top` (root's, from `take`) the account's, bottom-up."""
    with os.scandir(top) as entries:
        children = list(entries)
    for entry in children:
        if entry.is_dir(follow_symlinks=False):
            give(Path(entry.path), account)
        else:
            os.lchown(entry.path, account.uid, account.gid)
    os.lchown(top, account.uid, account.gid)


def require_directories(top: Path, names: Sequence[str]) -> None:
    """Raise OwnershipError unless each of `names` (relative to `top`), and each directory
    on its way, is a directory, not a link: root writes or reads below them."""
    for name in names:
        path = top
        for part in Path(name).parts:
            path = path / part
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                raise OwnershipError(f"{path} is missing") from None
            if not stat.S_ISDIR(info.st_mode):
                raise OwnershipError(f"{path} is something else than a directory (a link?)")


def seal(venv: Path, record: Path) -> None:
    """Make `venv` itself root's (0755) and `record` (inside it) a fresh directory of root's.

    Raises:
        OwnershipError: `bin/` or `lib/` is not a directory (a link, say).
    """
    os.lchown(venv, 0, 0)
    os.chmod(venv, 0o755)
    require_directories(venv, ("bin", "lib"))
    if record.is_dir() and not record.is_symlink():
        shutil.rmtree(record)  # descriptor-based: never follows a link planted inside
    elif record.is_symlink() or record.exists():
        record.unlink()
    record.mkdir(mode=0o755)
