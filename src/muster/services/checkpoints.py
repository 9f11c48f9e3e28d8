"""Downloading a registered checkpoint: what the route calls, and what tests call directly.

Only an intact checkpoint is sent, and only while it still is: the directory is checked
against metadata.json and its registration before the first byte, and each file against
its sha256 as it is sent (`muster.checkpoint_archive`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from muster import checkpoint_archive
from muster.checkpoint_archive import ArchivePlan, CheckpointFolder, Registered
from muster.checkpoint_files import METADATA_FILE
from muster.checkpoint_storage.location import Location, open_backend
from muster.checkpoint_storage.resume import cache_dir
from muster.checkpoint_storage.transfer import fetch_checkpoint
from muster.errors import Conflict, Gone, NotFound
from muster.home import Home
from muster.services.experiments import trial_or_404
from muster.services.retention import checkpoint_row
from muster.states import CheckpointState
from muster.store import Checkpoint, Store, Trial


@dataclass
class CheckpointDownload:
    """One checkpoint, open and checked, ready to send as a tar of `size` bytes."""

    filename: str
    plan: ArchivePlan
    folder: CheckpointFolder

    @property
    def size(self) -> int:
        return self.plan.size

    def chunks(self) -> Iterator[bytes]:
        """The archive's bytes (see `checkpoint_archive.archive_chunks`); the directory is
        let go at the end."""
        try:
            yield from checkpoint_archive.archive_chunks(self.plan, self.folder)
        finally:
            self.folder.close()

    def close(self) -> None:
        self.folder.close()


def open_checkpoint_download(store: Store, trial_id: int, name: str) -> CheckpointDownload:
    """Trial `trial_id`'s registered checkpoint `name`, opened for download.

    Raises:
        NotFound: no such trial, or it has no checkpoint of that name.
        Conflict: the checkpoint was not intact when registered, was deleted, or has
            changed since.
        Gone: retention removed it with its trial's run.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        row = s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial_id,
                                                 Checkpoint.name == name)).one_or_none()
        if row is None:
            raise NotFound(f"trial {trial_id} has no checkpoint {name!r}; `muster checkpoint "
                           f"list {trial_id}` shows its checkpoints")
        if not row.intact:
            raise Conflict(f"checkpoint {name} of trial {trial_id} is not intact ({row.problem})"
                           "; only an intact checkpoint can be downloaded")
        _check_not_deleted(row, trial, f"checkpoint {name} of trial {trial_id}")
        path, registered = Path(row.path), Registered(row.file_count, row.size_bytes)
    try:
        return _opened(path, trial_id, name, registered)
    except Conflict as exc:
        raise Conflict(f"checkpoint {name} of trial {trial_id} has changed since it was "
                       f"registered intact: {exc}; it cannot be downloaded") from exc


def open_any_download(store: Store, home: Home, checkpoint: str) -> CheckpointDownload:
    """A checkpoint by id or uuid, opened for download from its run directory, or, when that
    no longer holds it intact, from storage (fetched into the cache and verified first).

    Raises:
        NotFound: no such checkpoint.
        Conflict: it is not intact, deleted, or neither here nor in storage intact.
        Gone: retention removed it with its trial's run.
    """
    with store.session_scope() as s:
        row = checkpoint_row(s, checkpoint)
        trial = s.get_one(Trial, row.trial_id)
        what = f"checkpoint {row.id} ({row.name} of trial {row.trial_id})"
        if not row.intact:
            raise Conflict(f"{what} is not intact ({row.problem}); only an intact checkpoint "
                           "can be downloaded")
        _check_not_deleted(row, trial, what)
        path, name, trial_id, uuid = Path(row.path), row.name, row.trial_id, row.uuid
        registered = Registered(row.file_count, row.size_bytes)
        storage = row.storage if row.state is CheckpointState.STORED else None
        cached = cache_dir(home, trial.uuid) / name
    try:
        return _opened(path, trial_id, name, registered)
    except Conflict as exc:
        if storage is None:
            raise Conflict(f"{what} is no longer intact in its run directory ({exc}) and is "
                           "not in storage") from exc
    if not cached.is_dir():
        backend = open_backend(Location.from_json(storage), home.root)
        fetch_checkpoint(backend, uuid, cached, trial_id)
    return _opened(cached, trial_id, name, registered)


def _check_not_deleted(row: Checkpoint, trial: Trial, what: str) -> None:
    """Raise when the checkpoint's deletion has begun: `Gone` when retention removed its
    trial's run (the reason says when and by which rule), else `Conflict` (GC's reason)."""
    if row.state.is_gone():
        refusal = Gone if trial.files_removed_at is not None else Conflict
        raise refusal(f"{what} was deleted ({row.gc_reason})")


def _opened(path: Path, trial_id: int, name: str, registered: Registered) -> CheckpointDownload:
    """The directory held open and checked; `Conflict` with what is wrong when it cannot be."""
    try:
        folder = CheckpointFolder(path)
    except OSError as exc:
        raise Conflict(f"its directory {path} cannot be opened ({exc.strerror or exc})") from exc
    try:
        plan = checkpoint_archive.plan_archive(name, folder.read(METADATA_FILE), folder.files(),
                                               registered)
    except OSError as exc:
        folder.close()
        raise Conflict(f"it cannot be read ({exc.strerror or exc})") from exc
    except BaseException:
        folder.close()
        raise
    return CheckpointDownload(checkpoint_archive.archive_name(trial_id, name), plan, folder)
