"""Metrics read from the rank logs into the store, as the run goes and once more at its end.

`ingest_log_metrics` scans what each rank's log gained since the last call (the log's
`IngestCursor`, `file_kind` "log", keeps the byte offset, the lines and the reports before
it: `log_metrics.Position`) in a child process (`log_metrics.scan_log`), and stores the
reports it recognised as `metrics` rows with `source` "log", in the transaction that moves
the cursor: like a metrics file's lines, a log's reports are stored once, whatever stops
the server. Rank 0's reports feed the trial's series (`muster.store.series`), so they are
charted, and a validation metric read there is the searcher's like any other.

A scan reads at most `SCAN_BYTES` (the final one `FINAL_SCAN_BYTES` in all); a log that grows
faster is read on as it goes, and verification (`log_metric_evidence`) reads every log
whole anyway.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from muster.launch.log_index import IndexWalker
from muster.launch.logs import LogPart, ReplicaLog
from muster.rundir import AttemptDir, RankFile
from muster.states import MetricSource
from muster.store import IngestCursor, Store, series
from muster.store.models import now
from muster.store.series import MetricRow
from muster.supervise.ingest import insert_if_absent, insert_metrics
from muster.supervise.log_metrics import (
    LogReport,
    Position,
    ScanResult,
    ScanSpec,
    builtin_recognisers_apply,
    scan_log,
)

if TYPE_CHECKING:
    from muster.config import ExperimentConfig
    from muster.launch.base import Launcher

__all__ = ["FINAL_SCAN_BYTES", "LOG_CURSOR", "SCAN_BYTES", "ingest_log_metrics",
           "wrote_metrics_files"]

log = logging.getLogger(__name__)

LOG_CURSOR = "log"  # IngestCursor.file_kind of a rank's log
SCAN_BYTES = 16 << 20  # a scan's bytes: a second or two of a child's time
FINAL_SCAN_BYTES = 256 << 20  # what the end of an attempt reads at most, per rank
SCAN_TIMEOUT_S = 30.0


def wrote_metrics_files(attempt_dir: Path) -> bool:
    """Whether any rank of the attempt wrote a metrics file (the harness or an integration
    reports its metrics: the built-in recognisers stay off)."""
    return bool(AttemptDir(attempt_dir).ranks_with(RankFile.METRICS))


def ingest_log_metrics(store: Store, launcher: Launcher, trial_id: int, attempt: int,
                       attempt_dir: Path, ranks: Sequence[int], config: ExperimentConfig,
                       final: bool = False) -> int:
    """Store the metrics that each rank's log gained since the last call; returns how many
    reports were stored. `final`: the replicas have exited, so a last line without its
    newline is read too.

    Raises:
        StoreError: the database failed; what was committed before stays committed.
    """
    spec = ScanSpec(config.verify.metrics_from_log,
                    builtin_recognisers_apply(config, wrote_metrics_files(attempt_dir)))
    if not spec.patterns and not spec.builtin:
        return 0
    cursors = _cursors(store, trial_id, attempt)
    added = 0
    for rank in ranks:
        replica_log = launcher.log(attempt_dir, rank)
        start = cursors.get(rank, Position())
        budget = FINAL_SCAN_BYTES if final else SCAN_BYTES
        # What the log holds now: a log still being written is not chased past it (each
        # scan is a child process; a steady writer would keep this loop going for ever).
        size = replica_log.size(LogPart.LOG)
        while budget > 0 and size > start.offset:
            limit = min(SCAN_BYTES, budget)
            whole = size - start.offset <= limit
            limit = min(limit, size - start.offset)
            result = _scan(replica_log, dataclasses.replace(
                spec, start=start, final=final and whole), limit, trial_id, attempt)
            if result is None or result.end.offset == start.offset:
                break  # a problem (logged), or only a line still being written
            if not _commit(store, trial_id, attempt, replica_log, start, result):
                break
            added += len(result.reports)
            budget -= result.end.offset - start.offset
            start = result.end
    return added


def _scan(replica_log: ReplicaLog, spec: ScanSpec, limit: int, trial_id: int,
          attempt: int) -> ScanResult | None:
    result = scan_log(replica_log, spec, SCAN_TIMEOUT_S, limit)
    if result.problem is not None:
        log.warning("trial %d, attempt %d, rank %d: %s", trial_id, attempt, replica_log.rank,
                    result.problem)
        return None
    return result


def _cursors(store: Store, trial_id: int, attempt: int) -> dict[int, Position]:
    with store.session_scope() as s:
        return {rank: Position(offset, lines, reports)
                for rank, offset, lines, reports in s.execute(select(
                    IngestCursor.rank, IngestCursor.byte_offset, IngestCursor.lines,
                    IngestCursor.reports).where(
                    IngestCursor.trial_id == trial_id, IngestCursor.attempt == attempt,
                    IngestCursor.file_kind == LOG_CURSOR))}


def _commit(store: Store, trial_id: int, attempt: int, replica_log: ReplicaLog,
            start: Position, result: ScanResult) -> bool:
    """Insert the reports and move the log's cursor from `start` to `result.end`, in one
    transaction; False (nothing stored) when another ingestion moved it meanwhile."""
    rank = replica_log.rank
    key = (IngestCursor.trial_id == trial_id, IngestCursor.attempt == attempt,
           IngestCursor.rank == rank, IngestCursor.file_kind == LOG_CURSOR)
    rows = _rows(trial_id, attempt, rank, result.reports, _arrival_times(replica_log,
                                                                          result.reports))
    with store.session_scope() as s:
        if start.offset == 0:
            s.execute(insert_if_absent(s, IngestCursor, dict(
                trial_id=trial_id, attempt=attempt, rank=rank, file_kind=LOG_CURSOR,
                byte_offset=0, lines=0, reports=0, updated_at=now())))
        cursor = s.scalars(select(IngestCursor).where(*key).with_for_update()).one()
        if cursor.byte_offset != start.offset:
            log.info("trial %d: the log of rank %d (attempt %d) was read elsewhere meanwhile",
                     trial_id, rank, attempt)
            return False
        if rows:
            insert_metrics(s, rows)
            series.record(s, trial_id, rows)
        cursor.byte_offset, cursor.lines = result.end.offset, result.end.lines
        cursor.reports, cursor.updated_at = result.end.reports, now()
    return True


def _rows(trial_id: int, attempt: int, rank: int, reports: list[LogReport],
          times: list[float]) -> list[MetricRow]:
    return [MetricRow(trial_id=trial_id, attempt=attempt, rank=rank, kind=r.kind, step=r.step,
                      time=at, values=r.values, source=MetricSource.LOG)
            for r, at in zip(reports, times, strict=True)]


def _arrival_times(replica_log: ReplicaLog, reports: list[LogReport]) -> list[float]:
    """When each report's line reached the log: the time the shim copied its chunk (the
    log's index; offsets only grow), so a rate of progress read from a log is the run's, not
    that of the scans. A log without an index: the time of this scan."""
    if not reports:
        return []
    walker = IndexWalker(replica_log, reports[0].offset)
    scanned = time.time()
    try:
        return [walker.time_at(r.offset) or scanned for r in reports]
    finally:
        walker.close()
