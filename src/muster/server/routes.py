"""HTTP routes: thin adapters from requests to the services in `muster.services`.

Each route declares its response model (`muster.server.api`) and the errors it can answer
with, so `/openapi.json` is a contract a client, a fuzzer and a browser test can hold the
server to. Every route but `/health`, `/login` and `/openapi.json` needs a credential (the
`bearer` security scheme, or a web session's cookie), and each names the action it performs
(`allow(Action...)`), checked against `muster.services.access`'s table before it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi import Path as InPath
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from muster import __version__, checkpoint_archive
from muster import api as shapes
from muster.config.units import parse_duration
from muster.downsample import MAX_POINTS
from muster.errors import InvalidRequest, MusterError
from muster.launch.logs import MAX_OFFSET
from muster.server import api, prometheus, upload_form
from muster.server.auth import authenticate, presented_token
from muster.server.downloads import Download, attachment
from muster.server.follows import MAX_FOLLOWS_PER_TOKEN, FollowStream
from muster.server.state import ServerState
from muster.server.unpack_queue import FairQueue
from muster.services import (
    artifacts,
    checkpoints,
    cluster,
    curves,
    diagnostics,
    environments,
    evidence,
    experiments,
    idempotency,
    importance,
    jobs,
    listing,
    log_search,
    logs,
    metrics,
    mlflow_exports,
    registry,
    retention,
    search,
    snapshots,
    trial_control,
    trials_export,
    usage,
)
from muster.services.access import Action, Principal, authorize
from muster.states import ExperimentState, LogSearchDirection, MetricKind, TrialState, UsageBy
from muster.store import MAX_BIGINT, MAX_INTEGER, MIN_BIGINT

PREFIX = "/api/v1"
BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="an API token (`Authorization: Bearer mst_...`): `muster "
                    "token create`, `muster login`, or the server's admin token in "
                    "$MUSTER_HOME/secrets/token")


# A route's `responses` beyond its model: OpenAPI response objects by status (free JSON
# that FastAPI merges into /openapi.json).
Responses = dict[int | str, shapes.JsonObject]


def _errors(*statuses: int) -> Responses:
    """The `responses` of a route that can answer with these error statuses."""
    return {status: {"model": api.Error, "description": _ERROR_MEANINGS[status],
                     **_ERROR_HEADERS.get(status, {})}
            for status in statuses}


def _total_count(what: str) -> Responses:
    """The `X-Total-Count` header of a paged list, documented: how many `what` in all."""
    return {200: {"headers": {"X-Total-Count": {
        "description": f"how many {what} in all (for paging)",
        "schema": {"type": "integer"}}}}}


_ERROR_MEANINGS = {
    400: "a malformed request (a body that is not JSON, a bad parameter, cursor or upload)",
    401: "a missing, unknown, revoked or expired token (or web session), or a deactivated "
         "user's",
    403: "the caller may not do this: its role, someone else's experiment, a priority "
         "reserved for admins, or a web session's request without its CSRF token",
    404: "no such experiment, trial, attempt, user or token",
    409: "the request clashes with the current state (e.g. it has ended)",
    410: "it was removed on purpose: the cluster config's retention removed the trial's "
         "logs or run files (the message says when, and by which rule)",
    413: "the request, or the archive it uploads, passes a size, count or time limit",
    422: "an invalid config, request body or parameter (e.g. a number out of range); the "
         "message names the key path or the parameter",
    429: f"too many at once: the caller already holds {MAX_FOLLOWS_PER_TOKEN} log follows, "
         "or failed to log in too often (retry after Retry-After seconds); or a create would "
         "queue more trials than a quota's max_queued_trials allows (QuotaExceeded: the "
         "message names the quota)",
    503: "the database is unreachable",
    502: "checkpoint storage (a shared directory, an S3 bucket), or the cluster's MLflow "
         "tracking server, failed or refused; the message names its URL",
}
_ERROR_HEADERS: dict[int, shapes.JsonObject] = {429: {"headers": {"Retry-After": {
    "description": "seconds to wait before trying again", "schema": {"type": "integer"}}}}}
# What any protected route may answer (403: a role's refusal, or a session without its
# CSRF token; 413: a body over 64 KiB).
COMMON = (401, 403, 413, 422, 503)


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.muster
    return state


def authenticated(
    request: Request,
    # (declared for the OpenAPI security scheme; the header itself is checked below, so
    # that every failure gets muster's own 401 shape)
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)] = None,
) -> Principal:
    """Who the request acts as (every protected route; once per request)."""
    return authenticate(request, server_state(request).store)


def allow(action: Action) -> Callable[..., Principal]:
    """A route's dependency: the caller, once its role may perform `action` (ownership is
    checked by the service, with the row it reads)."""

    def allowed(principal: Annotated[Principal, Depends(authenticated)]) -> Principal:
        authorize(principal, action)
        return principal

    allowed.__name__ = f"allow_{action.name.lower()}"
    return allowed


public = APIRouter(prefix=PREFIX)
router = APIRouter(prefix=PREFIX, dependencies=[Depends(authenticated)],
                   responses=_errors(*COMMON))
State = Annotated[ServerState, Depends(server_state)]
Reader = Annotated[Principal, Depends(allow(Action.READ))]
# Every number a route takes is bounded by what can hold it (an INTEGER column, a file
# offset), so a value out of range is a 422 naming the parameter, never a driver overflow.
ExperimentId = Annotated[int, InPath(ge=1, le=MAX_INTEGER, description="an experiment's id")]
TrialId = Annotated[int, InPath(ge=1, le=MAX_INTEGER, description="a trial's id")]


@public.get("/health", response_model=api.Health)
def health(state: State, request: Request) -> shapes.Health:
    """Liveness, and how the supervisor is doing: 200 while the server serves, with
    `degraded` true while its passes fail (the last error and its time are kept). The
    error's text (it may name paths and hosts) only to a caller with a credential."""
    passes = state.orchestrator.health
    error = passes.last_error if _known_caller(request, state) else None
    shown = "(sign in to see the error)" if passes.last_error and error is None else error
    return {
        "status": "ok", "version": __version__, "pid": os.getpid(),
        "degraded": passes.degraded,
        "last_supervisor_error": shown,
        "last_supervisor_error_at": passes.last_error_at,
        "supervisor": {"failures_in_a_row": passes.failures_in_a_row,
                       "last_error": shown, "last_error_at": passes.last_error_at,
                       "last_pass_at": passes.last_pass_at, "passes": passes.passes,
                       "interval": state.orchestrator.interval,
                       "wakeups": state.orchestrator.wakeups is not None},
    }


def _known_caller(request: Request, state: ServerState) -> bool:
    """True for a caller with a working credential, or with the home's admin token: that
    one is checked against its file, so the error stays readable while the database is
    what fails."""
    bearer = presented_token(request.headers.get("authorization"))
    try:
        home_token = state.home.token_path.read_text().strip()
    except OSError:
        home_token = ""
    if bearer and home_token and hmac.compare_digest(bearer.encode(), home_token.encode()):
        return True
    if not (bearer or request.cookies):
        return False
    try:
        authenticate(request, state.store)
    except MusterError:  # a bad credential, or no database: served as to anyone
        return False
    return True


_IDEMPOTENCY_KEY = Header(
    alias=idempotency.HEADER, pattern=idempotency.KEY_PATTERN,
    description=f"any 1 to {idempotency.MAX_KEY_LENGTH} characters of [A-Za-z0-9._:-] (a "
                "UUID), new for each submission: a create sent again with the same key (a "
                "retry, a double click) creates nothing and is answered, 201 and "
                f"`{idempotency.REPLAYED_HEADER}: true`, with the experiments the first "
                f"made; for {idempotency.KEEP_S / 3600:.0f} h, per user. The same key with "
                "another request is a 409")


