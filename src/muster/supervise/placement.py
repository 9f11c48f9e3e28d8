"""Where replicas go, as the store sees it: each attempt's reservation, the CAPACITY wait,
leftovers swept, and the bad-node circuit breaker.

What is reserved, and where, is the placement's (`muster.schedule.placement`, chosen once
at wiring); this module keeps the trials' side of it. A placement that `reserves` nothing
(this machine: the plan's slots are the reservation) costs no transaction here. With one
that does (Ray, `schedule/ray_placement.py`) an attempt starts only once its replica set
is placed, all or nothing: until then its trial stays QUEUED (or RESTARTING) with the
placement's reason, and after `failure_policy.capacity_timeout` the wait is a CAPACITY
failure: the reservation is given up and asked for again, up to `capacity_retries` times,
then the trial FAILS saying what the cluster lacked.

The circuit breaker, where the placement `quarantines_nodes`: a node on which replicas of
`node_quarantine.failures` different trials in a row ended INFRA, LOST or STALLED is
quarantined (no new replica is placed there) until an admin releases it; a replica that
ends any other way there, but stopped by muster, clears its streak.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.launch.exits import Classification
from muster.schedule.placement import Bundle
from muster.states import AttemptState, EventReason, Reason, TrialState, values
from muster.store import Attempt, ClusterNode, Replica, Trial, record_event, transition
from muster.store.configs import experiment_config
from muster.store.models import now
from muster.supervise.context import ACTOR, SupervisorContext

__all__ = ["Placements", "note_node_end", "quarantined_nodes", "release_node"]

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 30.0


@dataclass
class _Wait:
    attempt: int  # the attempt number its reservation is for
    since: float  # monotonic


@dataclass
class Placements:
    ctx: SupervisorContext
    _waits: dict[int, _Wait] = field(default_factory=dict)  # trial id -> its pending wait
    _swept_at: float = field(default=float("-inf"))

    def reserve(self, trial_id: int) -> bool:
        """Whether the trial's next attempt has its place now. While it waits, its queue
        reason says why; past the capacity timeout the wait ends as CAPACITY (retried, or
        the trial fails). Without a reservation to wait for: no transaction."""
        if not self.ctx.placement.reserves:
            return True
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            config = experiment_config(trial.experiment)
            number = len(trial.attempts) + 1
            uuid = trial.uuid
            resources = config.resources
            bundles = [Bundle(cpus=1.0, gpus=resources.gpus_per_replica,
                              memory=resources.memory_limit)] * resources.replicas
            policy = config.failure_policy
        self._exclude_quarantined()  # a node quarantined earlier in this pass is out already
        placement = self.ctx.placement.reserve(uuid, number, bundles)
        if placement.ready:
            self._waits.pop(trial_id, None)
            return True
        wait = self._waits.get(trial_id)
        if wait is None or wait.attempt != number:
            wait = self._waits[trial_id] = _Wait(number, time.monotonic())
        waited = time.monotonic() - wait.since
        reason = placement.reason or "waiting for the cluster to place its replicas"
        if waited < policy.capacity_timeout:
            with self.ctx.store.session_scope() as s:
                trial = s.get_one(Trial, trial_id)
                if trial.state == TrialState.QUEUED:
                    trial.queue_reason = f"{reason} ({waited:.0f} s of " \
                                         f"{policy.capacity_timeout:g} s)"
            return False
        self.ctx.placement.release(uuid, number)  # asked for again on the next pass
        del self._waits[trial_id]
        self._capacity_failure(trial_id, reason, policy.capacity_timeout,
                               policy.capacity_retries)
        return False

    def _capacity_failure(self, trial_id: int, reason: str, timeout: float,
                          retries: int) -> None:
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if not trial.state.is_waiting():
                return
            failures = trial.capacity_waits + 1
            trial.capacity_waits = failures
            if failures <= retries:
                record_event(s, entity="trial", entity_id=trial.id, reason=Reason.CAPACITY,
                             actor=ACTOR, experiment_id=trial.experiment_id, trial_id=trial.id,
                             message=f"the cluster had no room for its replicas for "
                                     f"{timeout:g} s; asking again (retry {failures} of "
                                     f"{retries}): {reason}")
                return
            if trial.state == TrialState.QUEUED:
                transition(s, trial, TrialState.STARTING, reason=EventReason.LAUNCHING,
                           actor=ACTOR)
            transition(s, trial, TrialState.FAILED, reason=Reason.CAPACITY, actor=ACTOR,
                       message=f"The cluster had no room for the trial's replicas in "
                               f"{failures} waits of {timeout:g} s: {reason}")

    def sweep(self, force: bool = False) -> None:
        """Every SWEEP_EVERY_S (and at start): remove what killed shims left on this machine
        (`Launcher.collect_leftovers`), and the reservations and replica owners of attempts
        that are not live and not about to start; apply the quarantine. With nothing
        reserved and no node to keep out (one machine): no query on the pass."""
        self._exclude_quarantined()
        if not force and time.monotonic() - self._swept_at < SWEEP_EVERY_S:
            return
        self._swept_at = time.monotonic()
        left = self.ctx.launcher.collect_leftovers()
        if left:
            log.info("removed what killed shims left: %s", ", ".join(left))
        if not self.ctx.placement.reserves:
            return
        with self.ctx.store.session_scope() as s:
            keep = {(uuid, number) for uuid, number in s.execute(
                select(Trial.uuid, Attempt.number).join(Attempt.trial)
                .where(Attempt.state.in_(values(AttemptState.live()))))}
            for trial in s.scalars(select(Trial).where(Trial.state.in_(
                    values(TrialState.waiting())))):
                keep.add((trial.uuid, len(trial.attempts) + 1))
        removed = self.ctx.placement.sweep(keep)
        if removed:
            log.warning("removed what no live attempt owns on the cluster: %s",
                        ", ".join(removed))

    def _exclude_quarantined(self) -> None:
        """Keep the quarantined nodes out of new placements (where there are nodes)."""
        if self.ctx.placement.quarantines_nodes:
            self.ctx.placement.exclude_nodes(quarantined_nodes(self.ctx))


def quarantined_nodes(ctx: SupervisorContext) -> set[str]:
    with ctx.store.session_scope() as s:
        return set(s.scalars(select(ClusterNode.id)
                             .where(ClusterNode.quarantined_at.is_not(None))))


def note_node_end(s: Session, replica: Replica, verdict: Classification,
                  failures: int | None) -> None:
    """The circuit breaker's bookkeeping for one ended replica on its node: an infra
    failure adds its trial to the node's streak (quarantined at `failures` different
    trials); an end of the job's own (exit 0, its error) clears the streak; a stop by
    muster changes nothing. `failures` None: no breaker (one machine: there is no other
    node to place replicas on)."""
    if replica.node is None or failures is None:
        return
    reason = verdict.reason
    if reason in (Reason.STOPPED, Reason.INTERNAL, Reason.CAPACITY):
        return  # muster's doing, not the node's
    node = s.get(ClusterNode, replica.node)
    if node is None:
        if not reason.is_infra():
            return
        node = ClusterNode(id=replica.node, failed_trials=[])
        s.add(node)
    trial = replica.attempt.trial
    if not reason.is_infra():
        if node.failed_trials and node.quarantined_at is None:
            node.failed_trials, node.updated_at = [], now()
        return
    streak = [t for t in node.failed_trials if t != trial.id] + [trial.id]
    node.failed_trials, node.updated_at = streak, now()
    if node.quarantined_at is not None or len(streak) < failures:
        return
    node.quarantined_at = now()
    node.quarantine_reason = (f"replicas of {len(streak)} different trials in a row ended "
                              f"{reason} or another infra failure there (trials "
                              f"{', '.join(map(str, streak))})")
    message = (f"node {node.id} quarantined: {node.quarantine_reason}; no new replica is "
               f"placed there until `muster cluster node release {node.id}`")
    log.warning("%s", message)
    record_event(s, entity="trial", entity_id=trial.id, reason=EventReason.NODE_QUARANTINED,
                 actor=ACTOR, message=message, experiment_id=trial.experiment_id,
                 trial_id=trial.id)


def release_node(s: Session, node_id: str) -> bool:
    """Return a quarantined node to the pool (its streak cleared); False when it is not
    quarantined."""
    node = s.get(ClusterNode, node_id)
    if node is None or node.quarantined_at is None:
        return False
    node.quarantined_at, node.quarantine_reason = None, None
    node.failed_trials, node.updated_at = [], now()
    return True
