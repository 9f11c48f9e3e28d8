"""A new attempt resumes from the trial's latest intact checkpoint, wherever it is now.

When the run directory does not hold it (the trial restarts on another machine, or the
directory was lost), it is fetched from storage into `$MUSTER_HOME/checkpoint-cache/
<trial uuid>/<name>/` before the attempt starts, every file checked against its sha256;
`MUSTER_LATEST_CHECKPOINT` then names that copy and `ctx.checkpoint.restore()` returns it.
A checkpoint corrupt in storage is skipped with a warning (and an event) that names it,
as a corrupt local one is, and the one before it is tried.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import ColumnElement, select

from muster import checkpoint_files
from muster.checkpoint_storage.location import Location, open_backend
from muster.checkpoint_storage.transfer import CorruptInStorage, fetch_checkpoint
from muster.errors import StorageError
from muster.home import Home
from muster.states import CheckpointState, EventReason
from muster.store import Checkpoint, Store, Trial, record_event
from muster.store.actors import STORAGE

log = logging.getLogger(__name__)

__all__ = ["cache_dir", "fetch_resume_point", "resumable", "resume_point"]



def cache_dir(home: Home, trial_uuid: str) -> Path:
    return home.checkpoint_cache_dir / trial_uuid


def resume_point(run_checkpoints: Path, cache: Path) -> Path | None:
    """The latest intact checkpoint in the run directory or the cache (the later wins)."""
    found = [c for c in (checkpoint_files.latest_intact(run_checkpoints),
                         checkpoint_files.latest_intact(cache)) if c is not None]
    return max(found, key=lambda c: c.order).path if found else None


def fetch_resume_point(store: Store, home: Home, trial_id: int) -> Path | None:
    """Fetch the trial's latest checkpoint from storage when neither the run directory nor
    the cache holds it; the copy fetched, or None when none was needed or none could be had.

    Whether a copy is here is decided by its directory alone: hashing it is the launch
    plan's work (`resume_point`), which falls back to an older intact one if it is corrupt.
    A storage that cannot be reached is logged and the attempt starts from what is here.
    """
    with store.session_scope() as s:
        trial = s.get_one(Trial, trial_id)
        rows = [(r.uuid, r.name, (r.step, r.created_at or 0.0, r.name), r.storage, r.state,
                 Path(r.path))
                for r in s.scalars(select(Checkpoint).where(*resumable(trial_id)))]
        trial_uuid, experiment_id = trial.uuid, trial.experiment_id
    cache = cache_dir(home, trial_uuid)
    for uuid, name, _, storage, state, local in sorted(rows, key=lambda r: r[2], reverse=True):
        if local.is_dir() or (cache / name).is_dir():
            return None
        if state is not CheckpointState.STORED or storage is None:
            continue
        location = Location.from_json(storage)
        try:
            fetch_checkpoint(open_backend(location, home.root), uuid, cache / name, trial_id)
        except CorruptInStorage as exc:
            _skipped(store, trial_id, experiment_id, name, location.url(uuid), exc)
            continue
        except StorageError as exc:
            log.warning("trial %d: cannot fetch checkpoint %s from %s: %s", trial_id, name,
                        location.url(uuid), exc.for_log())
            return None
        return cache / name
    return None


def resumable(trial_id: int) -> tuple[ColumnElement[bool], ...]:
    """The conditions on the checkpoints a new attempt of the trial may resume from."""
    return (Checkpoint.trial_id == trial_id, Checkpoint.intact.is_(True),
            Checkpoint.state.not_in(CheckpointState.gone()))


def _skipped(store: Store, trial_id: int, experiment_id: int, name: str, url: str,
             exc: StorageError) -> None:
    message = f"skipping the corrupt checkpoint {name} in storage ({url}): {exc}"
    log.warning("trial %d: %s", trial_id, message)
    with store.session_scope() as s:
        record_event(s, entity="trial", entity_id=trial_id, reason=EventReason.RESTORE_SKIPPED,
                     actor=STORAGE, trial_id=trial_id, experiment_id=experiment_id,
                     message=message)