@router.post("/experiments", status_code=201,
             response_model=api.one_or_many(api.ExperimentDetail),
             responses=_errors(400, 409, 413, 429),
             openapi_extra={"requestBody": upload_form.REQUEST_BODY})
async def create_experiment(state: State, request: Request, response: Response,
                            owner: Annotated[Principal, Depends(allow(Action.SUBMIT))],
                            key: Annotated[str | None, _IDEMPOTENCY_KEY] = None
                            ) -> shapes.ExperimentDetail | list[shapes.ExperimentDetail]:
    """Validate the config, snapshot the context, record the experiment (and its trial),
    owned by the caller. With the `config` field repeated (a batch, at most
    `upload_form.MAX_BATCH`), every config shares the one context and the answer is the
    list of experiments, in the order of the configs: all are created, or none.

    The form (`config`, YAML; `context`, a tar.gz; `git`, the context's git state) is read
    by `upload_form`, after the token check and within its limits, not declared as Form
    parameters: FastAPI reads those before any dependency runs. A create with a context
    (an upload, or `context_from`) waits its turn in the fair queue `_UNPACKING`; each user
    holds at most `_UNPACKING.per_user` creates of any kind at once (429 past it). A create
    that would take the caller past a `max_queued_trials` quota is a 429 `QuotaExceeded`
    that names the quota (`muster.schedule.quotas`). With an
    `Idempotency-Key`, a create sent again is answered with the first's experiments
    (`services.idempotency`)."""
    with (_UNPACKING.holding(owner.name),
          tempfile.TemporaryDirectory(prefix="muster-upload-") as tmp):
        form = await upload_form.read_upload_form(request, Path(tmp))
        claim = None if key is None else idempotency.Claim(owner.user_id, key, form.digest())
        new = experiments.NewExperiments(form.configs, form.archive, form.secrets,
                                         form.context_from, form.git, claim)
        create = functools.partial(experiments.create_once, state.platform, owner, new)
        if form.archive is None and form.context_from is None:
            created = await asyncio.to_thread(create)
        else:
            created = await _UNPACKING.run(owner.name, create)
    exp_ids = created.ids
    if created.replayed:
        response.headers[idempotency.REPLAYED_HEADER] = "true"
    state.orchestrator.wake.set()
    if len(form.configs) == 1:
        return await asyncio.to_thread(experiments.describe_experiment, state.store, exp_ids[0])
    return await asyncio.to_thread(experiments.describe_experiments, state.store, exp_ids)


# Contexts are unpacked on threads of their own, two at a time: the default pool, shared by
# every route, has only min(32, cpus + 4) threads, and six hostile archives (each allowed up
# to a minute, uploads.EXTRACT_TIMEOUT_S) must not hold them all while other requests wait;
# nor may one user's archives hold both while another user's upload waits (`unpack_queue`).
_UNPACKING = FairQueue(workers=2, per_user=8, total=32, name="muster-unpack")


@router.get("/cluster", response_model=api.ClusterStatus)
def get_cluster(state: State, _: Reader) -> shapes.ClusterStatus:
    """Slots, queue and disk of this installation (`muster cluster status`)."""
    return cluster.cluster_status(state.platform)


@router.post("/cluster/nodes/{node_id}/release", response_model=api.NodeReleaseView,
             responses=_errors(404, 409))
def release_node(state: State, node_id: Annotated[str, InPath(min_length=1, max_length=128)],
                 who: Annotated[Principal, Depends(allow(Action.MANAGE_NODES))]
                 ) -> shapes.NodeReleaseView:
    """Return a node the bad-node circuit breaker quarantined to the pool (`muster cluster
    node release NODE`): new replicas may be placed there again."""
    return cluster.release_quarantined(state.store, node_id, who.name)


@router.get("/environments", response_model=api.many(api.EnvironmentView),
            responses=_total_count("environments"))
