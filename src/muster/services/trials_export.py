"""An experiment's trials table as CSV: what the table shows, every trial the query matches.

One row a trial, in the table's order and filter (`search.TrialQuery`); the columns are the
trial's number, id, state, verdict, restarts and times, then every hyperparameter by dotted
name (`hparam:lr`), then every validation metric its trials reported (`metric:val_loss`,
the best value as the table shows it: the searcher's metric in its direction, any other its
smallest). Quoted per RFC 4180 (CRLF line ends); a text cell a spreadsheet would read as a
formula (= + - @, tab, CR at its start) gets a leading `'`.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import math
from typing import Any

from muster import api
from muster.services import search, views
from muster.services.experiments import experiment_or_404
from muster.services.validation import best_validation
from muster.states import MetricKind
from muster.store import Store, series
from muster.store.configs import experiment_searcher

__all__ = ["FIXED_COLUMNS", "flat_hparams", "trials_csv"]

FIXED_COLUMNS = ("number", "trial", "state", "verdict", "restarts", "started_at", "ended_at")
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def trials_csv(store: Store, experiment_id: int, query: search.TrialQuery) -> str:
    """Every trial `query` matches (its offset and limit ignored) as CSV text.

    Raises:
        NotFound: no such experiment.
        InvalidRequest: as `search.trial_page`.
    """
    page = search.trial_page(store, experiment_id, dataclasses.replace(query, offset=0,
                                                                       limit=None))
    ids = [row["id"] for row in page.rows]
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        goals = views.searcher_goals(experiment_searcher(exp))
        metrics = sorted(series.names(s, ids, MetricKind.VALIDATION) | set(goals))
        best = best_validation(s, ids, {name: goals.get(name, True) for name in metrics})
        space = exp.config.get("hyperparameters") or {}
    flat = [dict(flat_hparams(row["hparams"])) for row in page.rows]
    names = dict.fromkeys(name for name, _ in flat_hparams(_space_values(space)))
    for hparams in flat:
        names.update(dict.fromkeys(hparams))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([*FIXED_COLUMNS, *(f"hparam:{n}" for n in names),
                     *(f"metric:{m}" for m in metrics)])
    for row, hparams in zip(page.rows, flat, strict=True):
        values = best.get(row["id"], {})
        writer.writerow([_cell(v) for v in (
            *_fixed(row), *(hparams.get(n) for n in names), *(values.get(m) for m in metrics))])
    return out.getvalue()


def flat_hparams(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested hyperparameters as (dotted name, value) pairs."""
    if not isinstance(tree, dict):
        return [(prefix, tree)] if prefix else []
    pairs: list[tuple[str, Any]] = []
    for key, value in tree.items():
        pairs += flat_hparams(value, f"{prefix}.{key}" if prefix else str(key))
    return pairs


def _space_values(space: Any, searched: bool = False) -> Any:
    """A config's hyperparameter space with each searched one as a leaf: its names, in the
    config's order."""
    if isinstance(space, dict) and not (searched and isinstance(space.get("type"), str)):
        return {key: _space_values(value, True) for key, value in space.items()}
    return None


def _fixed(row: api.TrialSummary) -> tuple[Any, ...]:
    return (row["number"], row["id"], row["state"].value, row["verdict"], row["restarts"],
            _time(row["started_at"]), _time(row["ended_at"]))


def _time(ts: float | None) -> str | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return str(value)
    text = value if isinstance(value, str) else repr(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text
