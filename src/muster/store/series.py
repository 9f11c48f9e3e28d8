"""Metric series: each metric's best values and curve kept with the reports that make them.

Rank 0's reports are what a trial's values are (the best validation value, the curves of the
web UI); `record` folds a batch of them into one `MetricSeries` row per (kind, metric), in
the transaction that inserts the reports, so a trial's best value or curve is one row to
read however many reports it made. What cannot be kept (more than `MAX_SERIES` metrics of
a kind, a name longer than `SERIES_NAME_LENGTH` or one a database cannot hold as text)
marks the trial `series_partial`, and its readers fall back to the reports for that trial:
a value is never missing, only slower.

The shim's resource samples (kind `system`, `muster.system_metrics`) are every replica's,
so their series are kept per rank: each sample of rank r names the series
`<metric>/rank-<r>` (`system_metrics.series_name`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import Any, NotRequired, TypedDict

from sqlalchemy import Insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from muster.downsample import Series
from muster.states import MetricKind, MetricSource
from muster.store.models import SERIES_NAME_LENGTH, Metric, MetricSeries, Trial
from muster.system_metrics import series_name

__all__ = ["MAX_SERIES", "MetricRow", "extremes", "finite", "keepable", "names", "record"]

MAX_SERIES = 1000  # metrics of one kind kept per trial


class MetricRow(TypedDict):
    """A `metrics` row as ingestion inserts it (`COPY` or a DBAPI executemany: no ORM objects)."""

    trial_id: int
    attempt: int
    rank: int
    kind: MetricKind
    step: int
    time: float
    values: dict[str, int | float]  # metric name → value (NaN and ±inf included)
    source: NotRequired[MetricSource]  # absent: the column's default, HARNESS


def record(s: Session, trial_id: int, rows: Iterable[MetricRow]) -> None:
    """Fold the rank-0 reports among `rows` (`metrics` rows: kind, step, values, rank), and
    the resource samples of every rank, into the trial's series, in `s`'s transaction.

    Series rows are made if absent and then locked in one order (kind, name), so two
    ingestions of one trial's files wait for each other instead of losing an update.
    """
    by_kind: dict[MetricKind, dict[str, list[tuple[int, Any]]]] = {}
    for row in rows:
        kind, rank = row["kind"], row["rank"]
        system = kind is MetricKind.SYSTEM
        if rank != 0 and not system:
            continue
        step, names = row["step"], by_kind.get(kind)
        if names is None:
            names = by_kind[kind] = {}
        for reported, value in row["values"].items():
            name = series_name(reported, rank) if system else reported
            try:
                names[name].append((step, value))
            except KeyError:
                names[name] = [(step, value)]
    reports = {(kind, name): points for kind, names in by_kind.items()
               for name, points in names.items()}
    if not reports:
        return
    keys = sorted(key for key in reports if keepable(key[1]))
    partial = len(keys) < len(reports)
    stored = {(kind, name) for kind, name in s.execute(select(  # MAX_SERIES a kind at most
        MetricSeries.kind, MetricSeries.name).where(MetricSeries.trial_id == trial_id))}
    kept = stored & set(keys)
    room = {kind: MAX_SERIES - sum(k == kind for k, _ in stored) for kind, _ in keys}
    for kind, name in keys:
        if (kind, name) in kept:
            continue
        if room[kind] <= 0:
            partial = True
            continue
        room[kind] -= 1
        kept.add((kind, name))
        s.execute(_insert_if_absent(s, trial_id, kind, name))
    for series in _locked(s, trial_id, kept):
        _fold(series, reports[(series.kind, series.name)])
    if partial:
        s.execute(update(Trial).where(Trial.id == trial_id).values(series_partial=True))


def keepable(name: str) -> bool:
    """Whether a metric name fits a series row: at most `SERIES_NAME_LENGTH` characters and
    text every database holds (no NUL, which PostgreSQL's text refuses, and no lone
    surrogate, which is no UTF-8; JSON can spell both, and the reports keep them)."""
    if len(name) > SERIES_NAME_LENGTH or "\x00" in name:
        return False
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _locked(s: Session, trial_id: int, wanted: set[tuple[MetricKind, str]]
            ) -> list[MetricSeries]:
    rows = s.scalars(select(MetricSeries).where(
        MetricSeries.trial_id == trial_id, MetricSeries.name.in_({n for _, n in wanted}))
        .order_by(MetricSeries.kind, MetricSeries.name).with_for_update()).all()
    return [row for row in rows if (row.kind, row.name) in wanted]


def _fold(series: MetricSeries, points: list[tuple[int, Any]]) -> None:
    if series.kind is MetricKind.SYSTEM:
        points = _later(points, series.last_step)
        if not points:
            return
    kept = [(step, value) for step, value in points
            if type(value) is float and value - value == 0.0]  # finite floats: the usual
    if len(kept) < len(points):  # ints, NaN or ±inf among them: one by one
        kept = [(step, number) for step, value in points
                if (number := finite(value)) is not None]
    curve = Series.from_json(series.curve)
    curve.extend(kept)
    if kept:
        values = [value for _, value in kept]
        lowest, highest = min(values), max(values)
        series.lowest = lowest if series.lowest is None else min(series.lowest, lowest)
        series.highest = highest if series.highest is None else max(series.highest, highest)
    series.reports += len(points)
    series.last_step = points[-1][0]
    series.curve = curve.to_json()
    if series.kind is not MetricKind.SYSTEM:  # (no chart draws many resource series)
        series.coarse = curve.coarse()


def _later(points: list[tuple[int, Any]], last: int | None) -> list[tuple[int, Any]]:
    """A resource series' new samples in time order, each later than the one before (and
    than `last`, the series' latest): its steps are times, and two attempts of one rank
    (nodes whose clocks differ) must not cut it back as a resumed run's reports do."""
    later = []
    for step, value in sorted(points, key=lambda point: point[0]):
        if last is None or step > last:
            later.append((step, value))
            last = step
    return later


