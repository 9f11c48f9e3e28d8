"""Evidence bundles on request, and every bundle of an attempt as one download (issue 31).

A dump (`muster trial dump ID`, the trial page's "Dump stacks") asks the shim of every
running replica of the trial's current attempt for its part of one new bundle
(`muster.launch.dumps.request_dump`; the shim runs `muster.launch.evidence`), waits until
each rank's `summary.json` is there (at most `DUMP_WAIT_S`), and records the bundle and the
rank's line on each replica (`evidence`, `stack_summary`), as a stall's bundle is recorded.
One dump per trial at a time (`DumpsInFlight`), and at most `MAX_BUNDLES` per attempt.

The download (`muster trial evidence ID`) is the attempt's `evidence/` as a tar.gz made as it
is sent: `evidence/<bundle>/rank-<r>/<file>`, regular files only, read through directory
descriptors that never follow a link and skip whatever is not the server's own (under
`run_as` the job owns the attempt's directory; the shim makes the bundle's directories as
root), with the trial's secrets masked as in its logs.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tarfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import api, job_secrets
from muster.errors import Conflict, NotFound
from muster.home import Home
from muster.launch.dumps import SUMMARY, request_dump
from muster.launch.evidence import EvidenceSummary, read_summary
from muster.launch.logs import masked_stream
from muster.rundir import AttemptDir, new_bundle_id
from muster.services.access import Action, Principal
from muster.services.experiments import authorize_on, trial_or_404
from muster.states import EvidenceReason, TrialState
from muster.store import Attempt, Replica, Store, Trial

__all__ = ["DUMP_WAIT_S", "MAX_BUNDLES", "MEDIA_TYPE", "DumpPlan", "DumpsInFlight",
           "EvidenceDownload", "finish_dump", "open_evidence_download", "start_dump",
           "wait_for_dump"]

DUMP_WAIT_S = 20.0  # the collector takes at most ~12 s; the shim looks for requests often
DUMP_POLL_S = 0.1
MAX_BUNDLES = 64  # per attempt: a dump a user asks for is bounded like anything else
MEDIA_TYPE = "application/gzip"
CHUNK_BYTES = 1024**2
MAX_ENTRIES = 4096  # read of any one directory of the evidence
MAX_DEPTH = 3  # directories below evidence/: <bundle>/rank-<r>/flight-recorder/
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class DumpsInFlight:
    """The trials with a dump under way: one each (a second asks the same shims again)."""

    def __init__(self) -> None:
        self._trials: set[int] = set()
        self._lock = threading.Lock()

    @contextmanager
    def holding(self, trial_id: int) -> Iterator[None]:
        """Raises:
            Conflict: a dump of the trial is under way.
        """
        with self._lock:
            if trial_id in self._trials:
                raise Conflict(f"a dump of trial {trial_id} is under way; its answer says "
                               "where the bundle is")
            self._trials.add(trial_id)
        try:
            yield
        finally:
            with self._lock:
                self._trials.discard(trial_id)


@dataclass(frozen=True)
class DumpPlan:
    """A dump asked for: the bundle, and the ranks of which attempt it waits for."""

    trial_id: int
    attempt: int
    attempt_dir: AttemptDir
    ranks: tuple[int, ...]
    bundle: str

    @property
    def directory(self) -> Path:
        return self.attempt_dir.evidence / self.bundle

    def part(self, rank: int) -> Path:
        return self.attempt_dir.evidence_of(self.bundle, rank)

    def complete(self) -> bool:
        return all((self.part(rank) / SUMMARY).exists() for rank in self.ranks)


def start_dump(store: Store, principal: Principal, trial_id: int) -> DumpPlan:
    """Ask the shims of the trial's running replicas for a new bundle.

    Raises:
        NotFound: there is no such trial.
        Forbidden: it is not the caller's (and the caller is no admin).
        Conflict: it is not RUNNING, none of its replicas runs, or its attempt holds
            `MAX_BUNDLES` bundles already.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        authorize_on(principal, Action.DUMP, trial.experiment, f"trial {trial_id}")
        attempt = _running_attempt(s, trial)
        ranks = tuple(sorted(rank for rank, replica in _current(attempt).items()
                             if replica.pid is not None and replica.ended_at is None))
        number, attempt_dir = attempt.number, AttemptDir(Path(attempt.run_dir))
    if not ranks:
        raise Conflict(f"no replica of trial {trial_id} runs at the moment; nothing to dump")
    _check_room(attempt_dir, trial_id, number)
    _next_second(attempt_dir)
    bundle = request_dump([attempt_dir.rank(rank) for rank in ranks],
                          EvidenceReason.REQUESTED)
    return DumpPlan(trial_id, number, attempt_dir, ranks, bundle)


