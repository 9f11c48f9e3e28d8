"""What every part of the supervisor works with, and the attempts a pass follows, read once.

A pass reads every live attempt in one transaction (`read_live_attempts`) into plain,
frozen `LiveAttempt`s and hands each down to the parts that reconcile it; a part opens a
session only to write what it decided.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from muster.config import ExperimentConfig
from muster.config.cluster import DEFAULT_LOG_LIMIT
from muster.environments.registry import Environments
from muster.home import Home
from muster.launch.accounts import RunAs
from muster.launch.base import Launcher
from muster.rundir import AttemptDir
from muster.schedule.placement import Placement
from muster.states import AttemptState, StopIntent, TrialState, values
from muster.store import Attempt, Experiment, Replica, Store, Trial
from muster.store.actors import SUPERVISOR
from muster.store.configs import kept_config, stored_config
from muster.supervise.ingest import Known, known_files
from muster.system_metrics import DEFAULT_INTERVAL_S

__all__ = ["ACTOR", "LiveAttempt", "ReplicaFacts", "SupervisorContext", "TrialFacts",
           "current_replicas", "read_live_attempts"]

ACTOR = SUPERVISOR


@dataclass(frozen=True)
class SupervisorContext:
    """The store, the launcher, the home, the placement (slots, GPUs, nodes) and the
    environments every part of the supervisor uses."""

    store: Store
    launcher: Launcher
    home: Home
    host: str
    placement: Placement
    envs: Environments
    run_as: RunAs | None = None  # whom jobs run as; None: the server's own user
    # The bad-node circuit breaker: infra failures of this many trials in a row on a node.
    quarantine_after: int = 3
    # The cluster config's `log_limit`, for experiments that set none (None: no limit).
    log_limit: int | None = DEFAULT_LOG_LIMIT
    # The cluster config's `system_metrics_interval` (`muster.launch.resources`).
    system_metrics_interval: float = DEFAULT_INTERVAL_S

    @property
    def breaker(self) -> int | None:
        """The circuit breaker's threshold where replicas run on several nodes; None on one
        machine (there is no other node to place them on)."""
        return self.quarantine_after if self.placement.quarantines_nodes else None


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
    """Every live attempt (or those of `ids`), by id, with what reconciling them needs: the
    columns it needs, in a few queries whatever their number (no ORM objects, and no
    experiment's config unless it is not kept already).

    An attempt that cannot be read (its experiment's stored config no longer validates) is
    left out and handed to `on_broken(trial_id, error)`; without `on_broken` it raises.
    """
    query = (select(Attempt.id, Attempt.trial_id, Attempt.number, Attempt.state,
                    Attempt.standby, Attempt.run_dir)
             .where(Attempt.state.in_(values(AttemptState.live()))).order_by(Attempt.id))
    if ids is not None:
        query = query.where(Attempt.id.in_(list(ids)))
    attempts = s.execute(query).all()
    if not attempts:
        return []  # (an idle server's pass: none of the queries below has a row to find)
    trial_ids = {a.trial_id for a in attempts}
    trials = _trials(s, trial_ids, {a.trial_id for a in attempts if a.standby})
    replicas = _current_replicas(s, [a.id for a in attempts])
    known = known_files(s, trial_ids)
    configs = _configs(s, dict(experiment for _, experiment in trials.values()))
    live = []
    for attempt in attempts:
        trial, (experiment_id, _) = trials[attempt.trial_id]
        try:
            config = configs[experiment_id]
            if isinstance(config, Exception):
                raise config
            live.append(LiveAttempt(
                id=attempt.id, number=attempt.number, state=attempt.state,
                standby=attempt.standby, dir=AttemptDir(Path(attempt.run_dir)), trial=trial,
                config=config, replicas=replicas[attempt.id], known=known[attempt.trial_id]))
        except Exception as exc:
            if on_broken is None:
                raise
            on_broken(attempt.trial_id, exc)
    return live


def _trials(s: Session, trial_ids: set[int], standby_waiting: set[int]
            ) -> dict[int, tuple[TrialFacts, tuple[int, str]]]:
    """Each trial's facts, and its experiment's id and uuid."""
    counts = {trial_id: count for trial_id, count in s.execute(
        select(Attempt.trial_id, func.count()).where(Attempt.trial_id.in_(trial_ids))
        .group_by(Attempt.trial_id))}
    found = {}
    for row in s.execute(select(Trial.id, Trial.uuid, Trial.experiment_id, Trial.state,
                                Trial.stop_requested, Trial.stop_intent, Trial.queue_reason,
                                Experiment.uuid.label("experiment_uuid"))
                         .join(Experiment, Trial.experiment_id == Experiment.id)
                         .where(Trial.id.in_(trial_ids))):
        facts = TrialFacts(
            id=row.id, uuid=row.uuid, experiment_id=row.experiment_id,
            state=row.state, intent=Trial.intent_of(row.stop_requested,
                                                                row.stop_intent),
            queue_reason=row.queue_reason, attempts=counts.get(row.id, 0),
            standby_waiting=row.id in standby_waiting)
        found[row.id] = (facts, (row.experiment_id, row.experiment_uuid))
    return found


def _current_replicas(s: Session, attempt_ids: list[int]) -> dict[int, dict[int, ReplicaFacts]]:
    """Each attempt's replicas by rank, each rank's latest incarnation (`current_replicas`)."""
    found: dict[int, dict[int, ReplicaFacts]] = defaultdict(dict)
    for row in s.execute(select(Replica.attempt_id, Replica.rank, Replica.incarnation,
                                Replica.pid, Replica.log_path)
                         .where(Replica.attempt_id.in_(attempt_ids))
                         .order_by(Replica.incarnation)):
        found[row.attempt_id][row.rank] = ReplicaFacts(row.rank, row.incarnation, row.pid,
                                                       Path(row.log_path))
    return found


def _configs(s: Session, uuids: dict[int, str]) -> dict[int, ExperimentConfig | Exception]:
    """Each of these experiments' (id -> uuid) config, or why it cannot be read: kept
    validated already (`configs`), or read (in one query: none in steady state) and
    validated now."""
    found: dict[int, ExperimentConfig | Exception] = {}
    for experiment_id, uuid in uuids.items():
        kept = kept_config(uuid)
        if kept is not None:
            found[experiment_id] = kept
    missing = [experiment_id for experiment_id in uuids if experiment_id not in found]
    if missing:
        for experiment_id, stored in s.execute(select(Experiment.id, Experiment.config)
                                               .where(Experiment.id.in_(missing))):
            try:
                found[experiment_id] = stored_config(uuids[experiment_id], stored)
            except Exception as exc:  # noqa: BLE001 - its attempts go to `on_broken`
                found[experiment_id] = exc
    return found
