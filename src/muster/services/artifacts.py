"""A trial's artifacts as the API, the CLI and the pages show them: its latest artifact set
(`muster.artifacts`, copied when the trial ended), and one file of it, sent as it is read
and checked against the sha256 recorded when it was copied."""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import api
from muster.atomic import open_regular
from muster.checkpoint_storage.location import Location, open_backend
from muster.checkpoint_storage.resume import cache_dir
from muster.checkpoint_storage.retention import files_gone
from muster.checkpoint_storage.transfer import fetch_files
from muster.errors import Conflict, Gone, InvalidRequest, NotFound, StorageError
from muster.home import Home
from muster.services.experiments import trial_or_404
from muster.states import ArtifactState, CheckpointState
from muster.store import ArtifactSet, Store, Trial

__all__ = ["ArtifactDownload", "Preview", "artifact_image", "open_artifact", "preview_artifact",
           "preview_kind", "trial_artifacts"]

_CHUNK = 1 << 20


def trial_artifacts(store: Store, trial_id: int) -> api.ArtifactSetView:
    """The trial's artifact set (its final attempt's).

    Raises:
        NotFound: no such trial, or it has none (its config names no artifacts, or it has
            not ended).
    """
    with store.session_scope() as s:
        return _view(_latest(s, trial_id))


def _latest(s: Session, trial_id: int) -> ArtifactSet:
    trial_or_404(s, trial_id)
    row = s.scalars(select(ArtifactSet).where(ArtifactSet.trial_id == trial_id)
                    .order_by(ArtifactSet.attempt.desc()).limit(1)).first()
    if row is None:
        raise NotFound(f"trial {trial_id} has no artifacts: its config names none (`artifacts:"
                       " [model.pt, 'eval/*.json']`, or verify.outputs), or it has not ended")
    return row


def _view(row: ArtifactSet) -> api.ArtifactSetView:
    files = [api.ArtifactFile(path=path, size=int(facts["size"]), sha256=str(facts["sha256"]))
             for path, facts in sorted(row.files.items())]
    stored = row.storage_state is CheckpointState.STORED and row.storage is not None
    return api.ArtifactSetView(
        trial_id=row.trial_id, attempt=row.attempt, state=row.state, files=files,
        size=row.size_bytes, skipped=list(row.skipped), skipped_count=row.skipped_count,
        message=row.message, collected_at=row.collected_at, storage_state=row.storage_state,
        storage_url=(Location.from_json(row.storage).url(row.uuid)
                     if stored and row.storage is not None else None),
        error=row.error)


@dataclass
class ArtifactDownload:
    """One artifact file, open, to be sent as `size` bytes; a file whose bytes no longer
    match its sha256 breaks the download off at its end."""

    filename: str
    size: int
    fd: int
    sha256: str
    shown: str

    def chunks(self) -> Iterator[bytes]:
        digest = hashlib.sha256()
        sent = 0
        try:
            while sent < self.size and (chunk := os.read(self.fd, min(_CHUNK,
                                                                        self.size - sent))):
                digest.update(chunk)
                sent += len(chunk)
                yield chunk
            if sent != self.size or digest.hexdigest() != self.sha256:
                raise Conflict(f"{self.shown} changed since it was copied (its sha256 no "
                               "longer matches)")
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_artifact(store: Store, home: Home, trial_id: int, path: str) -> ArtifactDownload:
    """One file of the trial's artifact set, opened for download: from the run directory,
    or, when that no longer holds it, from checkpoint storage (the whole set fetched into
    the cache, every file's sha256 checked, then sent from there).

    Raises:
        NotFound: no such trial, set, or file in it.
        Gone: retention removed the trial's run, and its artifacts with it.
        Conflict: the set is not collected, or its copy is neither here nor in storage as
            it was recorded.
    """
    with store.session_scope() as s:
        row = _latest(s, trial_id)
        trial = s.get_one(Trial, trial_id)
        gone = files_gone(trial_id, trial.files_removed_at, trial.experiment.ended_at)
        if gone is not None:
            raise Gone(gone)
        storage = (row.storage if row.storage_state is CheckpointState.STORED else None)
        cached = cache_dir(home, trial.uuid) / f"artifacts-attempt-{row.attempt}"
        uuid = row.uuid
        shown = f"artifact {path!r} of trial {trial_id}"
        if row.state is not ArtifactState.COLLECTED or row.path is None:
            raise Conflict(f"trial {trial_id}'s artifacts are {row.state}"
                           + (f": {row.message}" if row.message else "")
                           + "; there is no file to download")
        facts = row.files.get(path)
        if facts is None:
            raise NotFound(f"trial {trial_id}'s artifacts hold no {path!r}; `muster trial "
                           f"artifacts {trial_id}` lists them")
        where = Path(row.path) / path
        size, sha256 = int(facts["size"]), str(facts["sha256"])
    try:
        fd = open_regular(where)
    except FileNotFoundError:
        if storage is None:
            raise Conflict(f"{shown} is gone from the run directory and is not in "
                           "storage") from None
        fd = _from_storage(home, storage, uuid, cached, path, shown)
    except OSError as exc:
        raise Conflict(f"{shown} cannot be read ({exc.strerror or exc})") from exc
    if os.fstat(fd).st_size != size:
        os.close(fd)
        raise Conflict(f"{shown} changed since it was copied (its size)")
    return ArtifactDownload(path.rsplit("/", 1)[-1], size, fd, sha256, shown)


