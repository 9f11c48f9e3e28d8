"""Drills (`muster drill`, "Run a drill"): made, read, listed and canceled here; run by the
server's drill thread (`muster.drill.runner`).

A drill is made whole or not at all: its config planned (`muster.drill.plan`), each fault
checked against this server and config (a fault that cannot run here is recorded skipped,
with the reason), and its clean run's experiment made from the upload (or the drilled
experiment's snapshot), in the create's own transaction; a create that fails leaves no
drill behind.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select

from muster import api
from muster.config.cluster import ClusterConfig, NetworkDrillConfig
from muster.drill.faults import Situation, skip_reason
from muster.drill.judge import summary
from muster.drill.plan import MAX_DRILL_FAULTS, DrillOptions, DrillPlan, plan_drill
from muster.errors import Conflict, NotFound
from muster.git_state import GitState
from muster.launch.base import Launcher
from muster.services import experiments
from muster.services.access import Action, Principal, authorize
from muster.services.experiments import DrillMark, NewExperiments, Submission
from muster.states import DrillFault, DrillRunState, DrillState
from muster.store import Store
from muster.store.models import Drill, DrillRun, Experiment

__all__ = ["DrillServer", "ExperimentDrills", "cancel_drill", "create_drill", "data_path",
           "describe_drill", "drills_of_experiment", "finish_drill", "inside_context",
           "list_drills", "network_drill"]

MAX_LISTED = 200


class DrillServer(Submission, Protocol):
    """What making a drill needs of the platform."""

    @property
    def launcher(self) -> Launcher: ...

    @property
    def settings(self) -> ClusterConfig: ...


def create_drill(platform: DrillServer, owner: Principal, config_text: str,
                 options: DrillOptions, *, archive: Path | None = None,
                 git: GitState | None = None, wake: Callable[[], None] = lambda: None
                 ) -> api.DrillView:
    """Record a drill of `config_text` (with the uploaded context `archive`, or the
    snapshot of `options.source_experiment`) and make its clean run; its faults' runs
    follow, one after another, in the drill thread.

    Raises:
        ConfigError: the config, or an option, is invalid (422).
        Forbidden, NotFound, QuotaExceeded: as `experiment create` would be refused.
    """
    authorize(owner, Action.SUBMIT)
    plan = plan_drill(config_text, options.scale)
    situation = _situation(platform, plan, options, owner)
    store = platform.store
    drill_id = _record(store, owner, plan, options, config_text, situation)
    try:
        new = NewExperiments([plan.run_config(drill_id, "clean")], archive,
                             context_from=options.source_experiment, git=git,
                             drill=DrillMark(drill_id, "clean"))
        clean = experiments.create_experiments(platform, owner, new)[0]
    except BaseException:
        with store.session_scope() as s:
            drill = s.get(Drill, drill_id)
            if drill is not None:
                s.delete(drill)
        raise
    with store.session_scope() as s:
        first = s.scalars(select(DrillRun).where(DrillRun.drill_id == drill_id,
                                                 DrillRun.position == 0)).one()
        first.experiment_id, first.state = clean, DrillRunState.RUNNING
    wake()
    return describe_drill(store, owner, drill_id)


def _situation(platform: DrillServer, plan: DrillPlan, options: DrillOptions,
               owner: Principal) -> Situation:
    config = plan.config
    return Situation(
        data_path=data_path(plan, options), replicas=config.resources.replicas,
        reports_metrics=config.harness or config.integrations != "off",
        root=os.geteuid() == 0, admin=owner.is_admin,
        ray=not platform.launcher.capabilities.watchable_files,
        link_commands=network_drill(platform.settings) is not None)


def network_drill(settings: ClusterConfig) -> NetworkDrillConfig | None:
    """How the cluster config cuts a Ray node's link (the `network` fault), if it says."""
    if settings.launcher != "ray" or settings.ray is None:
        return None
    return settings.ray.drill_network


