"""The web UI's compare page: trials picked in an experiment's table, or experiments, side
by side.

`/compare?trials=12,15,19` (at most `comparison.MAX_COMPARED`): each trial's state and
verdict, its hyperparameters and metrics as rows with a cell per trial (the rows whose
cells differ marked), a link to each pair's snapshot diff (`/trials/{a}/diff?other=b`), and
the curves of one metric overlaid, drawn by `static/compare.js` from the public API
(`GET /api/v1/trials/{id}/series`). The same service (`services/comparison.py`) the tests
call; every trial is readable by every role, as `GET /api/v1/trials/{id}`.

`/compare?experiments=1,2`: each experiment's search and the trial that stands for it (its
best, else its latest), its config's diff against the first's, and those trials compared as
above (the searcher metric's best curves overlaid).
"""

from __future__ import annotations

from itertools import combinations
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from muster.errors import InvalidRequest
from muster.server.pages import Visitor, render, server_state, to_login
from muster.services import comparison

__all__ = ["compare_pages"]

compare_pages = APIRouter(include_in_schema=False)

# `trials=` is at most MAX_COMPARED ids of 10 digits and their commas.
Ids = Annotated[str, Query(max_length=comparison.MAX_COMPARED * 11)]


@compare_pages.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, who: Visitor, trials: Ids = "",
                 experiments: Ids = "") -> Response:
    """Trials (`comparison.compare_trials`) or experiments (`compare_experiments`) side by
    side; a 400 page says how to ask."""
    if who is None:
        return to_login(request)
    store = server_state(request).store
    if experiments and not trials:
        ids = comparison.parse_ids(experiments, "experiments")
        found = comparison.compare_experiments(store, ids)
        return render(request, "compare_experiments.html", who, found=found,
                      experiment_ids=",".join(map(str, ids)),
                      **_trials_context(found.trials))
    if experiments:
        raise InvalidRequest("compare trials (trials=12,15) or experiments (experiments=1,2), "
                             "not both at once")
    return render(request, "compare.html", who, **_trials_context(
        comparison.compare_trials(store, comparison.parse_ids(trials, "trials"))))


def _trials_context(compared: comparison.TrialComparison | None) -> dict[str, Any]:
    """What `_compare_trials.html` reads: the trials, each pair, the metric drawn first (the
    first searcher metric's curve, else the first reported)."""
    if compared is None:
        return {}
    ids = [t.id for t in compared.trials]
    searched = [f"validation:{row.name[len('best '):]}" for row in compared.metrics
                if row.name.startswith("best ")]
    metric = next((name for name in searched if name in compared.series),
                  compared.series[0] if compared.series else "")
    return {"compared": compared, "pairs": list(combinations(ids, 2)),
            "trial_ids": ",".join(map(str, ids)), "metric": metric}
