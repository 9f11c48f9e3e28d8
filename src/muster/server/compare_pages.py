"""The web UI's compare page: trials picked in an experiment's table, side by side.

`/compare?trials=12,15,19` (at most `comparison.MAX_COMPARED`): each trial's state and
verdict, its hyperparameters and metrics as rows with a cell per trial (the rows whose
cells differ marked), a link to each pair's snapshot diff (`/trials/{a}/diff?other=b`), and
the curves of one metric overlaid, drawn by `static/compare.js` from the public API
(`GET /api/v1/trials/{id}/series`). The same service (`services/comparison.py`) the tests
call; every trial is readable by every role, as `GET /api/v1/trials/{id}`.
"""

from __future__ import annotations

from itertools import combinations
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from muster.server.pages import Visitor, render, server_state, to_login
from muster.services import comparison

__all__ = ["compare_pages"]

compare_pages = APIRouter(include_in_schema=False)

# `trials=` is at most MAX_COMPARED ids of 10 digits and their commas.
Ids = Annotated[str, Query(max_length=comparison.MAX_COMPARED * 11)]


@compare_pages.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, who: Visitor, trials: Ids = "") -> Response:
    """Trials side by side (`comparison.compare_trials`); a 400 page says how to ask."""
    if who is None:
        return to_login(request)
    ids = comparison.parse_ids(trials, "trials")
    compared = comparison.compare_trials(server_state(request).store, ids)
    first = compared.series[0] if compared.series else ""
    metric = next((f"validation:{row.name[len('best '):]}" for row in compared.metrics
                   if row.name.startswith("best ")), first)
    return render(request, "compare.html", who, compared=compared,
                  pairs=list(combinations(ids, 2)), trial_ids=",".join(map(str, ids)),
                  metric=metric if metric in compared.series else first)
