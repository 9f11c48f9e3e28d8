"""A supervisor on a real store, with a real LocalLauncher and a muster home in tmp_path.

Experiments are created through the real service (`create_experiment`) with entrypoints that
name the fixture scripts by absolute path, and the tests drive `Supervisor.tick()` themselves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.config import ClusterConfig
from muster.home import Home
from muster.launch.base import Launcher
from muster.launch.local import LocalLauncher
from muster.schedule.backends import open_placement
from muster.schedule.local_placement import LocalPlacement
from muster.services.access import Principal
from muster.services.experiments import create_experiment
from muster.states import ExperimentState, TrialState
from muster.store import Attempt, Event, Experiment, Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import first_admin
from tests.launch.fake_backend import FakeCluster, FakeLauncher, FakePlacement
from tests.processes import kill_home_processes
from tests.waiting import wait_until

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RUN_TIMEOUT = 60.0


def fixture_entrypoint(name: str, *args: str) -> list[str]:
    """The entrypoint for a fixture script: Python ones on this interpreter, others directly."""
    path = str(FIXTURES / name)
    return [sys.executable, path, *args] if name.endswith(".py") else [path, *args]


def experiment_yaml(entrypoint: list[str], **policy: Any) -> str:
    """An experiment config running `entrypoint`, with a short stop grace plus `policy`."""
    config = {
        "name": "supervise-test",
        "entrypoint": entrypoint,
        "failure_policy": {"stop_grace": 1.0, **policy},
    }
    return yaml.safe_dump(config)


@dataclass(frozen=True)
class EventView:
    entity: str
    entity_id: int
    from_state: str | None
    to_state: str | None
    reason: str
    actor: str
    message: str | None


@dataclass(frozen=True)
class AttemptView:
    id: int
    number: int
    state: str
    reason: str | None
    run_dir: Path
    replica_reason: str | None
    exit_code: int | None
    signal: str | None
    message: str | None
    shim_pid: int | None


@dataclass(frozen=True)
class TrialView:
    """A trial as stored, with its attempts and its events, read in one session."""

    id: int
    experiment_id: int
    state: str
    reason: str | None
    message: str | None
    replica_restarts: int
    trial_retries: int
    internal_retries: int
    user_error_retries: int
    attempts: list[AttemptView]
    events: list[EventView]

    @property
    def counters(self) -> tuple[int, int, int, int]:
        """(replica_restarts, trial_retries, internal_retries, user_error_retries)."""
        return (self.replica_restarts, self.trial_retries, self.internal_retries,
                self.user_error_retries)

    def trial_moves(self) -> list[tuple[str | None, str | None, str]]:
        """(from, to, reason) of every state change of the trial, oldest first."""
        return [(e.from_state, e.to_state, e.reason) for e in self.events
                if e.entity == "trial" and e.to_state is not None]

    def decisions(self) -> list[EventView]:
        """The trial's events that record a decision rather than a state change."""
        return [e for e in self.events if e.entity == "trial" and e.to_state is None
                and e.reason != "created"]

    def events_of(self, attempt: AttemptView) -> list[EventView]:
        return [e for e in self.events if e.entity == "attempt" and e.entity_id == attempt.id]


@dataclass(frozen=True)
class Submitted:
    experiment_id: int
    trial_id: int


