"""Determined's storage ids, as names of muster's checkpoints.

A checkpoint saved through `core_context.checkpoint` is one of muster's (the harness's
`checkpoints/step-<step:012d>-<8 hex>/`, `muster.checkpoint_files`), and its storage id is
`step-<step:012d>-<32 hex>`: its step (`metadata["steps_completed"]`) and a fresh uuid4,
chosen before the save (`store_path` hands it out before the directory has its final name)
and recorded in its metadata.json as `metadata["determined_storage_id"]`. A checkpoint saved
otherwise (by `muster.harness`, or copied in) is named by its directory name. Either way the
step in the id finds the few checkpoints to look at without reading the others.

A checkpoint is handed out only when intact (every file against its sha256), checked once
per process.
"""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any

from muster import checkpoint_files
from muster.checkpoint_files import NAME_PREFIX, Inspection

from ..errors import CheckpointNotFound, InvalidCheckpointException

STORAGE_ID_KEY = "determined_storage_id"  # where a checkpoint's metadata records its id


def new_storage_id(step: int) -> str:
    """A fresh storage id for a checkpoint of `step`."""
    return f"{NAME_PREFIX}{step:012d}-{uuid.uuid4().hex}"


def storage_id_of(found: Inspection) -> str:
    """The storage id a checkpoint records, else its directory name."""
    metadata = found.user_metadata
    recorded = metadata.get(STORAGE_ID_KEY) if isinstance(metadata, dict) else None
    return recorded if isinstance(recorded, str) and recorded else found.name


def determined_metadata(found: Inspection) -> dict[str, Any]:
    """What the script passed as the checkpoint's metadata (without the recorded id)."""
    metadata = found.user_metadata
    if not isinstance(metadata, dict):
        return {}
    return {key: value for key, value in metadata.items() if key != STORAGE_ID_KEY}


class StorageIds:
    """The trial's checkpoints by storage id: its checkpoint directory, the checkpoint
    muster named to resume from (MUSTER_LATEST_CHECKPOINT, which may lie elsewhere), and
    the experiment's warm start (MUSTER_SOURCE_CHECKPOINT: another trial's checkpoint,
    Determined's `source_trial_id` / `source_checkpoint_uuid`)."""

    def __init__(self, directory: Path, preferred: Path | None, trial_id: int | None,
                 source: Path | None = None) -> None:
        self.directory = directory
        self._preferred = preferred
        self._trial_id = trial_id
        self._source = source
        self._intact: dict[str, Inspection] = {}  # verified in this process

    def latest(self) -> str | None:
        """The storage id of the checkpoint to resume from, as `muster.harness` chooses it:
        MUSTER_LATEST_CHECKPOINT when intact, else the intact one of the highest step, else
        (a trial without one of its own) the warm start's when intact."""
        found = checkpoint_files.latest_intact(self.directory, self._preferred, _warn_corrupt,
                                               self._trial_id)
        if found is None and self._source is not None:
            found = self._warm_start(self._source)
        return None if found is None else self._remember(found)

    @staticmethod
    def _warm_start(source: Path) -> Inspection | None:
        try:
            found = checkpoint_files.inspect(source)  # another trial's, by design
        except OSError as exc:
            warnings.warn(f"muster: the warm start's checkpoint {source} cannot be read "
                          f"({exc}); starting without it", RuntimeWarning, stacklevel=4)
            return None
        if not found.intact:
            _warn_corrupt(found)
            return None
        return found

    def find(self, storage_id: str) -> Inspection:
        """The intact checkpoint `storage_id` names.

        Raises:
            CheckpointNotFound: no checkpoint of the trial has that id (never saved, or
                deleted by muster's retention).
            InvalidCheckpointException: it is there but not intact.
        """
        if storage_id in self._intact:
            return self._intact[storage_id]
        for path in self._candidates(storage_id):
            try:
                found = checkpoint_files.inspect(
                    path, None if path == self._source else self._trial_id)
            except FileNotFoundError:
                continue  # deleted since the listing
            if storage_id not in (found.name, storage_id_of(found)):
                continue
            if not found.intact:
                raise InvalidCheckpointException(
                    f"checkpoint {storage_id} ({path}) is not intact: {found.problem}")
            self._remember(found)
            return found
        raise CheckpointNotFound(
            f"no checkpoint of this trial has the storage id {storage_id!r} (looked in "
            f"{self.directory}); muster's checkpoint retention may have deleted it")

    def _candidates(self, storage_id: str) -> list[Path]:
        """The checkpoints of the id's step, the one named exactly first."""
        step = checkpoint_files.step_in_name(storage_id)
        if step is None:
            raise CheckpointNotFound(f"{storage_id!r} is not a storage id of muster's: they "
                                     "look like step-<step>-<hex>")
        paths = checkpoint_files.published(self.directory)
        if self._preferred is not None:
            paths.insert(0, self._preferred)
        if self._source is not None:
            paths.append(self._source)
        same_step = [p for p in paths if checkpoint_files.step_in_name(p.name) == step]
        return sorted(same_step, key=lambda p: p.name != storage_id)

    def _remember(self, found: Inspection) -> str:
        storage_id = storage_id_of(found)
        self._intact[storage_id] = self._intact[found.name] = found
        return storage_id


def _warn_corrupt(found: Inspection) -> None:
    warnings.warn(f"muster: skipping the corrupt checkpoint {found.path}: {found.problem}",
                  RuntimeWarning, stacklevel=4)
