"""Checkpoint storage in a directory that every machine reaches (NFS, or one local disk).

An object is the file `root/<key>`. Writes go to a temporary file beside it,
`.tmp-<random hex>-<name>`, which is fsynced and then renamed (or hard-linked, for
`create_once`) into place, so a reader sees a whole object or none. A temporary file left by
a crash is an `OpenUpload` until `abort_upload` removes it.

The key rules, the refusal of sources that are not regular files and the hashing reader are
shared with `muster.checkpoint_storage.s3`, which imports them from here.
"""

from __future__ import annotations

import builtins  # inside the class, `list` names the Backend method
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from muster.checkpoint_storage.base import Backend, ObjectMissing, OpenUpload, StoredObject
from muster.errors import StorageError

__all__ = ["SharedFs"]

CHUNK = 1 << 20  # bytes per read while copying
TMP_PREFIX = ".tmp-"
_NO_OBJECT = (FileNotFoundError, NotADirectoryError, IsADirectoryError)  # a path, no file
_KEY_RULES = ("a key is a relative POSIX path: not empty, no leading '/', no empty, '.' or "
              f"'..' parts, no NUL, no part starting with {TMP_PREFIX!r}")


def check_key(key: str) -> str:
    """`key` itself, once it is a valid object key; `StorageError` otherwise."""
    parts = key.split("/")
    bad = (not key or "\0" in key or any(p in ("", ".", "..") for p in parts)
           or any(p.startswith(TMP_PREFIX) for p in parts))
    if bad:
        raise StorageError(f"invalid storage key {key!r}: {_KEY_RULES}")
    return key


def check_prefix(prefix: str) -> str:
    """`prefix` itself, once it is `""` or a valid key, or one followed by a `/`."""
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix


def open_source(source: Path, url: str) -> tuple[BinaryIO, int]:
    """Open the regular file `source` for reading; the file and its size.

    Raises:
        StorageError: `source` is missing, unreadable, a symbolic link, a FIFO or a device.
    """
    what = f"cannot copy {source} to {url}"
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
    try:
        fd = os.open(source, flags)
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise StorageError(f"{what}: {reason}; give the path of a regular file") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise StorageError(f"{what}: it is not a regular file (a FIFO, socket or device); "
                           "give the path of a regular file")
    return os.fdopen(fd, "rb"), info.st_size


class HashingReader:
    """A forward-only reader that hashes what it hands out and checks the length it expects.

    It cannot seek, so s3transfer reads it once, in order, part after part: the digest is
    that of the bytes sent. A source that ends early or runs long (it changed while being
    copied) raises `StorageError` before the last byte is handed out, so the write fails.
    """

    def __init__(self, raw: BinaryIO, expected_size: int, name: str) -> None:
        self._raw = raw
        self.expected_size = expected_size
        self._name = name
        self.sha256 = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all that is left for a negative `size`)."""
        data = self._raw.read(size)
        self.size += len(data)
        if (not data and self.size != self.expected_size) or self.size > self.expected_size:
            raise StorageError(f"{self._name} changed while it was copied: expected "
                               f"{self.expected_size} bytes, read {self.size}; write it once, "
                               "then store it")
        self.sha256.update(data)
        return data


def copy_into(reader: HashingReader, dest: BinaryIO) -> str:
    """Copy everything `reader` holds into `dest`; the sha256 hex digest of it."""
    while data := reader.read(CHUNK):
        dest.write(data)
    return reader.sha256.hexdigest()


def too_large(url: str, size: int, max_bytes: int) -> StorageError:
    """The error for an object larger than a read allows."""
    return StorageError(f"{url} holds {size} bytes, more than the {max_bytes} this read "
                        "allows; check that it is the object meant")


def os_reason(exc: OSError) -> str:
    """The OS's words for `exc`, with the path it concerns."""
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_name(final: Path) -> Path:
    return final.with_name(f"{TMP_PREFIX}{secrets.token_hex(8)}-{final.name}")


