"""Curves for charts: metrics against steps, downsampled on the server.

What the web UI's charts draw and `GET /api/v1/experiments/{id}/curves` and
`GET /api/v1/trials/{id}/series` answer. Every curve comes from its metric series
(`muster.store.series`): at most `downsample.MAX_POINTS` points per curve, and for an
experiment's learning curves at most about `CURVES_BUDGET` points in all, so no answer ships
every report of a long search to a browser (the lesson of MLflow's and Aim's UIs, which
slowed to a halt at a few thousand runs). A trial whose series are partial
(`Trial.series_partial`: stored before series existed, or too many metrics) has its curves
made from its reports here instead.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import api
from muster.downsample import COARSE_POINTS, MAX_POINTS, Series, stored_points
from muster.errors import Conflict, InvalidRequest
from muster.services import views
from muster.services.experiments import experiment_or_404, trial_or_404
from muster.states import MetricKind
from muster.store import Metric, MetricSeries, Store, Trial, series
from muster.store.configs import experiment_searcher
from muster.store.series import finite

__all__ = ["CURVES_BUDGET", "experiment_curves", "trial_series"]

CURVES_BUDGET = 50_000  # points of an experiment's curves in all, by default
MIN_POINTS = 20  # a curve's points at least, however many trials share the budget


def experiment_curves(store: Store, experiment_id: int, metric: str | None = None,
                      kind: str = MetricKind.VALIDATION,
                      points: int | None = None) -> api.ExperimentCurves:
    """Every trial's curve of one metric (default: the searcher's) against steps, rank 0's
    reports of `kind`: `points` per curve at most (default: `CURVES_BUDGET` shared by the
    trials that have one, `MIN_POINTS` to `MAX_POINTS` each). Each trial says where the
    searcher stopped it (`early_stop`), so a chart can show ASHA's stops.

    Raises:
        NotFound: no such experiment.
        Conflict: no metric given and the searcher names none.
        InvalidRequest: an unknown kind, or `points` outside 4 to `MAX_POINTS`.
    """
    _check(kind, points)
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        searcher = experiment_searcher(exp)
        if metric is None:
            if searcher.metric is None:
                raise Conflict(f"experiment {experiment_id} has no searcher metric to draw; "
                               "name one with ?metric=NAME (a metric its trials report)")
            metric = searcher.metric
        trials = s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)
                           .order_by(Trial.number, Trial.id)).all()
        # Many trials at a few points each: their coarse copies draw the same (a curve has
        # one iff it has buckets); the whole curves only where a curve gets more points.
        fewest = points or max(MIN_POINTS, CURVES_BUDGET // max(1, len(trials)))
        coarse = fewest <= COARSE_POINTS
        curves = {trial_id: curve for trial_id, curve
                  in _curves(s, trials, kind, metric, coarse).items() if curve.get("buckets")}
        each = points or min(MAX_POINTS, max(MIN_POINTS, CURVES_BUDGET // max(1, len(curves))))
        if coarse and each > COARSE_POINTS:
            curves = {trial_id: curve for trial_id, curve
                      in _curves(s, trials, kind, metric).items() if curve.get("buckets")}
        rows: list[api.CurveView] = []
        for trial in trials:
            curve = curves.get(trial.id)
            if curve is None:
                continue
            steps, values = stored_points(curve, each)
            rows.append({"trial_id": trial.id, "number": trial.number, "state": trial.state,
                         "hparams": trial.hparams, "early_stop": views.early_stop(trial),
                         "reports": sum(bucket[0] for bucket in curve["buckets"]),
                         "steps": steps, "values": values})
        return {"experiment_id": experiment_id, "metric": metric, "kind": kind,
                "smaller_is_better": searcher.smaller_is_better
                if metric == searcher.metric else None,
                "points_per_trial": each, "trials": rows}


def trial_series(store: Store, trial_id: int, points: int = MAX_POINTS) -> api.TrialSeries:
    """Every metric the trial's rank-0 reports hold, of both kinds, as curves of at most
    `points` points, with how many reports named it and its lowest and highest finite
    value.

    Raises:
        NotFound: no such trial.
        InvalidRequest: `points` outside 4 to `MAX_POINTS`.
    """
    _check(MetricKind.VALIDATION, points)
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        rows: list[api.SeriesView] = []
        if trial.series_partial:
            for (kind, name), curve in sorted(_from_reports(s, [trial.id], None).items()):
                steps, values = curve.points(points)
                rows.append({"kind": kind, "name": name, "reports": curve.count,
                             "lowest": min(values, default=None),
                             "highest": max(values, default=None),
                             "last_step": steps[-1] if steps else None,
                             "steps": steps, "values": values})
        else:
            for row in s.scalars(select(MetricSeries).where(MetricSeries.trial_id == trial_id)
                                 .order_by(MetricSeries.kind, MetricSeries.name)):
                steps, values = Series.from_json(row.curve).points(points)
                rows.append({"kind": row.kind, "name": row.name, "reports": row.reports,
                             "lowest": row.lowest, "highest": row.highest,
                             "last_step": row.last_step, "steps": steps, "values": values})
        return {"trial_id": trial_id, "series": rows}


def _check(kind: str, points: int | None) -> None:
    if kind not in tuple(MetricKind):
        raise InvalidRequest(f"kind must be one of {', '.join(MetricKind)}, got {kind!r}")
    if points is not None and not 4 <= points <= MAX_POINTS:
        raise InvalidRequest(f"points must be 4 to {MAX_POINTS}, got {points}")


def _curves(s: Session, trials: Collection[Trial], kind: str, metric: str,
            coarse: bool = False) -> dict[int, Any]:
    """The trials' curves of `metric` as stored (`Series.to_json`), by trial id: from their
    series (with `coarse`, their coarse copies where kept: `Series.coarse`), or made from
    the reports of those whose series are partial."""
    partial = [t.id for t in trials if t.series_partial]
    whole = [t.id for t in trials if not t.series_partial]
    if not whole or not series.keepable(metric):
        curves: dict[int, Any] = {}
    else:
        of = (MetricSeries.trial_id.in_(whole), MetricSeries.kind == kind,
              MetricSeries.name == metric)
        curves = (dict(s.execute(select(MetricSeries.trial_id, MetricSeries.coarse)
                                 .where(*of)).all()) if coarse else {})
        older = [trial_id for trial_id in whole if curves.get(trial_id, 0) is None]
        if not coarse or older:  # (rows from before migration 0030 keep no coarse copy)
            curves |= dict(s.execute(select(MetricSeries.trial_id, MetricSeries.curve).where(
                *of[1:], MetricSeries.trial_id.in_(whole if not coarse else older))).all())
    for (trial_id, _, _), curve in _from_reports(s, partial, kind, metric).items():
        curves[trial_id] = curve.to_json()
    return curves


def _from_reports(s: Session, trial_ids: Collection[int], kind: str | None,
                  metric: str | None = None) -> dict[Any, Series]:
    """Curves made from the reports themselves, in the order they were stored: by (trial,
    kind, name) with `metric`, else by (kind, name) of the one trial."""
    if not trial_ids:
        return {}
    query = select(Metric.trial_id, Metric.kind, Metric.step, Metric.values).where(
        Metric.trial_id.in_(trial_ids), Metric.rank == 0).order_by(Metric.id)
    if kind is not None:
        query = query.where(Metric.kind == kind)
    curves: dict[Any, Series] = {}
    for trial_id, report_kind, step, values in s.execute(query):
        names = [metric] if metric is not None else list(values)
        for name in names:
            value = finite(values.get(name))
            if value is None:
                continue
            key = (trial_id, report_kind, name) if metric is not None else (report_kind, name)
            curves.setdefault(key, Series()).add(step, value)
    return curves
