"""Reading a trial's run directory into the store: metrics lines and checkpoint directories.

The harness writes files (`docs/run-directory.md`); `ingest_trial` moves what is new into
the database, and is cheap to call often: when nothing changed it costs one small query, a
directory listing per attempt and a `stat` per metrics file.

Metrics are read exactly once. Each rank's metrics file has a cursor (`IngestCursor`),
the byte offset up to which its lines are stored, and a batch of rows commits in the same
transaction as the cursor's advance, so a server that dies at any moment neither loses nor
repeats a line. Only complete lines are read: a torn last line (no "\\n" yet) waits for the
next call. A complete line that `muster.metrics_lines.parse` refuses (verification refuses
the same lines) is skipped, logged and counted; it never stops the lines after it.

Each rank's resource samples (`RankFile.SYSTEM`, written by its shim: `muster.system_metrics`)
are read the same way, with a cursor of their own, into rows of kind `system` (source
`shim`). They are counted apart from the run's reports (`IngestReport.system_added`): a
sample is no new report for the pruner to judge; and after a batch of them the GPU idle
check runs (`muster.supervise.gpu_idle`).

A checkpoint directory (`RunDir.checkpoints`) is registered once, by name, after each file
listed in its `metadata.json` has been checked against its sha256; a failed check registers
it with `intact=False` and the problem in words. Directories still being written
(`.tmp-*`) are never read.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypedDict, cast

import psycopg
from sqlalchemy import CursorResult, Insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from muster import checkpoint_files, metrics_lines
from muster.atomic import open_regular
from muster.checkpoint_files import Inspection
from muster.checkpoint_storage.metrics import Mark
from muster.errors import NotFound
from muster.rundir import AttemptDir, RankFile, RunDir
from muster.states import MetricKind, MetricSource
from muster.store import Attempt, Checkpoint, IngestCursor, Store, Trial, series
from muster.store.models import encode_non_finite, now
from muster.store.series import MetricRow
from muster.supervise.gpu_idle import ranks_last_seen_idle, warn_if_gpu_idle
from muster.supervise.step_scales import warn_if_step_scales_differ

log = logging.getLogger(__name__)

METRICS_CURSOR = "metrics"  # IngestCursor.file_kind of a rank's metrics file
SYSTEM_CURSOR = "system"  # and of its resource samples
# Bytes of complete lines per transaction: ~10,000 reports, a short hold of SQLite's lock.
BATCH_BYTES = 1 << 20
WARNINGS_PER_FILE = 5  # per call; the rest are counted in one line


@dataclass
class IngestReport:
    """What one `ingest_trial` call stored."""

    trial_id: int
    metrics_added: int = 0
    system_added: int = 0  # resource samples (`RankFile.SYSTEM`), not the run's reports
    lines_skipped: int = 0
    checkpoints_added: list[str] = field(default_factory=list)
    corrupt_checkpoints: list[str] = field(default_factory=list)
    validations: list[Mark] = field(default_factory=list)  # rank 0's, stored by this call
    # (attempt, rank) whose latest sample stored by this call shows its GPUs idle
    idle_gpu_ranks: set[tuple[int, int]] = field(default_factory=set)

    @property
    def changed(self) -> bool:
        return bool(self.metrics_added or self.lines_skipped or self.checkpoints_added)


@dataclass(frozen=True)
class MetricsFile:
    attempt: int
    rank: int
    path: Path
    size: int
    system: bool = False  # the shim's resource samples, not the run's own reports

    @property
    def cursor(self) -> str:
        return SYSTEM_CURSOR if self.system else METRICS_CURSOR

    def describe(self) -> str:
        return f"{self.path.name} of attempt {self.attempt}"


@dataclass(frozen=True)
class Known:
    """What the store already holds about a trial's files: where its attempts are, how far
    each metrics file was read, which checkpoints are registered."""

    run_dir: Path | None
    attempt_dirs: dict[int, Path]
    cursors: dict[tuple[int, int], int]
    checkpoints: frozenset[str]
    system_cursors: dict[tuple[int, int], int] = field(default_factory=dict)


def ingest_trial(store: Store, trial_id: int, known: Known | None = None) -> IngestReport:
    """Store the trial's new metrics lines and register its new checkpoint directories.

    Safe to call at any time and from a restarted server; what is already stored is never
    stored again. Two callers at once on the same trial are safe too (one of them backs off),
    and so is a `known` read a moment ago (`known_files`): a cursor that moved meanwhile is
    noticed when the batch commits.

    Raises:
        NotFound: there is no such trial.
        StoreError: the database failed; what was committed before stays committed.
    """
    report = IngestReport(trial_id)
    if known is None:
        with store.session_scope() as s:
            known = known_files(s, [trial_id]).get(trial_id)
        if known is None:
            raise NotFound(f"trial {trial_id} does not exist; nothing to ingest")
    if known.run_dir is None:
        return report
    for file in _metrics_files(known.attempt_dirs):
        cursors = known.system_cursors if file.system else known.cursors
        offset = cursors.get((file.attempt, file.rank), 0)
        if file.size == offset:
            continue
        try:
            _ingest_metrics_file(store, trial_id, file, offset, report)
        except OSError as exc:  # e.g. permissions: the next call tries again
            log.warning("trial %d: cannot read %s: %s", trial_id, file.describe(), exc)
    _register_checkpoints(store, trial_id, RunDir(known.run_dir).checkpoints,
                          known.checkpoints, report)
    warn_if_step_scales_differ(store, trial_id, report.validations,
                               bool(report.checkpoints_added))
    if report.idle_gpu_ranks:
        warn_if_gpu_idle(store, trial_id, report.idle_gpu_ranks)
    return report


def known_files(s: Session, trial_ids: Collection[int]) -> dict[int, Known]:
    """`Known` of each of these trials that exists, in three queries whatever their number."""
    ids = list(trial_ids)
    attempts: dict[int, dict[int, Path]] = {trial_id: {} for trial_id in s.scalars(
        select(Trial.id).where(Trial.id.in_(ids)))}
    for trial_id, number, run_dir in s.execute(select(
            Attempt.trial_id, Attempt.number, Attempt.run_dir).where(Attempt.trial_id.in_(ids))):
        attempts[trial_id][number] = Path(run_dir)
    cursors: dict[str, dict[int, dict[tuple[int, int], int]]] = {
        METRICS_CURSOR: defaultdict(dict), SYSTEM_CURSOR: defaultdict(dict)}
    for trial_id, kind, attempt, rank, offset in s.execute(select(
            IngestCursor.trial_id, IngestCursor.file_kind, IngestCursor.attempt,
            IngestCursor.rank, IngestCursor.byte_offset).where(
            IngestCursor.trial_id.in_(ids),
            IngestCursor.file_kind.in_((METRICS_CURSOR, SYSTEM_CURSOR)))):
        cursors[kind][trial_id][(attempt, rank)] = offset
    names: dict[int, set[str]] = defaultdict(set)
    for trial_id, name in s.execute(select(Checkpoint.trial_id, Checkpoint.name).where(
            Checkpoint.trial_id.in_(ids))):
        names[trial_id].add(name)
    return {trial_id: Known(
        run_dir=next(iter(dirs.values())).parent if dirs else None, attempt_dirs=dirs,
        cursors=cursors[METRICS_CURSOR][trial_id], checkpoints=frozenset(names[trial_id]),
        system_cursors=cursors[SYSTEM_CURSOR][trial_id])
        for trial_id, dirs in attempts.items()}


def _metrics_files(attempt_dirs: dict[int, Path]) -> Iterator[MetricsFile]:
    """Every rank's metrics file and resource samples, attempt by attempt."""
    for number, folder in sorted(attempt_dirs.items()):
        for kind, rank, path in AttemptDir(folder).rank_files(_INGESTED):
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                # Append-only files do not vanish; one that did has nothing left to read.
                log.warning("%s was removed while its attempt's files were listed", path)
                continue
            yield MetricsFile(number, rank, path, size, system=kind is RankFile.SYSTEM)