@dataclass
class Rig:
    """One muster "server" without HTTP: a store, a home and a supervisor over them."""

    store: Store
    home: Home
    supervisor: Supervisor
    admin: Principal  # who submits and acts: the first admin

    def submit(self, entrypoint: list[str], **policy: Any) -> Submitted:
        experiment_id = create_experiment(
            self.store, self.home, self.admin, experiment_yaml(entrypoint, **policy),
            archive=None)
        with self.store.session_scope() as s:
            trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id))
            return Submitted(experiment_id, trial_id.one())

    def set_slots(self, slots: int) -> None:
        """Let `slots` replicas without GPUs run at once from the next pass on (the cluster
        config's `slots`, changed)."""
        placement = self.supervisor.placement
        if isinstance(placement, FakePlacement):
            placement.cluster.resize(slots)
        else:
            assert isinstance(placement, LocalPlacement), placement
            placement.configured_slots = slots

    def restarted(self) -> Rig:
        """The same store and home under a NEW supervisor and launcher, as after a restart."""
        supervisor = Supervisor(self.store, LocalLauncher(), self.home,
                                LocalPlacement(self.store, self.supervisor.placement.slots()),
                                min_free_disk=0)
        return Rig(self.store, self.home, supervisor, self.admin)

    def trial(self, trial_id: int) -> TrialView:
        with self.store.session_scope() as s:
            return _trial_view(s.get_one(Trial, trial_id), list(s.scalars(
                select(Event).where(Event.trial_id == trial_id).order_by(Event.id)
            )))

    def experiment_state(self, experiment_id: int) -> ExperimentState:
        with self.store.session_scope() as s:
            return ExperimentState(s.get_one(Experiment, experiment_id).state)

    def tick_until(
        self, predicate: Callable[[], Any], what: str, timeout: float = RUN_TIMEOUT,
        interval: float = 0.02,
    ) -> Any:
        """Tick the supervisor until `predicate()` holds after a pass; returns its value."""

        def ticked() -> Any:
            self.supervisor.tick()
            return predicate()

        return wait_until(ticked, timeout=timeout, what=what, interval=interval)

    def run_to_end(self, job: Submitted) -> TrialView:
        """Tick until the experiment is terminal; returns its trial."""
        self.tick_until(lambda: self.experiment_state(job.experiment_id).is_terminal(),
                        what=f"experiment {job.experiment_id} to end")
        return self.trial(job.trial_id)

    def run_to_end_of(self, experiment_id: int, trial_id: int) -> TrialView:
        """`run_to_end` of an experiment created some other way than `submit`."""
        return self.run_to_end(Submitted(experiment_id, trial_id))

    def until_trial(self, job: Submitted, state: TrialState) -> TrialView:
        view = self.tick_until(
            lambda: (t := self.trial(job.trial_id)).state == state.value and t,
            what=f"trial {job.trial_id} to be {state.value}",
        )
        assert isinstance(view, TrialView)
        return view


def _trial_view(trial: Trial, events: list[Event]) -> TrialView:
    return TrialView(
        id=trial.id, experiment_id=trial.experiment_id, state=trial.state, reason=trial.reason,
        message=trial.message, replica_restarts=trial.replica_restarts,
        trial_retries=trial.trial_retries, internal_retries=trial.internal_retries,
        user_error_retries=trial.user_error_retries,
        attempts=[_attempt_view(a) for a in trial.attempts],
        events=[EventView(e.entity, e.entity_id, e.from_state, e.to_state, e.reason, e.actor,
                          e.message) for e in events],
    )


def _attempt_view(attempt: Attempt) -> AttemptView:
    replica = attempt.replicas[0]
    return AttemptView(
        id=attempt.id, number=attempt.number, state=attempt.state, reason=attempt.reason,
        run_dir=Path(attempt.run_dir), replica_reason=replica.reason,
        exit_code=replica.exit_code, signal=replica.signal, message=replica.message,
        shim_pid=replica.shim_pid,
    )


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Home]:
    """A fresh muster home; every process started under it is SIGKILLed at teardown."""
    where = Home(tmp_path / "home").ensure()
    yield where
    kill_home_processes(where.root)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """A migrated SQLite store, for the tests that run on one backend only."""
    migrated = Store(f"sqlite:///{tmp_path / 'db' / 'muster.db'}")
    migrated.upgrade()
    yield migrated
    migrated.dispose()


def _rig(store: Store, home: Home) -> Rig:
    return Rig(store, home, Supervisor(store, LocalLauncher(), home,
                                      LocalPlacement(store, slots=4), min_free_disk=0),
               first_admin(store, home))


# The launcher backends the lifecycle contract (`test_supervisor.py`) runs on: each one's
# placement is opened by the backend's name, as the server opens it.
BACKENDS = ["local", "fake"]


def backend_rig(backend: str, store: Store, home: Home) -> Rig:
    """A supervisor with 4 slots on the launcher backend `backend` ("local", or the
    test-only "fake" of `tests/launch/fake_backend.py`: two nodes of 2 CPUs)."""
    launcher: Launcher = (LocalLauncher() if backend == "local"
                          else FakeLauncher(FakeCluster.of(count=2, cpus=2)))
    placement = open_placement(launcher, store, ClusterConfig(slots=4, gpus="none"), home)
    return Rig(store, home, Supervisor(store, launcher, home, placement, min_free_disk=0),
               first_admin(store, home))


@pytest.fixture
def rig(store: Store, home: Home) -> Rig:
    """A supervisor on each database backend in turn."""
    return _rig(store, home)


@pytest.fixture
def sqlite_rig(sqlite_store: Store, home: Home) -> Rig:
    """A supervisor on SQLite only (the policy table: processes cost more than the backend)."""
    return _rig(sqlite_store, home)
