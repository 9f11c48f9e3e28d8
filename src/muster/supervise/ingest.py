"""Reading a trial's run directory into the store: metrics lines and checkpoint directories.

The harness writes files (`docs/run-directory.md`); `ingest_trial` moves what is new into
the database, and is cheap to call often: when nothing changed it costs one small query, a
directory listing per attempt and a `stat` per metrics file.

Metrics are read exactly once. Each `rank-<r>.metrics.jsonl` has a cursor (`IngestCursor`),
the byte offset up to which its lines are stored, and a batch of rows commits in the same
transaction as the cursor's advance, so a server that dies at any moment neither loses nor
repeats a line. Only complete lines are read: a torn last line (no "\\n" yet) waits for the
next call. A complete line that is not a report in the documented format is skipped, logged
and counted; it never stops the lines after it.

A checkpoint directory (`checkpoints/step-*`) is registered once, by name, after each file
listed in its `metadata.json` has been checked against its sha256; a failed check registers
it with `intact=False` and the problem in words. Directories still being written
(`.tmp-*`) are never read.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from sqlalchemy import CursorResult, Insert, Table, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from muster import checkpoint_files
from muster.checkpoint_files import Inspection
from muster.errors import NotFound
from muster.store import Checkpoint, IngestCursor, Metric, Store, Trial
from muster.store.models import now

log = logging.getLogger(__name__)

METRICS_FILE = re.compile(r"rank-(\d+)\.metrics\.jsonl")
CHECKPOINTS_DIR = "checkpoints"
METRICS_CURSOR = "metrics"  # IngestCursor.file_kind of rank-<r>.metrics.jsonl
KINDS = ("training", "validation")
# Bytes of complete lines per transaction: ~10,000 reports, a short hold of SQLite's lock.
BATCH_BYTES = 1 << 20
WARNINGS_PER_FILE = 5  # per call; the rest are counted in one line
BIGINT = 1 << 63
METRICS_TABLE = cast(Table, Metric.__table__)


@dataclass
class IngestReport:
    """What one `ingest_trial` call stored."""

    trial_id: int
    metrics_added: int = 0
    lines_skipped: int = 0
    checkpoints_added: list[str] = field(default_factory=list)
    corrupt_checkpoints: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.metrics_added or self.lines_skipped or self.checkpoints_added)


@dataclass(frozen=True)
class MetricsFile:
    attempt: int
    rank: int
    path: Path
    size: int

    def describe(self) -> str:
        return f"{self.path.name} of attempt {self.attempt}"


@dataclass(frozen=True)
class _Known:
    """What the store already holds about a trial's files."""

    run_dir: Path | None
    attempt_dirs: dict[int, Path]
    cursors: dict[tuple[int, int], int]
    checkpoints: frozenset[str]


def ingest_trial(store: Store, trial_id: int) -> IngestReport:
    """Store the trial's new metrics lines and register its new checkpoint directories.

    Safe to call at any time and from a restarted server; what is already stored is never
    stored again. Two callers at once on the same trial are safe too (one of them backs off).

    Raises:
        NotFound: there is no such trial.
        StoreError: the database failed; what was committed before stays committed.
    """
    report = IngestReport(trial_id)
    known = _load_known(store, trial_id)
    if known.run_dir is None:
        return report
    for file in _metrics_files(known.attempt_dirs):
        offset = known.cursors.get((file.attempt, file.rank), 0)
        if file.size == offset:
            continue
        try:
            _ingest_metrics_file(store, trial_id, file, offset, report)
        except OSError as exc:  # e.g. permissions: the next call tries again
            log.warning("trial %d: cannot read %s: %s", trial_id, file.describe(), exc)
    _register_checkpoints(store, trial_id, known.run_dir / CHECKPOINTS_DIR,
                          known.checkpoints, report)
    return report


def _load_known(store: Store, trial_id: int) -> _Known:
    with store.session_scope() as s:
        trial = s.get(Trial, trial_id)
        if trial is None:
            raise NotFound(f"trial {trial_id} does not exist; nothing to ingest")
        attempt_dirs = {a.number: Path(a.run_dir) for a in trial.attempts}
        cursors = s.execute(
            select(IngestCursor.attempt, IngestCursor.rank, IngestCursor.byte_offset).where(
                IngestCursor.trial_id == trial_id, IngestCursor.file_kind == METRICS_CURSOR
            )
        )
        names = s.scalars(select(Checkpoint.name).where(Checkpoint.trial_id == trial_id))
        return _Known(
            run_dir=next(iter(attempt_dirs.values())).parent if attempt_dirs else None,
            attempt_dirs=attempt_dirs,
            cursors={(a, r): offset for a, r, offset in cursors},
            checkpoints=frozenset(names),
        )


