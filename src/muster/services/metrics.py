"""Metrics and checkpoint services: what the routes call, and what tests call directly.

They read what `muster.supervise.ingest` stored from the trials' run directories.
"""

from __future__ import annotations

from sqlalchemy import Select, select

from muster import api
from muster.metrics_lines import REPORTED_KINDS
from muster.services import views
from muster.services.experiments import trial_or_404
from muster.states import MetricKind
from muster.store import Metric, Store

DEFAULT_LIMIT = 10_000
MAX_LIMIT = 100_000


def list_metrics(
    store: Store, trial_id: int, *, kind: MetricKind | None = None,
    after_step: int | None = None, limit: int = DEFAULT_LIMIT, tail: int | None = None,
) -> list[api.MetricReport]:
    """The trial's reports with a step above `after_step`, by step (then in stored order):
    its training and validation reports, or only those of `kind` (`system`: its replicas'
    resource samples, which are never among its reports unless asked for).

    A page holds `limit` reports, plus the rest of its last step's, so that asking again
    with `after_step` = the last step seen goes on exactly where the page ended. With
    `tail=N`, the last N reports instead (oldest first). NaN and ±Infinity are the strings
    "NaN", "Infinity" and "-Infinity" (see `views.metric_view`).
    """
    with store.session_scope() as s:
        trial_or_404(s, trial_id)
        query = select(Metric).where(Metric.trial_id == trial_id, Metric.kind.in_(
            REPORTED_KINDS if kind is None else (kind,)))
        if after_step is not None:
            query = query.where(Metric.step > after_step)
        if tail is not None:
            newest = query.order_by(Metric.step.desc(), Metric.id.desc()).limit(tail)
            return [views.metric_view(m) for m in reversed(s.scalars(newest).all())]
        rows = list(s.scalars(query.order_by(Metric.step, Metric.id).limit(limit)))
        if len(rows) == limit:
            rows += s.scalars(_rest_of_step(query, rows[-1]))
        return [views.metric_view(m) for m in rows]


def _rest_of_step(query: Select[Metric], last: Metric) -> Select[Metric]:
    """The reports of `last`'s step stored after it: a page never ends inside a step."""
    return query.where(Metric.step == last.step, Metric.id > last.id).order_by(Metric.id)
