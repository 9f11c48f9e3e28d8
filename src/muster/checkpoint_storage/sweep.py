"""Orphans in storage: what no checkpoint of the store references, found and removed.

An orphan is a prefix `<uuid>/` without metadata.json whose every object is older than a
bound (an upload that never finished, and will not be redone as it is: a redo re-sends
every file), the leftovers of a checkpoint the store says is deleted, and a write begun
and never finished (an S3 multipart upload, a shared_fs temporary file) older than the
bound. Prefixes whose name is not a UUID are not muster's and are never touched; nor is
anything of an upload running now (`busy`).
"""

from __future__ import annotations

import time
import uuid as uuids
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from muster.checkpoint_files import METADATA_FILE
from muster.checkpoint_storage.base import Backend
from muster.states import CheckpointState

__all__ = ["SweepReport", "sweep_location"]


@dataclass
class SweepReport:
    prefixes_deleted: int = 0
    objects_deleted: int = 0
    uploads_aborted: int = 0
    directories_removed: int = 0  # shared_fs: made for a write that never came
    saves_removed: int = 0  # run directories' checkpoint saves nobody writes any more

    def __iadd__(self, other: SweepReport) -> SweepReport:
        self.prefixes_deleted += other.prefixes_deleted
        self.objects_deleted += other.objects_deleted
        self.uploads_aborted += other.uploads_aborted
        self.directories_removed += other.directories_removed
        self.saves_removed += other.saves_removed
        return self


def sweep_location(backend: Backend, states: Mapping[str, CheckpointState],
                   busy: Collection[str], older_than: float, at: float) -> SweepReport:
    """Sweep one storage. `states` maps each checkpoint uuid the store knows to its state."""
    report = SweepReport()
    for child in list(backend.children()):
        if _is_uuid(child) and child not in busy:
            _sweep_prefix(backend, child, states.get(child), older_than, at, report)
    for upload in backend.open_uploads():
        owner = upload.key.split("/", 1)[0]
        if owner not in busy and at - upload.started_at >= older_than:
            backend.abort_upload(upload)
            report.uploads_aborted += 1
    # Measured from now: what this sweep emptied was touched just now, and goes once it has
    # been left alone as long as anything else.
    report.directories_removed += backend.tidy(older_than, max(at, time.time()))
    return report


def _sweep_prefix(backend: Backend, uuid: str, state: CheckpointState | None,
                  older_than: float, at: float, report: SweepReport) -> None:
    objects = list(backend.list(f"{uuid}/"))
    if not objects:
        return
    deleted = state is CheckpointState.DELETED
    complete = any(o.key == f"{uuid}/{METADATA_FILE}" for o in objects)
    abandoned = not complete and all(at - o.modified_at >= older_than for o in objects)
    referenced = state is not None and state.keeps_storage()
    if deleted or (abandoned and not referenced):
        keys = sorted(o.key for o in objects)
        keys.sort(key=lambda k: k != f"{uuid}/{METADATA_FILE}")  # metadata.json first
        backend.delete(keys)
        report.prefixes_deleted += 1
        report.objects_deleted += len(keys)


def _is_uuid(name: str) -> bool:
    try:
        return str(uuids.UUID(name)) == name
    except ValueError:
        return False
