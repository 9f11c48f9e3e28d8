"""The storage worker's part of artifacts: copy each `pending` artifact set
(`muster.artifacts.collect`) out of its trial's working directory, in the worker's thread, so
a large copy never holds up the supervisor's passes.

The files taken are those the working directory's owner owns: under `run_as: owner` that is
the job's account, so a file the job could not have written is left; without it the jobs
run as the server's own user, which owns both. A set is claimed `pending` → settled in one
transaction after the copy: a server killed mid-copy finds it `pending` again and copies it
anew (a half-made set is a temporary directory, removed by the next collection of that
attempt).
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from sqlalchemy import select

from muster import artifacts
from muster.checkpoint_storage import transfer
from muster.checkpoint_storage.base import Backend
from muster.checkpoint_storage.location import Location
from muster.errors import MusterError, StorageError
from muster.home import Home
from muster.sizes import format_size
from muster.states import ArtifactState, CheckpointState, EventReason
from muster.store import ArtifactSet, Experiment, Store, Trial, record_event
from muster.store.actors import STORAGE
from muster.store.configs import experiment_config
from muster.store.models import now
from muster.words import count

__all__ = ["collect_pending", "delete_stored", "recover", "upload_due"]

log = logging.getLogger(__name__)


class Storing(Protocol):
    """What uploads need of the storage worker (`worker.StorageWorker`)."""

    store: Store

    def backend(self, location: Location) -> Backend: ...

    def location_of(self, experiment: Experiment) -> Location: ...

    def uploading(self, uuid: str) -> AbstractContextManager[None]: ...


def collect_pending(store: Store, home: Home, limit: int) -> bool:
    """Copy up to `limit` pending artifact sets; whether there were any."""
    with store.session_scope() as s:
        pending = list(s.scalars(select(ArtifactSet.id).where(
            ArtifactSet.state == ArtifactState.PENDING).order_by(ArtifactSet.id).limit(limit)))
    for set_id in pending:
        _collect(store, home, set_id)
    return bool(pending)


def _collect(store: Store, home: Home, set_id: int) -> None:
    with store.session_scope() as s:
        row = s.get_one(ArtifactSet, set_id)
        trial = s.get_one(Trial, row.trial_id)
        config = experiment_config(trial.experiment)
        run = home.run_dir(trial.uuid)
        attempt, since, trial_id = row.attempt, row.since, row.trial_id
    patterns, limit = config.artifact_patterns, config.artifacts_limit
    try:
        owner = os.lstat(run.workdir).st_uid
        found = artifacts.collect(run.workdir, patterns, run.artifacts, trial_id=trial_id,
                                  attempt=attempt, since=since, limit=limit, owner=owner)
    except (MusterError, OSError) as exc:
        why = str(exc) if isinstance(exc, MusterError) else (
            f"the working directory could not be read ({exc.strerror or exc})")
        _settle_refused(store, set_id, why)
        return
    with store.session_scope() as s:
        row = s.get_one(ArtifactSet, set_id)
        row.path = str(found.path) if found.path is not None else None
        row.files = {relative: {"sha256": digest, "size": found.sizes[relative]}
                     for relative, digest in found.files.items()}
        row.size_bytes, row.file_count = found.size, len(found.files)
        row.skipped, row.skipped_count = list(found.skipped), found.skipped_count
        row.state = ArtifactState.COLLECTED if found.files else ArtifactState.EMPTY
        row.collected_at = now()
        copied = (f"{count(len(found.files), 'artifact file')} of attempt {attempt} copied "
                  f"({format_size(found.size)})" if found.files
                  else f"no artifact file of attempt {attempt} taken from {', '.join(patterns)}")
        left = (f"; {count(found.skipped_count, 'matching file')} left, e.g. {found.skipped[0]}"
                if found.skipped_count else "")
        message = copied + left
        record_event(s, entity="trial", entity_id=trial_id,
                     reason=EventReason.ARTIFACTS_COLLECTED, actor=STORAGE, trial_id=trial_id,
                     experiment_id=s.get_one(Trial, trial_id).experiment_id, message=message)


def _settle_refused(store: Store, set_id: int, why: str) -> None:
    with store.session_scope() as s:
        row = s.get_one(ArtifactSet, set_id)
        row.state, row.message, row.collected_at = ArtifactState.REFUSED, why, now()
        record_event(s, entity="trial", entity_id=row.trial_id,
                     reason=EventReason.ARTIFACTS_REFUSED, actor=STORAGE,
                     trial_id=row.trial_id,
                     experiment_id=s.get_one(Trial, row.trial_id).experiment_id,
                     message=f"the artifacts of attempt {row.attempt} were not kept: {why}")
    log.warning("artifact set %d refused: %s", set_id, why)




# -- into checkpoint storage ---------------------------------------------------------------


def upload_due(worker: Storing, limit: int) -> bool:
    """Upload up to `limit` collected sets that are due (`local`, or `upload_failed` whose
    retry is due) to their experiment's checkpoint storage, as a checkpoint is uploaded
    (`transfer.upload_checkpoint`: every file's sha256 checked as it is sent, metadata.json
    last); whether there were any."""
    at = now()
    with worker.store.session_scope() as s:
        rows = s.execute(
            select(ArtifactSet, Experiment).join(Trial, Trial.id == ArtifactSet.trial_id)
            .join(Experiment, Experiment.id == Trial.experiment_id)
            .where(ArtifactSet.state == ArtifactState.COLLECTED,
                   Experiment.delete_requested_at.is_(None),
                   (ArtifactSet.storage_state == CheckpointState.LOCAL)
                   | ((ArtifactSet.storage_state == CheckpointState.UPLOAD_FAILED)
                      & (ArtifactSet.next_try_at <= at)))
            .order_by(ArtifactSet.id).limit(limit)).all()
        claimed = []
        for row, experiment in rows:
            if row.path is None:  # (a collected set has its directory)
                continue
            location = (Location.from_json(row.storage) if row.storage
                        else worker.location_of(experiment))
            row.storage_state, row.storage = CheckpointState.UPLOADING, location.to_json()
            claimed.append((row.id, location, Path(row.path), row.uuid, row.trial_id))
    for set_id, location, path, uuid, trial_id in claimed:
        try:
            with worker.uploading(uuid):
                transfer.upload_checkpoint(worker.backend(location), path, uuid, trial_id)
        except StorageError as exc:
            _upload_failed(worker.store, set_id, location, exc)
        else:
            with worker.store.session_scope() as s:
                row = s.get_one(ArtifactSet, set_id)
                if row.storage_state is CheckpointState.UPLOADING:
                    row.storage_state, row.stored_at, row.error, row.next_try_at = (
                        CheckpointState.STORED, now(), None, None)
    return bool(claimed)


def _upload_failed(store: Store, set_id: int, location: Location, exc: StorageError) -> None:
    retry = not isinstance(exc, transfer.CheckpointChanged)
    with store.session_scope() as s:
        row = s.get_one(ArtifactSet, set_id)
        row.upload_tries += 1
        delay = transfer.retry_delay(row.upload_tries)
        row.storage_state, row.error = CheckpointState.UPLOAD_FAILED, str(exc)
        row.next_try_at = now() + delay if retry else None
        then = (f"tried again in {delay:.0f} s" if retry
                else "not tried again: the local copy is no longer what was collected")
        record_event(s, entity="trial", entity_id=row.trial_id,
                     reason=EventReason.CHECKPOINT_UPLOAD_FAILED, actor=STORAGE,
                     trial_id=row.trial_id,
                     experiment_id=s.get_one(Trial, row.trial_id).experiment_id,
                     message=f"uploading the artifacts of attempt {row.attempt} to "
                             f"{location.url()} failed (try {row.upload_tries}): {exc}; "
                             f"{then}")
    log.warning("artifact set %d: upload to %s failed: %s", set_id, location.url(),
                exc.for_log())


def recover(store: Store) -> None:
    """After a restart: uploads cut short are redone."""
    with store.session_scope() as s:
        for row in s.scalars(select(ArtifactSet).where(
                ArtifactSet.storage_state == CheckpointState.UPLOADING)):
            row.storage_state = CheckpointState.LOCAL


def delete_stored(worker: Storing, experiment_id: int) -> bool:
    """Remove a deleted experiment's artifact sets from storage (their local copies go with
    the run directories); whether none is left there (False: storage refused, tried
    again)."""
    with worker.store.session_scope() as s:
        doomed = [(row.id, row.uuid, row.storage) for row in s.scalars(
            select(ArtifactSet).join(Trial, Trial.id == ArtifactSet.trial_id).where(
                Trial.experiment_id == experiment_id, ArtifactSet.storage.is_not(None),
                ArtifactSet.storage_state != CheckpointState.DELETED))]
    left = False
    for set_id, uuid, storage in doomed:
        assert storage is not None  # (selected so)
        try:
            transfer.delete_checkpoint(worker.backend(Location.from_json(storage)), uuid)
        except StorageError as exc:
            log.warning("artifact set %d: deletion not finished, tried again later: %s",
                        set_id, exc.for_log())
            left = True
            continue
        with worker.store.session_scope() as s:
            s.get_one(ArtifactSet, set_id).storage_state = CheckpointState.DELETED
    return not left