def list_environments(
    state: State, who: Reader, response: Response,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=environments.MAX_PAGE)] = environments.MAX_PAGE,
) -> list[shapes.EnvironmentView]:
    """The environments muster was asked to build, by hash: their state, packages, size,
    last use and the newest 100 trials that need each or ran in it, with `trials_total`
    (`muster env list`); why a build failed only to those who may read its log. A page of
    `limit` (at most 1,000, the default) from `offset`, with the count of all in
    `X-Total-Count`."""
    page = environments.list_environments(state.store, state.platform.envs, who,
                                          state.platform.build_logs_open, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


_BUILD_LOG: Responses = {200: {
    "description": "the build's log, bytes from `offset` (at most 1 MiB)",
    "content": {"text/plain": {"schema": {"type": "string"}}}}}


@router.get("/environments/{prefix}/log", response_class=Response,
            responses={**_BUILD_LOG, **_errors(403, 404, 422)})
def environment_log(state: State, who: Reader,
                    prefix: Annotated[str, InPath(min_length=4, max_length=16,
                                                  pattern="^[0-9a-fA-F]+$")],
                    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0) -> Response:
    """The build log of the environment whose hash starts with `prefix` (`muster env logs`),
    for admins and the owners of experiments that need it (or every reader, with the
    cluster config's `build_logs: everyone`); the `X-Environment` header names it in full."""
    key, data = environments.environment_log(state.store, state.platform.envs, prefix, who,
                                             offset, state.platform.build_logs_open)
    return Response(data, media_type="text/plain; charset=utf-8",
                    headers={"X-Environment": key})


@router.post("/environments/prune", response_model=api.PruneResultView,
             responses=_errors(400, 422))
def prune_environments(state: State, body: api.PruneRequest,
                       _: Annotated[Principal, Depends(allow(Action.PRUNE_ENVIRONMENTS))]
                       ) -> shapes.PruneResultView:
    """Remove built environments unused for `older_than` (and the leftovers of failed or
    killed builds); never one a trial that has not ended needs (`muster env prune`)."""
    try:
        older_than = parse_duration(body.older_than)
    except ValueError as exc:
        raise InvalidRequest(f"older_than: {exc}") from exc
    return environments.prune_environments(state.store, state.platform.envs, older_than)


_PROMETHEUS_TEXT: Responses = {200: {
    "description": "Prometheus's text format, version 0.0.4",
    "content": {prometheus.CONTENT_TYPE: {"schema": {"type": "string"}}}}}


@router.get("/metrics", response_class=Response, responses=_PROMETHEUS_TEXT)
def get_prometheus_metrics(state: State, _: Reader) -> Response:
    """The cluster's gauges and counters in Prometheus's text format (version 0.0.4)."""
    snapshot = cluster.read_cluster(state.platform)
    return Response(prometheus.render(prometheus.cluster_metrics(snapshot)),
                    media_type=prometheus.CONTENT_TYPE)


# Prometheus scrapes `/metrics` by default: the same text there, with the same token.
scrape = APIRouter(dependencies=[Depends(authenticated)])
scrape.add_api_route("/metrics", get_prometheus_metrics, methods=["GET"],
                     response_class=Response, include_in_schema=False)


@router.get("/jobs", response_model=api.many(api.Job),
            responses=_total_count("jobs"))
def list_jobs(
    state: State, _: Reader, response: Response,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=jobs.MAX_PAGE)] = jobs.MAX_PAGE,
) -> list[shapes.Job]:
    """Trials that run or wait: those holding resources, then the queue in its order (priority,
    then id), then paused ones; each with its resources, GPUs held and `queue_reason`. A
    page of `limit` (at most 1,000, the default) from `offset`, with the count of all in
    `X-Total-Count`."""
    page = jobs.list_jobs(state.store, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


@router.get("/usage", response_model=api.UsageReport, responses=_errors(400, 404))
def get_usage(
    state: State, who: Reader, by: UsageBy = UsageBy.USER,
    since: Annotated[str, Query(min_length=1, max_length=16, description=(
        "how far back: 30d, 12h, 90m (at most 400d)"))] = usage.DEFAULT_SINCE,
    user: Annotated[str | None, Query(min_length=1, max_length=32, pattern=r"^[^\x00]*$",
                                      description="only this user's experiments")] = None,
    everyone: Annotated[bool, Query(description="everyone's experiments (a user's default "
                                                "is its own)")] = False,
) -> shapes.UsageReport:
    """Slot-hours and GPU-hours of the last `since`, by user, experiment or label, split into
    productive, lost, stalled, idle and running, queued hours, and goodput (`muster usage`);
    each group's definition is in docs/how-to/team.md, "Usage and goodput"."""
    return usage.usage_report(state.store, who, by=by, since=since, user=user,
                              everyone=everyone)


@router.post("/trials/{trial_id}/priority", response_model=api.TrialDescription,
             responses=_errors(400, 404, 409))
async def set_trial_priority(state: State, trial_id: TrialId, body: api.PriorityRequest,
                             who: Annotated[Principal, Depends(allow(Action.SET_PRIORITY))]
                             ) -> shapes.TrialDescription:
    """Move a trial in the queue; 409 once it has ended. Takes effect on the next pass. A
    user moves its own trials, and not above the cluster's `priority_floor`."""
    view = await asyncio.to_thread(jobs.set_trial_priority, state.store, who, trial_id,
                                   body.priority, state.platform.priority_floor)
    state.orchestrator.wake.set()
    return view


@router.post("/experiments/{experiment_id}/priority", response_model=api.ExperimentDetail,
             responses=_errors(400, 404, 409))
async def set_experiment_priority(
    state: State, experiment_id: ExperimentId, body: api.PriorityRequest,
    who: Annotated[Principal, Depends(allow(Action.SET_PRIORITY))],
) -> shapes.ExperimentDetail:
    """Set the priority of every trial of the experiment that has not ended, and of those
    it makes from now on; 409 once it has ended."""
    view = await asyncio.to_thread(jobs.set_experiment_priority, state.store, who,
                                   experiment_id, body.priority,
                                   state.platform.priority_floor)
    state.orchestrator.wake.set()
    return view


_TOTAL_COUNT = _total_count("experiments the filter matches")


@router.get("/experiments", response_model=api.many(api.ExperimentSummary),
            responses={**_TOTAL_COUNT, **_errors(400, 404)})
def list_experiments(
    state: State, who: Reader, response: Response,
    owner: Annotated[str | None, Query(min_length=1, max_length=32,
                                       description="only this user's")] = None,
    mine: Annotated[bool, Query(description="only the caller's")] = False,
    archived: Annotated[bool, Query(description="include archived experiments")] = False,
    experiment_state: Annotated[ExperimentState | None, Query(
        alias="state", description="only experiments in this state")] = None,
    label: Annotated[str | None, Query(min_length=1, max_length=200,
                                       pattern=r"^[^\x00]*$")] = None,
    name: Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00]*$",
                                      description="part of the name, any case")] = None,
    sort: Annotated[str, Query(pattern="^(" + "|".join(listing.SORTS) + ")$")] = "id",
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "asc",
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int | None, Query(ge=1, le=listing.MAX_PAGE)] = None,
) -> list[shapes.ExperimentSummary]:
    """Experiments, oldest first by default (every one without `limit`): filtered by
    `owner` (or `mine`), `state`, `label`, `name`; sorted by `sort` and `order`; a page of
    `limit` from `offset`, with the count of all matches in `X-Total-Count`. Each has its
    progress, its SUSPECT and unverified trials and the best trial so far."""
    where = listing.ExperimentFilter(state=experiment_state, owner=who.name if mine else owner,
                                     label=label, name=name, archived=archived)
    page = listing.list_page(state.store, where, sort=sort, descending=order == "desc",
                             offset=offset, limit=limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


@router.get("/experiments/{experiment_id}", response_model=api.ExperimentDetail,
            responses=_errors(404))
def get_experiment(
    state: State, _: Reader, response: Response, experiment_id: ExperimentId,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=experiments.DESCRIBE_TRIALS)
                     ] = experiments.DESCRIBE_TRIALS,
) -> shapes.ExperimentDetail:
    """The experiment, its search, and a page of its trials by id (attempts, replicas, how
    each ended, the trial part of each one's snapshot): `limit` (at most 1,000, the default)
    from `offset`, with the count of all its trials in `X-Total-Count` and where the next
    page starts in `trials_next_offset`."""
    exp = experiments.describe_experiment(state.store, experiment_id,
                                          snapshots.TrialParts(state.home),
                                          experiments.TrialWindow(offset, limit))
    response.headers["X-Total-Count"] = str(exp["trials_total"])
    return exp


@router.get("/experiments/{experiment_id}/best", response_model=api.TrialDetail,
            responses=_errors(404, 409))
def get_best_trial(state: State, _: Reader, experiment_id: ExperimentId) -> shapes.TrialDetail:
    """The SUCCEEDED trial with the best value of the searcher's metric (early-stopped trials
    count; ties: lowest number), with its `best_validation`. 404 while there is none yet; 409
    when the searcher names no metric."""
    return search.best_trial(state.store, experiment_id, snapshots.TrialParts(state.home))


@router.get("/experiments/{experiment_id}/front", response_model=api.ParetoFront,
            responses=_errors(404, 409))
def get_pareto_front(state: State, _: Reader, experiment_id: ExperimentId) -> shapes.ParetoFront:
    """The SUCCEEDED trials by the searcher's objectives (`searcher.metrics`, or its one
    metric): each one's value in the last report that held it, those on the Pareto front
    (no other trial as good on every objective and better on one) first; 409 when the
    searcher names no metric."""
    return search.pareto_front(state.store, experiment_id)


@router.get("/experiments/{experiment_id}/importance", response_model=api.Importance,
            responses=_errors(404, 409))
def get_importance(state: State, _: Reader, experiment_id: ExperimentId) -> shapes.Importance:
    """Each varied hyperparameter's share of the importance for the searcher's metric
    (Optuna's PedAnovaImportanceEvaluator over the SUCCEEDED trials with a value), the
    largest first; recomputed when another trial ends. 409 without a searcher metric, a
    varied hyperparameter, or 10 such trials."""
    return importance.experiment_importance(state.store, experiment_id)


def _trial_query(
    sort: Annotated[str | None, Query(
        min_length=1, max_length=200, description="a validation metric: the searcher's best "
        "first, any other smallest first; trials without a value last")] = None,
    order_by: Annotated[str | None, Query(
        min_length=1, max_length=210, description="instead of sort: " + ", ".join(
            search.ORDERS) + ", or hparam:NAME (a hyperparameter's dotted name)")] = None,
    order: Annotated[str | None, Query(
        pattern="^(asc|desc)$", description="desc reverses the order")] = None,
    trial_state: Annotated[list[TrialState] | None, Query(
        alias="state", max_length=len(TrialState), description="only trials in these "
        "states (repeat it)")] = None,
    where: Annotated[list[Annotated[str, Query(max_length=300)]] | None, Query(
        max_length=search.MAX_RANGES, description="only trials inside this range (repeat "
        "it): hparam:NAME:LOW:HIGH or metric:NAME:LOW:HIGH (its best value), an end may "
        "be empty")] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=search.MAX_TRIAL_PAGE)] = search.MAX_TRIAL_PAGE,
) -> search.TrialQuery:
    return search.TrialQuery(sort=sort, order_by=order_by, descending=order == "desc",
                             states=frozenset(trial_state or ()), offset=offset, limit=limit,
                             ranges=tuple(search.ValueRange.parse(w) for w in where or ()))