def _from_storage(home: Home, storage: dict[str, object], uuid: str, cached: Path, path: str,
                  shown: str) -> int:
    """`path` of the set from the cache, fetched from storage first when not there."""
    if not cached.is_dir():
        try:
            fetch_files(open_backend(Location.from_json(storage), home.root), uuid, cached)
        except StorageError as exc:
            raise Conflict(f"{shown} is gone from the run directory and could not be fetched "
                           f"from storage: {exc}") from exc
    try:
        return open_regular(cached / path)
    except OSError as exc:
        raise Conflict(f"{shown} cannot be read from the copy fetched from storage "
                       f"({exc.strerror or exc})") from exc


# -- previews (the trial page) -------------------------------------------------------------

PREVIEW_BYTES = 256 << 10  # of a text or a table, the first
PREVIEW_ROWS = 200
PREVIEW_COLUMNS = 50
IMAGE_BYTES = 16 << 20  # an image is shown whole, or not at all
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_KINDS = {".json": "text", ".txt": "text", ".log": "text", ".yaml": "text", ".md": "text",
          ".csv": "table", ".png": "image"}


def preview_kind(path: str) -> str | None:
    """How the page previews an artifact (text, table, image), or None: download it."""
    name = path.rsplit("/", 1)[-1].lower()
    return next((kind for suffix, kind in _KINDS.items() if name.endswith(suffix)), None)


@dataclass(frozen=True)
class Preview:
    path: str
    kind: str  # text | table | image
    size: int
    text: str | None = None  # a text's first PREVIEW_BYTES, decoded (bad bytes replaced)
    rows: tuple[tuple[str, ...], ...] = ()  # a table's first rows and columns
    truncated: bool = False  # only the beginning is shown


def preview_artifact(store: Store, home: Home, trial_id: int, path: str) -> Preview:
    """What the page shows of one artifact.

    Raises:
        InvalidRequest: it is of a kind the page does not preview (download it).
        NotFound, Conflict: as `open_artifact`.
    """
    kind = preview_kind(path)
    if kind is None:
        raise InvalidRequest(f"{path!r} is not a file the page previews (.json, .txt, .log, "
                             ".yaml, .md, .csv, .png); download it")
    download = open_artifact(store, home, trial_id, path)
    if kind == "image":
        download.close()
        return Preview(path, kind, download.size, truncated=download.size > IMAGE_BYTES)
    try:
        data = os.read(download.fd, PREVIEW_BYTES)
    finally:
        download.close()
    text = data.decode("utf-8", errors="replace")
    truncated = download.size > len(data)
    if kind == "text":
        return Preview(path, kind, download.size, text=text, truncated=truncated)
    rows: list[tuple[str, ...]] = []
    for row in csv.reader(io.StringIO(text)):
        if len(rows) == PREVIEW_ROWS:
            truncated = True
            break
        truncated = truncated or len(row) > PREVIEW_COLUMNS
        rows.append(tuple(row[:PREVIEW_COLUMNS]))
    return Preview(path, kind, download.size, rows=tuple(rows), truncated=truncated)


def artifact_image(store: Store, home: Home, trial_id: int, path: str) -> bytes:
    """A PNG artifact's bytes, whole and checked against its sha256, for the page's <img>.

    Raises:
        InvalidRequest: not a .png, larger than IMAGE_BYTES, or not a PNG inside.
        NotFound, Conflict: as `open_artifact` (Conflict too when its bytes changed).
    """
    if preview_kind(path) != "image":
        raise InvalidRequest(f"{path!r} is not a .png")
    download = open_artifact(store, home, trial_id, path)
    if download.size > IMAGE_BYTES:
        download.close()
        raise InvalidRequest(f"{path!r} is larger than {IMAGE_BYTES >> 20} MiB: download it")
    data = b"".join(download.chunks())
    if not data.startswith(PNG_SIGNATURE):
        raise InvalidRequest(f"{path!r} is not a PNG image inside; download it")
    return data
