"""HTTP routes: thin adapters from requests to the services in `muster.server.*`."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Header, Query, Request, UploadFile
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from muster import __version__
from muster.config.schema import MAX_PRIORITY, MIN_PRIORITY
from muster.errors import InvalidRequest
from muster.server import prometheus
from muster.server.auth import check_bearer
from muster.server.state import ServerState
from muster.services import cluster, experiments, jobs, logs, metrics, search
from muster.services.uploads import MAX_UPLOAD_BYTES

PREFIX = "/api/v1"


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.muster
    return state


def require_token(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> ServerState:
    state = server_state(request)
    check_bearer(authorization, state.token)
    return state


public = APIRouter(prefix=PREFIX)
router = APIRouter(prefix=PREFIX, dependencies=[Depends(require_token)])
State = Annotated[ServerState, Depends(server_state)]


@public.get("/health")
def health() -> dict[str, str | int]:
    """Liveness; `pid` tells `muster up` that the server answering is the one it started."""
    return {"status": "ok", "version": __version__, "pid": os.getpid()}


@router.post("/experiments", status_code=201)
async def create_experiment(
    state: State,
    config: Annotated[str, Form(description="the experiment config, YAML")],
    context: Annotated[UploadFile | None, File(description="the context dir, tar.gz")] = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="muster-upload-") as tmp:
        archive = await _save_upload(context, Path(tmp)) if context is not None else None
        exp_id = await asyncio.to_thread(
            experiments.create_experiment, state.store, state.home, config, archive
        )
    state.orchestrator.wake.set()
    return await asyncio.to_thread(experiments.describe_experiment, state.store, exp_id)


async def _save_upload(upload: UploadFile, folder: Path) -> Path:
    path = folder / "context.tar.gz"
    size = 0
    with path.open("wb") as out:
        while chunk := await upload.read(1024**2):
            size += len(chunk)
            if size > MAX_UPLOAD_BYTES:
                raise InvalidRequest(
                    f"context upload is larger than {MAX_UPLOAD_BYTES // 1024**2} MiB; "
                    "keep data sets out of the context directory"
                )
            out.write(chunk)
    return path


@router.get("/cluster")
def get_cluster(state: State) -> dict[str, Any]:
    """Slots, queue and disk of this installation (`muster cluster status`)."""
    return cluster.cluster_status(state.orchestrator.supervisor)


@router.get("/metrics", response_class=Response)
def get_prometheus_metrics(state: State) -> Response:
    """The cluster's gauges and counters in Prometheus's text format (version 0.0.4)."""
    snapshot = cluster.read_cluster(state.orchestrator.supervisor)
    return Response(prometheus.render(prometheus.cluster_metrics(snapshot)),
                    media_type=prometheus.CONTENT_TYPE)


# Prometheus scrapes `/metrics` by default: the same text there, with the same token.
scrape = APIRouter(dependencies=[Depends(require_token)])
scrape.add_api_route("/metrics", get_prometheus_metrics, methods=["GET"],
                     response_class=Response, include_in_schema=False)


@router.get("/jobs")
def list_jobs(state: State) -> list[dict[str, Any]]:
    """Trials that run or wait: those holding resources, then the queue in its order (priority,
    then id), then paused ones; each with its resources, GPUs held and `queue_reason`."""
    return jobs.list_jobs(state.store)


class PriorityRequest(BaseModel):
    priority: Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY,
                                   description="1 to 99; lower runs first")]


@router.post("/trials/{trial_id}/priority")
async def set_trial_priority(state: State, trial_id: int, body: PriorityRequest
                             ) -> dict[str, Any]:
    """Move a trial in the queue; 409 once it has ended. Takes effect on the next pass."""
    view = await asyncio.to_thread(jobs.set_trial_priority, state.store, trial_id,
                                   body.priority)
    state.orchestrator.wake.set()
    return view


@router.post("/experiments/{experiment_id}/priority")
async def set_experiment_priority(state: State, experiment_id: int, body: PriorityRequest
                                  ) -> dict[str, Any]:
    """Set the priority of every trial of the experiment that has not ended, and of those
    it makes from now on; 409 once it has ended."""
    view = await asyncio.to_thread(jobs.set_experiment_priority, state.store, experiment_id,
                                   body.priority)
    state.orchestrator.wake.set()
    return view


@router.get("/experiments")
def list_experiments(state: State) -> list[dict[str, Any]]:
    return experiments.list_experiments(state.store)


@router.get("/experiments/{experiment_id}")
def get_experiment(state: State, experiment_id: int) -> dict[str, Any]:
    return experiments.describe_experiment(state.store, experiment_id)


@router.get("/experiments/{experiment_id}/best")
def get_best_trial(state: State, experiment_id: int) -> dict[str, Any]:
    """The SUCCEEDED trial with the best value of the searcher's metric (early-stopped trials
    count; ties: lowest number), with its `best_validation`. 404 while there is none yet; 409
    when the searcher names no metric."""
    return search.best_trial(state.store, experiment_id)


@router.get("/experiments/{experiment_id}/trials")
def list_experiment_trials(
    state: State,
    experiment_id: int,
    sort: Annotated[str | None, Query(
        min_length=1, description="a validation metric: the searcher's best first, any other "
        "smallest first; trials without a value last")] = None,
) -> list[dict[str, Any]]:
    """The experiment's trials `{id, number, state, hparams, early_stopped, best_validation,
    restarts, started_at, ended_at}`, by number or by `sort`; 400 for a metric no trial
    reported."""
    return search.list_trials(state.store, experiment_id, sort)


@router.post("/experiments/{experiment_id}/kill")
async def kill_experiment(state: State, experiment_id: int) -> dict[str, Any]:
    view = await asyncio.to_thread(experiments.kill_experiment, state.store, experiment_id)
    state.orchestrator.wake.set()
    return view


@router.post("/experiments/{experiment_id}/pause")
async def pause_experiment(state: State, experiment_id: int) -> dict[str, Any]:
    view = await asyncio.to_thread(experiments.pause_experiment, state.store, experiment_id)
    state.orchestrator.wake.set()
    return view


@router.post("/experiments/{experiment_id}/activate")
async def activate_experiment(state: State, experiment_id: int) -> dict[str, Any]:
    view = await asyncio.to_thread(experiments.activate_experiment, state.store,
                                   experiment_id)
    state.orchestrator.wake.set()
    return view


@router.get("/trials/{trial_id}")
def get_trial(state: State, trial_id: int) -> dict[str, Any]:
    return experiments.describe_trial(state.store, trial_id)


@router.get("/trials/{trial_id}/logs", response_model=None)
async def get_trial_logs(
    state: State,
    trial_id: int,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    rank: Annotated[int | None, Query(
        ge=0, description="only this rank's log, raw (default: every rank, merged)")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=logs.MAX_LIMIT)] = logs.DEFAULT_LIMIT,
    tail: Annotated[int | None, Query(ge=0)] = None,
    cursor: Annotated[str | None, Query(
        description="where a read without rank goes on: X-Muster-Next-Cursor")] = None,
    follow: bool = False,
) -> Response:
    """Log bytes. With `rank`, or for an attempt with one replica, that replica's raw bytes;
    else every rank's whole lines in time order, each prefixed `[rank r] `. Headers carry
    the cursor: X-Muster-Attempt, and X-Muster-Next-Offset for one rank's bytes or
    X-Muster-Next-Cursor (pass it back as `cursor`) for a read without `rank`."""
    if follow:
        if cursor is not None:
            raise InvalidRequest("cursor pages reads without follow; to follow from the "
                                 "end, pass tail=N instead")
        stream = await logs.follow_log(
            state.store, trial_id, attempt=attempt, rank=rank, offset=offset, tail=tail
        )
        return StreamingResponse(stream, media_type="application/octet-stream")
    piece = await asyncio.to_thread(
        logs.read_log, state.store, trial_id, attempt=attempt, rank=rank, offset=offset,
        limit=limit, tail=tail, cursor=cursor,
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


@router.get("/trials/{trial_id}/metrics")
def get_trial_metrics(
    state: State,
    trial_id: int,
    kind: metrics.MetricKind | None = None,
    after_step: int | None = None,
    limit: Annotated[int, Query(ge=1, le=metrics.MAX_LIMIT)] = metrics.DEFAULT_LIMIT,
    tail: Annotated[int | None, Query(ge=1, le=metrics.MAX_LIMIT)] = None,
) -> list[dict[str, Any]]:
    """Reports `{kind, step, time, attempt, rank, metrics}` by step. A page never ends inside
    a step: pass its last step as `after_step` for the next. `tail=N`: the last N reports.
    Non-finite values are the JSON strings "NaN", "Infinity" and "-Infinity"."""
    return metrics.list_metrics(state.store, trial_id, kind=kind, after_step=after_step,
                                limit=limit, tail=tail)


@router.get("/trials/{trial_id}/checkpoints")
def get_trial_checkpoints(state: State, trial_id: int) -> list[dict[str, Any]]:
    """Registered checkpoints by step, each with `intact` and, if not, the `problem`."""
    return metrics.list_checkpoints(state.store, trial_id)


class ReviewRequest(BaseModel):
    decision: Literal["approve", "reject"]
    note: Annotated[str, Field(min_length=1, description="why; recorded with the decision")]
    reviewer: Annotated[str, Field(min_length=1, description="who reviewed")]


@router.post("/trials/{trial_id}/review")
async def review_trial(state: State, trial_id: int, review: ReviewRequest) -> dict[str, Any]:
    """Approve (→ SUCCEEDED) or reject (→ FAILED) a SUSPECT trial; 409 for any other state."""
    view = await asyncio.to_thread(experiments.review_trial, state.store, trial_id,
                                   review.decision, review.note, review.reviewer)
    state.orchestrator.wake.set()  # its experiment may now be over
    return view


__all__ = ["public", "router", "scrape"]
