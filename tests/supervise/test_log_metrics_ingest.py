"""Metrics read from rank logs into the store (`log_metrics_ingest`), on both backends: each
report once however the log is read, marked as read from the log, rank 0's in the series;
a line still being written waits until the run has ended."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy import select

from muster.config import ExperimentConfig
from muster.launch.local import LocalLauncher
from muster.rundir import RankFiles
from muster.store import IngestCursor, Metric, MetricSeries, Store
from muster.supervise.log_metrics_ingest import ingest_log_metrics
from tests.supervise.test_ingest import RunDir, add_run


@pytest.fixture
def store(shared_store: Store) -> Store:
    return shared_store


def _config(**verify: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {"name": "t", "entrypoint": "python train.py", "verify": verify})


def _append(run: RunDir, rank: int, text: str) -> None:
    path = RankFiles(run.root / "attempt-1", rank).log
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as log:
        log.write(text.encode())


def _ingest(store: Store, run: RunDir, config: ExperimentConfig, final: bool = False) -> int:
    return ingest_log_metrics(store, LocalLauncher(), run.trial_id, 1, run.root / "attempt-1",
                              [0, 1], config, final=final)


def _rows(store: Store, trial_id: int) -> list[tuple[int, str, int, dict[str, float], str]]:
    with store.session_scope() as s:
        return [(m.rank, m.kind, m.step, m.values, m.source) for m in s.scalars(
            select(Metric).where(Metric.trial_id == trial_id).order_by(Metric.id))]


def test_log_reports_are_stored_once_as_they_come(store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path / "run")
    config = _config()
    _append(run, 0, "starting\n{'loss': 0.5, 'epoch': 0.5}\n{'loss': 0.4, 'ep")
    _append(run, 1, "loss: 9.0\n")
    assert _ingest(store, run, config) == 2
    assert _ingest(store, run, config) == 0  # nothing new: the torn line waits
    _append(run, 0, "och': 1.0}\nstep 7: train loss 0.3, val loss nan\nloss: 0.2")
    assert _ingest(store, run, config) == 3
    assert _ingest(store, run, config, final=True) == 1  # the run ended: its last line too
    assert _ingest(store, run, config, final=True) == 0
    rows = _rows(store, run.trial_id)
    assert [r[:3] for r in rows] == [(0, "training", 0), (1, "training", 0),
                                     (0, "training", 1), (0, "training", 7),
                                     (0, "validation", 7), (0, "training", 3)]
    assert {r[4] for r in rows} == {"log"}
    assert rows[2][3] == {"loss": 0.4, "epoch": 1.0} and math.isnan(rows[4][3]["val_loss"])
    with store.session_scope() as s:
        cursor = s.scalars(select(IngestCursor).where(
            IngestCursor.trial_id == run.trial_id, IngestCursor.rank == 0,
            IngestCursor.file_kind == "log")).one()
        assert (cursor.lines, cursor.reports) == (4, 4)  # 4 lines recognised, 5 reports
        kept = {(m.kind, m.name): (m.reports, m.lowest, m.highest) for m in s.scalars(
            select(MetricSeries).where(MetricSeries.trial_id == run.trial_id))}
    assert kept[("training", "loss")] == (3, 0.2, 0.5)  # rank 0's only
    assert kept[("validation", "val_loss")] == (1, None, None)  # NaN is no value


def test_nothing_is_read_where_nothing_applies(store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path / "run")
    _append(run, 0, "loss: 0.5\nacc=0.9\n")
    assert _ingest(store, run, _config(log_metrics="off"), final=True) == 0
    harness = ExperimentConfig.model_validate(
        {"name": "t", "entrypoint": "python train.py", "harness": True})
    assert _ingest(store, run, harness, final=True) == 0
    named = _config(log_metrics="off", metrics_from_log={"acc": r"acc=(?P<value>\S+)"})
    assert _ingest(store, run, named, final=True) == 1
    assert [r[3] for r in _rows(store, run.trial_id)] == [{"acc": 0.9}]


def test_a_metrics_file_turns_the_recognisers_off(store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path / "run")
    _append(run, 0, "loss: 0.5\n")
    run.report(0)  # the harness (or an integration) reports this run's metrics
    assert _ingest(store, run, _config(), final=True) == 0