TrialsAsked = Annotated[search.TrialQuery, Depends(_trial_query)]


@router.get("/experiments/{experiment_id}/trials", response_model=api.many(api.TrialSummary),
            responses={**_total_count("trials the filter matches"), **_errors(400, 404)})
def list_experiment_trials(state: State, _: Reader, response: Response,
                           experiment_id: ExperimentId, query: TrialsAsked
                           ) -> list[shapes.TrialSummary]:
    """The experiment's trials `{id, number, state, hparams, early_stopped, early_stop,
    best_validation, restarts, started_at, ended_at, verified}`, by number, by `sort` or by
    `order_by`, filtered by `state` and `where`, a page of `limit` (at most 10,000, the
    default: a search's most trials) from `offset`, with the count of all matches in
    `X-Total-Count`; 400 for a metric no trial reported or a malformed range."""
    page = search.trial_page(state.store, experiment_id, query)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


@router.get("/experiments/{experiment_id}/trials.csv", response_class=Response,
            responses={200: {"description": "the trials table as CSV (RFC 4180)",
                             "content": {"text/csv": {"schema": {"type": "string"}}}},
                       **_errors(400, 404)})
def export_experiment_trials(state: State, _: Reader, experiment_id: ExperimentId,
                             query: TrialsAsked) -> Response:
    """Every trial the query matches (as `/trials`; offset and limit ignored) as CSV, a file
    `experiment-<id>-trials.csv`: number, trial, state, verdict, restarts, started_at,
    ended_at, then `hparam:NAME` for each hyperparameter and `metric:NAME` for each
    validation metric (its best value)."""
    text = trials_export.trials_csv(state.store, experiment_id, query)
    return Response(text, media_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": attachment(f"experiment-{experiment_id}-trials.csv")})


@router.get("/experiments/{experiment_id}/curves", response_model=api.ExperimentCurves,
            responses=_errors(400, 404, 409))
def get_experiment_curves(
    state: State,
    _: Reader,
    experiment_id: ExperimentId,
    metric: Annotated[str | None, Query(
        min_length=1, max_length=200, description="default: the searcher's")] = None,
    kind: Annotated[str, Query(pattern="^(training|validation)$")] = "validation",
    points: Annotated[int | None, Query(
        ge=4, le=MAX_POINTS, description="per curve at most (default: a budget of "
        f"{curves.CURVES_BUDGET:,} points shared by the curves)")] = None,
) -> shapes.ExperimentCurves:
    """Every trial's learning curve of one metric (rank 0's reports), downsampled on the
    server (min/max buckets), with where the searcher stopped each trial."""
    return curves.experiment_curves(state.store, experiment_id, metric, kind, points)


@router.post("/experiments/{experiment_id}/kill", response_model=api.ExperimentDetail,
             responses=_errors(404, 409))
async def kill_experiment(state: State, experiment_id: ExperimentId,
                        who: Annotated[Principal, Depends(allow(Action.KILL))]
                        ) -> shapes.ExperimentDetail:
    """Stop every trial (SIGTERM, grace, SIGKILL); 409 once the experiment has ended."""
    view = await asyncio.to_thread(experiments.kill_experiment, state.store, who,
                                   experiment_id)
    state.orchestrator.wake.set()
    return view


@router.post("/experiments/{experiment_id}/pause", response_model=api.ExperimentDetail,
             responses=_errors(404, 409))
async def pause_experiment(state: State, experiment_id: ExperimentId,
                        who: Annotated[Principal, Depends(allow(Action.PAUSE))]
                        ) -> shapes.ExperimentDetail:
    """Pause an ACTIVE experiment: its trials checkpoint and free their slots and GPUs."""
    view = await asyncio.to_thread(experiments.pause_experiment, state.store, who,
                                   experiment_id)
    state.orchestrator.wake.set()
    return view


@router.post("/experiments/{experiment_id}/activate", response_model=api.ExperimentDetail,
             responses=_errors(404, 409))
async def activate_experiment(state: State, experiment_id: ExperimentId,
                        who: Annotated[Principal, Depends(allow(Action.ACTIVATE))]
                        ) -> shapes.ExperimentDetail:
    """Resume a PAUSED experiment: its trials resume from their latest checkpoints."""
    view = await asyncio.to_thread(experiments.activate_experiment, state.store, who,
                                   experiment_id)
    state.orchestrator.wake.set()
    return view


@router.get("/trials/{trial_id}", response_model=api.TrialDescription, responses=_errors(404))
def get_trial(state: State, _: Reader, trial_id: TrialId) -> shapes.TrialDescription:
    """The trial, its attempts and replicas, its `best_validation`, its events and the
    trial part of its snapshot."""
    return experiments.describe_trial(state.store, trial_id, snapshots.TrialParts(state.home))


_LOG_BYTES: Responses = {200: {
    "description": "log bytes as written; the cursor is in the X-Muster-* headers",
    "content": {"application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}},
    "headers": {
        "X-Muster-Attempt": {"description": "the attempt read", "schema": {"type": "integer"}},
        "X-Muster-Offset": {"description": "where the bytes start (one rank)",
                            "schema": {"type": "integer"}},
        "X-Muster-Next-Offset": {"description": "where to go on (one rank)",
                                 "schema": {"type": "integer"}},
        "X-Muster-Next-Cursor": {"description": "where to go on without a rank, e.g. "
                                                "0:1234,1:88", "schema": {"type": "string"}},
    },
}}


@router.get("/trials/{trial_id}/logs", response_class=Response,
            responses={**_LOG_BYTES, **_errors(400, 404, 410, 429)})
async def get_trial_logs(
    request: Request,
    state: State,
    who: Reader,
    trial_id: TrialId,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_INTEGER)] = None,
    rank: Annotated[int | None, Query(
        ge=0, le=MAX_INTEGER,
        description="only this rank's log, raw (default: every rank, merged)")] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=logs.MAX_LIMIT)] = logs.DEFAULT_LIMIT,
    tail: Annotated[int | None, Query(ge=0, le=MAX_OFFSET)] = None,
    cursor: Annotated[str | None, Query(
        description="where a read without rank goes on: X-Muster-Next-Cursor")] = None,
    follow: bool = False,
    one_attempt: Annotated[bool, Query(
        description="with follow: end the stream when that attempt ends")] = False,
) -> Response:
    """Log bytes. With `rank`, or for an attempt with one replica, that replica's raw bytes;
    else every rank's whole lines in time order, each prefixed `[rank r] `. Headers carry
    the cursor: X-Muster-Attempt, and X-Muster-Next-Offset for one rank's bytes or
    X-Muster-Next-Cursor (pass it back as `cursor`) for a read without `rank`. A token
    holds at most MAX_FOLLOWS_PER_TOKEN follows at once; one more is a 429 (Retry-After).
    Every check of a follow is made before its 200: an error never breaks a stream."""
    if follow:
        if cursor is not None:
            raise InvalidRequest("cursor pages reads without follow; to follow from the "
                                 "end, pass tail=N instead")
        ticket = state.follows.take(who.name)
        with contextlib.ExitStack() as on_error:
            on_error.callback(ticket.release)
            stream = await logs.follow_log(state.store, state.platform.launcher, trial_id,
                                           attempt=attempt, rank=rank, offset=offset,
                                           tail=tail, one_attempt=one_attempt,
                                           home=state.home,
                                           wait_growth=state.log_watch.wait_growth)
            on_error.pop_all()
        return FollowStream(stream, ticket, recheck_s=state.follows.recheck_s,
                            recheck=functools.partial(authenticate, request, state.store,
                                                      csrf=False))
    piece = await asyncio.to_thread(
        logs.read_log, state.store, state.platform.launcher, trial_id, attempt=attempt,
        rank=rank, offset=offset, limit=limit, tail=tail, cursor=cursor, home=state.home,
    )
    return Response(piece.data, media_type="application/octet-stream",
                    headers=_log_headers(piece, rank_named=rank is not None))


