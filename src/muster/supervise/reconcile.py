"""Reconciliation on server start: reconcile every non-terminal attempt before new work starts.

For each replica of each live attempt in the store: an exit record on disk → finalise it; a shim or
training process alive with the recorded (pid, start time) → reattach (keep following it);
otherwise → LOST, and the failure policy decides. Identities come from the attempt's files,
so a PID that now belongs to an unrelated process is never taken for the shim.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from muster.states import EventReason, ReplicaPhase
from muster.store import Attempt, record_event
from muster.store.actors import SERVER_START
from muster.supervise.supervisor import Supervisor

log = logging.getLogger(__name__)

_VERB = {
    ReplicaPhase.EXITED: "finalised from its exit record",
    ReplicaPhase.RUNNING: "reattached to its running process",
    ReplicaPhase.STARTING: "reattached to its starting shim",
    ReplicaPhase.LOST: "lost: no exit record and no live process with its identity",
}


def reconcile_attempts(supervisor: Supervisor) -> Counter[ReplicaPhase]:
    """Reconcile every live attempt once; returns how many replicas were found in each phase."""
    found: Counter[ReplicaPhase] = Counter()
    for attempt_id in supervisor.active_attempt_ids():
        found.update(_note_phases(supervisor, attempt_id))
        supervisor.reconcile_attempt(attempt_id)
    if found:
        log.info("reconciled replicas: %s", {p.value: n for p, n in found.items()})
    return found


def _note_phases(supervisor: Supervisor, attempt_id: int) -> list[ReplicaPhase]:
    with supervisor.store.session_scope() as s:
        attempt = s.get_one(Attempt, attempt_id)
        ranks = sorted(r.rank for r in attempt.replicas)
        phases = [supervisor.launcher.describe(Path(attempt.run_dir), rank).phase
                  for rank in ranks]
        if len(ranks) == 1:
            message = f"attempt {attempt.number} {_VERB[phases[0]]}"
        else:
            message = f"attempt {attempt.number}: " + "; ".join(
                f"rank {rank} {_VERB[phase]}" for rank, phase in zip(ranks, phases, strict=True))
        record_event(
            s, entity="attempt", entity_id=attempt.id, reason=EventReason.RECONCILE,
            actor=SERVER_START, message=message, experiment_id=attempt.trial.experiment_id,
            trial_id=attempt.trial_id,
        )
        return phases
