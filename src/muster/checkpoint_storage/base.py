"""The contract of a checkpoint storage backend, and where a storage is (`Location`).

A backend stores objects under string keys (`<uuid>/<relative path>`; `/` separates parts,
never `..`), relative to its root (a directory, or a bucket and prefix). The rules every
backend keeps, and `tests/checkpoint_storage/test_backends.py` holds both to:

- `put_file` streams a local file to `key` and returns the sha256 of the bytes it sent;
  a put that fails or is interrupted never leaves an object under `key` that a `get`
  returns as complete (S3: a multipart upload is only visible once completed; shared_fs:
  a temporary name renamed into place).
- `put_bytes(..., create_once=True)` writes only if `key` does not exist, atomically,
  and returns False when it did (S3: `IfNoneMatch="*"` → 412; shared_fs: a hard link).
- `get_file` / `get_bytes` raise `ObjectMissing` for a key that is not there.
- `delete` of a missing key is done, not an error (S3 answers 404 or 204 alike).
- every other failure is a `StorageError` naming the storage URL; secrets never appear in
  a message, a log line or `describe()`.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from muster.errors import StorageError

__all__ = ["Backend", "ObjectMissing", "OpenUpload", "StoredObject"]


class ObjectMissing(StorageError):
    """The key holds no object (never written, or deleted)."""

    http_status = 404


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    modified_at: float  # unix seconds


@dataclass(frozen=True)
class OpenUpload:
    """A write begun and never finished: an S3 multipart upload never completed or aborted,
    or a shared_fs temporary file never renamed into place."""

    key: str
    upload_id: str  # S3's UploadId; the temporary file's name for shared_fs
    started_at: float  # unix seconds


class Backend(abc.ABC):
    """One storage place. Safe to use from several threads at once."""

    @abc.abstractmethod
    def url(self, key: str = "") -> str:
        """Where `key` is, for people: `file:///mnt/ckpt/<key>`, `s3://bucket/prefix/<key>`."""

    @abc.abstractmethod
    def put_file(self, key: str, source: Path) -> str:
        """Copy the regular file `source` to `key` (replacing it); the sha256 hex digest of
        the bytes sent. Large files go in parts (S3 multipart)."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes, create_once: bool = False) -> bool:
        """Write `data` to `key`; with `create_once`, only if `key` does not exist yet.
        Returns False when `create_once` found it there (nothing was written)."""

    @abc.abstractmethod
    def get_file(self, key: str, dest: Path) -> str:
        """Copy `key` to the new file `dest` (its parent exists); the sha256 hex digest of
        the bytes written."""

    @abc.abstractmethod
    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        """The object at `key`; `StorageError` when it is larger than `max_bytes`."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is at `key`."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[StoredObject]:
        """Every object whose key starts with `prefix` (e.g. `"<uuid>/"`; `""`: all)."""

    @abc.abstractmethod
    def children(self) -> Iterator[str]:
        """The first parts of every key (the checkpoints' uuids, and anything else there)."""

    @abc.abstractmethod
    def delete(self, keys: builtins.list[str]) -> None:
        """Delete these objects, in this order; missing ones are done already."""

    @abc.abstractmethod
    def open_uploads(self) -> builtins.list[OpenUpload]:
        """Writes begun and not finished (see `OpenUpload`)."""

    @abc.abstractmethod
    def abort_upload(self, upload: OpenUpload) -> None:
        """Drop an unfinished write; one already gone is done."""

    def tidy(self, older_than: float, at: float) -> int:
        """Remove what a write cut short leaves that is no object and no open upload (a
        shared_fs directory made for a file never written), untouched for `older_than`
        seconds; how many were removed. Object stores have no such thing."""
        del older_than, at
        return 0

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release connections."""
