"""HTTP routes of drills (`muster drill`; "Run a drill" on an experiment's page). Thin:
`muster.services.drills` makes, reads and cancels them; the drill thread runs them."""

from __future__ import annotations

import asyncio
import functools
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as InPath

from muster import api as shapes
from muster.drill.faults import parse_faults
from muster.drill.plan import DEFAULT_SCALE, DrillOptions
from muster.errors import ConfigError, InvalidRequest
from muster.server import api, upload_form
from muster.server.routes import (
    _UNPACKING,
    COMMON,
    PREFIX,
    Reader,
    State,
    _errors,
    allow,
    authenticated,
)
from muster.services import drills, experiments
from muster.services.access import Action, Principal
from muster.states import DrillFault

__all__ = ["router"]

router = APIRouter(prefix=PREFIX, dependencies=[Depends(authenticated)],
                   responses=_errors(*COMMON))
Submitter = Annotated[Principal, Depends(allow(Action.SUBMIT))]
DrillId = Annotated[int, InPath(ge=1, le=2**31 - 1, description="a drill's id")]
ExperimentId = Annotated[int, InPath(ge=1, le=2**31 - 1, description="an experiment's id")]
Faults = Annotated[list[DrillFault] | None, Query(
    max_length=len(DrillFault),
    description="the faults to inject (repeat it); none: every fault")]


@router.post("/drills", status_code=201, response_model=api.DrillView,
             responses=_errors(400, 404, 409, 429),
             openapi_extra={"requestBody": upload_form.REQUEST_BODY})
async def create_drill(state: State, request: Request, owner: Submitter,
                       faults: Faults = None,
                       scale: Annotated[float, Query(gt=0, le=1)] = DEFAULT_SCALE,
                       data: Annotated[str | None, Query(min_length=1, max_length=1024)] = None,
                       at: Annotated[float, Query(gt=0, lt=1)] = 0.5) -> shapes.DrillView:
    """Drill an experiment: its config and context as `POST /experiments` takes them (one
    config), the drill's options in the query. The clean run's experiment is made now; each
    fault's run follows it, one after another (`GET /drills/{id}` reports them)."""
    options = _options(faults, scale, data, at)
    with (_UNPACKING.holding(owner.name),
          tempfile.TemporaryDirectory(prefix="muster-upload-") as tmp):
        form = await upload_form.read_upload_form(request, Path(tmp))
        if len(form.configs) != 1:
            raise InvalidRequest(f"a drill drills one config; the form has "
                                 f"{len(form.configs)}")
        if form.context_from is not None:
            options = DrillOptions(**{**options.__dict__,
                                      "source_experiment": form.context_from})
        create = functools.partial(drills.create_drill, state.platform, owner,
                                   form.configs[0], options, archive=form.archive,
                                   git=form.git, wake=state.wake_drills)
        view = await _UNPACKING.run(owner.name, create)
    state.orchestrator.wake.set()
    return view


@router.post("/experiments/{experiment_id}/drills", status_code=201,
             response_model=api.DrillView, responses=_errors(404, 409, 429))
async def drill_experiment(state: State, experiment_id: ExperimentId, body: api.DrillRequest,
                           owner: Submitter) -> shapes.DrillView:
    """Drill an experiment as it was submitted ("Run a drill"): its config, on a copy of
    its context snapshot."""
    options = _options(body.faults, body.scale, body.data, body.at, experiment_id)
    config = await asyncio.to_thread(experiments.experiment_config_text, state.store,
                                     experiment_id)
    create = functools.partial(drills.create_drill, state.platform, owner, config, options,
                               wake=state.wake_drills)
    view = await _UNPACKING.run(owner.name, create)
    state.orchestrator.wake.set()
    return view


@router.get("/drills", response_model=api.many(api.DrillSummary))
def list_drills(state: State, who: Reader) -> list[shapes.DrillSummary]:
    """The latest drills, newest first."""
    return drills.list_drills(state.store, who)


@router.get("/drills/{drill_id}", response_model=api.DrillView, responses=_errors(404))
def get_drill(state: State, drill_id: DrillId, who: Reader) -> shapes.DrillView:
    """A drill and its report so far (`muster drill --json` prints this)."""
    return drills.describe_drill(state.store, who, drill_id)


@router.post("/drills/{drill_id}/cancel", response_model=api.DrillView,
             responses=_errors(404, 409))
async def cancel_drill(state: State, drill_id: DrillId,
                       who: Annotated[Principal, Depends(allow(Action.KILL))]
                       ) -> shapes.DrillView:
    """Stop a drill: the run going on is killed, the runs left are skipped."""
    view = await asyncio.to_thread(drills.cancel_drill, state.store, who, drill_id)
    state.orchestrator.wake.set()
    return view


def _options(faults: list[DrillFault] | None, scale: float, data: str | None, at: float,
             source: int | None = None) -> DrillOptions:
    try:
        chosen = tuple(DrillFault) if not faults else parse_faults(map(str, faults))
        return DrillOptions(chosen, scale, data, at, source)
    except ConfigError as exc:
        raise InvalidRequest(str(exc)) from exc
