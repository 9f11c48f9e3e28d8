"""One checkpoint into storage, back out of it, and out of it for good.

In storage a checkpoint is the prefix `<uuid>/`: the files its metadata.json lists, each
under its relative path, and `<uuid>/metadata.json` itself, written **last** and only
once (create-once), so a prefix without metadata.json is an upload that never finished and
is no checkpoint. Each file's sha256 is computed from the bytes as they stream out and
compared with metadata.json; a fetch hashes the bytes as they stream in and keeps the copy
only when every file matches (`muster.checkpoint_files.inspect` judges it again at the
end, the one integrity rule). A deletion removes metadata.json first: from its first step
on, the checkpoint no longer exists for anyone reading storage.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from muster import checkpoint_files
from muster.atomic import fsync_dir, read_regular
from muster.checkpoint_files import METADATA_FILE, Inspection
from muster.checkpoint_storage.base import Backend, ObjectMissing
from muster.errors import StorageError

__all__ = ["CheckpointChanged", "CorruptInStorage", "delete_checkpoint", "fetch_checkpoint",
           "fetch_files", "retry_delay", "upload_checkpoint"]

MAX_METADATA_BYTES = 16 << 20  # a metadata.json lists files; 16 MiB is ~100,000 of them
MAX_RETRY_SECONDS = 3600.0
FETCH_PREFIX = ".tmp-fetch-"


class CheckpointChanged(StorageError):
    """The local checkpoint no longer matches its metadata.json: uploading it again cannot
    help (it is not retried)."""

    http_status = 409


class CorruptInStorage(StorageError):
    """The checkpoint in storage is incomplete or does not match its metadata.json."""

    http_status = 409


@dataclass(frozen=True)
class Uploaded:
    files: int
    size: int


def retry_delay(tries: int) -> float:
    """Seconds before the next try of an upload that failed `tries` times (5 s, doubling,
    at most an hour)."""
    return min(MAX_RETRY_SECONDS, 5.0 * 2.0 ** min(max(tries - 1, 0), 20))


def upload_checkpoint(backend: Backend, local: Path, uuid: str,
                      trial_id: int | None = None) -> Uploaded:
    """Copy the intact checkpoint directory `local` to `<uuid>/`, metadata.json last.

    Redoing an upload that was cut short (or that finished without being recorded) is
    safe: files are replaced, and a metadata.json already there must be this one.

    Raises:
        CheckpointChanged: `local` is missing or not intact, or a file changed while it
            was sent.
        StorageError: storage failed.
    """
    files, raw = _local_document(local, trial_id)
    size = 0
    for relative, expected in sorted(files.items()):
        sent = backend.put_file(f"{uuid}/{relative}", local / relative)
        if sent != expected:
            raise CheckpointChanged(f"{local / relative} changed while it was uploaded (its "
                                    f"sha256 no longer matches {METADATA_FILE})")
        size += (local / relative).stat().st_size
    if not backend.put_bytes(f"{uuid}/{METADATA_FILE}", raw, create_once=True):
        there = backend.get_bytes(f"{uuid}/{METADATA_FILE}", MAX_METADATA_BYTES)
        if there != raw:
            raise CorruptInStorage(f"{backend.url(uuid)} already holds another "
                                   f"{METADATA_FILE}; it was not replaced")
    return Uploaded(files=len(files), size=size)


def fetch_checkpoint(backend: Backend, uuid: str, dest: Path,
                     trial_id: int | None = None) -> Inspection:
    """Copy checkpoint `<uuid>/` from storage into the new directory `dest` (its name is
    the checkpoint's, e.g. `step-000000000010-1a2b3c4d`); nothing is left at `dest` unless
    every file matched.

    Raises:
        ObjectMissing: storage holds no metadata.json for it (never stored, or deleted).
        CorruptInStorage: a file is missing or does not match its sha256.
        StorageError: storage failed.
    """
    fetch_files(backend, uuid, dest)
    found = checkpoint_files.inspect(dest, trial_id)
    if not found.intact:
        shutil.rmtree(dest, ignore_errors=True)
        raise CorruptInStorage(f"{backend.url(uuid)} is not intact once fetched: "
                               f"{found.problem}")
    return found


def fetch_files(backend: Backend, uuid: str, dest: Path) -> dict[str, str]:
    """Copy `<uuid>/` (its metadata.json's files, then metadata.json) into the new
    directory `dest`, renamed into place only when every file matched its sha256; the files
    (relative path -> sha256).

    Raises:
        ObjectMissing: storage holds no metadata.json for it.
        CorruptInStorage: a file is missing or does not match its sha256.
        StorageError: storage failed.
    """
    raw = backend.get_bytes(f"{uuid}/{METADATA_FILE}", MAX_METADATA_BYTES)
    files = _listed_files(raw, backend.url(uuid))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f"{FETCH_PREFIX}{dest.name}-{os.urandom(4).hex()}"
    tmp.mkdir()
    try:
        _fetch_files(backend, uuid, files, tmp)
        (tmp / METADATA_FILE).write_bytes(raw)
        os.rename(tmp, dest)
        fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files


def delete_checkpoint(backend: Backend, uuid: str) -> None:
    """Delete `<uuid>/` from storage, metadata.json first; done when nothing is left.

    Raises:
        StorageError: storage failed, or objects are still there after the deletion.
    """
    rest = sorted(o.key for o in backend.list(f"{uuid}/") if o.key != f"{uuid}/{METADATA_FILE}")
    backend.delete([f"{uuid}/{METADATA_FILE}", *rest])
    left = [o.key for o in backend.list(f"{uuid}/")]
    if left:
        raise StorageError(f"{backend.url(uuid)} still holds {len(left)} objects after its "
                           f"deletion (e.g. {left[0]}); it will be deleted again")


def _local_document(local: Path, trial_id: int | None) -> tuple[dict[str, str], bytes]:
    """The files (relative path → sha256) and the raw metadata.json of a registered local
    checkpoint. Its files are not hashed here: each is hashed as it is sent and compared
    with metadata.json then (hashing them first as well cost an extra pass of the disk)."""
    try:
        raw = read_regular(local / METADATA_FILE)
    except OSError as exc:
        raise CheckpointChanged(f"{local} cannot be read ({exc.strerror or exc})") from None
    try:
        files = _listed_files(raw, str(local))
    except CorruptInStorage as exc:
        raise CheckpointChanged(f"{local} is no longer intact: {exc}") from None
    recorded = json.loads(raw).get("trial_id")
    if trial_id is not None and recorded is not None and str(recorded) != str(trial_id):
        raise CheckpointChanged(f"{local}/{METADATA_FILE} names trial {recorded}, not "
                                f"{trial_id}")
    for relative in files:
        try:
            regular = stat.S_ISREG(os.lstat(local / relative).st_mode)
        except OSError as exc:
            raise CheckpointChanged(f"{local / relative} cannot be read "
                                    f"({exc.strerror or exc})") from None
        if not regular:
            raise CheckpointChanged(f"{local / relative} is no longer a regular file")
    return files, raw


def _listed_files(raw: bytes, url: str) -> dict[str, str]:
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CorruptInStorage(f"{url}/{METADATA_FILE} is not valid JSON ({exc})") from None
    files = document.get("files") if isinstance(document, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and _inside(k) for k, v in files.items()):
        raise CorruptInStorage(f'{url}/{METADATA_FILE} has no "files" object of relative '
                               "paths and sha256 sums")
    return files


def _fetch_files(backend: Backend, uuid: str, files: dict[str, str], into: Path) -> None:
    for relative, expected in sorted(files.items()):
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            got = backend.get_file(f"{uuid}/{relative}", target)
        except ObjectMissing:
            raise CorruptInStorage(f"{backend.url(uuid)}: {relative} is missing, although "
                                   f"{METADATA_FILE} lists it") from None
        if got != expected:
            raise CorruptInStorage(f"{backend.url(uuid)}: {relative} does not match its "
                                   f"sha256 in {METADATA_FILE}")


def _inside(relative: str) -> bool:
    where = PurePosixPath(relative)
    return (bool(where.parts) and not where.is_absolute() and ".." not in where.parts
            and relative != METADATA_FILE and "\0" not in relative)
