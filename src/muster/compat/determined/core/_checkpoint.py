"""`core_context.checkpoint`: Determined's checkpoints, saved and found as muster's.

Every save is a harness save (`muster.harness.checkpoints`): written into a temporary
directory, hashed, and published whole as `checkpoints/step-<step>-<hex>/` with muster's
metadata.json, whose "metadata" is the script's metadata. The step is the metadata's
`steps_completed`, which Determined requires too. Storage ids are `_storage_ids`'.

Three differences from Determined's shared_fs storage, which this is closest to:

- metadata.json in a checkpoint is muster's (the script's metadata under "metadata");
  Determined writes the metadata itself under that name, over any file of the script's,
  and so does this: such a file is left out, and muster's takes its place.
- `restore_path` hands out the checkpoint's own directory, after checking every file
  against its sha256; `selector` chooses what to download, and nothing is downloaded.
- A trial does not delete checkpoints: muster's retention does (`delete` raises).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from muster.checkpoint_files import METADATA_FILE

from .._unprovided import unprovided
from ._distributed import DistributedContext
from ._sharding import file_owners, merge_metadata
from ._storage_ids import STORAGE_ID_KEY, StorageIds, determined_metadata, new_storage_id

if TYPE_CHECKING:
    from muster.harness.checkpoints import Checkpoints

Selector = Callable[[str], bool]  # a path relative to the checkpoint -> whether it is wanted
T = TypeVar("T")
STEP_KEY = "steps_completed"


class DownloadMode(str, Enum):
    """Whether the ranks of a node share one download (`LocalWorkersShareDownload`: they
    call in step, the node's chief does the work) or each does its own."""

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


class CheckpointContext:
    """Save, upload, find and download the trial's checkpoints by storage id."""

    def __init__(self, saves: Checkpoints, distributed: DistributedContext,
                 ids: StorageIds) -> None:
        self._saves = saves
        self._dist = distributed
        self._ids = ids

    @contextmanager
    def store_path(self, metadata: Mapping[str, Any] | None = None, *,
                   shard: bool = False) -> Iterator[tuple[Path, str]]:
        """A directory to save a checkpoint into, and its storage id; published when the
        block ends. Without `shard` only the chief saves; with it every rank calls in step
        and writes its files into the one directory (every rank must see it: one node, or
        a shared file system).

        Raises:
            ValueError: `metadata` has no `steps_completed` (an int ≥ 0).
            RuntimeError: a worker calls it without `shard`, or a rank cannot see the
                directory.
            muster.harness.CheckpointError: the block raised, or publishing failed;
                nothing was saved.
        """
        saving = self._shared_save(metadata) if shard else self._chief_save(metadata)
        with saving as (path, storage_id):
            yield path, storage_id

    def upload(self, ckpt_dir: str | os.PathLike[str] | None,
               metadata: Mapping[str, Any] | None = None, *, shard: bool = False,
               selector: Selector | None = None) -> str:
        """Save the files of `ckpt_dir` (those `selector` accepts) as a checkpoint; its
        storage id. With `shard` every rank calls in step, a rank with nothing to add
        passing None, and the checkpoint holds every rank's files (the same name with
        different contents on two ranks is refused).

        Raises:
            RuntimeError: a worker calls it without `shard`, no rank gives a directory, or
                ranks give different files under one name.
            ValueError, muster.harness.CheckpointError: as `store_path`.
        """
        source = None if ckpt_dir is None else Path(ckpt_dir)
        if not shard:
            if source is None:
                raise RuntimeError("upload(ckpt_dir=None, shard=False) would save nothing")
            with self._chief_save(metadata) as (path, storage_id):
                _copy(source, path, _uploaded(source, selector))
            return storage_id
        if not any(self._dist.allgather(source is not None)):
            raise RuntimeError("upload(shard=True) with ckpt_dir=None on every rank would "
                               "save nothing")
        mine = {} if source is None else {p: _sha256(source / p)
                                          for p in _uploaded(source, selector)}
        owners = file_owners(self._dist.allgather(mine))
        with self._shared_save(metadata) as (path, storage_id):
            if source is not None:
                _copy(source, path, [p for p in mine if owners[p] == self._dist.rank])
        return storage_id

    def download(self, storage_id: str, ckpt_dir: str | os.PathLike[str],
                 download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                 selector: Selector | None = None) -> None:
        """Copy the checkpoint's files (those `selector` accepts; muster's metadata.json
        among them) into `ckpt_dir`, made if missing.

        Raises:
            CheckpointNotFound, InvalidCheckpointException: no intact checkpoint has the id.
        """
        target = Path(ckpt_dir)
        if DownloadMode(download_mode) is DownloadMode.NoSharedDownload:
            found = self._ids.find(storage_id).path
            _copy(found, target, _selected(found, selector))
            return
        # The node's chief copies every file any of its ranks selects.
        found = self._on_local_chief(lambda: self._ids.find(storage_id).path)
        wanted = self._dist.gather_local(_selected(found, selector))
        self._on_local_chief(
            lambda: _copy(found, target, sorted({p for part in wanted or [] for p in part})))

    @contextmanager
    def restore_path(self, storage_id: str,
                     download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                     selector: Selector | None = None) -> Iterator[Path]:
        """The checkpoint's directory, to read (not to write into), once every file matched
        its sha256; by default the node's chief checks, and its ranks call in step.

        Raises:
            CheckpointNotFound, InvalidCheckpointException: no intact checkpoint has the id.
        """
        if DownloadMode(download_mode) is DownloadMode.NoSharedDownload:
            yield self._ids.find(storage_id).path
        else:
            yield self._on_local_chief(lambda: self._ids.find(storage_id).path)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The metadata the checkpoint was saved with."""
        return determined_metadata(self._ids.find(storage_id))

    def delete(self, storage_id: str) -> NoReturn:
        raise unprovided("CheckpointContext.delete", "muster's server owns a trial's "
                         "checkpoints once saved (registration, upload, retention by "
                         "checkpoint_storage's save_trial_latest/save_trial_best); "
                         "`muster checkpoint gc` deletes them")

    @contextmanager
    def _chief_save(self, metadata: Mapping[str, Any] | None) -> Iterator[tuple[Path, str]]:
        if self._dist.rank != 0:
            raise RuntimeError(f"a checkpoint without shard=True is saved by the chief "
                               f"(rank 0) alone, not by rank {self._dist.rank}")
        given = dict(metadata or {})
        step = _step_of(given)
        storage_id = new_storage_id(step)
        with self._saves.save(step, {**given, STORAGE_ID_KEY: storage_id}) as path:
            yield path, storage_id
            _leave_out_metadata_file(path)

    @contextmanager
    def _shared_save(self, metadata: Mapping[str, Any] | None) -> Iterator[tuple[Path, str]]:
        """The chief saves through the harness; the others write into its directory. Every
        rank waits for the others' files, and learns whether the chief published."""
        merged = merge_metadata(self._dist.allgather(dict(metadata or {})))
        step = _step_of(merged)
        if self._dist.rank != 0:
            where, storage_id = self._dist.broadcast(None)
            self._check_every_rank_sees(Path(where))
            yield Path(where), storage_id
            self._dist.allgather(None)
            failure = self._dist.broadcast(None)
            if failure is not None:
                raise RuntimeError(f"the chief could not publish checkpoint {storage_id}: "
                                   f"{failure}")
            return
        storage_id, written = new_storage_id(step), False
        try:
            with self._saves.save(step, {**merged, STORAGE_ID_KEY: storage_id}) as path:
                self._dist.broadcast((str(path), storage_id))
                self._check_every_rank_sees(path)
                yield path, storage_id
                self._dist.allgather(None)
                written = True
                _leave_out_metadata_file(path)
        except Exception as exc:
            if written:
                self._dist.broadcast(f"{type(exc).__name__}: {exc}")
            raise
        self._dist.broadcast(None)

    def _check_every_rank_sees(self, path: Path) -> None:
        seen = self._dist.allgather(path.is_dir())
        blind = [rank for rank, sees in enumerate(seen) if not sees]
        if blind:
            raise RuntimeError(f"ranks {blind} cannot see {path}: a sharded checkpoint needs "
                               "one file system for every rank's files")

    def _on_local_chief(self, work: Callable[[], T]) -> T:
        """`work`'s result on the node's chief, handed to the node's other ranks; its
        exception raised on every one of them."""
        outcome: tuple[bool, Any] = (True, None)
        if self._dist.local_rank == 0:
            try:
                outcome = (True, work())
            except Exception as exc:  # noqa: BLE001 - raised again, on every rank of the node
                outcome = (False, exc)
        succeeded, value = self._dist.broadcast_local(outcome)
        if not succeeded:
            raise value
        result: T = value
        return result


def _step_of(metadata: Mapping[str, Any]) -> int:
    if STEP_KEY not in metadata:
        raise ValueError(f"checkpoint metadata must hold {STEP_KEY!r}: muster saves the "
                         "checkpoint as that step")
    step = metadata[STEP_KEY]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint metadata's {STEP_KEY!r} must be an int ≥ 0, got {step!r}")
    return step


def _leave_out_metadata_file(path: Path) -> None:
    """Determined writes the metadata as metadata.json over any file of the script's of
    that name; muster's own metadata.json (the metadata within) takes that name here."""
    (path / METADATA_FILE).unlink(missing_ok=True)


def _uploaded(root: Path, selector: Selector | None) -> list[str]:
    """What an upload of `root` saves: `_selected`, less a metadata.json at the top (see
    `_leave_out_metadata_file`)."""
    return [path for path in _selected(root, selector) if path != METADATA_FILE]


def _selected(root: Path, selector: Selector | None) -> list[str]:
    """The files under `root`, relative POSIX paths, that `selector` accepts (all without
    one)."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            relative = (Path(folder) / name).relative_to(root).as_posix()
            if selector is None or selector(relative):
                found.append(relative)
    return sorted(found)


def _copy(source: Path, target: Path, relative_paths: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for relative in relative_paths:
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / relative, destination)


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
