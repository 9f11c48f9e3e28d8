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

from sqlalchemy import select

from muster import artifacts
from muster.errors import MusterError
from muster.home import Home
from muster.sizes import format_size
from muster.states import ArtifactState, EventReason
from muster.store import ArtifactSet, Store, Trial, record_event
from muster.store.actors import STORAGE
from muster.store.configs import experiment_config
from muster.store.models import now
from muster.words import count

__all__ = ["collect_pending"]

log = logging.getLogger(__name__)


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


