"""The job services (`muster.services.jobs`) on a real database, without a server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from muster.config import load_config
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.services import jobs
from muster.services.access import Principal
from muster.states import Role
from muster.store import Event, Experiment, GpuDevice, Store, Trial

# The services check roles and owners with the principal alone: an admin acts on anything.
ADMIN = Principal(user_id=1, name="admin", role=Role.ADMIN)


def add_experiment(store: Store, *states: str, priority: int = 42,
                   resources: dict[str, Any] | None = None) -> tuple[int, list[int]]:
    """An experiment with one trial per state; returns its id and the trials' ids."""
    text = json.dumps({"name": "exp", "entrypoint": ["true"],
                       "resources": {"priority": priority, **(resources or {})}})
    config = load_config(text, source="the test").to_json_dict()
    with store.session_scope() as s:
        exp = Experiment(name="exp", config=config, config_yaml=text, context_dir="/tmp/c",
                         state="ACTIVE", priority=priority)
        trials = [Trial(experiment=exp, state=state, priority=priority, number=number)
                  for number, state in enumerate(states)]
        s.add_all([exp, *trials])
        s.flush()
        return exp.id, [t.id for t in trials]


def events(store: Store, trial_id: int) -> list[tuple[str, str | None, str]]:
    with store.session_scope() as s:
        return [(e.reason, e.message, e.actor) for e in s.scalars(
            select(Event).where(Event.trial_id == trial_id).order_by(Event.id))]


@pytest.mark.parametrize(("rows", "listed"), [
    # (state, priority, id): what holds resources, then the queue, then paused trials
    ([("QUEUED", 42, 1), ("RUNNING", 50, 2)], [2, 1]),
    ([("QUEUED", 42, 1), ("QUEUED", 10, 2), ("QUEUED", 42, 3)], [2, 1, 3]),
    ([("PAUSED", 1, 1), ("QUEUED", 99, 2), ("STARTING", 60, 3), ("RESTARTING", 5, 4)],
     [4, 3, 2, 1]),
])
def test_job_order(rows: list[tuple[str, int, int]], listed: list[int]) -> None:
    ordered = sorted(rows, key=lambda row: jobs.job_order(*row))
    assert [row[2] for row in ordered] == listed


def test_list_jobs_shows_only_trials_that_run_or_wait_in_order(store: Store) -> None:
    _, (running, ended) = add_experiment(store, "RUNNING", "SUCCEEDED", priority=60,
                                         resources={"gpus_per_replica": 1, "gpu_type": "A100"})
    _, (late, paused) = add_experiment(store, "QUEUED", "PAUSED", priority=50)
    _, (early,) = add_experiment(store, "QUEUED", priority=10,
                                 resources={"replicas": 2})
    with store.session_scope() as s:
        s.add(GpuDevice(index=3, name="Fake-A100", type="a100", memory_total=1,
                        state="allocated", trial_id=running, rank=0))
    listed = jobs.list_jobs(store).rows
    assert [job["trial_id"] for job in listed] == [running, early, late, paused]
    first, second = listed[0], listed[1]
    assert first["gpus"] == [3] and first["gpus_per_replica"] == 1
    assert first["gpu_type"] == "a100" and first["priority"] == 60
    assert second["replicas"] == 2 and second["gpus"] == [] and second["state"] == "QUEUED"
    assert second["experiment_name"] == "exp"
    assert ended not in [job["trial_id"] for job in listed]


def test_set_trial_priority_records_who_changed_what(store: Store) -> None:
    _, (trial,) = add_experiment(store, "QUEUED")
    view = jobs.set_trial_priority(store, ADMIN, trial, 10)
    assert view["priority"] == 10
    assert events(store, trial)[-1] == ("priority changed", "priority 42 → 10", "admin")
    jobs.set_trial_priority(store, ADMIN, trial, 10)  # the same again: nothing to record
    assert [e for e in events(store, trial) if e[0] == "priority changed"] == [
        ("priority changed", "priority 42 → 10", "admin")]


@pytest.mark.parametrize("priority", [0, 100, -5])
def test_a_priority_outside_1_to_99_is_refused(store: Store, priority: int) -> None:
    _, (trial,) = add_experiment(store, "QUEUED")
    with pytest.raises(InvalidRequest, match=f"priority must be 1 to 99.*got {priority}"):
        jobs.set_trial_priority(store, ADMIN, trial, priority)


@pytest.mark.parametrize("state", ["SUCCEEDED", "FAILED", "CANCELED", "SUSPECT"])
def test_an_ended_trial_keeps_its_priority(store: Store, state: str) -> None:
    _, (trial,) = add_experiment(store, state)
    with pytest.raises(Conflict, match=f"trial {trial} is {state}: it will not run again"):
        jobs.set_trial_priority(store, ADMIN, trial, 10)


def test_unknown_ids_are_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="trial 999 does not exist"):
        jobs.set_trial_priority(store, ADMIN, 999, 10)
    with pytest.raises(NotFound, match="experiment 999 does not exist"):
        jobs.set_experiment_priority(store, ADMIN, 999, 10)


def test_set_experiment_priority_moves_its_trials_that_have_not_ended(store: Store) -> None:
    exp, (queued, running, ended) = add_experiment(store, "QUEUED", "RUNNING", "FAILED")
    view = jobs.set_experiment_priority(store, ADMIN, exp, 7)
    assert view["priority"] == 7
    assert {t["id"]: t["priority"] for t in view["trials"]} == {
        queued: 7, running: 7, ended: 42}
    with store.session_scope() as s:
        reasons = [(e.entity, e.message) for e in s.scalars(
            select(Event).where(Event.experiment_id == exp, Event.reason == "priority changed"))]
    assert sorted(reasons) == [("experiment", "priority 42 → 7"), ("trial", "priority 42 → 7"),
                               ("trial", "priority 42 → 7")]


def test_an_ended_experiment_keeps_its_priority(store: Store) -> None:
    exp, _ = add_experiment(store, "SUCCEEDED")
    with store.session_scope() as s:
        s.get_one(Experiment, exp).state = "COMPLETED"
    with pytest.raises(Conflict, match=f"experiment {exp} is COMPLETED"):
        jobs.set_experiment_priority(store, ADMIN, exp, 10)