def _log_headers(piece: logs.LogSlice | logs.MergedSlice, rank_named: bool) -> dict[str, str]:
    headers = {"X-Muster-Attempt": str(piece.attempt)}
    if isinstance(piece, logs.LogSlice):
        headers["X-Muster-Offset"] = str(piece.offset)
        headers["X-Muster-Next-Offset"] = str(piece.next_offset)
    if not rank_named:
        headers["X-Muster-Next-Cursor"] = str(piece.next_cursor)
    return headers


@router.get("/trials/{trial_id}/logs/search", response_model=api.LogSearchResult,
            responses=_errors(400, 404, 410, 429))
async def search_trial_log(
    state: State,
    _: Reader,
    trial_id: TrialId,
    pattern: Annotated[str, Query(min_length=1, max_length=log_search.MAX_PATTERN_CHARS,
                                  description="the text, or with regex=true an RE2 "
                                  "expression, to find in each line")],
    regex: bool = False,
    ignore_case: bool = False,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_INTEGER,
                                         description="default: the latest")] = None,
    rank: Annotated[int | None, Query(ge=0, le=MAX_INTEGER,
                                      description="default: the attempt's first")] = None,
    start: Annotated[int | None, Query(
        alias="from", ge=0, le=MAX_OFFSET,
        description="a byte offset of the log: forward, matches at or after it (default "
        "0); backward, matches before it (default: the end)")] = None,
    direction: LogSearchDirection = LogSearchDirection.FORWARD,
    limit: Annotated[int, Query(ge=1, le=log_search.MAX_MATCHES)] = log_search.DEFAULT_MATCHES,
    max_bytes: Annotated[int | None, Query(
        ge=1, le=MAX_OFFSET, description="scan at most about this many bytes (whole lines; "
        "default: as many as SEARCH_SECONDS allows)")] = None,
) -> shapes.LogSearchResult:
    """Search one rank's whole log (secrets masked) for a text or an RE2 expression, line
    by line, from `from` forward or backward: at most `limit` matches, about
    `SEARCH_SECONDS` (2 s) of scanning. Matches are byte offsets of the log (`GET
    .../logs?rank=R&offset=N` reads them) with their line; when not `complete`, pass
    `next_from` back as `from` to go on. An invalid expression is a 422 that names where;
    past `MAX_SCANS` (4) searches scanning at once, a 429 (Retry-After)."""
    def search() -> shapes.LogSearchResult:  # compiling a pattern is work too
        plan = log_search.SearchPlan(
            log_search.compile_pattern(pattern, regex=regex, ignore_case=ignore_case),
            start=start, direction=direction, limit=limit, max_bytes=max_bytes)
        return log_search.search_log(state.store, state.platform.launcher, trial_id, plan,
                                     attempt=attempt, rank=rank, home=state.home)

    return await asyncio.to_thread(search)


def _file_response(media_type: str, description: str) -> Responses:
    """The 200 of a route that answers with a file to save (`server/downloads.py`)."""
    return {200: {"description": description,
                  "content": {media_type: {"schema": {"type": "string", "format": "binary"}}},
                  "headers": {"Content-Disposition": {
                      "description": 'attachment; filename="..."', "required": True,
                      "schema": {"type": "string"}}}}}


@router.get("/trials/{trial_id}/logs/download", response_class=Response,
            responses={**_file_response("application/octet-stream",
                                        "the replica's whole log as written (secrets masked), "
                                        "its bytes when the request came"),
                       **_errors(404, 410)})
async def download_trial_log(
    state: State,
    _: Reader,
    trial_id: TrialId,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_INTEGER,
                                         description="default: the latest")] = None,
    rank: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
) -> Response:
    """One replica's whole log as a file, `trial-<id>-attempt-<a>-rank-<r>.log`: every byte
    it held when the request came (Content-Length), however large; 404 before it exists."""
    raw = await asyncio.to_thread(logs.open_raw_log, state.store, state.platform.launcher,
                                  trial_id, attempt=attempt, rank=rank, home=state.home)
    return Download(raw.chunks(), size=raw.size, filename=raw.filename,
                    media_type="application/octet-stream", close=raw.close,
                    headers={"X-Muster-Attempt": str(raw.attempt)})


@router.post("/trials/{trial_id}/dump", response_model=api.DumpResult,
             responses=_errors(404, 409))
async def dump_trial_stacks(state: State, trial_id: TrialId,
                            who: Annotated[Principal, Depends(allow(Action.DUMP))]
                            ) -> shapes.DumpResult:
    """Save an evidence bundle of the RUNNING trial's current attempt now: every thread's
    stack of every Python process of each running replica, its processes, the end of its
    log (what muster saves before it stops a stalled replica). Answers once every rank's
    part is complete, or after 20 s with what there is; each complete part becomes its
    replica's `evidence` and `stack_summary`. 409 for a trial that is not RUNNING, or while
    another dump of it is under way."""
    with state.dumps.holding(trial_id):
        plan = await asyncio.to_thread(evidence.start_dump, state.store, who, trial_id)
        await evidence.wait_for_dump(plan)
        return await asyncio.to_thread(evidence.finish_dump, state.store, plan)


@router.get("/trials/{trial_id}/evidence", response_class=Response,
            responses={**_file_response(evidence.MEDIA_TYPE,
                                        "the attempt's evidence bundles as a tar.gz"),
                       **_errors(404)})
async def download_trial_evidence(
    state: State, _: Reader, trial_id: TrialId,
    attempt: Annotated[int | None, Query(
        ge=1, le=MAX_INTEGER, description="default: the latest that has evidence")] = None,
) -> Response:
    """Every evidence bundle of one attempt, `trial-<id>-attempt-<a>-evidence.tar.gz`:
    `evidence/<bundle>/rank-<r>/` (summary.json, stacks.txt, stacks.json, processes.json,
    log-tail.txt, flight-recorder/), the trial's secrets masked. Made as it is sent, so
    without Content-Length (gzip's trailer shows a cut); 404 when there is none."""
    download = await asyncio.to_thread(evidence.open_evidence_download, state.store,
                                       state.home, trial_id, attempt)
    return Download(download.chunks(), size=None, filename=download.filename,
                    media_type=evidence.MEDIA_TYPE, close=download.close,
                    headers={"X-Muster-Attempt": str(download.attempt)})


@router.get("/trials/{trial_id}/metrics", response_model=api.many(api.MetricReport),
            responses=_errors(404))