def _running_attempt(s: Session, trial: Trial) -> Attempt:
    if trial.state is not TrialState.RUNNING:
        kept = (f"; `muster trial evidence {trial.id}` downloads the bundles it has"
                if trial.state.is_terminal() else "")
        raise Conflict(f"trial {trial.id} is {trial.state}; only a RUNNING trial's processes "
                       f"can be dumped{kept}")
    attempts = [a for a in trial.attempts if not a.standby]
    if not attempts:
        raise Conflict(f"trial {trial.id} has no attempt yet; nothing to dump")
    return max(attempts, key=lambda a: a.number)


def _current(attempt: Attempt) -> dict[int, Replica]:
    """Each rank's latest incarnation."""
    current: dict[int, Replica] = {}
    for replica in sorted(attempt.replicas, key=lambda r: r.incarnation):
        current[replica.rank] = replica
    return current


def _check_room(attempt_dir: AttemptDir, trial_id: int, number: int) -> None:
    try:
        bundles = len(os.listdir(attempt_dir.evidence))
    except FileNotFoundError:
        return
    if bundles >= MAX_BUNDLES:
        raise Conflict(f"attempt {number} of trial {trial_id} holds {bundles} evidence bundles, "
                       f"the most one attempt keeps ({MAX_BUNDLES}); `muster trial evidence "
                       f"{trial_id}` downloads them")


def _next_second(attempt_dir: AttemptDir) -> None:
    """Wait for a bundle id not taken yet: ids have whole seconds, and a dump that came back
    within the second it started would be asked again under its own id."""
    while (attempt_dir.evidence / new_bundle_id(EvidenceReason.REQUESTED)).exists():
        time.sleep(1.0 - time.time() % 1.0 + 0.001)


async def wait_for_dump(plan: DumpPlan, timeout: float = DUMP_WAIT_S) -> None:
    """Return once every rank's part of the bundle is complete, or after `timeout`."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(plan.complete) and time.monotonic() < deadline:
        await asyncio.sleep(DUMP_POLL_S)


def finish_dump(store: Store, plan: DumpPlan) -> api.DumpResult:
    """What each rank's part says (`api.DumpResult`); each complete one is recorded on its
    replica as its latest bundle."""
    parts = {rank: read_summary(plan.part(rank)) for rank in plan.ranks}
    relative = str(plan.directory.relative_to(plan.attempt_dir.path))
    with store.session_scope() as s:
        attempt = s.scalars(select(Attempt).where(Attempt.trial_id == plan.trial_id,
                                                  Attempt.number == plan.attempt)).one()
        for rank, replica in _current(attempt).items():
            summary = parts.get(rank)
            if summary is not None:
                replica.evidence, replica.stack_summary = relative, summary.line
    return {"bundle": plan.bundle, "attempt": plan.attempt,
            "path": str(plan.directory),
            "ranks": [_rank_result(rank, parts[rank]) for rank in plan.ranks]}


def _rank_result(rank: int, summary: EvidenceSummary | None) -> api.DumpRankView:
    if summary is None:
        return {"rank": rank, "complete": False, "tool": None, "errors": [],
                "line": f"rank {rank}: no evidence within {DUMP_WAIT_S:.0f} s (its shim may be "
                        "busy with another bundle, or gone)"}
    return {"rank": rank, "complete": True, "tool": summary.tool, "errors": summary.errors,
            "line": summary.line}


# -- the download ----------------------------------------------------------------------------


@dataclass
class EvidenceDownload:
    """An attempt's `evidence/`, held open, as the tar.gz `filename`."""

    attempt: int
    filename: str
    masks: tuple[bytes, ...]
    _fd: int
    _closed: bool = field(default=False)

    def chunks(self) -> Iterator[bytes]:
        """The archive as it is made: gzip of a pax tar, `evidence/<path>` per file."""
        gzip = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: the gzip container
        for name, fd in _walk(self._fd, "evidence", MAX_DEPTH):
            with os.fdopen(fd, "rb", buffering=0) as file:
                for piece in _member(name, file, self.masks):
                    if out := gzip.compress(piece):
                        yield out
        yield gzip.compress(bytes(2 * tarfile.BLOCKSIZE)) + gzip.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)


