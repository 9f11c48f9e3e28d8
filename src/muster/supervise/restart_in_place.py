"""Restart in place (`restart_scope: replica`): one failed replica is launched again in the
same attempt while the others run on.

Only for infrastructure failures (INFRA, LOST, STALLED), at most `replica_restarts` times
per rank and attempt. The ended incarnation's control files move to `restarts/`, a new
`replicas` row (`incarnation` + 1) is launched with the attempt's MASTER_PORT, and it
appends to the same log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from muster.errors import LaunchError
from muster.launch.base import ReplicaSpec, ReplicaStatus
from muster.launch.exits import replica_name
from muster.launch.torchrun import free_port
from muster.states import ReplicaPhase
from muster.store import Attempt, Replica
from muster.supervise.context import LiveAttempt, SupervisorContext, current_replicas
from muster.supervise.ending import (
    Ending,
    classify_replica,
    record_decision,
    record_replica_end,
)
from muster.supervise.launching import Launching
from muster.supervise.outcome import exited_cleanly
from muster.supervise.placement import note_node_end

__all__ = ["RestartInPlace"]

log = logging.getLogger(__name__)


@dataclass
class RestartInPlace:
    ctx: SupervisorContext
    launching: Launching
    ending: Ending

    def maybe_restart(self, live: LiveAttempt, status: ReplicaStatus) -> ReplicaStatus | None:
        """The new incarnation's status when the replica ended for an infrastructure reason
        and has restarts left; None when it is left as it is (it then decides the attempt
        as usual, and the policy retries the trial)."""
        if status.phase not in (ReplicaPhase.EXITED, ReplicaPhase.LOST) or exited_cleanly(status):
            return None
        recorded = self._record_restart(live, status)
        if recorded is None:
            return None
        spec, incarnation = recorded
        self.ctx.launcher.archive(live.dir.path, status.rank, incarnation - 1)
        try:
            shim = self.ctx.launcher.submit(spec)
        except LaunchError as exc:
            log.error("restart in place of trial %s rank %s failed: %s", live.trial.id,
                      status.rank, exc)
            return ReplicaStatus(rank=status.rank, phase=ReplicaPhase.LOST)
        with self.ctx.store.session_scope() as s:
            restarted = current_replicas(s.get_one(Attempt, live.id))[status.rank]
            restarted.shim_pid, restarted.shim_start_ticks = shim.pid, shim.start_ticks
            restarted.node = self.ctx.placement.node_of(live.dir.path, status.rank)
        return self.ctx.launcher.describe(live.dir.path, status.rank)

    def _record_restart(
        self, live: LiveAttempt, status: ReplicaStatus
    ) -> tuple[ReplicaSpec, int] | None:
        """Record the ended incarnation and the next one; the next one's launch plan and
        number, or None when the replica is not to be restarted in place."""
        policy = live.config.failure_policy
        with self.ctx.store.session_scope() as s:
            attempt = s.get_one(Attempt, live.id)
            trial, replica = attempt.trial, current_replicas(attempt)[status.rank]
            tail = self.ending.log_tail(replica)
            verdict = classify_replica(replica, status, trial, tail)
            if not verdict.reason.is_infra() or replica.incarnation >= policy.replica_restarts:
                return None
            record_replica_end(replica, status, verdict, tail)
            note_node_end(s, replica, verdict, self.ctx.breaker)
            number = replica.incarnation + 1
            trial.replica_restarts += 1
            record_decision(s, trial, verdict.reason,
                            f"{verdict.reason} failure of the replica "
                            f"{replica_name(status.rank)}; restarting it in place (restart "
                            f"{number} of {policy.replica_restarts} in attempt "
                            f"{attempt.number})")
            s.add(Replica(attempt=attempt, rank=status.rank, incarnation=number,
                          host=self.ctx.host, log_path=replica.log_path))
            # (attempts recorded before MASTER_PORT was kept have none: any free port)
            port = attempt.master_port if attempt.master_port is not None else free_port()
            plan = self.launching.plan(s, trial, attempt.number, port, incarnation=number)
            return self.launching.specs(plan, [status.rank])[0], number
