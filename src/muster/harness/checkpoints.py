"""Checkpoints: saved whole or not at all, and restored only when every byte verifies.

A save writes into `checkpoints/.tmp-…/`, fsyncs every file, writes `metadata.json` with
the sha256 of each file, and renames the directory into place as
`checkpoints/step-<step:012d>-<8 hex>/`; the platform sees only complete checkpoints.
`checkpoints/` belongs to the trial: every attempt saves into and restores from it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from muster.atomic import fsync_dir
from muster.errors import MusterError
from muster.harness.arguments import check_count
from muster.harness.heartbeat import Heartbeat

METADATA_FILE = "metadata.json"
NAME_PREFIX = "step-"
TMP_PREFIX = ".tmp-"


class CheckpointError(MusterError):
    """A checkpoint could not be saved; nothing of it was left behind."""


class Checkpoint(NamedTuple):
    """An intact checkpoint found by `restore()`."""

    path: Path
    step: int
    time: float
    metadata: dict[str, Any]  # what the training code passed to save(metadata=...)


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
        self, directory: Path, saver: Saver, heartbeat: Heartbeat, preferred: Path | None
    ) -> None:
        self.directory = directory
        self._saver = saver
        self._heartbeat = heartbeat
        self._preferred = preferred

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
        self._publish(tmp, step, user_metadata)
        self._heartbeat.progress(time.time(), step)

    def restore(self) -> Checkpoint | None:
        """The latest intact checkpoint (highest step, then newest), or None.

        MUSTER_LATEST_CHECKPOINT wins when it is intact. A corrupt checkpoint (metadata
        missing or malformed, a file missing or changed) is skipped with a RuntimeWarning
        that names it.
        """
        checked: set[Path] = set()
        if self._preferred is not None:
            found = _verified(self._preferred, _read_metadata(self._preferred))
            checked.add(self._preferred.resolve())
            if found is not None:
                return found
        for path, metadata in self._candidates():
            if path.resolve() in checked:
                continue
            found = _verified(path, metadata)
            if found is not None:
                return found
        return None

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

    def _publish(self, tmp: Path, step: int, user_metadata: dict[str, Any]) -> None:
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
        except (OSError, CheckpointError) as exc:
            _remove(final if renamed else tmp)
            raise CheckpointError(
                f"Could not save the checkpoint for step {step}: {doing} failed: "
                f"{exc}{_hint(exc)}; nothing was saved"
            ) from exc

    def _metadata(self, step: int, user_metadata: dict[str, Any], files: dict[str, str]) -> bytes:
        if METADATA_FILE in files:
            raise CheckpointError(f"{METADATA_FILE} is muster's name in a checkpoint; "
                                  "save your own metadata under another name or as metadata=")
        document = {
            "step": step,
            "time": time.time(),
            "trial_id": self._saver.trial_id,
            "attempt": self._saver.attempt,
            "rank": self._saver.rank,
            "hparams": dict(self._saver.hparams),
            "metadata": user_metadata,
            "files": files,
        }
        return json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"

    def _candidates(self) -> list[tuple[Path, Any]]:
        """Published checkpoints with their parsed metadata (None when unreadable), best first."""
        found = []
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        for entry in entries:
            step = _step_in_name(entry.name)
            if step is None or not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            metadata = _read_metadata(path)
            saved_at = metadata.get("time") if isinstance(metadata, dict) else None
            found.append((step, saved_at if isinstance(saved_at, int | float) else 0.0,
                          path, metadata))
        found.sort(key=lambda c: (c[0], c[1], c[2].name), reverse=True)
        return [(path, metadata) for _, _, path, metadata in found]


def _checked_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
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


def _step_in_name(name: str) -> int | None:
    """The step in `step-<12 digits>-<8 hex>`, or None for any other name."""
    if not name.startswith(NAME_PREFIX):
        return None
    digits, _, suffix = name.removeprefix(NAME_PREFIX).partition("-")
    if len(digits) != 12 or not digits.isdigit() or len(suffix) != 8:
        return None
    if any(c not in "0123456789abcdef" for c in suffix):
        return None
    return int(digits)


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


def _read_metadata(path: Path) -> Any:
    """The parsed metadata.json of the checkpoint at `path`, or None when it is unreadable."""
    try:
        return json.loads((path / METADATA_FILE).read_bytes())
    except (OSError, ValueError):
        return None


def _verified(path: Path, metadata: Any) -> Checkpoint | None:
    """The checkpoint at `path` if every file's sha256 matches; else warn and return None."""
    problem = _problem(path, metadata)
    if problem is not None:
        warnings.warn(f"muster.harness: skipping the corrupt checkpoint {path}: {problem}",
                      RuntimeWarning, stacklevel=3)
        return None
    user_metadata = metadata.get("metadata")
    return Checkpoint(path=path, step=metadata["step"], time=float(metadata["time"]),
                      metadata=user_metadata if isinstance(user_metadata, dict) else {})


def _problem(path: Path, metadata: Any) -> str | None:
    """What is wrong with the checkpoint at `path`, or None when it is intact."""
    if metadata is None:
        return f"{METADATA_FILE} is missing or not valid JSON"
    if not isinstance(metadata, dict):
        return f"{METADATA_FILE} is not a JSON object"
    files, step, saved_at = metadata.get("files"), metadata.get("step"), metadata.get("time")
    if not (isinstance(files, dict) and type(step) is int and isinstance(saved_at, int | float)):
        return f"{METADATA_FILE} lacks its step, time or files"
    for name, expected in files.items():
        file = path / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            return f"{METADATA_FILE} names a file outside the checkpoint: {name!r}"
        try:
            with file.open("rb") as handle:
                actual = hashlib.file_digest(handle, "sha256").hexdigest()
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
        if actual != expected:
            return f"{name} does not match its sha256 in {METADATA_FILE}"
    return None


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _hint(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return " (the disk is full)"
    return ""