_INGESTED = (RankFile.METRICS, RankFile.SYSTEM)


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
    with os.fdopen(open_regular(file.path), "rb") as stream:
        stream.seek(offset)
        while data := _read_complete_lines(stream, file.size - offset):
            rows, problems = _parse_lines(data, file, trial_id, offset)
            if not _commit_batch(store, trial_id, file, offset, offset + len(data), rows):
                return
            if file.system:
                report.system_added += len(rows)
                report.idle_gpu_ranks.update(ranks_last_seen_idle(rows))
            else:
                report.metrics_added += len(rows)
                report.validations.extend(Mark(row["attempt"], row["time"], row["step"])
                                          for row in rows if row["rank"] == 0
                                          and row["kind"] == MetricKind.VALIDATION)
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
) -> tuple[list[MetricRow], list[tuple[int, str]]]:
    """The rows of the complete lines in `data`, and (byte offset, why) per skipped line."""
    rows: list[MetricRow] = []
    problems: list[tuple[int, str]] = []
    for line in data.split(b"\n")[:-1]:
        try:
            row = _metric_row(line, file, trial_id)
        except metrics_lines.BadLine as exc:
            problems.append((offset, str(exc)))
        else:
            if row is not None:
                rows.append(row)
        offset += len(line) + 1
    return rows, problems


