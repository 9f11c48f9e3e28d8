"""The web UI's pages: server-rendered HTML (Jinja2), made live with htmx.

Every page and fragment is rendered from the same service calls as the API routes that
serve the same data (named in each docstring), with the same principal, so the UI shows
nothing the API (and the CLI) cannot; its actions are calls to the API itself, from the
browser, with the session's CSRF token (`hx-headers` on the page's body). A request without
a working session is shown the login form at `/` and sent there from every other page.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import yaml
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from muster import __version__, api, ui
from muster.errors import InvalidRequest, MusterError, NotFound, TooManyRequests, Unauthorized
from muster.server.account_routes import (
    client_address,
    open_session,
)
from muster.server.auth import (
    SESSION_COOKIE,
    authenticate,
    check_csrf,
    clear_session_cookie,
    own_origin,
    set_session_cookie,
)
from muster.server.register_form import register_offer
from muster.server.state import ServerState
from muster.server.static_files import asset
from muster.services import (
    artifacts,
    audit,
    cluster,
    drills,
    environments,
    experiments,
    jobs,
    listing,
    logs,
    registry,
    retention,
    search,
    snapshots,
    tokens,
)
from muster.services.access import Action, Principal, authorize
from muster.services.views import ExperimentOverview
from muster.sizes import format_size
from muster.states import CheckStatus, DrillFault, ExperimentState, Role, TrialState
from muster.store import MAX_INTEGER, Store
from muster.verdicts import check_status
from muster.words import count, progress_line

__all__ = ["PAGE_ROWS", "Visitor", "check_form_csrf", "error_page", "pages", "render",
           "server_state", "to_login"]

log = logging.getLogger(__name__)

PAGE_ROWS = 50  # experiments per page of the list
LOGIN_CHECK = "muster_login"  # the login form's double-submit cookie

pages = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=ui.TEMPLATES)


NONE = "\N{EN DASH}"  # what a table cell without a value shows
# A template's variables by name: whatever the template reads (rows, queries, helpers).
TemplateContext = dict[str, Any]


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else NONE


def _clock(ts: float | None) -> str:
    """The time of day, to the second (a drill's faults come seconds apart)."""
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else NONE


def _duration(start: float | None, end: float | None) -> str:
    if not start:
        return NONE
    seconds = max(0.0, (end or time.time()) - start)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _flat(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested hyperparameters as (dotted name, value) pairs."""
    if not isinstance(tree, dict):
        return [(prefix, tree)]
    pairs: list[tuple[str, Any]] = []
    for key, value in tree.items():
        pairs += _flat(value, f"{prefix}.{key}" if prefix else str(key))
    return pairs


def _verdict_class(verified: bool | None, state: str) -> str:
    """How a trial's verdict looks (`verdict-<class>` in muster.css)."""
    if verified is None:
        return "pending"
    if verified:
        return "verified"
    classes: dict[str, str] = {TrialState.SUCCEEDED: "not-verified",
                               TrialState.SUSPECT: "suspect"}
    return classes.get(state, "failed")


def _check_status(check: Any) -> str:
    """A verification check's status, also for one stored before checks had one."""
    return check_status(check) if isinstance(check, Mapping) else CheckStatus.FAILED


templates.env.globals["asset"] = asset
templates.env.filters.update(when=_when, clock=_clock, duration=_duration, number=_number,
                             flat=_flat, size=format_size, count=count,
                             verdict_class=_verdict_class, check_status=_check_status,
                             progress_line=progress_line,
                             previewable=lambda path: artifacts.preview_kind(path) is not None)


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.muster
    return state


def _visitor(request: Request) -> Principal | None:
    """Who the browser is logged in as (a session cookie; a bearer token works too, for
    scripts such as `make screenshots`); None for nobody."""
    try:
        return authenticate(request, server_state(request).store, csrf=False)
    except Unauthorized:
        return None


Visitor = Annotated[Principal | None, Depends(_visitor)]


def render(request: Request, template: str, who: Principal | None, status: int = 200,
            **context: Any) -> HTMLResponse:
    cookie = request.cookies.get(SESSION_COOKIE)
    csrf = tokens.csrf_token(cookie) if who is not None and who.via_session and cookie else ""
    return templates.TemplateResponse(request, template, status_code=status, context={
        "me": who, "csrf": csrf, "version": __version__,
        "can_submit": who is not None and who.role is not Role.VIEWER,
        "assets_missing": ui.assets_missing(), **context})


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """A page's error as a page (the API's errors stay JSON)."""
    return render(request, "error.html", _visitor_or_none(request), status=status,
                   status_code=status, message=message)


def _visitor_or_none(request: Request) -> Principal | None:
    try:
        return _visitor(request)
    except MusterError:  # the database is what failed: the error page shows no user
        return None


# -- logging in and out ------------------------------------------------------------------

@pages.get("/login", response_class=HTMLResponse)
def login_page(request: Request, who: Visitor, next: str = "/") -> Response:
    if who is not None:
        return RedirectResponse(_local(next), status_code=303)
    return _login_form(request, next)


def _login_form(request: Request, next: str, problem: str = "", name: str = "",
                status: int = 200) -> HTMLResponse:
    """The login form, with a fresh value for its double-submit check (a cross-site form
    cannot read the cookie to copy it into the field)."""
    check = secrets.token_urlsafe(16)
    response = render(request, "login.html", None, status=status, login_check=check,
                       next=_local(next), problem=problem, name=name)
    response.set_cookie(LOGIN_CHECK, check, max_age=3600, path="/login", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@pages.post("/login", response_class=HTMLResponse)
async def log_in(request: Request) -> Response:
    """The login form's post: a password or a token → a web session, then `next`."""
    form = await request.form()
    fields = {key: str(form.get(key) or "") for key in
              ("name", "password", "token", "login_check", "next")}
    origin = request.headers.get("origin")
    if (not fields["login_check"] or fields["login_check"] != request.cookies.get(LOGIN_CHECK)
            or (origin is not None and origin != own_origin(request))):
        return _login_form(request, fields["next"], "The login form expired; log in again.",
                           fields["name"], status=403)
    try:
        login = await open_session(server_state(request), client_address(request),
                                   fields["name"] or None,
                                   fields["password"] or None, fields["token"].strip() or None)
    except (Unauthorized, InvalidRequest, TooManyRequests) as exc:
        status = 429 if isinstance(exc, TooManyRequests) else 401
        return _login_form(request, fields["next"], str(exc), fields["name"], status=status)
    response = RedirectResponse(_local(fields["next"]), status_code=303)
    set_session_cookie(response, request, login.secret)
    response.delete_cookie(LOGIN_CHECK, path="/login")
    return response


@pages.post("/logout")
async def log_out(request: Request, who: Visitor) -> Response:
    """The logout button (a form with the session's CSRF token)."""
    response = RedirectResponse("/", status_code=303)
    cookie = request.cookies.get(SESSION_COOKIE)
    if who is not None and who.via_session and cookie:
        form = await request.form()
        check_form_csrf(request, cookie, str(form.get("csrf_token") or ""))
        await asyncio.to_thread(tokens.log_out, server_state(request).store, who)
        server_state(request).follows.recheck(who.name)
    clear_session_cookie(response, request)
    return response


def check_form_csrf(request: Request, cookie: str, given: str) -> None:
    """A plain form's CSRF check: its hidden field, as htmx's header would be."""
    if not hmac.compare_digest(given.encode(), tokens.csrf_token(cookie).encode()):
        check_csrf(request, cookie)  # no header either: refused with the API's sentence


def _local(target: str) -> str:
    """`target` if it is a path on this server, else `/` (no open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


# -- the experiments list ----------------------------------------------------------------

COLUMNS = [("id", "ID"), ("name", "Name"), ("owner", "Owner"), ("state", "State"),
           ("", "Trials"), ("", "Best"), ("created", "Created"), ("", "Duration")]


@dataclass(frozen=True)
class ListQuery:
    """The list page's query string: filters, sort, order and where the page starts."""

    state: str | None = None
    owner: str | None = None
    label: str | None = None
    name: str | None = None
    sort: str = "id"
    order: str = "desc"  # the newest first
    offset: int = 0

    @property
    def filtered(self) -> bool:
        return any((self.state, self.owner, self.label, self.name))

    @property
    def params(self) -> str:
        values = {"state": self.state, "owner": self.owner, "label": self.label,
                  "name": self.name, "sort": self.sort, "order": self.order,
                  "offset": self.offset or None}
        return urlencode({k: v for k, v in values.items() if v})

    def sorted_by(self, key: str) -> str:
        order = "asc" if self.sort == key and self.order == "desc" else "desc"
        return replace(self, sort=key, order=order, offset=0).params

    def at(self, offset: int) -> str:
        return replace(self, offset=max(0, offset)).params

    def where(self) -> listing.ExperimentFilter:
        return listing.ExperimentFilter(
            state=ExperimentState(self.state) if self.state else None, owner=self.owner,
            label=self.label, name=self.name)


def _list_query(
    state: Annotated[str | None, Query(pattern="^(|" + "|".join(ExperimentState) + ")$")
                     ] = None,
    owner: Annotated[str | None, Query(max_length=32)] = None,
    label: Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00]*$")] = None,
    name: Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00]*$")] = None,
    sort: Annotated[str, Query(pattern="^(" + "|".join(listing.SORTS) + ")$")] = "id",
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
) -> ListQuery:
    return ListQuery(state or None, owner or None, label or None, name or None, sort, order,
                     offset)


Listed = Annotated[ListQuery, Depends(_list_query)]


@pages.get("/", response_class=HTMLResponse)
def experiments_page(request: Request, who: Visitor, query: Listed) -> Response:
    """The experiments list (`GET /api/v1/experiments` with the same filters and paging);
    the login form for a visitor without a session."""
    if who is None:
        return _login_form(request, "/")
    return render(request, "experiments.html", who, nav="experiments", stream="",
                   **_list_context(request, query))


@pages.get("/ui/experiments", response_class=HTMLResponse)
def experiments_fragment(request: Request, who: Visitor, query: Listed) -> Response:
    """The list's table, polled by the page every few seconds for live states."""
    if who is None:
        return Response(status_code=401)
    return render(request, "_experiments_table.html", who, **_list_context(request, query))


def _list_context(request: Request, query: ListQuery) -> TemplateContext:
    try:
        page = listing.list_page(server_state(request).store, query.where(), sort=query.sort,
                                 descending=query.order == "desc", offset=query.offset,
                                 limit=PAGE_ROWS)
    except MusterError as exc:  # an owner that is no user: an empty page that says so
        page = listing.Page([], 0, 0, PAGE_ROWS)
        return {"page": page, "query": query, "columns": COLUMNS, "problem": str(exc),
                "states": list(ExperimentState)}
    return {"page": page, "query": query, "columns": COLUMNS,
            "states": list(ExperimentState)}


# -- an experiment, a trial --------------------------------------------------------------

def _bounded(value: int, what: str) -> int:
    if not 1 <= value <= MAX_INTEGER:
        raise NotFound(f"{what} {value} does not exist")
    return value


TRIAL_ROWS = 50  # trials per page of an experiment's table
MAX_HIDDEN = 64  # columns the table's address may hide


@dataclass(frozen=True)
class TrialsQuery:
    """The trials table's query string: a metric (`sort`) or another order, the direction,
    the states shown and where the page starts."""

    sort: str | None = None
    order_by: str | None = None
    order: str = "asc"
    state: tuple[str, ...] = ()
    offset: int = 0
    where: tuple[str, ...] = ()  # search.ValueRange words
    hide: tuple[str, ...] = ()  # columns not shown: `hparam:NAME`, `metric:NAME`

    def params(self, **changes: Any) -> str:
        query = replace(self, **changes)
        values: list[tuple[str, Any]] = [("sort", query.sort), ("order_by", query.order_by),
                                         ("order", query.order if query.order == "desc"
                                          else None), ("offset", query.offset or None)]
        values += [("state", state) for state in query.state]
        values += [("where", word) for word in query.where]
        values += [("hide", column) for column in query.hide]
        return urlencode([(k, v) for k, v in values if v])

    def hiding(self, column: str) -> str:
        """The query that hides one more column (the column chooser)."""
        return self.params(hide=(*self.hide, column))

    def showing(self, column: str) -> str:
        return self.params(hide=tuple(c for c in self.hide if c != column))

    def ranges(self) -> list[tuple[str, str]]:
        """Each range the table is filtered by, as words to show and the query without it."""
        return [(_range_label(word), self.params(where=tuple(w for w in self.where if w != word),
                                                 offset=0)) for word in self.where]

    def sorted_by(self, *, sort: str | None = None, order_by: str | None = None) -> str:
        """The query that sorts by this column: ascending first, flipped when it already is
        the order (a metric: its best first)."""
        same = (sort, order_by) == (self.sort, self.order_by)
        order = "desc" if same and self.order == "asc" else "asc"
        return self.params(sort=sort, order_by=order_by, order=order, offset=0)

    def marker(self, *, sort: str | None = None, order_by: str | None = None) -> str:
        if (sort, order_by) != (self.sort, self.order_by):
            return ""
        return " \N{DOWNWARDS ARROW}" if self.order == "desc" else " \N{UPWARDS ARROW}"

    def search(self) -> search.TrialQuery:
        return search.TrialQuery(sort=self.sort, order_by=self.order_by,
                                 descending=self.order == "desc",
                                 states=frozenset(TrialState(s) for s in self.state),
                                 offset=self.offset, limit=TRIAL_ROWS, ranges=tuple(
                                     search.ValueRange.parse(w) for w in self.where))


def _range_label(word: str) -> str:
    """A range word as the table's filter shows it: `lr 0.001 to 0.01`, `val_loss ≤ 0.3`."""
    try:
        bound = search.ValueRange.parse(word)
    except InvalidRequest:
        return word
    name = bound.field.partition(":")[2]
    if bound.low is not None and bound.high is not None:
        return f"{name} {_number(bound.low)} to {_number(bound.high)}"
    if bound.low is not None:
        return f"{name} \N{GREATER-THAN OR EQUAL TO} {_number(bound.low)}"
    return f"{name} \N{LESS-THAN OR EQUAL TO} {_number(bound.high)}"


def _trials_query(
    sort: Annotated[str | None, Query(max_length=200)] = None,
    order_by: Annotated[str | None, Query(max_length=210)] = None,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "asc",
    state: Annotated[list[str] | None, Query(max_length=len(TrialState))] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    where: Annotated[list[Annotated[str, Query(max_length=300)]] | None, Query(
        max_length=search.MAX_RANGES)] = None,
    where_on: Annotated[str, Query(max_length=210)] = "",
    where_min: Annotated[str, Query(max_length=40, pattern="^[^:]*$")] = "",
    where_max: Annotated[str, Query(max_length=40, pattern="^[^:]*$")] = "",
    hide: Annotated[list[Annotated[str, Query(max_length=210)]] | None, Query(
        max_length=MAX_HIDDEN)] = None,
) -> TrialsQuery:
    """The table's words; the filter form's new range (`where_on`, `where_min`,
    `where_max`) joins the others as one more `where` word."""
    states = tuple(TrialState(s) for s in (state or []) if s in set(TrialState))
    words = list(where or [])
    if where_on and (where_min.strip() or where_max.strip()):
        words.append(f"{where_on}:{where_min.strip()}:{where_max.strip()}")
    return TrialsQuery(sort or None, order_by or None, order, states, offset,
                       tuple(dict.fromkeys(words)), tuple(dict.fromkeys(hide or [])))


TrialsShown = Annotated[TrialsQuery, Depends(_trials_query)]

EVENT_ROWS = 25  # events a page of an experiment's events shows


@dataclass(frozen=True)
class EventsQuery:
    """The experiment page's events in its query string (`ev_*`, beside the trials
    table's): a kind, an actor, and which page (the events before `before`)."""

    kind: str | None = None
    actor: str | None = None
    before: int | None = None

    @property
    def shown(self) -> bool:
        """True when the query asks for more than the newest page of every event: the
        events section is then open."""
        return bool(self.kind or self.actor or self.before)

    def params(self, **changes: Any) -> str:
        query = replace(self, **changes)
        return urlencode([(key, value) for key, value in (
            ("ev_kind", query.kind), ("ev_actor", query.actor), ("ev_before", query.before))
            if value])


def _events_query(
    ev_kind: Annotated[str | None, Query(max_length=64)] = None,
    ev_actor: Annotated[str | None, Query(max_length=64)] = None,
    ev_before: Annotated[int | None, Query(ge=1, le=MAX_INTEGER)] = None,
) -> EventsQuery:
    return EventsQuery(ev_kind or None, ev_actor or None, ev_before)


EventsShown = Annotated[EventsQuery, Depends(_events_query)]


@pages.get("/experiments/{experiment_id}", response_class=HTMLResponse)
def experiment_page(request: Request, who: Visitor, experiment_id: int,
                    query: TrialsShown, events: EventsShown) -> Response:
    """An experiment (`GET /api/v1/experiments/{id}` without its trials, a page of its
    `/events`, and a page of `/trials`); its charts are drawn by the page from `/curves`,
    `/trials` and `/importance`."""
    if who is None:
        return to_login(request)
    store = server_state(request).store
    exp = experiments.experiment_overview(store, _bounded(experiment_id, "experiment"))
    return render(request, "experiment.html", who, nav="experiments", exp=exp,
                   stream=f"experiment_id={exp['id']}", can_act=_can_act(who, exp["owner"]),
                   config_defaults=yaml.safe_dump(exp["config"], sort_keys=False),
                   **_events_context(store, exp["id"], exp["state"], events),
                   hparam_types=_hparam_types(exp["config"].get("hyperparameters") or {}),
                   exp_drills=drills.drills_of_experiment(store, who, exp["id"]),
                   drill_faults=list(DrillFault), **_trials_context(store, exp, query))


@pages.get("/ui/experiments/{experiment_id}/live", response_class=HTMLResponse)
def experiment_fragment(request: Request, who: Visitor, experiment_id: int,
                        query: TrialsShown) -> Response:
    """The experiment's state, search progress and page of trials, polled by its page."""
    if who is None:
        return Response(status_code=401)
    store = server_state(request).store
    exp = experiments.experiment_overview(store, _bounded(experiment_id, "experiment"))
    response = render(request, "_experiment_live.html", who, exp=exp,
                      can_act=_can_act(who, exp["owner"]), **_trials_context(store, exp, query))
    response.headers["HX-Replace-Url"] = _page_address(
        request, f"/experiments/{exp['id']}", query.params(), owns=_table_word)
    return response


@pages.get("/ui/experiments/{experiment_id}/events", response_class=HTMLResponse)
def experiment_events_fragment(request: Request, who: Visitor, experiment_id: int,
                               query: EventsShown) -> Response:
    """A page of the experiment's events (`GET /api/v1/events?experiment_id=`, by kind
    and actor), newest first: what its filters and pager fetch, and its page polls while
    the experiment runs. The page's address follows (`HX-Replace-Url`), so a reload or a
    shared link shows the same events."""
    if who is None:
        return Response(status_code=401)
    store = server_state(request).store
    header = experiments.experiment_header(store, _bounded(experiment_id, "experiment"))
    response = render(request, "_experiment_events.html", who,
                      **_events_context(store, header["id"], header["state"], query))
    response.headers["HX-Replace-Url"] = _page_address(
        request, f"/experiments/{header['id']}", query.params(), owns=_events_word)
    return response


def _events_context(store: Store, experiment_id: int, state: ExperimentState,
                    query: EventsQuery) -> TemplateContext:
    """A page of an experiment's events, newest first, with what its filters offer and
    where the next (older) page starts, if there is one."""
    page = audit.list_events(store, experiment_id=experiment_id, kind=query.kind,
                             actor=query.actor, before_id=query.before, tail=EVENT_ROWS + 1)
    shown = page[-EVENT_ROWS:][::-1]
    return {"events": shown, "eq": query, "event_facets": audit.event_facets(store, experiment_id),
            "events_older": shown[-1]["id"] if len(page) > EVENT_ROWS else None,
            "events_live": not state.is_terminal() and query.before is None,
            "events_experiment": experiment_id}


def _page_address(request: Request, path: str, words: str, owns: Callable[[str], bool]
                  ) -> str:
    """The page's address with `words` in place of the query words a fragment `owns`: the
    others kept from the browser's current address (htmx's `HX-Current-URL`) when it is
    `path`'s, so the table's sort and the events' filter live side by side in one address."""
    current = urlsplit(request.headers.get("HX-Current-URL", ""))
    kept = [(key, value) for key, value in parse_qsl(current.query)[:64]
            if not owns(key)] if current.path == path else []
    joined = "&".join(part for part in (urlencode(kept), words) if part)
    return f"{path}?{joined}" if joined else path


def _events_word(key: str) -> bool:
    return key.startswith("ev_")


def _table_word(key: str) -> bool:
    """A word of the trials table's (sort, filters, page): none of the events' (`ev_*`),
    the charts' (`find`, `sel`, `zoom.*`, static/charts.js) or the trials picked to compare
    (`compare`, static/compare.js)."""
    return not (key.startswith(("ev_", "zoom.")) or key in ("find", "sel", "compare"))


def _trials_context(store: Store, exp: ExperimentOverview, query: TrialsQuery
                    ) -> TemplateContext:
    """The trials table's page (each trial with its hyperparameters flattened), the
    hyperparameters' names (from the config's space, then any a trial has), and a problem
    with the query, if any (the table is then empty and says why)."""
    problem = None
    try:
        page = search.trial_page(store, exp["id"], query.search())
    except InvalidRequest as exc:
        page, problem = search.TrialPage([], 0), str(exc)
    rows = [(trial, dict(_flat(trial["hparams"]))) for trial in page.rows]
    names = dict.fromkeys(_space_names(exp["config"].get("hyperparameters") or {}))
    for _, hp in rows:
        names.update(dict.fromkeys(hp))
    shown = [n for n in names if n and f"hparam:{n}" not in query.hide]
    return {"trial_rows": rows, "hparam_names": [n for n in names if n], "trials_total":
            page.total, "tq": query, "trial_rows_per_page": TRIAL_ROWS, "table_problem": problem,
            "trial_states": list(TrialState), "shown_hparams": shown}


def _space_names(space: Any, prefix: str = "") -> list[str]:
    """The dotted names of a config's hyperparameters, searched or constant, in order."""
    if isinstance(space, dict) and not (isinstance(space.get("type"), str) and prefix):
        return [name for key, value in space.items()
                for name in _space_names(value, f"{prefix}.{key}" if prefix else str(key))]
    return [prefix] if prefix else []


def _hparam_types(space: Any, prefix: str = "") -> dict[str, str]:
    """Each searched hyperparameter's type (`int`, `double`, `log`, `categorical`) by dotted
    name: how the charts draw its axis."""
    found: dict[str, str] = {}
    if not isinstance(space, dict):
        return found
    if isinstance(space.get("type"), str) and prefix:
        return {prefix: space["type"]}
    for key, value in space.items():
        found.update(_hparam_types(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


@pages.get("/trials/{trial_id}", response_class=HTMLResponse)
def trial_page(request: Request, who: Visitor, trial_id: int) -> Response:
    """A trial (`GET /api/v1/trials/{id}`) with its log's last lines; the page reads the
    rest of its log from `GET /api/v1/trials/{id}/logs` (ranges, then follow)."""
    if who is None:
        return to_login(request)
    context = _trial_context(request, who, trial_id)
    return render(request, "trial.html", who, nav="experiments",
                  stream=f"trial_id={context['trial']['id']}",
                  early_log=(None if context["logs_removed"]
                             else _early_log(request, context["trial"])), **context)


EARLY_LOG_LINES = 1000  # as many as log.js's TAIL_LINES
EARLY_LOG_BYTES = 512 * 1024


def _early_log(request: Request, trial: api.TrialDetail) -> TemplateContext | None:
    """The latest attempt's last lines, in the page itself: shown as soon as it is parsed,
    before the scripts load (log.js then takes them over, and asks no tail). Only one rank's
    bytes that read back as the same bytes from the page's text: UTF-8 without CR or NUL
    (an HTML parser changes those), and whole (not cut at EARLY_LOG_BYTES); else None, and
    log.js asks for the tail."""
    shown = [a for a in trial["attempts"] if not a["standby"]]
    if not shown:
        return None
    state = server_state(request)
    try:
        piece = logs.read_log(state.store, state.platform.launcher, trial["id"],
                              attempt=shown[-1]["number"], tail=EARLY_LOG_LINES,
                              limit=EARLY_LOG_BYTES, home=state.home)
    except NotFound:  # gone meanwhile: log.js asks, and says what it is told
        return None
    except OSError as exc:  # the page still shows; log.js asks, and says what it is told
        log.warning("trial %s: its log's last lines could not be read for its page: %s",
                    trial["id"], exc)
        return None
    if not isinstance(piece, logs.LogSlice) or len(piece.data) >= EARLY_LOG_BYTES:
        return None
    try:
        text = piece.data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\r" in text or "\0" in text:
        return None
    return {"attempt": piece.attempt, "offset": piece.offset, "next": piece.next_offset,
            "text": text}


def _trial_context(request: Request, who: Principal, trial_id: int, snapshot: bool = True
                   ) -> TemplateContext:
    """What the trial page shows; its snapshot (files read) only when `snapshot`."""
    state = server_state(request)
    store = state.store
    trial = experiments.describe_trial(store, _bounded(trial_id, "trial"),
                                       snapshots.TrialParts(state.home) if snapshot else None)
    exp = experiments.experiment_header(store, trial["experiment_id"])
    ranks = sorted({r["rank"] for a in trial["attempts"] for r in a["replicas"]})
    listed = retention.trial_checkpoints(store, trial["id"])  # the first page, bounded
    checkpoints = listed.rows
    return {"trial": trial, "exp": exp, "can_act": _can_act(who, exp["owner"]),
            "ranks": ranks, "checkpoints": checkpoints, "checkpoints_total": listed.total,
            "logs_removed": retention.logs_removed(store, trial["id"]),
            "artifacts": _artifacts_of(store, trial["id"]),
            "at_rest": trial["state"].is_at_rest(),
            "register": register_offer(
                who, trial, exp["owner"], checkpoints,
                lambda: registry.model_names(store),
                state.platform.owners_accept_unverified)}


def _artifacts_of(store: Store, trial_id: int) -> api.ArtifactSetView | None:
    """The trial's artifact set, or None when it has none (the page leaves the section out)."""
    try:
        return artifacts.trial_artifacts(store, trial_id)
    except NotFound:
        return None


@pages.get("/ui/trials/{trial_id}/state", response_class=HTMLResponse)
def trial_state_fragment(request: Request, who: Visitor, trial_id: int) -> Response:
    """The trial page's live parts (its state, verdict, verification and review; its
    attempts and checkpoints out of band), fetched again on each of its events."""
    if who is None:
        return Response(status_code=401)
    return render(request, "_trial_live.html", who,
                  **_trial_context(request, who, trial_id, snapshot=False))


@pages.get("/ui/trials/{trial_id}/progress", response_class=HTMLResponse)
def trial_progress_fragment(request: Request, who: Visitor, trial_id: int) -> Response:
    """The trial page's progress line, polled every few seconds while the trial runs."""
    if who is None:
        return Response(status_code=401)
    trial = experiments.trial_progress(server_state(request).store, _bounded(trial_id, "trial"))
    return render(request, "_trial_progress.html", who, trial=trial,
                   at_rest=trial["state"].is_at_rest())


ArtifactQuery = Annotated[str, Query(min_length=1, max_length=4096,
                                     description="a file of the trial's artifact set")]


@pages.get("/trials/{trial_id}/artifacts/view", response_class=HTMLResponse)
def artifact_page(request: Request, who: Visitor, trial_id: int, path: ArtifactQuery
                  ) -> Response:
    """One artifact shown: a text's or a table's beginning, or an image."""
    if who is None:
        return to_login(request)
    state = server_state(request)
    trial_id = _bounded(trial_id, "trial")
    preview = artifacts.preview_artifact(state.store, state.home, trial_id, path)
    return render(request, "artifact.html", who, nav="experiments", trial_id=trial_id,
                  preview=preview)


@pages.get("/trials/{trial_id}/artifacts/image", response_class=Response)
def artifact_image(request: Request, who: Visitor, trial_id: int, path: ArtifactQuery
                   ) -> Response:
    """A PNG artifact for the artifact page's <img>: whole, sha256 checked, as image/png."""
    if who is None:
        return Response(status_code=401)
    state = server_state(request)
    data = artifacts.artifact_image(state.store, state.home, _bounded(trial_id, "trial"), path)
    return Response(data, media_type="image/png",
                    headers={"Content-Disposition": "inline", "Cache-Control": "no-store"})


@pages.get("/trials/{trial_id}/diff", response_class=HTMLResponse)
def trial_diff_page(request: Request, who: Visitor, trial_id: int,
                    other: Annotated[str, Query(max_length=20)] = "") -> Response:
    """What differs between two trials' snapshots (`GET /api/v1/trials/{id}/diff/{other}`),
    by group, most result-relevant first: the trial page's "compare with" form."""
    if who is None:
        return to_login(request)
    state = server_state(request)
    a, b = _bounded(trial_id, "trial"), _bounded(_other_trial(other), "trial")
    found = snapshots.diff_trials(state.store, state.home, a, b)
    pairs = zip(found["differences"], found["lines"], strict=True)
    groups = [(group, [line for _, line in rows])
              for group, rows in groupby(pairs, key=lambda pair: pair[0]["group"])]
    return render(request, "trial_diff.html", who, nav="experiments", a=a, b=b,
                   groups=groups)


def _other_trial(text: str) -> int:
    """The id the "compare with" form names."""
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidRequest("compare with: give the other trial's id, a whole number such "
                             f"as 12; got {text!r}") from None


@pages.get("/new", response_class=HTMLResponse)
def new_page(request: Request, who: Visitor) -> Response:
    """Start a run: a config and a context (`POST /api/v1/experiments`, sent by the page)."""
    if who is None:
        return to_login(request)
    authorize(who, Action.SUBMIT)
    return render(request, "new.html", who, nav="new", source=None, config_text=NEW_CONFIG)


@pages.get("/experiments/{experiment_id}/again", response_class=HTMLResponse)
def again_page(request: Request, who: Visitor, experiment_id: int) -> Response:
    """Run again: the experiment's config as submitted, to edit, and its context snapshot
    (`context_from`)."""
    if who is None:
        return to_login(request)
    authorize(who, Action.SUBMIT)
    exp = experiments.experiment_overview(server_state(request).store,
                                          _bounded(experiment_id, "experiment"))
    return render(request, "new.html", who, nav="new", source=exp,
                   config_text=exp["config_yaml"])


NEW_CONFIG = """\
name: my-run
entrypoint: python train.py --epochs 5
harness: true     # train.py calls muster.harness.init()
failure_policy: {trial_retries: 3}
"""


CLUSTER_ROWS = 100  # jobs, and environments, per page of the cluster page
_HOLDING = (TrialState.STARTING, TrialState.RUNNING, TrialState.RESTARTING)  # jobs listed first


@dataclass(frozen=True)
class ClusterQuery:
    """The cluster page's query string: where its jobs' page and its environments' start."""

    jobs_offset: int = 0
    envs_offset: int = 0

    @property
    def params(self) -> str:
        return urlencode({k: v for k, v in vars(self).items() if v})

    def at(self, **offsets: int) -> str:
        return replace(self, **{k: max(0, v) for k, v in offsets.items()}).params


@pages.get("/cluster", response_class=HTMLResponse)
@pages.get("/ui/cluster", response_class=HTMLResponse)
def cluster_page(
    request: Request, who: Visitor,
    jobs_offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    envs_offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
) -> Response:
    """Slots, GPUs, the queue, the disk and the environments (`GET /api/v1/cluster`, `/jobs`
    and `/environments`), `CLUSTER_ROWS` jobs and environments a page; its part `#cluster`
    is polled by the page."""
    if who is None:
        return to_login(request)
    state = server_state(request)
    status = cluster.cluster_status(state.platform)
    holding = sum(status["trial_counts"].get(s, 0) for s in _HOLDING)
    return render(request, "cluster.html", who, nav="cluster", stream="", cluster=status,
                   query=ClusterQuery(jobs_offset, envs_offset),
                   jobs=jobs.list_jobs(state.store, jobs_offset, CLUSTER_ROWS),
                   queued_before=max(0, jobs_offset - holding),  # the page's first position
                   envs=environments.list_environments(
                       state.store, state.platform.envs, who, state.platform.build_logs_open,
                       envs_offset, CLUSTER_ROWS))


def _can_act(who: Principal, owner: str | None) -> bool:
    """Whether the controls that act on this experiment are shown: its owner's and admins'
    (a viewer's page has none; the API refuses anyone else anyway)."""
    return who.role is Role.ADMIN or (who.role is Role.USER and owner == who.name)