def finite(value: Any) -> float | None:
    """`value` as a float if it is a finite number (NaN, ±inf and an int too large for a
    float are no value)."""
    if type(value) is float and value - value == 0.0:  # the usual case, first
        return value
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _insert_if_absent(s: Session, trial_id: int, kind: str, name: str) -> Insert:
    """An empty series row of the metric, unless there is one."""
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    statement: Insert = dialect.insert(MetricSeries).values(
        trial_id=trial_id, kind=kind, name=name, reports=0, curve={}).on_conflict_do_nothing()
    return statement


def final_values(s: Session, trial_ids: Iterable[int], names: Sequence[str]
                 ) -> dict[int, dict[str, float]]:
    """Per trial, the value of each of `names` in rank 0's last validation report that
    holds it (a later attempt's report is later: the resumed run is what continued): what a
    multi-objective search and its Pareto front compare. NaN and ±inf are kept (a trial
    that ended on one has no place on the front); a value that is not a number is none."""
    ids = list(trial_ids)
    if not ids or not names:
        return {}
    rows = s.execute(select(Metric.trial_id, Metric.values)
                     .where(Metric.trial_id.in_(ids), Metric.kind == MetricKind.VALIDATION,
                            Metric.rank == 0)
                     .order_by(Metric.attempt, Metric.step, Metric.id))
    found: dict[int, dict[str, float]] = {}
    for trial_id, values in rows:
        if not isinstance(values, dict):
            continue
        for name in names:
            value = values.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found.setdefault(trial_id, {})[name] = float(value)
    return found


def extremes(
    s: Session, trial_ids: Collection[int], kind: str, names: Collection[str]
) -> dict[int, dict[str, tuple[float, float]]]:
    """Per trial, (lowest, highest) finite value of each of `names` its rank-0 reports of
    `kind` hold; a trial without a finite value of a name leaves it out. Read from the
    series, and from the reports for a `series_partial` trial."""
    if not trial_ids or not names:
        return {}
    found: dict[int, dict[str, tuple[float, float]]] = {}
    partial = []
    kept = [name for name in names if keepable(name)]  # the others have no series
    rows = s.execute(select(Trial.id, Trial.series_partial, MetricSeries.name,
                            MetricSeries.lowest, MetricSeries.highest)
                     .outerjoin(MetricSeries, (MetricSeries.trial_id == Trial.id)
                                & (MetricSeries.kind == kind) & MetricSeries.name.in_(kept)
                                & MetricSeries.lowest.is_not(None))
                     .where(Trial.id.in_(trial_ids)))
    for trial_id, is_partial, name, lowest, highest in rows:
        if is_partial:
            partial.append(trial_id)
        if name is not None and lowest is not None and highest is not None:
            found.setdefault(trial_id, {})[name] = (lowest, highest)
    for trial_id, values in _reports(s, set(partial), kind):
        for name in names:
            value = finite(values.get(name))
            if value is not None:
                low, high = found.setdefault(trial_id, {}).get(name, (value, value))
                found[trial_id][name] = (min(low, value), max(high, value))
    return found


def names(s: Session, trial_ids: Collection[int], kind: str) -> set[str]:
    """The metric names the trials' rank-0 reports of `kind` hold (a `series_partial`
    trial's read from its reports)."""
    if not trial_ids:
        return set()
    found = set(s.scalars(select(MetricSeries.name).where(
        MetricSeries.trial_id.in_(trial_ids), MetricSeries.kind == kind).distinct()))
    partial = s.scalars(select(Trial.id).where(Trial.id.in_(trial_ids),
                                               Trial.series_partial.is_(True))).all()
    for _, values in _reports(s, partial, kind):
        found.update(values)
    return found


def _reports(s: Session, trial_ids: Collection[int], kind: str
             ) -> Iterable[tuple[int, dict[str, int | float]]]:
    if not trial_ids:
        return []
    rows = s.execute(select(Metric.trial_id, Metric.values).where(
        Metric.trial_id.in_(trial_ids), Metric.kind == kind, Metric.rank == 0))
    return [(trial_id, values) for trial_id, values in rows]