def open_evidence_download(store: Store, home: Home, trial_id: int,
                           attempt: int | None) -> EvidenceDownload:
    """The evidence of attempt `attempt` of the trial (default: the latest that has some).

    Raises:
        NotFound: no such trial or attempt, or the attempt has no evidence.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        attempts = {a.number: AttemptDir(Path(a.run_dir)) for a in trial.attempts
                    if not a.standby}
        declared = (trial.experiment.config.get("environment") or {}).get("secrets") or {}
        masks = tuple(job_secrets.masked_values(declared, home, trial.experiment.uuid)
                      ) if declared else ()
    if attempt is not None and attempt not in attempts:
        raise NotFound(f"trial {trial_id} has no attempt {attempt} (it has "
                       f"{len(attempts)}); `muster trial describe {trial_id}` lists them")
    for number in [attempt] if attempt is not None else sorted(attempts, reverse=True):
        fd = _open_evidence(attempts[number])
        if fd is not None:
            return EvidenceDownload(number, f"trial-{trial_id}-attempt-{number}-evidence.tar.gz",
                                    masks, fd)
    which = f"attempt {attempt} of trial {trial_id}" if attempt else f"trial {trial_id}"
    raise NotFound(f"{which} has no evidence bundle; muster saves one before it stops a "
                   f"stalled replica, and `muster trial dump {trial_id}` takes one while the "
                   "trial runs")


def _open_evidence(attempt_dir: AttemptDir) -> int | None:
    """The attempt's evidence directory, held open, when it is the server's own and holds a
    bundle; else None."""
    try:
        fd = os.open(attempt_dir.evidence, _DIRECTORY)
    except OSError:  # none, or a link
        return None
    if os.fstat(fd).st_uid != os.geteuid() or not os.listdir(fd):
        os.close(fd)
        return None
    return fd


def _walk(directory: int, prefix: str, depth: int) -> Iterator[tuple[str, int]]:
    """(member name, open descriptor) of each regular file below `directory` that is the
    server's own, by name; a link, another user's entry or one too deep is passed over."""
    names: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if len(names) >= MAX_ENTRIES:
                break
            if not entry.name.startswith("."):  # an atomic write's temporary file
                names.append(entry.name)
    for name in sorted(names):
        try:
            fd = os.open(name, _FILE, dir_fd=directory)
        except OSError:  # a link (ELOOP), or gone
            continue
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            os.close(fd)
        elif stat.S_ISREG(info.st_mode):
            yield f"{prefix}/{name}", fd
        elif stat.S_ISDIR(info.st_mode) and depth > 0:
            try:
                yield from _walk(fd, f"{prefix}/{name}", depth - 1)
            finally:
                os.close(fd)
        else:
            os.close(fd)


def _member(name: str, file: Any, masks: tuple[bytes, ...]) -> Iterator[bytes]:
    """One file as a tar member: its header, its bytes as they were when it was opened
    (masked), padded to whole blocks."""
    info = os.fstat(file.fileno())
    header = tarfile.TarInfo(name)
    header.size, header.mtime, header.mode = info.st_size, int(info.st_mtime), 0o644
    yield header.tobuf(tarfile.PAX_FORMAT)
    stream = masked_stream(file, masks)
    left = info.st_size
    while left > 0:
        data = stream.read(min(CHUNK_BYTES, left)) or bytes(min(CHUNK_BYTES, left))
        left -= len(data)
        yield data
    yield bytes(-info.st_size % tarfile.BLOCKSIZE)
