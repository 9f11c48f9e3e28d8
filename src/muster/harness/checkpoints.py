"""Checkpoints: saved whole or not at all, and restored only when every byte verifies.

A save writes into `checkpoints/.tmp-…/`, fsyncs every file, writes `metadata.json` with
the sha256 of each file, and renames the directory into place as
`checkpoints/step-<step:012d>-<8 hex>/`; the platform sees only complete checkpoints.
`checkpoints/` belongs to the trial: every attempt saves into and restores from it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from muster import checkpoint_files
from muster.atomic import fsync_dir
from muster.checkpoint_files import CheckpointDocument, Metadata
from muster.errors import MusterError
from muster.harness.arguments import check_count
from muster.harness.heartbeat import Heartbeat

METADATA_FILE = checkpoint_files.METADATA_FILE
NAME_PREFIX = checkpoint_files.NAME_PREFIX
TMP_PREFIX = checkpoint_files.TMP_PREFIX


class CheckpointError(MusterError):
    """A checkpoint could not be saved; nothing of it was left behind."""


class Checkpoint(NamedTuple):
    """An intact checkpoint found by `restore()`."""

    path: Path
    step: int
    time: float
    metadata: Metadata  # what the training code passed to save(metadata=...)


class Saver(NamedTuple):
    """Who saves: recorded in each checkpoint's metadata.json."""

    trial_id: int | None
    attempt: int
    rank: int
    hparams: Mapping[str, Any]


class Checkpoints:
    """`ctx.checkpoint`: save and restore the trial's checkpoints.

    Normally only rank 0 saves (all ranks hold the same state); any rank may, and
    metadata.json records which one did.
    """

    def __init__(
        self, directory: Path, saver: Saver, heartbeat: Heartbeat, preferred: Path | None,
        before_publish: Callable[[], None] = lambda: None,
        failures: SaveFailures | None = None,
    ) -> None:
        self.directory = directory
        # Every save that failed is recorded for verification, even when the training code
        # catches the error and carries on: its last results would be missing.
        self._failures = failures
        self._saver = saver
        self._heartbeat = heartbeat
        self._preferred = preferred
        # Writes this rank's buffered sample counts and metrics first: a run killed right
        # after a checkpoint resumes from it, and must not have lost the accounting of the
        # steps the checkpoint already contains.
        self._before_publish = before_publish
        self.last_saved: Path | None = None  # the latest checkpoint this process published

    @contextmanager
    def save(self, step: int, metadata: Mapping[str, Any] | None = None) -> Iterator[Path]:
        """A directory to write the checkpoint's files into; published when the block ends.

        Raises:
            CheckpointError: the block raised, or finishing the checkpoint failed (a full
                disk included); the original error is the cause, and nothing is left.
            TypeError, ValueError: `step` is not an int ≥ 0, or `metadata` is not a JSON
                object.
        """
        step = check_count(step, "checkpoint.save: step")
        user_metadata = _checked_metadata(metadata)
        if self._failures is None:
            with self._saving(step, user_metadata) as tmp:
                yield tmp
            return
        self._failures.prepare()
        try:
            with self._saving(step, user_metadata) as tmp:
                yield tmp
        except CheckpointError as exc:
            self._failures.record(step, str(exc))
            raise
        except KeyboardInterrupt:
            self._failures.record(step, "interrupted (KeyboardInterrupt) while saving")
            raise

    @contextmanager
    def _saving(self, step: int, user_metadata: Metadata) -> Iterator[Path]:
        self._heartbeat.progress(time.time(), step)
        tmp = self._make_tmp(step)
        try:
            yield tmp
        except Exception as exc:
            _remove(tmp)
            raise CheckpointError(
                f"Checkpoint for step {step} failed inside its save block "
                f"({type(exc).__name__}: {exc}); nothing was saved ({tmp} was removed)"
            ) from exc
        except BaseException:
            _remove(tmp)
            raise
        try:
            self._before_publish()
        except OSError as exc:
            _remove(tmp)
            raise CheckpointError(
                f"Could not save the checkpoint for step {step}: writing the sample counts "
                f"and metrics it accounts for failed: {exc}{_hint(exc)}; nothing was saved"
            ) from exc
        self._publish(tmp, step, user_metadata)
        self._heartbeat.progress(time.time(), step)

    def restore(self) -> Checkpoint | None:
        """The latest intact checkpoint (highest step, then newest), or None.

        MUSTER_LATEST_CHECKPOINT wins when it is intact. A corrupt checkpoint (metadata
        missing or malformed, a file missing or changed) is skipped with a RuntimeWarning
        that names it and what is wrong.
        """
        found = checkpoint_files.latest_intact(self.directory, self._preferred, _warn_corrupt,
                                               self._saver.trial_id)
        if found is None:
            return None
        user_metadata = found.user_metadata
        return Checkpoint(path=found.path, step=found.step, time=found.saved_at or 0.0,
                          metadata=user_metadata if isinstance(user_metadata, dict) else {})

    latest = restore

    def _make_tmp(self, step: int) -> Path:
        tmp = self.directory / f"{TMP_PREFIX}step-{step:012d}-{os.urandom(4).hex()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
        except OSError as exc:
            raise CheckpointError(
                f"Could not start the checkpoint for step {step}: creating {tmp} failed: "
                f"{exc}{_hint(exc)}"
            ) from exc
        return tmp

    def _publish(self, tmp: Path, step: int, user_metadata: Metadata) -> None:
        """Sync and hash the files, write metadata.json, rename into place, sync the parent."""
        final = self.directory / f"{NAME_PREFIX}{step:012d}-{os.urandom(4).hex()}"
        doing, renamed = f"listing {tmp}", False
        try:
            files: dict[str, str] = {}
            for path in _files_under(tmp):
                doing = f"syncing and hashing {path}"
                files[path.relative_to(tmp).as_posix()] = _sync_and_hash(path)
            doing = f"writing {tmp / METADATA_FILE}"
            _write_synced(tmp / METADATA_FILE, self._metadata(step, user_metadata, files))
            doing = f"syncing {tmp}"
            for directory in _directories_under(tmp):
                fsync_dir(directory)
            doing = f"renaming {tmp} to {final}"
            os.rename(tmp, final)
            renamed = True
            doing = f"syncing {self.directory}"
            fsync_dir(self.directory)
            self.last_saved = final
        except (OSError, CheckpointError) as exc:
            _remove(final if renamed else tmp)
            raise CheckpointError(
                f"Could not save the checkpoint for step {step}: {doing} failed: "
                f"{exc}{_hint(exc)}; nothing was saved"
            ) from exc

    def _metadata(self, step: int, user_metadata: Metadata, files: dict[str, str]) -> bytes:
        if METADATA_FILE in files:
            raise CheckpointError(f"{METADATA_FILE} is muster's name in a checkpoint; "
                                  "save your own metadata under another name or as metadata=")
        document = CheckpointDocument(
            step=step, time=time.time(), trial_id=self._saver.trial_id,
            attempt=self._saver.attempt, rank=self._saver.rank,
            hparams=dict(self._saver.hparams), metadata=user_metadata, files=files)
        return json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"


