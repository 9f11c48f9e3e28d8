"""The web UI's drills: `/drills` and `/drills/{id}`.

`/drills` lists the latest drills (`GET /api/v1/drills`). `/drills/{id}` (`GET
/api/v1/drills/{id}`) shows a drill's clean run, what it scaled, and its report, a fault a
row: when it was injected, what muster said, whether that caught it, how long that took and
what to change, each row's experiment linked, then the summary line. While the drill runs,
its live part (`/ui/drills/{id}`) is polled every 2 s, and its owner and admins have a
Cancel button (`POST /api/v1/drills/{id}/cancel`, sent by the page with the session's CSRF
token, as every action of the UI: `static/muster.js`'s `data-act`). A drill is asked for
from an experiment's page ("Run a drill", `static/drill.js`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, Response

from muster import api
from muster.errors import Forbidden
from muster.server.pages import Visitor, render, server_state, to_login
from muster.services import drills
from muster.services.access import Action, Principal, authorize
from muster.store import MAX_INTEGER

__all__ = ["drill_pages"]

drill_pages = APIRouter(include_in_schema=False)

# As the API's `{drill_id}`: an id that cannot be a drill's is a 404 page.
DrillId = Annotated[int, Path(ge=1, le=MAX_INTEGER, description="a drill's id")]


@drill_pages.get("/drills", response_class=HTMLResponse)
def drills_page(request: Request, who: Visitor) -> Response:
    """The latest drills, newest first, each with its summary line."""
    if who is None:
        return to_login(request)
    return render(request, "drills.html", who, nav="drills",
                  drills=drills.list_drills(server_state(request).store, who))


@drill_pages.get("/drills/{drill_id}", response_class=HTMLResponse)
def drill_page(request: Request, who: Visitor, drill_id: DrillId) -> Response:
    """A drill and its report so far; its live part polls while it runs."""
    if who is None:
        return to_login(request)
    drill = drills.describe_drill(server_state(request).store, who, drill_id)
    return render(request, "drill.html", who, nav="drills", drill=drill,
                  can_cancel=_may_cancel(who, drill))


@drill_pages.get("/ui/drills/{drill_id}", response_class=HTMLResponse)
def drill_fragment(request: Request, who: Visitor, drill_id: DrillId) -> Response:
    """The drill page's live part: its state, clean run, report and summary."""
    if who is None:
        return Response(status_code=401)
    drill = drills.describe_drill(server_state(request).store, who, drill_id)
    return render(request, "_drill_live.html", who, drill=drill,
                  can_cancel=_may_cancel(who, drill))


def _may_cancel(who: Principal, drill: api.DrillView) -> bool:
    """Whether the page offers Cancel: a running drill, to its owner and admins (the API
    refuses anyone else anyway)."""
    if drill["state"].is_terminal():
        return False
    try:
        authorize(who, Action.KILL, owner=drill["owner"], subject=f"drill {drill['id']}")
    except Forbidden:
        return False
    return True
