"""Checkpoints: saved whole or not at all, and restored only when every byte verifies.

A save writes into `checkpoints/.tmp-…/`, fsyncs every file, writes `metadata.json` with
the sha256 of each file, and renames the directory into place as
`checkpoints/step-<step:012d>-<8 hex>/`; the platform sees only complete checkpoints.
`checkpoints/` belongs to the trial: every attempt saves into and restores from it.

A sharded save (`save_sharded`, `save_sharded_async`: torch.distributed.checkpoint) is one
directory every rank writes its shard into; rank 0 publishes it the same way once every
rank said its part is written (`muster.harness.sharded`). A publication also removes the
saves in progress that nobody writes into any more (`checkpoint_files.abandoned`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import threading
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
from muster.harness.sharded import PARTS_TIMEOUT_S, PendingSave, ShardedSave, Waitable

METADATA_FILE = checkpoint_files.METADATA_FILE
COMMIT_WAIT_S = 5.0  # how long close() lets a publication that began its rename finish
# From SaveFailures.record up to the training code's `with ctx.checkpoint.save(...)`: record,
# _record_failure, _failures_recorded, its __exit__, the save generator, its __exit__, the
# caller. The failure's warning points there.
USER_FRAME = 7


class CheckpointError(MusterError):
    """A checkpoint could not be saved; nothing of it was published (nor left behind, but
    for a sharded save's directory, removed once every rank is done with it)."""


class Checkpoint(NamedTuple):
    """An intact checkpoint found by `restore()`."""

    path: Path
    step: int
    time: float
    metadata: Metadata  # what the training code passed to save(metadata=...)
    # Not the trial's own: the experiment's warm start (`searcher.source_*`), another
    # trial's checkpoint. Load its weights; its step and counters are that trial's.
    warm_start: bool = False


class Saver(NamedTuple):
    """Who saves: recorded in each checkpoint's metadata.json."""

    trial_id: int | None
    attempt: int
    rank: int
    hparams: Mapping[str, Any]
    world_size: int = 1  # the ranks a sharded save waits for


class Checkpoints:
    """`ctx.checkpoint`: save and restore the trial's checkpoints.

    Normally only rank 0 saves (all ranks hold the same state); any rank may, and
    metadata.json records which one did. A sharded save is entered by every rank together.
    """

    def __init__(
        self, directory: Path, saver: Saver, heartbeat: Heartbeat, preferred: Path | None,
        before_publish: Callable[[], None] = lambda: None,
        failures: SaveFailures | None = None, source: Path | None = None,
    ) -> None:
        self.directory = directory
        # A warm start's checkpoint (MUSTER_SOURCE_CHECKPOINT), outside `directory`.
        self._source = source
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
        self._sharded_saves = 0  # how many this process began: the next one's number
        self._pending: list[tuple[PendingSave, ShardedSave]] = []  # written in the background

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
        with self._failures_recorded(step, USER_FRAME), \
                self._saving(step, user_metadata) as tmp:
            yield tmp

    @contextmanager
    def save_sharded(
        self, step: int, metadata: Mapping[str, Any] | None = None, *,
        timeout: float = PARTS_TIMEOUT_S,
    ) -> Iterator[Path]:
        """The directory every rank writes its shard of `step` into (`dcp.save(state,
        checkpoint_id=path)`); published by rank 0 once every rank's block ended.

        Every rank calls it, in the same order as its other sharded saves, with the same
        step. A rank other than 0 returns once its part is written; rank 0 waits up to
        `timeout` seconds for theirs, then publishes the directory, hashed like any save,
        with its own `metadata`. A rank whose block raises says so, and nothing is published.

        Raises:
            CheckpointError: the block raised, or (rank 0) a rank failed or did not finish
                within `timeout`, or publishing failed; nothing was published.
            TypeError, ValueError: `step` is not an int ≥ 0, `metadata` is not a JSON object,
                or `timeout` is not a positive number.
        """
        step, user_metadata, timeout = _checked_sharded(step, metadata, timeout)
        with self._failures_recorded(step, USER_FRAME):
            sharded = self._begin_sharded(step)
            with self._writing(sharded):
                yield sharded.path
            self._finish_part(sharded, user_metadata, timeout, None)
        self._heartbeat.progress(time.time(), step)

    def save_sharded_async(
        self, step: int, start: Callable[[Path], Waitable],
        metadata: Mapping[str, Any] | None = None, *, timeout: float = PARTS_TIMEOUT_S,
    ) -> PendingSave:
        """A sharded save of `step` written in the background: `start(path)` begins the
        write and returns its future (`dcp.async_save(state, checkpoint_id=path)`); once it
        resolves, the save finishes as `save_sharded`'s does, on a thread of the harness.

        The training loop goes on at once. A failed future is recorded like any failed save
        and publishes nothing; `init()`'s end waits a bounded time for what is pending.

        Raises:
            CheckpointError: `start` raised; nothing was published.
            TypeError, ValueError: as `save_sharded`.
        """
        step, user_metadata, timeout = _checked_sharded(step, metadata, timeout)
        with self._failures_recorded(step, USER_FRAME - 1):  # not a generator
            sharded = self._begin_sharded(step)
            with self._writing(sharded):
                future = start(sharded.path)
        pending = PendingSave(sharded.path, step)
        self._pending = [(p, s) for p, s in self._pending if not p.done()] + [(pending, sharded)]
        threading.Thread(target=self._finish_in_background,
                         args=(sharded, future, pending, user_metadata, timeout),
                         name=f"muster-checkpoint-{step}", daemon=True).start()
        return pending

    def close(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the saves written in the background; give up the
        ones still going, each recorded as a failed save (which warns)."""
        deadline = time.monotonic() + timeout
        for pending, sharded in self._pending:
            if pending.wait(max(0.0, deadline - time.monotonic())):
                continue
            if pending.drop():
                problem = (f"the sharded checkpoint for step {pending.step} was still being "
                           f"written when muster.harness.init() ended (after waiting "
                           f"{timeout:g} s); it was dropped and is not published")
                sharded.give_up(problem)
                self._record_failure(pending.step, problem, USER_FRAME)  # through init()
            else:
                pending.wait(COMMIT_WAIT_S)  # its rename began: it ends in a moment
        self._pending = []

    @contextmanager
    def _failures_recorded(self, step: int, frame: int,
                           pending: PendingSave | None = None) -> Iterator[None]:
        """Record a save that fails (even when the training code catches the error); one
        dropped by `close` was recorded there. `frame`: the caller's, for the warning."""
        if self._failures is not None:
            self._failures.prepare()
        try:
            yield
        except CheckpointError as exc:
            if pending is None or not pending.dropped():
                self._record_failure(step, str(exc), frame)
            raise
        except KeyboardInterrupt:
            self._record_failure(step, "interrupted (KeyboardInterrupt) while saving", frame)
            raise

    def _record_failure(self, step: int, error: str, frame: int) -> None:
        """Record and warn; `frame` counts the frames up to the training code's from
        `_failures_recorded`'s (`USER_FRAME` through a `with`), where the warning points."""
        if self._failures is not None:
            self._failures.record(step, error, stacklevel=frame)
        else:
            warnings.warn(f"muster: the checkpoint save for step {step} failed: {error}",
                          RuntimeWarning, stacklevel=frame - 1)

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

    def _begin_sharded(self, step: int) -> ShardedSave:
        """This rank's view of the next sharded save; its directory made, its accounting
        written (every rank's: the checkpoint says the steps before it are done)."""
        self._heartbeat.progress(time.time(), step)
        self._sharded_saves += 1
        saver = self._saver
        name = checkpoint_files.sharded_name(step, saver.attempt, self._sharded_saves)
        sharded = ShardedSave(self.directory / name, step, saver.rank, saver.world_size)
        doing = f"creating {sharded.path}"
        try:
            sharded.path.mkdir(parents=True, exist_ok=True)
            # A local run is always attempt 1: a run before it may have left this name.
            checkpoint_files.part_file(sharded.path, saver.rank).unlink(missing_ok=True)
            doing = "writing the sample counts and metrics it accounts for"
            self._before_publish()
        except OSError as exc:
            sharded.give_up(f"{doing} failed: {exc}")
            raise CheckpointError(
                f"Could not start the sharded checkpoint for step {step} on rank "
                f"{saver.rank}: {doing} failed: {exc}{_hint(exc)}; it will not be published"
            ) from exc
        return sharded

    @contextmanager
    def _writing(self, sharded: ShardedSave) -> Iterator[None]:
        """A rank whose writing raised gives up the save, so that rank 0 stops waiting."""
        try:
            yield
        except Exception as exc:
            sharded.give_up(f"{type(exc).__name__}: {exc}")
            raise CheckpointError(
                f"Sharded checkpoint for step {sharded.step} failed on rank {sharded.rank} "
                f"({type(exc).__name__}: {exc}); it will not be published") from exc
        except BaseException as exc:
            sharded.give_up(f"interrupted ({type(exc).__name__})")
            raise

    def _finish_part(self, sharded: ShardedSave, user_metadata: Metadata, timeout: float,
                     pending: PendingSave | None) -> Path | None:
        """Say this rank's part is written; rank 0 publishes instead, once every rank's is.
        The published checkpoint on rank 0, else None."""
        commit = pending.commit if pending is not None else (lambda: True)
        if sharded.rank != 0:
            if not commit():
                raise CheckpointError("muster.harness.init() ended before the part was written")
            try:
                sharded.finish_part()
            except OSError as exc:
                raise CheckpointError(
                    f"Could not finish the sharded checkpoint for step {sharded.step} on rank "
                    f"{sharded.rank}: writing its part file failed: {exc}{_hint(exc)}; it "
                    "will not be published") from exc
            return None
        dropped = pending.dropped if pending is not None else (lambda: False)
        problem = sharded.other_ranks_problem(timeout, dropped)
        if problem is not None:
            sharded.give_up(problem)
            raise CheckpointError(f"The sharded checkpoint for step {sharded.step} was not "
                                  f"published: {problem}")
        checkpoint_files.remove_parts(sharded.path)  # muster's, not the checkpoint's
        return self._publish(sharded.path, sharded.step, user_metadata, sharded.world_size,
                             commit)

    def _finish_in_background(self, sharded: ShardedSave, future: Waitable,
                              pending: PendingSave, user_metadata: Metadata,
                              timeout: float) -> None:
        try:
            with self._failures_recorded(sharded.step, USER_FRAME, pending):  # no user frame
                with self._writing(sharded):
                    future.result()
                published = self._finish_part(sharded, user_metadata, timeout, pending)
        except BaseException as exc:  # noqa: BLE001 - recorded, and raised by result()
            pending.end(None, exc)
        else:
            pending.end(published, None)

    def restore(self) -> Checkpoint | None:
        """The latest intact checkpoint (highest step, then newest), or None.

        MUSTER_LATEST_CHECKPOINT wins when it is intact. A corrupt checkpoint (metadata
        missing or malformed, a file missing or changed) is skipped with a RuntimeWarning
        that names it and what is wrong. A trial without an intact checkpoint of its own
        gets its experiment's warm start, when it has one (MUSTER_SOURCE_CHECKPOINT,
        `warm_start` true): another trial's checkpoint, which the trial's own directory
        never counts as one of its own.
        """
        found = checkpoint_files.latest_intact(self.directory, self._preferred, _warn_corrupt,
                                               self._saver.trial_id)
        warm_start = found is None and self._source is not None
        if found is None and self._source is not None:
            found = self._warm_start(self._source)
        if found is None:
            return None
        user_metadata = found.user_metadata
        return Checkpoint(path=found.path, step=found.step, time=found.saved_at or 0.0,
                          metadata=user_metadata if isinstance(user_metadata, dict) else {},
                          warm_start=warm_start)

    @staticmethod
    def _warm_start(source: Path) -> checkpoint_files.Inspection | None:
        """The warm start's checkpoint when intact (any trial's: it is another's by design)."""
        try:
            found = checkpoint_files.inspect(source)
        except OSError as exc:
            warnings.warn(f"muster.harness: the warm start's checkpoint {source} cannot be "
                          f"read ({exc}); starting without it", RuntimeWarning, stacklevel=3)
            return None
        if not found.intact:
            warnings.warn(f"muster.harness: skipping the warm start's corrupt checkpoint "
                          f"{source}: {found.problem}", RuntimeWarning, stacklevel=3)
            return None
        return found

    latest = restore

    def _make_tmp(self, step: int) -> Path:
        tmp = self.directory / checkpoint_files.in_progress_name(step, self._saver.attempt)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
        except OSError as exc:
            raise CheckpointError(
                f"Could not start the checkpoint for step {step}: creating {tmp} failed: "
                f"{exc}{_hint(exc)}"
            ) from exc
        return tmp

    def _publish(self, tmp: Path, step: int, user_metadata: Metadata,
                 world_size: int | None = None,
                 commit: Callable[[], bool] = lambda: True) -> Path:
        """Sync and hash the files, write metadata.json, rename into place (unless `commit`
        says no), sync the parent; then remove the saves nobody writes into any more."""
        final = self.directory / checkpoint_files.new_name(step)
        doing, renamed = f"listing {tmp}", False
        try:
            files: dict[str, str] = {}
            for path in _files_under(tmp):
                doing = f"syncing and hashing {path}"
                files[path.relative_to(tmp).as_posix()] = _sync_and_hash(path)
            doing = f"writing {tmp / METADATA_FILE}"
            document = self._metadata(step, user_metadata, files, world_size)
            _write_synced(tmp / METADATA_FILE, document)
            doing = f"syncing {tmp}"
            for directory in _directories_under(tmp):
                fsync_dir(directory)
            doing = f"renaming {tmp} to {final}"
            if not commit():
                raise CheckpointError("muster.harness.init() ended first")
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
        self._remove_abandoned()
        return final

    def _remove_abandoned(self) -> None:
        """Tidy up after a save: what an earlier attempt left, and sharded saves every rank
        of this one has finished with; never one this process still writes."""
        attempt = self._saver.attempt
        keep = {pending.path for pending, _ in self._pending if not pending.done()}
        with contextlib.suppress(OSError):  # tidying only: the next save tries again
            checkpoint_files.remove_abandoned(self.directory, attempt, {attempt}, keep=keep)

    def _metadata(self, step: int, user_metadata: Metadata, files: dict[str, str],
                  world_size: int | None) -> bytes:
        if METADATA_FILE in files:
            raise CheckpointError(f"{METADATA_FILE} is muster's name in a checkpoint; "
                                  "save your own metadata under another name or as metadata=")
        document = CheckpointDocument(
            step=step, time=time.time(), trial_id=self._saver.trial_id,
            attempt=self._saver.attempt, rank=self._saver.rank,
            hparams=dict(self._saver.hparams), metadata=user_metadata, files=files)
        if world_size is not None:
            document["world_size"] = world_size
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
    Saves written in the background record from their own threads.
    """

    SIZE = 4096
    KEPT = 5  # the latest failures named; all are counted
    ERROR_CHARS = 400

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._failures: list[SaveFailure] = []
        self._count = 0
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Make the file and its room once (a warning if that fails: saving goes on)."""
        with self._lock:
            self._prepare()

    def _prepare(self) -> None:
        if self._fd is not None:
            return
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            warnings.warn(f"muster could not make {self.path}: {exc}; a failed checkpoint save "
                          "would not be recorded", RuntimeWarning, stacklevel=5)
            return
        self._fd = fd
        with contextlib.suppress(OSError):  # no room to reserve: the first write may still fit
            os.posix_fallocate(fd, 0, self.SIZE)
        self._write()

    def record(self, step: int, error: str, stacklevel: int = 4) -> None:
        text = error if len(error) <= self.ERROR_CHARS else error[:self.ERROR_CHARS] + "…"
        with self._lock:
            self._count += 1
            failure = SaveFailure(step=step, time=time.time(), error=text)
            self._failures = [*self._failures, failure][-self.KEPT:]
            self._write()
        warnings.warn(f"muster: the checkpoint save for step {step} failed: {text}",
                      RuntimeWarning, stacklevel=stacklevel)

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


def _checked_sharded(step: int, metadata: Mapping[str, Any] | None,
                     timeout: float) -> tuple[int, Metadata, float]:
    step = check_count(step, "checkpoint.save_sharded: step")
    user_metadata = _checked_metadata(metadata)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"checkpoint.save_sharded: timeout must be a positive number of "
                         f"seconds, got {timeout=}")
    return step, user_metadata, float(timeout)


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
