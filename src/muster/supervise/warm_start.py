"""A warm start's checkpoint, copied into a trial's run directory before its launch.

While a warm-started trial (its experiment's `searcher.source_*`, resolved to one checkpoint
at submission: `muster.services.warm_starts`; or a PBT member, from its parent's checkpoint,
`Trial.source_checkpoint_id`) has no checkpoint of its own, its launch plan
names `source/<name>/` in its run directory as MUSTER_SOURCE_CHECKPOINT, and the launch
puts the checkpoint there first (`copy_source`): from the run directory of the trial that
saved it, held open and read without following links, every file checked against its
sha256 and what its registration counted as it is copied (`muster.checkpoint_archive`); or,
when that directory no longer holds it intact, fetched from checkpoint storage and checked
the same way. The copy is judged by the one checkpoint rule (as the checkpoint of the trial
that saved it) and takes its name only when whole; a copy already there and intact is kept,
so every attempt that starts from the source starts from the same bytes. Only a checkpoint
row's directory or storage is ever read, never a path a user writes.

Once copied, the trial no longer needs the source; until its experiment has ended, GC and
`experiment delete` keep the source for the trials still to launch
(`muster.checkpoint_storage.pins`).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from muster import checkpoint_archive, checkpoint_files
from muster.checkpoint_archive import CheckpointFolder, Registered
from muster.checkpoint_files import METADATA_FILE
from muster.checkpoint_storage.location import Location, open_backend
from muster.checkpoint_storage.transfer import fetch_checkpoint
from muster.errors import Conflict, LaunchError, MusterError
from muster.home import Home
from muster.rundir import RunDir
from muster.store import Checkpoint, Experiment, Trial

__all__ = ["Source", "copy_source", "source_of", "source_of_trial"]


@dataclass(frozen=True)
class Source:
    """An experiment's warm start as its checkpoint's row has it, read in one transaction."""

    uuid: str
    name: str
    trial_id: int  # the trial that saved it: the trial its metadata.json names
    path: Path  # in that trial's run directory
    registered: Registered  # what registration counted there
    storage: dict[str, Any] | None  # where it is stored (stored only)
    shown: str  # "checkpoint step-… (step 40) of trial 3 (model digits v2)"

    def copy_in(self, run_dir: RunDir) -> Path:
        """Where a trial's launch puts its copy (MUSTER_SOURCE_CHECKPOINT)."""
        return run_dir.source / self.name


def source_of(s: Session, experiment: Experiment) -> Source | None:
    """The experiment's warm start, None without one (or when its row is gone)."""
    if experiment.source_checkpoint_id is None:
        return None
    row = s.get(Checkpoint, experiment.source_checkpoint_id)
    if row is None:
        return None
    model = (experiment.source or {}).get("model")
    named_by = (f" (model {model} v{(experiment.source or {}).get('version')})"
                if model else "")
    return _source(row, named_by)


def source_of_trial(s: Session, trial: Trial) -> Source | None:
    """The checkpoint the trial starts from while it has none of its own: its own source (a
    PBT member's parent's, `Trial.source_checkpoint_id`), else its experiment's warm start;
    None without either (or when the row is gone)."""
    if trial.source_checkpoint_id is None:
        return source_of(s, trial.experiment)
    row = s.get(Checkpoint, trial.source_checkpoint_id)
    return None if row is None else _source(row, " (its parent in the population)")


def _source(row: Checkpoint, named_by: str) -> Source:
    return Source(uuid=row.uuid, name=row.name, trial_id=row.trial_id, path=Path(row.path),
                  registered=Registered(row.file_count, row.size_bytes),
                  storage=row.storage if row.state.is_stored() else None,
                  shown=f"checkpoint {row.name} (step {row.step}) of trial {row.trial_id}"
                        f"{named_by}")


def copy_source(source: Source, dest: Path, home: Home) -> None:
    """Put the source's checkpoint at `dest` (kept when an intact copy is there already).

    Raises:
        LaunchError: it is neither in its run directory nor in storage intact (the attempt
            ends INTERNAL, and its retry tries again).
    """
    if _intact(dest, source.trial_id):
        return
    try:
        _clear(dest)
        _copy_from_run_dir(source, dest)
        return
    except (MusterError, OSError) as exc:
        local = exc
    if source.storage is None:
        raise LaunchError(f"the warm start's {source.shown} cannot be copied from its run "
                          f"directory ({local}) and is not in checkpoint storage")
    try:
        fetch_checkpoint(open_backend(Location.from_json(source.storage), home.root),
                         source.uuid, dest, source.trial_id)
    except (MusterError, OSError) as exc:
        raise LaunchError(f"the warm start's {source.shown} cannot be copied from its run "
                          f"directory ({local}) nor fetched from storage ({exc})") from exc


def _copy_from_run_dir(source: Source, dest: Path) -> None:
    """The checkpoint's files through `checkpoint_archive`: read from its directory held
    open, checked as they go, unpacked beside `dest` and judged whole before the rename.

    Raises:
        Conflict: it no longer matches its metadata.json or its registration.
        ServerError, InvalidRequest: the copy is not whole, or `dest` is in the way.
        OSError: its directory cannot be opened.
    """
    folder = CheckpointFolder(source.path)
    try:
        plan = checkpoint_archive.plan_archive(source.name, folder.read(METADATA_FILE),
                                               folder.files(), source.registered)
        checkpoint_archive.unpack_checkpoint(checkpoint_archive.archive_chunks(plan, folder),
                                             dest, source.name, source.trial_id)
    except OSError as exc:
        raise Conflict(f"it cannot be read ({exc.strerror or exc})") from exc
    finally:
        folder.close()


def _clear(dest: Path) -> None:
    """Remove what is at `dest`: a copy no longer intact (made again), or anything else."""
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)


def _intact(dest: Path, trial_id: int) -> bool:
    """Whether `dest` holds an intact copy (a link in its place never does)."""
    if dest.is_symlink() or not dest.is_dir():
        return False
    with contextlib.suppress(OSError):
        return checkpoint_files.inspect(dest, trial_id).intact
    return False
