"""A trial's artifacts as the API, the CLI and the pages show them: its latest artifact set
(`muster.artifacts`, copied when the trial ended), and one file of it, sent as it is read
and checked against the sha256 recorded when it was copied."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import api
from muster.atomic import open_regular
from muster.errors import Conflict, NotFound
from muster.services.experiments import trial_or_404
from muster.states import ArtifactState
from muster.store import ArtifactSet, Store

__all__ = ["ArtifactDownload", "open_artifact", "trial_artifacts"]

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
    return api.ArtifactSetView(
        trial_id=row.trial_id, attempt=row.attempt, state=row.state, files=files,
        size=row.size_bytes, skipped=list(row.skipped), skipped_count=row.skipped_count,
        message=row.message, collected_at=row.collected_at)


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


def open_artifact(store: Store, trial_id: int, path: str) -> ArtifactDownload:
    """One file of the trial's artifact set, opened for download.

    Raises:
        NotFound: no such trial, set, or file in it.
        Conflict: the set is not collected, or the copy is gone or not what was recorded.
    """
    with store.session_scope() as s:
        row = _latest(s, trial_id)
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
    except OSError as exc:
        raise Conflict(f"{shown} cannot be read ({exc.strerror or exc})") from exc
    if os.fstat(fd).st_size != size:
        os.close(fd)
        raise Conflict(f"{shown} changed since it was copied (its size)")
    return ArtifactDownload(path.rsplit("/", 1)[-1], size, fd, sha256, shown)
