"""What every part of the supervisor works with, and the attempts a pass follows, read once.

A pass reads every live attempt in one transaction (`read_live_attempts`) into plain,
frozen `LiveAttempt`s and hands each down to the parts that settle it; a part opens a
session only to write what it decided.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from muster.config import ExperimentConfig
from muster.environments.registry import Environments
from muster.home import Home
from muster.launch.accounts import RunAs
from muster.launch.base import Launcher
from muster.rundir import AttemptDir
from muster.schedule.gpu_pool import GpuPool
from muster.schedule.inventory import GpuInventory
from muster.states import AttemptState, StopIntent, TrialState, values
from muster.store import Attempt, Replica, Store, Trial
from muster.store.actors import SUPERVISOR
from muster.supervise.configs import experiment_config
from muster.supervise.ingest import Known, known_files

__all__ = ["ACTOR", "LiveAttempt", "ReplicaFacts", "SupervisorContext", "TrialFacts",
           "current_replicas", "read_live_attempts"]

ACTOR = SUPERVISOR


@dataclass(frozen=True)
class SupervisorContext:
    """The store, the launcher, the home, the GPUs and the environments every part of the
    supervisor uses."""

    store: Store
    launcher: Launcher
    home: Home
    host: str
    pool: GpuPool
    inventory: GpuInventory
    envs: Environments
    run_as: RunAs | None = None  # whom jobs run as; None: the server's own user
    # The bad-node circuit breaker: infra failures of this many trials in a row on a node.
    quarantine_after: int = 3

    @property
    def breaker(self) -> int | None:
        """The circuit breaker's threshold where replicas run on a cluster's nodes; None on
        one machine (there is no other node to place them on)."""
        return self.quarantine_after if self.launcher.on_cluster else None


@dataclass(frozen=True)
class ReplicaFacts:
    """A rank's current incarnation, as the store holds it."""

    rank: int
    incarnation: int
    pid: int | None
    log_path: Path


@dataclass(frozen=True)
class TrialFacts:
    """The trial of a live attempt, as the pass found it."""

    id: int
    uuid: str
    experiment_id: int
    state: TrialState
    intent: StopIntent | None
    queue_reason: str | None
    attempts: int  # how many it has, warm standbys included
    standby_waiting: bool  # a warm standby waits for it


@dataclass(frozen=True)
class LiveAttempt:
    """A STARTING or RUNNING attempt (a warm standby too), read once per pass."""

    id: int
    number: int
    state: AttemptState
    standby: bool
    dir: AttemptDir
    trial: TrialFacts
    config: ExperimentConfig
    replicas: dict[int, ReplicaFacts]  # rank -> its current incarnation
    known: Known  # what the store holds of the trial's files (for ingestion)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.replicas)


def current_replicas(attempt: Attempt) -> dict[int, Replica]:
    """Each rank's latest incarnation (the one that runs, or ran last)."""
    current: dict[int, Replica] = {}
    for replica in sorted(attempt.replicas, key=lambda r: r.incarnation):
        current[replica.rank] = replica
    return current


def read_live_attempts(s: Session, ids: Iterable[int] | None = None,
                       on_broken: Callable[[int, Exception], None] | None = None
                       ) -> list[LiveAttempt]:
    """Every live attempt (or those of `ids`), by id, with what settling them needs.

    An attempt that cannot be read (its experiment's stored config no longer validates) is
    left out and handed to `on_broken(trial_id, error)`; without `on_broken` it raises.
    """
    query = (select(Attempt).where(Attempt.state.in_(values(AttemptState.live())))
             .options(selectinload(Attempt.replicas),
                      selectinload(Attempt.trial).selectinload(Trial.experiment),
                      selectinload(Attempt.trial).selectinload(Trial.attempts))
             .order_by(Attempt.id))
    if ids is not None:
        query = query.where(Attempt.id.in_(list(ids)))
    attempts = list(s.scalars(query))
    known = known_files(s, {a.trial_id for a in attempts})
    waiting: dict[int, bool] = defaultdict(bool)
    for attempt in attempts:
        waiting[attempt.trial_id] |= attempt.standby
    live = []
    for attempt in attempts:
        try:
            live.append(_live(attempt, known[attempt.trial_id], waiting[attempt.trial_id]))
        except Exception as exc:
            if on_broken is None:
                raise
            on_broken(attempt.trial_id, exc)
    return live


def _live(attempt: Attempt, known: Known, standby_waiting: bool) -> LiveAttempt:
    trial = attempt.trial
    facts = TrialFacts(
        id=trial.id, uuid=trial.uuid, experiment_id=trial.experiment_id,
        state=TrialState(trial.state), intent=trial.intent, queue_reason=trial.queue_reason,
        attempts=len(trial.attempts), standby_waiting=standby_waiting)
    replicas = {rank: ReplicaFacts(rank, r.incarnation, r.pid, Path(r.log_path))
                for rank, r in current_replicas(attempt).items()}
    return LiveAttempt(
        id=attempt.id, number=attempt.number, state=AttemptState(attempt.state),
        standby=attempt.standby, dir=AttemptDir(Path(attempt.run_dir)), trial=facts,
        config=experiment_config(trial.experiment), replicas=replicas, known=known)
