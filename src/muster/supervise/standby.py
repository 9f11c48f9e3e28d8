"""Warm standby (`failure_policy.warm_standby`): the next attempt starts ahead and waits.

Once an attempt is RUNNING, the next one is launched with `attempts.standby` true: not
active, holding no slot, hidden from the logs. Its replicas wait in
`muster.harness.init()` for their go files (`RankFiles.standby_go`). A retry promotes it
(`promote`: the go files name the latest checkpoint); a trial that comes to rest or is being
stopped drops it (CANCELED, reason `standby`, processes cancelled with no grace).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from muster.atomic import atomic_write_json
from muster.errors import LaunchError
from muster.jobenv import LATEST_CHECKPOINT
from muster.rundir import AttemptDir
from muster.states import AttemptState, EventReason, Reason, ReplicaPhase, TrialState
from muster.store import Attempt, Trial, record_event, transition
from muster.store.models import now
from muster.supervise.context import ACTOR, LiveAttempt, SupervisorContext
from muster.supervise.launching import (
    Launching,
    latest_checkpoint,
    note_outputs_before,
    prepare_attempt_dir,
    resumed_from,
)

__all__ = ["Standby"]

log = logging.getLogger(__name__)


@dataclass
class Standby:
    ctx: SupervisorContext
    launching: Launching
    # A standby started during this pass is not in the pass's `live` list, and its trial
    # may come to rest in the same pass (a quick attempt checks in and ends between two passes).
    _started: bool = False

    def ensure(self, live: LiveAttempt, trial_running: bool) -> None:
        """Start the next attempt's replicas while `live` runs, unless the trial has a
        standby, is being stopped, or restarts only single replicas."""
        policy = live.config.failure_policy
        # Not where the backend reserves places: a standby's is not reserved (docs/ray.md).
        if (not policy.warm_standby or not self.ctx.launcher.capabilities.supports_standby
                or policy.restart_scope != "trial" or not trial_running
                or live.trial.intent is not None or live.trial.standby_waiting):
            return
        # Called once every rank checked in: the config requires `harness: true` with a
        # standby (one that never calls init() would not wait there, and its standby
        # would run the training twice).
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, live.trial.id)
            if (trial.state != TrialState.RUNNING or trial.intent is not None
                    or _standby_of(trial) is not None):
                return
            standby = self.launching.new_attempt(s, trial, standby=True)
            record_event(s, entity="attempt", entity_id=standby.id, reason=EventReason.STANDBY,
                         actor=ACTOR, message=f"starting attempt {standby.number} as a warm "
                                              "standby",
                         experiment_id=trial.experiment_id, trial_id=trial.id)
            assert standby.master_port is not None
            plan = self.launching.plan(s, trial, standby.number, standby.master_port,
                                       standby=True)
            standby_id, specs = standby.id, self.launching.specs(plan)
            hparams = dict(trial.hparams)
        self._started = True
        try:
            prepare_attempt_dir(AttemptDir(specs[0].attempt_dir), hparams, plan.account)
            for spec in specs:
                shim = self.ctx.launcher.submit(spec)
                self.launching.note_shims(standby_id, {spec.rank: shim})
        except LaunchError as exc:
            log.error("the warm standby of trial %s could not start: %s", live.trial.id, exc)
            self.drop(standby_id, f"the warm standby could not start: {exc}")

    def promote(self, trial_id: int) -> bool:
        """Make the trial's warm standby its next attempt; False when there is none alive
        (one that died is dropped, and the caller starts a fresh attempt)."""
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            standby = _standby_of(trial)
            if standby is None or trial.intent is not None:
                return False
            standby_id, attempt_dir = standby.id, AttemptDir(Path(standby.run_dir))
            ranks = sorted({replica.rank for replica in standby.replicas})
        statuses = [self.ctx.launcher.describe(attempt_dir.path, rank) for rank in ranks]
        if not all(st.phase in (ReplicaPhase.STARTING, ReplicaPhase.RUNNING) for st in statuses):
            self.drop(standby_id, "a replica of the warm standby ended while it waited; "
                                  "starting a fresh attempt")
            return False
        with self.ctx.store.session_scope() as s:
            standby = s.get_one(Attempt, standby_id)
            latest = latest_checkpoint(attempt_dir.run, self.ctx.home)
            go = {"env": {LATEST_CHECKPOINT: str(latest) if latest else None}}
            for rank in ranks:  # root's, readable by a job running as its own account
                atomic_write_json(attempt_dir.rank(rank).standby_go, go, mode=0o644,
                                  exact_mode=True)
            standby.standby = False
            standby.resumed_from = resumed_from(latest)
            note_outputs_before(standby)  # as it starts training, not as it began to wait
            standby.trial.queue_reason = None
            transition(s, standby.trial, TrialState.STARTING, reason=EventReason.LAUNCHING,
                       actor=ACTOR, message=f"starting attempt {standby.number} (the warm "
                                            "standby)")
        return True

    def drop_unneeded(self, live: list[LiveAttempt]) -> None:
        """Stop the standbys of trials at rest or being stopped (read again
        only when a standby waits: this pass may have brought its trial to rest)."""
        started, self._started = self._started, False
        if not started and not any(attempt.standby for attempt in live):
            return
        with self.ctx.store.session_scope() as s:
            unneeded = [a.id for a in s.scalars(select(Attempt).where(
                Attempt.standby.is_(True), Attempt.state == AttemptState.STARTING))
                if a.trial.intent is not None or a.trial.state.is_at_rest()]
        for standby_id in unneeded:
            self.drop(standby_id, "the warm standby was not needed")

    def drop(self, standby_id: int, message: str) -> None:
        with self.ctx.store.session_scope() as s:
            standby = s.get_one(Attempt, standby_id)
            attempt_dir = AttemptDir(Path(standby.run_dir))
            ranks = sorted({replica.rank for replica in standby.replicas})
            for replica in standby.replicas:
                replica.reason, replica.message = Reason.STOPPED, message
                replica.ended_at = now()
            transition(s, standby, AttemptState.CANCELED, reason=EventReason.STANDBY,
                       actor=ACTOR, message=message)
        for rank in ranks:
            self.ctx.launcher.cancel(attempt_dir.path, rank, grace=0.0)


def _standby_of(trial: Trial) -> Attempt | None:
    return next((a for a in trial.attempts if a.standby
                 and a.state == AttemptState.STARTING), None)
