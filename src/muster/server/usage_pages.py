"""The web UI's Usage page: `/usage`, slot-hours and GPU-hours by user, experiment or label.

The same report as `GET /api/v1/usage` (`muster.services.usage.usage_report`, one fixed set
of queries whatever the history), for the same principal: a user's own experiments by
default, everyone's with "everyone" ticked; a GET form changes the grouping and the window.
Each number cell carries its exact value in `data-value`, the text shows it rounded.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from muster.server.pages import Visitor, render, server_state, to_login
from muster.services import usage
from muster.states import UsageBy

__all__ = ["usage_pages"]

usage_pages = APIRouter(include_in_schema=False)

# The columns of the table, in order: (row key, heading).
COLUMNS = (("slot_hours", "Slot-hours"), ("gpu_hours", "GPU-hours"),
           ("productive_hours", "Productive"), ("lost_hours", "Lost"),
           ("stalled_hours", "Stalled"), ("idle_hours", "Idle"), ("running_hours", "Running"),
           ("queued_hours", "Queued"))


@usage_pages.get("/usage", response_class=HTMLResponse)
def usage_page(
    request: Request, who: Visitor, by: UsageBy = UsageBy.USER,
    since: Annotated[str, Query(max_length=16)] = usage.DEFAULT_SINCE,
    user: Annotated[str | None, Query(max_length=32, pattern=r"^[^\x00]*$")] = None,
    everyone: bool = False,
) -> Response:
    """The usage report as a table, with its grouping and window as a form."""
    if who is None:
        return to_login(request)
    report = usage.usage_report(server_state(request).store, who, by=by, since=since,
                                user=user or None, everyone=everyone)
    return render(request, "usage.html", who, nav="usage", report=report, columns=COLUMNS,
                  groupings=list(UsageBy),
                  query={"by": by, "since": since, "user": user or "", "everyone": everyone})