def _metric_row(line: bytes, file: MetricsFile, trial_id: int) -> MetricRow | None:
    """The `metrics` row of one complete report line; None for a blank line.

    Raises:
        metrics_lines.BadLine: the line is not a report in the documented format.
    """
    kinds = metrics_lines.SYSTEM_KINDS if file.system else metrics_lines.REPORTED_KINDS
    report = metrics_lines.parse(line, file.rank, kinds)
    if report is None:
        return None
    row = MetricRow(trial_id=trial_id, attempt=file.attempt, rank=report.rank,
                    kind=report.kind, step=report.step, time=report.time,
                    values=report.metrics)
    if file.system:
        row["source"] = MetricSource.SHIM
    return row


def _commit_batch(
    store: Store, trial_id: int, file: MetricsFile, start: int, end: int,
    rows: list[MetricRow],
) -> bool:
    """Insert `rows` and move the file's cursor from `start` to `end`, in one transaction.

    Returns False (and stores nothing) when the cursor is no longer at `start`: another
    ingestion of the same trial got there first.
    """
    key = (IngestCursor.trial_id == trial_id, IngestCursor.attempt == file.attempt,
           IngestCursor.rank == file.rank, IngestCursor.file_kind == file.cursor)
    with store.session_scope() as s:
        if start == 0:
            s.execute(insert_if_absent(s, IngestCursor, dict(
                trial_id=trial_id, attempt=file.attempt, rank=file.rank,
                file_kind=file.cursor, byte_offset=0, updated_at=now())))
        cursor = s.scalars(select(IngestCursor).where(*key).with_for_update()).one()
        if cursor.byte_offset != start:
            log.info("trial %d: %s was ingested elsewhere meanwhile (cursor at %d, not %d)",
                     trial_id, file.describe(), cursor.byte_offset, start)
            return False
        if rows:
            insert_metrics(s, rows)
            series.record(s, trial_id, rows)
        cursor.byte_offset, cursor.updated_at = end, now()
    return True


def insert_metrics(s: Session, rows: list[MetricRow]) -> None:
    """`rows` into `metrics` in `s`'s transaction, each value as its column's type binds it
    (`NonFiniteJSON`'s encoding, the enums' words) but without SQLAlchemy's per-row work,
    which cost more than the database's own: on PostgreSQL one `COPY`, on SQLite one
    executemany."""
    # A member or its word (log reports give words), as `EnumText` took them; another word
    # is a KeyError, not a row.
    values = [(row["trial_id"], row["attempt"], row["rank"], _KINDS[row["kind"]], row["step"],
               row["time"], _ENCODE(encode_non_finite(row["values"])),
               _SOURCES[row.get("source", MetricSource.HARNESS)])
              for row in rows]
    connection = s.connection()
    columns = ", ".join(_METRIC_COLUMNS)
    if connection.dialect.name == "postgresql":
        driver = connection.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)  # the only PostgreSQL driver muster uses
        with driver.cursor() as cursor, cursor.copy(
                f"COPY metrics ({columns}) FROM STDIN") as copy:
            for value in values:
                copy.write_row(value)
        return
    connection.exec_driver_sql(
        f"INSERT INTO metrics ({columns}) VALUES ({', '.join('?' * len(_METRIC_COLUMNS))})",
        values)


_METRIC_COLUMNS = ("trial_id", "attempt", "rank", "kind", "step", "time", '"values"', "source")
_ENCODE = json.JSONEncoder().encode  # as the JSON column's serializer writes (json.dumps)
_KINDS = {str(kind): str(kind) for kind in MetricKind}  # a StrEnum member is its word's key
_SOURCES = {str(source): str(source) for source in MetricSource}


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


def insert_if_absent(s: Session, model: type[IngestCursor | Checkpoint],
                      values: Mapping[str, object]) -> Insert:
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
            result = cast(CursorResult[Any], s.execute(insert_if_absent(s, Checkpoint, row)))
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


class CheckpointRow(TypedDict):
    """A `checkpoints` row as registration inserts it (the columns it sets)."""

    trial_id: int
    name: str
    path: str
    step: int
    attempt: int | None
    rank: int | None
    created_at: float | None
    size_bytes: int
    file_count: int
    metadata: object  # what the training code passed to save(metadata=...), as read
    intact: bool
    problem: str | None
    registered_at: float


def _checkpoint_row(trial_id: int, found: Inspection) -> CheckpointRow:
    return CheckpointRow(
        trial_id=trial_id, name=found.name, path=str(found.path), step=found.step,
        attempt=found.recorded_int("attempt"), rank=found.recorded_int("rank"),
        created_at=found.saved_at, size_bytes=found.size_bytes,
        file_count=len(found.file_sizes), metadata=found.user_metadata,
        intact=found.intact, problem=found.problem, registered_at=now())


def _note_registered(trial_id: int, found: Inspection, report: IngestReport) -> None:
    report.checkpoints_added.append(found.name)
    if not found.intact:
        report.corrupt_checkpoints.append(found.name)
        log.warning("trial %d: checkpoint %s is not intact: %s", trial_id, found.name,
                    found.problem)