class SaveFailure(TypedDict):
    """One failed save in `save-failures.json`."""

    step: int
    time: float
    error: str  # at most `SaveFailures.ERROR_CHARS`, then "…"


class SaveFailuresDocument(TypedDict):
    """`save-failures.json`: how many saves failed, and the latest `SaveFailures.KEPT`."""

    count: int
    failures: list[SaveFailure]


class SaveFailures:
    """The rank's failed checkpoint saves, in its `save-failures.json` (docs/run-directory.md).

    The file is made and given its room (`SIZE` bytes) before the first save, and rewritten
    in place: a save that failed because the disk is full can still be recorded. Readers
    read it after the process ended; the JSON is padded with spaces to the file's size.
    """

    SIZE = 4096
    KEPT = 5  # the latest failures named; all are counted
    ERROR_CHARS = 400

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._failures: list[SaveFailure] = []
        self._count = 0

    def prepare(self) -> None:
        """Make the file and its room once (a warning if that fails: saving goes on)."""
        if self._fd is not None:
            return
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            warnings.warn(f"muster could not make {self.path}: {exc}; a failed checkpoint save "
                          "would not be recorded", RuntimeWarning, stacklevel=4)
            return
        self._fd = fd
        with contextlib.suppress(OSError):  # no room to reserve: the first write may still fit
            os.posix_fallocate(fd, 0, self.SIZE)
        self._write()

    def record(self, step: int, error: str) -> None:
        self._count += 1
        text = error if len(error) <= self.ERROR_CHARS else error[:self.ERROR_CHARS] + "…"
        failure = SaveFailure(step=step, time=time.time(), error=text)
        self._failures = [*self._failures, failure][-self.KEPT:]
        warnings.warn(f"muster: the checkpoint save for step {step} failed: {text}",
                      RuntimeWarning, stacklevel=4)
        self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        document = json.dumps(SaveFailuresDocument(count=self._count,
                                                   failures=self._failures)).encode()
        try:
            os.pwrite(self._fd, document.ljust(self.SIZE), 0)
            os.fsync(self._fd)
        except OSError as exc:
            warnings.warn(f"muster could not record a failed checkpoint save in {self.path}: "
                          f"{exc}", RuntimeWarning, stacklevel=4)


def _checked_metadata(metadata: Mapping[str, Any] | None) -> Metadata:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"checkpoint metadata must be a mapping, got {type(metadata).__name__}")
    copy = dict(metadata)
    try:
        json.dumps(copy)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"checkpoint metadata must be JSON-serialisable: {exc}") from None
    return copy


def _files_under(root: Path) -> list[Path]:
    """Every regular file below `root`; anything else (a symlink, a FIFO) is refused."""
    files = []
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            files.extend(_files_under(Path(entry.path)))
        elif entry.is_file(follow_symlinks=False):
            files.append(Path(entry.path))
        else:
            raise CheckpointError(f"{entry.path} is not a regular file or directory; "
                                  "a checkpoint holds only regular files")
    return files


def _directories_under(root: Path) -> list[Path]:
    """`root` and its subdirectories, deepest first (so each is synced after its entries)."""
    subdirectories = [Path(e.path) for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    return [d for sub in subdirectories for d in _directories_under(sub)] + [root]


def _sync_and_hash(path: Path) -> str:
    with path.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
        os.fsync(file.fileno())
    return digest


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _warn_corrupt(found: checkpoint_files.Inspection) -> None:
    warnings.warn(f"muster.harness: skipping the corrupt checkpoint {found.path}: "
                  f"{found.problem}", RuntimeWarning, stacklevel=4)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _hint(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return " (the disk is full)"
    return ""
