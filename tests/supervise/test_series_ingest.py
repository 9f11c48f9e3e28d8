"""Metric series written with the reports they summarise, through real ingestion of real
files on both backends: the best values read from them are those of the reports, across
attempts and with NaN; what cannot be kept falls back to the reports, never goes missing."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from sqlalchemy import select

from muster.downsample import Series
from muster.services.validation import best_validation
from muster.store import Metric, MetricSeries, Store, Trial, series
from muster.supervise.ingest import ingest_trial
from tests.supervise.test_ingest import RunDir, add_run


@pytest.fixture
def store(shared_store: Store) -> Store:
    return shared_store


def _from_reports(store: Store, trial_id: int, goals: dict[str, bool]) -> dict[str, float]:
    """The best of each metric over the trial's rank-0 validation reports, read from the
    reports themselves: what the series must agree with."""
    with store.session_scope() as s:
        reports = s.scalars(select(Metric.values).where(
            Metric.trial_id == trial_id, Metric.kind == "validation", Metric.rank == 0)).all()
    best: dict[str, float] = {}
    for name, smaller_is_better in goals.items():
        values = [float(v[name]) for v in reports if isinstance(v.get(name), int | float)
                  and not isinstance(v.get(name), bool) and math.isfinite(v[name])]
        if values:
            best[name] = min(values) if smaller_is_better else max(values)
    return best


def _best(store: Store, trial_id: int, goals: dict[str, bool]) -> dict[str, float]:
    with store.session_scope() as s:
        return best_validation(s, [trial_id], goals).get(trial_id, {})


def test_best_values_are_those_of_the_reports(store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path / "run", attempts=2)
    rng = random.Random(3)
    for attempt, steps in ((1, range(0, 40)), (2, range(30, 80))):  # 2 resumed at 30
        for step in steps:
            value = rng.choice([math.nan, math.inf, rng.uniform(-5, 5)])
            run.report(step, attempt=attempt, kind="validation", acc=value, loss=-value)
            run.report(step, attempt=attempt, rank=1, kind="validation", acc=99.0)  # not rank 0
            run.report(step, attempt=attempt, kind="training", acc=123.0)  # not validation
        ingest_trial(store, run.trial_id)
    for goals in ({"acc": False, "loss": True}, {"acc": True}, {"loss": False}):
        assert _best(store, run.trial_id, goals) == _from_reports(store, run.trial_id, goals)
    assert _best(store, run.trial_id, {"absent": True}) == {}


def test_the_curve_is_the_rank_0_reports_in_buckets(store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path / "run", attempts=2)
    expected = Series()
    for attempt, steps in ((1, range(0, 3_000)), (2, range(2_500, 4_000))):
        for step in steps:
            value = math.cos(step / 300) + attempt
            run.report(step, attempt=attempt, kind="validation", acc=value)
            expected.add(step, value)
        ingest_trial(store, run.trial_id)
    with store.session_scope() as s:
        row = s.scalars(select(MetricSeries).where(MetricSeries.trial_id == run.trial_id)).one()
        assert (row.kind, row.name, row.reports, row.last_step) == (
            "validation", "acc", 4_500, 3_999)
        assert Series.from_json(row.curve).points() == expected.points()
        assert not s.get(Trial, run.trial_id).series_partial


def _fill(run: RunDir, names: list[str]) -> None:
    for step in range(3):
        for name in names:
            run.report(step, kind="validation", **{name: float(step + len(name))})


def test_too_many_metrics_fall_back_to_the_reports(store: Store, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series, "MAX_SERIES", 3)
    run = add_run(store, tmp_path / "run")
    names = ["a", "bb", "ccc", "dddd", "eeeee"]
    _fill(run, names)
    ingest_trial(store, run.trial_id)
    goals = dict.fromkeys(names, False)
    with store.session_scope() as s:
        kept = s.scalars(select(MetricSeries.name).where(
            MetricSeries.trial_id == run.trial_id)).all()
        assert len(kept) == 3 and s.get(Trial, run.trial_id).series_partial
    assert _best(store, run.trial_id, goals) == _from_reports(store, run.trial_id, goals)
    assert _best(store, run.trial_id, goals)["eeeee"] == 7.0


def test_a_name_that_breaks_the_rule_is_never_stored(store: Store, tmp_path: Path) -> None:
    """A name too long for the series table, or one no database text can hold (PostgreSQL's
    text holds no NUL, UTF-8 no lone surrogate), breaks the one rule of names
    (`metrics_lines.NAME_RULE`): its lines are skipped as unreadable, never stored, never
    stop ingestion, and the other names' series are whole."""
    run = add_run(store, tmp_path / "run")
    odd = ["x" * 500, "nul\x00name", "half\ud800surrogate"]
    _fill(run, ["ok", *odd])
    report = ingest_trial(store, run.trial_id)
    assert (report.metrics_added, report.lines_skipped) == (3, 9)
    goals = dict.fromkeys(["ok", *odd], True)
    assert _best(store, run.trial_id, goals) == {"ok": 2.0}
    assert _from_reports(store, run.trial_id, {"ok": True}) == {"ok": 2.0}
    with store.session_scope() as s:
        assert not s.get(Trial, run.trial_id).series_partial