def _metrics_files(attempt_dirs: dict[int, Path]) -> Iterator[MetricsFile]:
    for number, folder in sorted(attempt_dirs.items()):
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue  # the attempt has not created its directory yet
        for entry in entries:
            match = METRICS_FILE.fullmatch(entry.name)
            if match and entry.is_file():
                size = entry.stat().st_size
                yield MetricsFile(number, int(match[1]), Path(entry.path), size)


# -- metrics -------------------------------------------------------------------------------


def _ingest_metrics_file(
    store: Store, trial_id: int, file: MetricsFile, offset: int, report: IngestReport
) -> None:
    """Store the complete lines of `file` from `offset` on, one transaction per batch."""
    if file.size < offset:
        log.warning(
            "trial %d: %s shrank from %d to %d bytes although it is append-only; the lines "
            "already stored stay, and reading goes on from byte %d",
            trial_id, file.describe(), offset, file.size, file.size,
        )
        _commit_batch(store, trial_id, file, offset, file.size, [])
        return
    warned = 0
    with file.path.open("rb") as stream:
        stream.seek(offset)
        while data := _read_complete_lines(stream, file.size - offset):
            rows, problems = _parse_lines(data, file, trial_id, offset)
            if not _commit_batch(store, trial_id, file, offset, offset + len(data), rows):
                return
            report.metrics_added += len(rows)
            report.lines_skipped += len(problems)
            warned = _warn_skipped(trial_id, file, problems, warned)
            offset += len(data)


def _read_complete_lines(stream: IO[bytes], available: int) -> bytes:
    """Up to about `BATCH_BYTES` of whole lines from `stream` (more if one line is longer);
    empty when all that is left of the `available` bytes is a torn last line."""
    data = stream.read(min(BATCH_BYTES, available))
    while b"\n" not in data and len(data) < available:
        more = stream.read(min(BATCH_BYTES, available - len(data)))
        if not more:
            break
        data += more
    cut = data.rfind(b"\n") + 1
    stream.seek(cut - len(data), os.SEEK_CUR)  # back to the start of the torn line
    return data[:cut]