def get_trial_metrics(
    state: State,
    _: Reader,
    trial_id: TrialId,
    kind: MetricKind | None = None,
    after_step: Annotated[int | None, Query(ge=MIN_BIGINT, le=MAX_BIGINT)] = None,
    limit: Annotated[int, Query(ge=1, le=metrics.MAX_LIMIT)] = metrics.DEFAULT_LIMIT,
    tail: Annotated[int | None, Query(ge=1, le=metrics.MAX_LIMIT)] = None,
) -> list[shapes.MetricReport]:
    """Reports `{kind, step, time, attempt, rank, metrics}` by step: training and
    validation, or only `kind` (`system`: each replica's resource samples, `system/*`,
    whose step is their time in ms). A page never ends inside a step: pass its last step as
    `after_step` for the next. `tail=N`: the last N reports. Non-finite values are the
    JSON strings "NaN", "Infinity" and "-Infinity"."""
    return metrics.list_metrics(state.store, trial_id, kind=kind, after_step=after_step,
                                limit=limit, tail=tail)


@router.get("/trials/{trial_id}/series", response_model=api.TrialSeries,
            responses=_errors(400, 404))
def get_trial_series(
    state: State, _: Reader, trial_id: TrialId,
    points: Annotated[int, Query(ge=4, le=MAX_POINTS, description="per curve at most")
                      ] = MAX_POINTS,
) -> shapes.TrialSeries:
    """Every metric the trial reported (rank 0, training and validation) as a curve
    downsampled on the server (min/max buckets), with its report count and its lowest and
    highest finite value."""
    return curves.trial_series(state.store, trial_id, points)


@router.get("/trials/{trial_id}/checkpoints", response_model=api.many(api.CheckpointView),
            responses={**_total_count("checkpoints of the trial"), **_errors(404)})