def _record(store: Store, owner: Principal, plan: DrillPlan, options: DrillOptions,
            config_text: str, situation: Situation) -> int:
    with store.session_scope() as s:
        drill = Drill(name=plan.name, owner_id=owner.user_id, state=DrillState.RUNNING,
                      options={**options.to_json(), "scaled": plan.scaled},
                      config_yaml=config_text,
                      source_experiment_id=options.source_experiment)
        drill.runs.append(DrillRun(position=0, fault=None, state=DrillRunState.PENDING))
        for position, fault in enumerate(options.faults[:MAX_DRILL_FAULTS], 1):
            why = skip_reason(fault, situation)
            if why is None and situation.ray and fault is not DrillFault.NETWORK:
                why = ("muster injects this fault into processes on its own machine; "
                       "this server runs trials on Ray nodes")
            drill.runs.append(DrillRun(
                position=position, fault=str(fault), skip_reason=why,
                state=DrillRunState.SKIPPED if why else DrillRunState.PENDING))
        s.add(drill)
        s.flush()
        return drill.id


def describe_drill(store: Store, principal: Principal, drill_id: int) -> api.DrillView:
    """The drill and its report so far.

    Raises:
        NotFound: no drill has that id.
    """
    authorize(principal, Action.READ)
    with store.session_scope() as s:
        drill = s.get(Drill, drill_id)
        if drill is None:
            raise NotFound(f"no drill {drill_id}; `muster drill --list` lists them")
        return _view(drill)


def list_drills(store: Store, principal: Principal) -> list[api.DrillSummary]:
    """The latest drills, newest first."""
    authorize(principal, Action.READ)
    with store.session_scope() as s:
        drills = s.scalars(select(Drill).order_by(Drill.id.desc()).limit(MAX_LISTED))
        return [_summary(d) for d in drills]


def _summary(drill: Drill) -> api.DrillSummary:
    return {"id": drill.id, "name": drill.name,
            "owner": drill.owner.name if drill.owner else None, "state": drill.state,
            "created_at": drill.created_at, "summary": drill.message}


def cancel_drill(store: Store, principal: Principal, drill_id: int) -> api.DrillView:
    """Stop a drill: its running experiment is killed, its runs left are skipped.

    Raises:
        NotFound, Forbidden: no such drill, or not the caller's (nor an admin's).
        Conflict: it has ended.
    """
    with store.session_scope() as s:
        drill = s.get(Drill, drill_id)
        if drill is None:
            raise NotFound(f"no drill {drill_id}")
        owner = drill.owner.name if drill.owner else None
        authorize(principal, Action.KILL, owner=owner, subject=f"drill {drill_id}")
        if drill.state.is_terminal():
            raise Conflict(f"drill {drill_id} is already {drill.state}")
        running = [r.experiment_id for r in drill.runs if r.experiment_id is not None
                   and r.state in (DrillRunState.RUNNING, DrillRunState.INJECTED)]
        for run in drill.runs:
            if not run.state.is_terminal():
                run.state = DrillRunState.SKIPPED
                run.skip_reason = f"canceled by {principal.name}"
        # In the same transaction: the drill thread, seeing every run ended, would
        # otherwise end it DONE first.
        _end(drill, DrillState.CANCELED)
    for experiment_id in running:
        with contextlib.suppress(Conflict):  # it ended meanwhile
            experiments.kill_experiment(store, principal, experiment_id)
    return describe_drill(store, principal, drill_id)


def _view(drill: Drill) -> api.DrillView:
    runs = list(drill.runs)
    clean_run, fault_runs = runs[0], runs[1:]
    clean = clean_run.outcome or {}
    options = drill.options
    return {
        "id": drill.id, "name": drill.name,
        "owner": drill.owner.name if drill.owner else None, "state": drill.state,
        "created_at": drill.created_at, "ended_at": drill.ended_at,
        "scale": options.get("scale", 0.1), "at": options.get("at", 0.5),
        "scaled": list(options.get("scaled") or []),
        "experiment_ids": [r.experiment_id for r in runs if r.experiment_id is not None],
        "clean": {"state": clean.get("state"), "verified": clean.get("verified"),
                  "verdict": clean.get("verdict"), "seconds": clean.get("seconds"),
                  "experiment_id": clean_run.experiment_id},
        "faults": [_fault_row(run) for run in fault_runs],
        "summary": drill.message,
        "source_experiment": options.get("source_experiment"),
    }