def _parse_lines(
    data: bytes, file: MetricsFile, trial_id: int, offset: int
) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The rows of the complete lines in `data`, and (byte offset, why) per skipped line."""
    rows: list[dict[str, Any]] = []
    problems: list[tuple[int, str]] = []
    for line in data.split(b"\n")[:-1]:
        if line.strip():
            try:
                rows.append(_metric_row(line, file, trial_id))
            except ValueError as exc:
                problems.append((offset, str(exc)))
        offset += len(line) + 1
    return rows, problems


def _metric_row(line: bytes, file: MetricsFile, trial_id: int) -> dict[str, Any]:
    """The `metrics` row of one report line.

    Raises:
        ValueError: the line is not JSON, or not a report in the documented format.
    """
    try:
        report = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(report, dict):
        raise ValueError(f"a report is a JSON object, got {type(report).__name__}")
    kind: Any = report.get("kind")
    step: Any = report.get("step")
    at: Any = report.get("time")
    rank: Any = report.get("rank")
    metrics: Any = report.get("metrics")
    if kind not in KINDS:
        raise ValueError(f'"kind" must be "training" or "validation", got {kind!r}')
    if not _is_int(step) or not -BIGINT <= step < BIGINT:
        raise ValueError(f'"step" must be a whole number, got {step!r}')
    if not _is_finite(at):
        raise ValueError(f'"time" must be a finite unix time, got {at!r}')
    if rank != file.rank or not _is_int(rank):
        raise ValueError(f'"rank" must be {file.rank} in {file.path.name}, got {rank!r}')
    if not isinstance(metrics, dict):
        raise ValueError(f'"metrics" must be an object of numbers, got {metrics!r}')
    not_numbers = [name for name, value in metrics.items() if not _is_number(value)]
    if not_numbers:
        raise ValueError(f'"metrics" must map names to numbers; {not_numbers[0]!r} is '
                         f"{metrics[not_numbers[0]]!r}")
    return {"trial_id": trial_id, "attempt": file.attempt, "rank": rank, "kind": kind,
            "step": step, "time": float(at), "values": metrics}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    try:
        return _is_number(value) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _commit_batch(
    store: Store, trial_id: int, file: MetricsFile, start: int, end: int,
    rows: list[dict[str, Any]],
) -> bool:
    """Insert `rows` and move the file's cursor from `start` to `end`, in one transaction.

    Returns False (and stores nothing) when the cursor is no longer at `start`: another
    ingestion of the same trial got there first.
    """
    key = (IngestCursor.trial_id == trial_id, IngestCursor.attempt == file.attempt,
           IngestCursor.rank == file.rank, IngestCursor.file_kind == METRICS_CURSOR)
    with store.session_scope() as s:
        if start == 0:
            s.execute(_insert_if_absent(s, IngestCursor, dict(
                trial_id=trial_id, attempt=file.attempt, rank=file.rank,
                file_kind=METRICS_CURSOR, byte_offset=0, updated_at=now())))
        cursor = s.scalars(select(IngestCursor).where(*key).with_for_update()).one()
        if cursor.byte_offset != start:
            log.info("trial %d: %s was ingested elsewhere meanwhile (cursor at %d, not %d)",
                     trial_id, file.describe(), cursor.byte_offset, start)
            return False
        if rows:
            s.execute(insert(METRICS_TABLE), rows)  # Core executemany: no ORM objects
        cursor.byte_offset, cursor.updated_at = end, now()
    return True


def _warn_skipped(
    trial_id: int, file: MetricsFile, problems: list[tuple[int, str]], warned: int
) -> int:
    """Log the skipped lines (the first few one by one); returns how many were logged."""
    for offset, why in problems[: max(0, WARNINGS_PER_FILE - warned)]:
        log.warning("trial %d: skipped the line at byte %d of %s: %s",
                    trial_id, offset, file.describe(), why)
    shown = min(len(problems), max(0, WARNINGS_PER_FILE - warned))
    if len(problems) > shown:
        log.warning("trial %d: skipped %d more malformed lines of %s",
                    trial_id, len(problems) - shown, file.describe())
    return warned + shown


def _insert_if_absent(s: Session, model: type[IngestCursor | Checkpoint],
                      values: dict[str, Any]) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING: a row another writer inserted first is kept."""
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    statement: Insert = dialect.insert(model).values(**values).on_conflict_do_nothing()
    return statement


# -- checkpoints ---------------------------------------------------------------------------


def _register_checkpoints(
    store: Store, trial_id: int, folder: Path, known: frozenset[str], report: IngestReport
) -> None:
    checked = [c for name in _new_checkpoint_names(folder, known)
               if (c := _check_if_still_there(folder / name, trial_id)) is not None]
    if not checked:
        return
    with store.session_scope() as s:
        for found in checked:
            row = _checkpoint_row(trial_id, found)
            result = cast(CursorResult[Any], s.execute(_insert_if_absent(s, Checkpoint, row)))
            if result.rowcount:
                _note_registered(trial_id, found, report)


def _new_checkpoint_names(folder: Path, known: frozenset[str]) -> list[str]:
    # `.tmp-*` directories are never published: they are still being written.
    return [p.name for p in checkpoint_files.published(folder) if p.name not in known]


def _check_if_still_there(path: Path, trial_id: int) -> Inspection | None:
    """`checkpoint_files.inspect`, or None when the directory was deleted while being
    checked or cannot be read now (it is checked again on the next call)."""
    try:
        found = checkpoint_files.inspect(path, trial_id)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("trial %d: cannot check checkpoint %s yet: %s", trial_id, path.name, exc)
        return None
    return found if path.is_dir() else None


def _checkpoint_row(trial_id: int, found: Inspection) -> dict[str, Any]:
    return {
        "trial_id": trial_id, "name": found.name, "path": str(found.path),
        "step": found.step, "attempt": found.recorded_int("attempt"),
        "rank": found.recorded_int("rank"), "created_at": found.saved_at,
        "size_bytes": found.size_bytes, "file_count": len(found.file_sizes),
        "metadata": found.user_metadata, "intact": found.intact,
        "problem": found.problem, "registered_at": now(),
    }


def _note_registered(trial_id: int, found: Inspection, report: IngestReport) -> None:
    report.checkpoints_added.append(found.name)
    if not found.intact:
        report.corrupt_checkpoints.append(found.name)
        log.warning("trial %d: checkpoint %s is not intact: %s", trial_id, found.name,
                    found.problem)