def get_trial_checkpoints(
    state: State, _: Reader, response: Response, trial_id: TrialId,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=retention.MAX_CHECKPOINTS)] = retention.MAX_CHECKPOINTS,
) -> list[shapes.CheckpointView]:
    """Registered checkpoints by step, each with `intact` and, if not, the `problem`: a page
    of `limit` (at most 1,000, the default) from `offset`, with the count of all in
    `X-Total-Count`."""
    page = retention.trial_checkpoints(state.store, trial_id, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


CheckpointName = Annotated[str, InPath(min_length=1, max_length=255, pattern=r"^[^/\x00]+$",
                                       description="a registered checkpoint's name")]


@router.get("/trials/{trial_id}/checkpoints/{name}/download", response_class=Response,
            responses={**_file_response(checkpoint_archive.MEDIA_TYPE,
                                        "the checkpoint's files as an uncompressed tar"),
                       **_errors(404, 409)})
async def download_trial_checkpoint(state: State, _: Reader, trial_id: TrialId,
                                    name: CheckpointName) -> Response:
    """An intact checkpoint as a tar, `trial-<id>-<name>.tar`: `<name>/metadata.json`, then
    each file it lists. 409 for one that is not intact, or no longer matches its
    registration; a file whose sha256 fails while it is sent breaks the download off."""
    download = await asyncio.to_thread(checkpoints.open_checkpoint_download, state.store,
                                       trial_id, name)
    return Download(download.chunks(), size=download.size, filename=download.filename,
                    media_type=checkpoint_archive.MEDIA_TYPE, close=download.close)


@router.get("/trials/{trial_id}/artifacts", response_model=api.ArtifactSetView,
            responses=_errors(404))
def get_trial_artifacts(state: State, _: Reader, trial_id: TrialId
                        ) -> shapes.ArtifactSetView:
    """The files the trial's final attempt left that its config names (`artifacts`,
    `verify.outputs`), as the server copied them when the trial ended: each with its size
    and sha256, and every matching file it left with why (a link, a stale file...)."""
    return artifacts.trial_artifacts(state.store, trial_id)


ArtifactPath = Annotated[str, InPath(min_length=1, max_length=4096,
                                     pattern=r"^[^/\x00][^\x00]*$",
                                     description="a file of the set, as listed")]


@router.get("/trials/{trial_id}/artifacts/{path:path}", response_class=Response,
            responses={**_file_response("application/octet-stream",
                                        "the artifact file's bytes as copied"),
                       **_errors(404, 409, 410)})
async def download_trial_artifact(state: State, _: Reader, trial_id: TrialId,
                                  path: ArtifactPath) -> Response:
    """One file of the trial's artifact set. 409 while the set is not collected, or when
    the copy is no longer what was recorded; a file whose sha256 fails as it is sent breaks
    the download off."""
    download = await asyncio.to_thread(artifacts.open_artifact, state.store, state.home,
                                       trial_id, path)
    return Download(download.chunks(), size=download.size, filename=download.filename,
                    media_type="application/octet-stream", close=download.close)


ModelName = Annotated[str, InPath(min_length=1, max_length=128,
                                  pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                  description="a registered model's name")]


@router.get("/models", response_model=api.many(api.RegisteredModelView),
            responses=_total_count("models"))
def get_models(
    state: State, _: Reader, response: Response,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=registry.MAX_PAGE)] = registry.MAX_PAGE,
) -> list[shapes.RegisteredModelView]:
    """Registered models by name, each with its newest 100 versions and `versions_total`: a
    page of `limit` (at most 1,000, the default) from `offset`, with the count of all in
    `X-Total-Count`."""
    page = registry.list_models(state.store, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


@router.post("/models", response_model=api.RegisteredModelView, status_code=201,
             responses=_errors(400, 403, 409))
async def create_model(state: State, body: api.ModelCreateRequest,
                       who: Annotated[Principal, Depends(allow(Action.SUBMIT))]
                       ) -> shapes.RegisteredModelView:
    """A new, empty model; 409 when the name is taken."""
    return await asyncio.to_thread(registry.create_model, state.store, who, body.name,
                                   body.description, body.labels)


@router.get("/models/{name}", response_model=api.RegisteredModelView, responses=_errors(404))
def get_model(state: State, _: Reader, name: ModelName) -> shapes.RegisteredModelView:
    """A model and its newest 100 versions, oldest first, each with its lineage, and
    `versions_total` (`GET /models/{name}/versions` pages through every one)."""
    return registry.describe_model(state.store, name)


@router.get("/models/{name}/versions", response_model=api.many(api.ModelVersionView),
            responses={**_total_count("versions of the model"), **_errors(404)})
def get_model_versions(
    state: State, _: Reader, response: Response, name: ModelName,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=registry.MAX_PAGE)] = registry.MAX_PAGE,
) -> list[shapes.ModelVersionView]:
    """A model's versions, oldest first: a page of `limit` (at most 1,000, the default) from
    `offset`, with the count of all in `X-Total-Count`."""
    page = registry.list_versions(state.store, name, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


@router.post("/models/{name}/versions", response_model=api.ModelVersionView, status_code=201,
             responses=_errors(400, 403, 404, 409))
async def register_model_version(state: State, name: ModelName, body: api.RegisterRequest,
                                 who: Annotated[Principal, Depends(allow(Action.SUBMIT))]
                                 ) -> shapes.ModelVersionView:
    """A trial's checkpoint as the model's next version. Only a verified trial; one that
    was not needs `accept_unverified` (a reason, from an admin) and is marked so; a
    rejected one never (409 says which). With the cluster config's `mlflow: {export:
    on_register}`, the new version is then exported to MLflow in the background: a
    `model exported` or `model export failed` event on the model says how it went."""
    version = await asyncio.to_thread(
        registry.register_version, state.store, state.home, who, name, body.trial_id,
        checkpoint=body.checkpoint, pick=body.pick, accept_unverified=body.accept_unverified,
        owners_accept_unverified=state.platform.owners_accept_unverified)
    if state.platform.mlflow_exports is not None:
        state.platform.mlflow_exports.submit(name, version["version"], who.name)
    return version


VersionAt = Annotated[str, InPath(
    min_length=1, max_length=16, pattern=r"^([vV]?[0-9]{1,9}|latest|production|staging)$",
    description="a version number (3 or v3), `latest`, `production` or `staging`")]


def _version_ref(name: str, at: str) -> registry.VersionRef:
    return registry.VersionRef.parse(f"{name}@{at}")


@router.get("/models/{name}/versions/{version}", response_model=api.ModelVersionView,
            responses=_errors(400, 404))
def get_model_version(state: State, _: Reader, name: ModelName, version: VersionAt
                      ) -> shapes.ModelVersionView:
    """One version (by number, `latest`, or the one in `production` or `staging`), with
    its lineage."""
    return registry.describe_version(state.store, _version_ref(name, version))


@router.put("/models/{name}/versions/{version}/stage", response_model=api.ModelVersionView,
            responses=_errors(400, 403, 404))
async def set_model_stage(state: State, name: ModelName, version: VersionAt,
                          body: api.StageRequest,
                          who: Annotated[Principal, Depends(allow(Action.MANAGE_MODEL))]
                          ) -> shapes.ModelVersionView:
    """Move the version to a stage (the model's owner or an admin). Production and staging
    hold one version each: the one there before is archived."""
    return await asyncio.to_thread(registry.set_stage, state.store, who,
                                   _version_ref(name, version), body.stage)


@router.delete("/models/{name}/versions/{version}", response_model=api.ModelVersionView,
               responses=_errors(400, 403, 404))
async def delete_model_version(state: State, name: ModelName, version: VersionAt,
                               who: Annotated[Principal, Depends(allow(Action.DELETE_MODEL))]
                               ) -> shapes.ModelVersionView:
    """Take a version out of the registry (admins): its checkpoint is no longer pinned
    against garbage collection and `experiment delete`."""
    return await asyncio.to_thread(registry.delete_version, state.store, who,
                                   _version_ref(name, version))


@router.delete("/models/{name}", response_model=api.RegisteredModelView,
               responses=_errors(403, 404, 409))
async def delete_model(state: State, name: ModelName,
                       who: Annotated[Principal, Depends(allow(Action.DELETE_MODEL))]
                       ) -> shapes.RegisteredModelView:
    """Delete a model without versions (admins); 409 names the versions it still has."""
    return await asyncio.to_thread(registry.delete_model, state.store, who, name)


@router.get("/models/{name}/versions/{version}/download", response_class=Response,
            responses={**_file_response("application/gzip",
                                        "the version's checkpoint as a tar.gz"),
                       **_errors(400, 404, 409)})
async def download_model_version(state: State, _: Reader, name: ModelName,
                                 version: VersionAt) -> Response:
    """The version's checkpoint as `<name>-v<N>.tar.gz`: `<name>-v<N>/metadata.json`, then
    each file it lists, from the run directory or from storage. Each file is checked
    against its sha256 as it is sent; one that fails cuts the stream off before gzip's end,
    so no client takes it for whole."""
    download = await asyncio.to_thread(registry.open_version_download, state.store,
                                       state.home, _version_ref(name, version))
    return Download(download.chunks(), size=None, filename=download.filename,
                    media_type="application/gzip", close=download.close,
                    headers={"X-Muster-Model-Version": download.top})


@router.post("/models/{name}/versions/{version}/mlflow", response_model=api.MlflowExport,
             responses=_errors(400, 403, 404, 409, 502))
async def export_model_version(state: State, name: ModelName, version: VersionAt,
                               who: Annotated[Principal, Depends(allow(Action.SUBMIT))]
                               ) -> shapes.MlflowExport:
    """Export the version to the MLflow tracking server the cluster config names (`mlflow:`;
    409 without one), now: an MLflow run with the trial's hyperparameters, metric series,
    muster's ids and verdict as tags, the checkpoint and artifacts as files, and a version
    in MLflow's registry linked to it. Whoever may register from the version's trial may
    ask; 502 when MLflow does not answer or refuses (a `model export failed` event says
    it too). Only the admin's server is reached: a user's own goes by `muster model export
    --mlflow`, from the user's machine."""
    return await asyncio.to_thread(mlflow_exports.export_for, state.store, state.home,
                                   state.platform.settings.mlflow, who,
                                   _version_ref(name, version))


@router.get("/trials/{trial_id}/snapshot", response_model=api.TrialSnapshot,
            responses=_errors(404))
def get_trial_snapshot(state: State, _: Reader, trial_id: TrialId) -> shapes.TrialSnapshot:
    """What the trial was made of: its code's tree hash, config, hyperparameters, seed,
    environment and data fingerprint, what each rank of its latest attempt loaded
    (written by the harness: libraries, frameworks, numerics switches and variables), and
    what the server saw of that attempt from outside at its launch (`outside`: the
    interpreter and the packages of the trial's layer; a run without the harness has only
    this)."""
    return snapshots.trial_snapshot(state.store, state.home, trial_id)


@router.get("/trials/{trial_id}/diff/{other_id}", response_model=api.TrialDiff,
            responses=_errors(404))
def diff_trials(state: State, _: Reader, trial_id: TrialId,
                other_id: Annotated[int, InPath(ge=1, le=MAX_INTEGER)]) -> shapes.TrialDiff:
    """What differs between two trials' snapshots, grouped (code, config, packages,
    frameworks, numerics, hardware, platform) and most result-relevant first; volatile
    fields (hostnames, paths, GPU uuids) are left out."""
    return snapshots.diff_trials(state.store, state.home, trial_id, other_id)


@router.get("/trials/{trial_id}/diagnostics", response_model=api.TrialDiagnostics,
            responses=_errors(404))
def get_trial_diagnostics(state: State, _: Reader, trial_id: TrialId) -> shapes.TrialDiagnostics:
    """The coded-bias diagnostics of the trial's latest attempt, judged now from what its
    ranks recorded (`muster.harness.torch`): each check's finding, and the series behind
    them (the spread of the ranks' gradient norms per sampled update, the sampler overlap
    per pass). Verification judges the same files when the trial ends."""
    return diagnostics.trial_diagnostics(state.store, trial_id)


@router.get("/experiments/{experiment_id}/diff/{other_id}", response_model=api.ExperimentDiff,
            responses=_errors(404, 409))
def diff_experiments(state: State, _: Reader, experiment_id: ExperimentId,
                     other_id: Annotated[int, InPath(ge=1, le=MAX_INTEGER)]
                     ) -> shapes.ExperimentDiff:
    """What differs between two experiments, as two trials' diff: each experiment's best
    trial by the searcher's metric, else its latest (`a_trial`, `b_trial` and why,
    `a_basis`, `b_basis`). 409 for an experiment without a trial yet."""
    return snapshots.diff_experiments(state.store, state.home, experiment_id, other_id)


CheckpointRef = Annotated[str, InPath(min_length=1, max_length=36, pattern=r"^[0-9a-f-]+$",
                                      description="a checkpoint's id or uuid")]


@router.get("/checkpoints/{checkpoint}", response_model=api.CheckpointView,
            responses=_errors(404))
def get_checkpoint(state: State, _: Reader, checkpoint: CheckpointRef) -> shapes.CheckpointView:
    """One checkpoint by id or uuid."""
    return retention.checkpoint_view(state.store, checkpoint)


@router.get("/checkpoints/{checkpoint}/download", response_class=Response,
            responses={**_file_response(checkpoint_archive.MEDIA_TYPE,
                                        "the checkpoint's files as an uncompressed tar"),
                       **_errors(404, 409, 502)})
async def download_checkpoint(state: State, _: Reader, checkpoint: CheckpointRef) -> Response:
    """A checkpoint (by id or uuid) as a tar, from its run directory or, when that no
    longer holds it, from storage (fetched and verified first); as
    `/trials/{id}/checkpoints/{name}/download` otherwise."""
    download = await asyncio.to_thread(checkpoints.open_any_download, state.store, state.home,
                                       checkpoint)
    return Download(download.chunks(), size=download.size, filename=download.filename,
                    media_type=checkpoint_archive.MEDIA_TYPE, close=download.close)


@router.get("/experiments/{experiment_id}/checkpoints",
            response_model=api.many(api.CheckpointView),
            responses={**_total_count("checkpoints of the experiment"), **_errors(404)})
def get_experiment_checkpoints(
    state: State, _: Reader, response: Response, experiment_id: ExperimentId,
    offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0,
    limit: Annotated[int, Query(ge=1, le=retention.MAX_CHECKPOINTS)] = retention.MAX_CHECKPOINTS,
) -> list[shapes.CheckpointView]:
    """The checkpoints of the experiment's trials (deleted ones too), by trial number and
    step: a page of `limit` (at most 1,000, the default) from `offset`, with the count of
    all in `X-Total-Count`."""
    page = retention.experiment_checkpoints(state.store, experiment_id, offset, limit)
    response.headers["X-Total-Count"] = str(page.total)
    return page.rows


@router.post("/experiments/{experiment_id}/checkpoints/gc", response_model=api.GcPlan,
             responses=_errors(400, 403, 404))
async def collect_checkpoints(state: State, experiment_id: ExperimentId,
                              body: api.GcRequest, who: Reader) -> shapes.GcPlan:
    """The experiment's checkpoint GC plan, with a reason per checkpoint; unless `dry_run`,
    the counts given become its policy and the plan is applied (by the storage worker, at
    once). Applying takes the owner or an admin; a dry run, anyone who reads."""
    counts = body.model_dump(exclude_none=True, exclude={"dry_run"})
    return await asyncio.to_thread(retention.collect, state.store, state.platform.storage, who,
                                   experiment_id, counts, body.dry_run)


@router.delete("/experiments/{experiment_id}", response_model=api.DeleteAccepted,
               status_code=202, responses=_errors(403, 404, 409))
async def delete_experiment(state: State, experiment_id: ExperimentId,
                            who: Annotated[Principal, Depends(allow(Action.DELETE))]
                            ) -> shapes.DeleteAccepted:
    """Delete an ended experiment: its checkpoints (in storage and on disk), run
    directories, logs and records, by the storage worker; 409 while it runs. The records
    go last: until then it is hidden from lists and its checkpoints are `deleting`."""
    return await asyncio.to_thread(retention.delete_experiment, state.store,
                                   state.platform.storage, who, experiment_id)


@router.post("/experiments/{experiment_id}/archive", response_model=api.Archived,
             responses=_errors(403, 404))
async def archive_experiment(state: State, experiment_id: ExperimentId,
                             who: Annotated[Principal, Depends(allow(Action.ARCHIVE))]
                             ) -> shapes.Archived:
    """Hide the experiment from the default lists (`archived=true` shows it); kept whole."""
    return await asyncio.to_thread(retention.set_archived, state.store, who, experiment_id,
                                   True)


@router.post("/experiments/{experiment_id}/unarchive", response_model=api.Archived,
             responses=_errors(403, 404))
async def unarchive_experiment(state: State, experiment_id: ExperimentId,
                               who: Annotated[Principal, Depends(allow(Action.ARCHIVE))]
                               ) -> shapes.Archived:
    """Show an archived experiment in the default lists again."""
    return await asyncio.to_thread(retention.set_archived, state.store, who, experiment_id,
                                   False)


@router.post("/retention/runs", response_model=api.RetentionPlan, responses=_errors(400))
async def sweep_retention(state: State, body: api.RetentionRequest,
                          who: Annotated[Principal, Depends(allow(Action.SWEEP_RETENTION))]
                          ) -> shapes.RetentionPlan:
    """What the cluster config's `retention` removes now, with sizes: the logs, run
    directories, checkpoints not registered and artifacts of experiments that ended long
    enough ago, and what stays past a rule and why. Unless `dry_run`, the storage worker
    removes them at once, recording each trial's removal as an event first. Admins only.
    Without `retention` the plan is empty, `enabled` false, and its message says so."""
    return await asyncio.to_thread(retention.sweep_runs, state.platform.storage, who,
                                   body.dry_run)


@router.post("/trials/{trial_id}/review", response_model=api.TrialDescription,
             responses=_errors(400, 404, 409))
async def review_trial(state: State, trial_id: TrialId, review: api.ReviewRequest,
                       who: Annotated[Principal, Depends(allow(Action.REVIEW))]
                       ) -> shapes.TrialDescription:
    """Approve (→ SUCCEEDED) or reject (→ FAILED) a SUSPECT trial; 409 for any other state.
    The review is recorded as the caller's (a user reviews its own trials)."""
    view = await asyncio.to_thread(experiments.review_trial, state.store, who, trial_id,
                                   review.decision, review.note)
    state.orchestrator.wake.set()  # its experiment may now be over
    return view


# One trial's controls (`muster.services.trial_control`): the rest of its experiment goes on.


@router.post("/trials/{trial_id}/kill", response_model=api.TrialDescription,
             responses=_errors(404, 409))
async def kill_trial(state: State, trial_id: TrialId,
                     who: Annotated[Principal, Depends(allow(Action.KILL))]
                     ) -> shapes.TrialDescription:
    """Stop one trial for good (CANCELED; SIGTERM, grace, SIGKILL when it runs): its search
    goes on drawing the others. 409 once it has ended, or while it is SUSPECT."""
    view = await asyncio.to_thread(trial_control.kill_trial, state.store, who, trial_id)
    state.orchestrator.wake.set()
    return view


@router.post("/trials/{trial_id}/pause", response_model=api.TrialDescription,
             responses=_errors(404, 409))
async def pause_trial(state: State, trial_id: TrialId,
                      who: Annotated[Principal, Depends(allow(Action.PAUSE))]
                      ) -> shapes.TrialDescription:
    """Pause one trial (it can checkpoint, then frees its slots) until it is activated; its
    experiment stays ACTIVE. 409 when it has ended or its experiment is not ACTIVE."""
    view = await asyncio.to_thread(trial_control.pause_trial, state.store, who, trial_id)
    state.orchestrator.wake.set()
    return view


@router.post("/trials/{trial_id}/activate", response_model=api.TrialDescription,
             responses=_errors(404, 409))
async def activate_trial(state: State, trial_id: TrialId,
                         who: Annotated[Principal, Depends(allow(Action.ACTIVATE))]
                         ) -> shapes.TrialDescription:
    """Queue a PAUSED trial again; it resumes from its latest checkpoint."""
    view = await asyncio.to_thread(trial_control.activate_trial, state.store, who, trial_id)
    state.orchestrator.wake.set()
    return view


@router.post("/trials/{trial_id}/restart", response_model=api.TrialDescription,
             responses=_errors(404, 409))
async def restart_trial(state: State, trial_id: TrialId,
                        who: Annotated[Principal, Depends(allow(Action.RESTART))]
                        ) -> shapes.TrialDescription:
    """Stop a running trial and queue it again at once, from its latest checkpoint: no
    failure, no budget used. 409 when it is not running."""
    view = await asyncio.to_thread(trial_control.restart_trial, state.store, who, trial_id)
    state.orchestrator.wake.set()
    return view


__all__ = ["COMMON", "PREFIX", "allow", "authenticated", "public", "router", "scrape"]