def _fault_row(run: DrillRun) -> api.DrillFaultReport:
    outcome: dict[str, Any] = dict(run.outcome or {})
    ended = run.state == DrillRunState.ENDED
    return {
        "name": str(run.fault), "injected_at": run.injected_at,
        "state": outcome.get("state") if ended else None,
        "class": outcome.get("class") if ended else None,
        "message": outcome.get("message") if ended else None,
        "caught": outcome.get("caught") if ended else None,
        "detect_seconds": outcome.get("detect_seconds") if ended else None,
        "advice": outcome.get("advice") if ended else None,
        "expected": "survive" if DrillFault(str(run.fault)).must_survive else "named",
        "run_state": run.state, "experiment_id": run.experiment_id,
        "injection": run.injection, "verdict": outcome.get("verdict") if ended else None,
        "skipped": run.skip_reason,
    }


def experiment_drills(store: Store, experiment_id: int) -> list[int]:
    """The drills an experiment was the source of, or a run of (its page links them)."""
    with store.session_scope() as s:
        exp = s.get(Experiment, experiment_id)
        own = [exp.drill_id] if exp is not None and exp.drill_id is not None else []
        made = list(s.scalars(select(Drill.id).where(
            Drill.source_experiment_id == experiment_id).order_by(Drill.id.desc())
            .limit(MAX_LISTED)))
        return own + made


@dataclass(frozen=True)
class ExperimentDrills:
    """An experiment's drills, as its page links them."""

    run_of: api.DrillSummary | None  # the drill this experiment is one run of
    run: str | None  # which of that drill's runs it is: "clean" or a `DrillFault`
    made: list[api.DrillSummary]  # the drills asked for on it, newest first


def drills_of_experiment(store: Store, principal: Principal, experiment_id: int
                         ) -> ExperimentDrills:
    """The drill an experiment is a run of, and the drills asked for on it (its page)."""
    authorize(principal, Action.READ)
    ids = experiment_drills(store, experiment_id)
    if not ids:
        return ExperimentDrills(None, None, [])
    with store.session_scope() as s:
        exp = s.get(Experiment, experiment_id)
        own, run = (exp.drill_id, exp.drill_fault) if exp is not None else (None, None)
        found = {d.id: _summary(d) for d in s.scalars(select(Drill).where(Drill.id.in_(ids)))}
    return ExperimentDrills(found.get(own) if own is not None else None, run,
                            [found[i] for i in ids if i != own and i in found])


def finish_drill(store: Store, drill_id: int, state: DrillState,
                 message: str | None = None) -> None:
    """End a drill: its summary ("8 of 10 faults caught; …") as its message."""
    with store.session_scope() as s:
        drill = s.get_one(Drill, drill_id)
        if not drill.state.is_terminal():
            _end(drill, state, message)


def _end(drill: Drill, state: DrillState, message: str | None = None) -> None:
    rows = [r.outcome for r in drill.runs[1:] if r.state == DrillRunState.ENDED and r.outcome]
    skipped = [(str(r.fault), r.skip_reason or "") for r in drill.runs[1:]
               if r.state == DrillRunState.SKIPPED]
    drill.state, drill.ended_at = state, time.time()
    said = summary(rows, skipped)
    drill.message = message or (f"canceled; {said}" if state is DrillState.CANCELED
                                else said)


def data_path(plan: DrillPlan, options: DrillOptions) -> str | None:
    """The data directory inside the context: the config's, else the drill's `--data`."""
    path = plan.config.data.path if plan.config.data is not None else options.data
    return path if path is not None and inside_context(path) else None


def inside_context(path: str) -> bool:
    """A data path the drill may copy and damage: relative, inside the context (a path
    outside it is shared with every trial, never a drill's to touch)."""
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts \
        and not path.startswith("~")