def _key_of_temp(name: str) -> str:
    """The object name a temporary file was going to become (`.tmp-<hex>-<name>`)."""
    return name.removeprefix(TMP_PREFIX).partition("-")[2]


class SharedFs(Backend):
    """Objects as files under `root`, written atomically and durably (fsync, rename)."""

    def __init__(self, root: Path) -> None:
        self._root = Path(root).expanduser().absolute()

    def __repr__(self) -> str:
        return f"SharedFs(root={str(self._root)!r})"

    def url(self, key: str = "") -> str:
        base = self._root.as_uri()
        return f"{base}/{key}" if key else base

    def put_file(self, key: str, source: Path) -> str:
        final = self._path(key)
        src, size = open_source(source, self.url(key))
        with src, self._errors("write", key):
            reader = HashingReader(src, size, str(source))
            self._write_atomically(final, lambda tmp: copy_into(reader, tmp), os.replace)
        return reader.sha256.hexdigest()

    def put_bytes(self, key: str, data: bytes, create_once: bool = False) -> bool:
        final = self._path(key)
        place = os.link if create_once else os.replace
        with self._errors("write", key):
            try:
                self._write_atomically(final, lambda tmp: tmp.write(data), place)
            except FileExistsError:
                return False
        return True

    def get_file(self, key: str, dest: Path) -> str:
        path = self._path(key)
        with self._errors("read", key), self._open_object(key, path) as src:
            reader = HashingReader(src, os.fstat(src.fileno()).st_size, self.url(key))
            with open(dest, "xb") as out:
                try:
                    return copy_into(reader, out)
                except BaseException:
                    dest.unlink(missing_ok=True)  # leave no truncated copy behind
                    raise

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        path = self._path(key)
        with self._errors("read", key), self._open_object(key, path) as src:
            size = os.fstat(src.fileno()).st_size
            data = src.read(max_bytes + 1) if size <= max_bytes else b""
            if size > max_bytes or len(data) > max_bytes:
                raise too_large(self.url(key), max(size, len(data)), max_bytes)
            return data

    def exists(self, key: str) -> bool:
        path = self._path(key)
        with self._errors("check", key):
            try:
                return stat.S_ISREG(path.stat().st_mode)
            except _NO_OBJECT:
                return False

    def list(self, prefix: str) -> Iterator[StoredObject]:
        start = self._root / check_prefix(prefix).rpartition("/")[0]
        with self._errors("list", prefix):
            for entry in self._walk(start):
                key = self._key_of(entry.path)
                if entry.name.startswith(TMP_PREFIX) or not key.startswith(prefix):
                    continue
                with suppress(FileNotFoundError):  # deleted since the directory was read
                    info = entry.stat(follow_symlinks=False)
                    yield StoredObject(key=key, size=info.st_size, modified_at=info.st_mtime)

    def children(self) -> Iterator[str]:
        with self._errors("list", ""):
            for entry in _scan(self._root):
                if self._holds_objects(entry):
                    yield entry.name

    def delete(self, keys: builtins.list[str]) -> None:
        paths = [self._path(key) for key in keys]
        for key, path in zip(keys, paths, strict=True):
            with self._errors("delete", key), suppress(*_NO_OBJECT):
                path.unlink()
        for parent in sorted({p.parent for p in paths}, key=lambda p: -len(p.parts)):
            self._remove_empty_dirs(parent)

    def open_uploads(self) -> builtins.list[OpenUpload]:
        with self._errors("list", ""):
            return builtins.list(self._temporary_files())

    def abort_upload(self, upload: OpenUpload) -> None:
        head, _, name = upload.upload_id.rpartition("/")
        if head:
            check_key(head)
        if not name.startswith(TMP_PREFIX) or "\0" in name:
            raise StorageError(f"{upload.upload_id!r} is not a temporary file of "
                               f"{self.url()}; pass an upload from open_uploads()")
        path = self._root / upload.upload_id
        with self._errors("delete", upload.upload_id):
            path.unlink(missing_ok=True)
        self._remove_empty_dirs(path.parent)

    # -- helpers ---------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self._root / check_key(key)

    def _key_of(self, path: str) -> str:
        return Path(path).relative_to(self._root).as_posix()

    @contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        """Turn an unexpected OSError into a StorageError naming the URL and the cause."""
        try:
            yield
        except OSError as exc:
            raise StorageError(f"cannot {action} {self.url(key)}: {os_reason(exc)}; check "
                               "that the directory is mounted, writable and not full"
                               ) from exc

    @contextmanager
    def _open_object(self, key: str, path: Path) -> Iterator[BinaryIO]:
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except _NO_OBJECT:
            raise ObjectMissing(f"no object at {self.url(key)}") from None
        with src:
            yield src

    def _write_atomically(self, final: Path, fill: Callable[[BinaryIO], object],
                          place: Callable[[Path, Path], None]) -> None:
        """Fill a temporary file beside `final`, fsync it, `place` it at `final` (os.replace,
        or os.link, which raises FileExistsError where `final` is taken)."""
        self._make_dirs(final.parent)
        tmp = _temp_name(final)
        try:
            with open(tmp, "xb") as out:
                fill(out)
                out.flush()
                os.fsync(out.fileno())
            place(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)  # after os.replace it is gone; after os.link, a twin
        _fsync_dir(final.parent)

    @staticmethod
    def _make_dirs(path: Path) -> None:
        """Create `path` and its missing parents, each made durable in its parent."""
        missing = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for directory in reversed(missing):
            with suppress(FileExistsError):
                directory.mkdir()
            _fsync_dir(directory.parent)

    def tidy(self, older_than: float, at: float) -> int:
        """Remove directories without a file below them, unchanged for `older_than` seconds
        (a write killed between making its directory and its temporary file)."""
        with self._errors("tidy", ""):
            return sum(self._prune(Path(e.path), older_than, at) for e in _scan(self._root)
                       if e.is_dir(follow_symlinks=False))

    def _prune(self, directory: Path, older_than: float, at: float) -> int:
        """Remove the empty, old directories at and below `directory`, deepest first (its age
        is read first: removing a child below it makes it look new)."""
        try:
            old = at - directory.stat().st_mtime >= older_than
        except FileNotFoundError:
            return 0
        removed = sum(self._prune(Path(e.path), older_than, at) for e in _scan(directory)
                      if e.is_dir(follow_symlinks=False))
        try:
            if old:
                directory.rmdir()
                return removed + 1
        except OSError:  # not empty (or a write just began there): left alone
            pass
        return removed

    def _remove_empty_dirs(self, directory: Path) -> None:
        """Remove `directory` and its parents while they are empty, up to (not) the root."""
        while directory != self._root and self._root in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty, already gone, or not ours to remove
                return
            directory = directory.parent

    def _temporary_files(self) -> Iterator[OpenUpload]:
        for entry in self._walk(self._root):
            if not entry.name.startswith(TMP_PREFIX):
                continue
            with suppress(FileNotFoundError):  # a write in progress just renamed it
                started_at = entry.stat(follow_symlinks=False).st_mtime
                final = os.path.join(os.path.dirname(entry.path), _key_of_temp(entry.name))
                yield OpenUpload(key=self._key_of(final), upload_id=self._key_of(entry.path),
                                 started_at=started_at)

    def _holds_objects(self, entry: os.DirEntry[str]) -> bool:
        """Whether `entry` is an object or a directory with one below it (what a crash left,
        temporary files and empty directories, is no key's first part)."""
        if entry.is_dir(follow_symlinks=False):
            files = self._walk(Path(entry.path))
            return any(not f.name.startswith(TMP_PREFIX) for f in files)
        return entry.is_file(follow_symlinks=False) and not entry.name.startswith(TMP_PREFIX)

    def _walk(self, directory: Path) -> Iterator[os.DirEntry[str]]:
        """Every file below `directory` (symbolic links are not followed)."""
        for entry in _scan(directory):
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield entry


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    """The entries of `directory`, by name; none when it does not exist (yet)."""
    try:
        with os.scandir(directory) as entries:
            return sorted(entries, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
