"""The supervisor: starts queued trials, follows their attempts, applies the failure policy.

Each `tick()` is one pass over the store; the server's orchestrator calls it in a loop and
tests call it directly. Every state change goes through `muster.store.transition`; every
process action goes through the `Launcher`. The order of a pass is chosen for crash
safety: a decision is committed before the side effect it leads to, so a server killed
between the two finds the decision on restart and carries it out (see `reconcile`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.atomic import atomic_write_json, read_json
from muster.config import ExperimentConfig
from muster.errors import LaunchError, MusterError
from muster.home import Home
from muster.launch.base import Launcher, ReplicaPhase, ReplicaSpec, ReplicaStatus
from muster.launch.environment import ReplicaContext, build_env, free_port
from muster.launch.exits import Classification, ExitObservation, classify_exit
from muster.launch.logs import tail_text
from muster.states import AttemptState, ExperimentState, Reason, TrialState
from muster.store import Attempt, Experiment, Replica, Store, Trial, record_event, transition
from muster.store.models import now
from muster.supervise import verification
from muster.supervise.disk import disk_shortfall
from muster.supervise.heartbeats import stall_reason
from muster.supervise.ingest import ingest_trial
from muster.supervise.manifest import scan_manifest
from muster.supervise.policy import Action, Budgets, decide

log = logging.getLogger(__name__)

ACTOR = "supervisor"
HPARAMS_FILE = "hparams.json"
TAIL_LINES = 20

_ATTEMPT_END = {
    Reason.OK: AttemptState.SUCCEEDED,
    Reason.STOPPED: AttemptState.CANCELED,
}


@dataclass
class Supervisor:
    store: Store
    launcher: Launcher
    home: Home
    slots: int = os.cpu_count() or 1
    host: str = socket.gethostname()
    min_free_disk: int = 5 * 1024**3
    _disk_warning: str | None = field(default=None, init=False)

    def tick(self) -> None:
        """One pass: settle running attempts, start what may start, close finished experiments."""
        for attempt_id in self.active_attempt_ids():
            self.settle_attempt(attempt_id)
        if not self._disk_low():  # the disk guard: nothing new launches while it is low
            self._launch_restarting()
            self._admit_queued()
        self._close_experiments()

    # -- following attempts ------------------------------------------------------------

    def active_attempt_ids(self) -> list[int]:
        live = [AttemptState.STARTING.value, AttemptState.RUNNING.value]
        with self.store.session_scope() as s:
            return list(s.scalars(select(Attempt.id).where(Attempt.state.in_(live))))

    def settle_attempt(self, attempt_id: int) -> None:
        """Look at one live attempt's replica and record whatever has happened to it."""
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            replica, trial = attempt.replicas[0], attempt.trial
            run_dir, stop = Path(attempt.run_dir), trial.stop_requested
            timeout = _config(trial).failure_policy.heartbeat_timeout
        self._ingest(trial.id)
        status = self.launcher.describe(run_dir, replica.rank)
        if stop and not status.stop_requested and status.phase is not ReplicaPhase.EXITED:
            self.launcher.cancel(run_dir, replica.rank)
        if status.phase is ReplicaPhase.RUNNING and not stop:
            self._check_progress(attempt_id, run_dir, replica.rank, timeout)
        if status.phase is ReplicaPhase.RUNNING or (
            status.phase is ReplicaPhase.EXITED and status.exit and status.exit.pid is not None
        ):
            self._mark_running(attempt_id, status)
        if status.phase is ReplicaPhase.LOST:
            # A shim that never published its child in time may still be alive: make sure it
            # cannot start a second copy of the trial next to the retry.
            self.launcher.cancel(run_dir, replica.rank)
        if status.phase in (ReplicaPhase.EXITED, ReplicaPhase.LOST):
            self._finish_attempt(attempt_id, status)

    def _check_progress(self, attempt_id: int, run_dir: Path, rank: int, timeout: float) -> None:
        """Stop a replica that checked in through the harness but has made no progress for
        `heartbeat_timeout`; the marker makes its end STALLED, not STOPPED."""
        marker = _stall_marker(run_dir, rank)
        if marker.exists():
            return
        why = stall_reason(run_dir, rank, timeout, time.time())
        if why is None:
            return
        atomic_write_json(marker, {"reason": why, "time": time.time()})
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            record_event(s, entity="attempt", entity_id=attempt.id, reason=Reason.STALLED.value,
                         actor=ACTOR, message=f"stopping rank {rank}: {why}",
                         experiment_id=attempt.trial.experiment_id, trial_id=attempt.trial_id)
        self.launcher.cancel(run_dir, rank)

    def _ingest(self, trial_id: int) -> None:
        """Bring the trial's metrics and checkpoints into the store (cheap when unchanged)."""
        try:
            ingest_trial(self.store, trial_id)
        except OSError as exc:
            log.error("could not read the run directory of trial %s: %s", trial_id, exc)

    def _mark_running(self, attempt_id: int, status: ReplicaStatus) -> None:
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            if attempt.state != AttemptState.STARTING.value:
                return
            replica = attempt.replicas[0]
            child = status.child
            if child is None and status.exit is not None:
                replica.pid, replica.start_ticks = status.exit.pid, status.exit.start_ticks
            elif child is not None:
                replica.pid, replica.start_ticks = child.pid, child.start_ticks
            replica.started_at = status.exit.started_at if status.exit else None
            transition(s, attempt, AttemptState.RUNNING, reason="started", actor=ACTOR)
            if attempt.trial.state == TrialState.STARTING.value:
                transition(s, attempt.trial, TrialState.RUNNING, reason="started", actor=ACTOR)

    def _finish_attempt(
        self, attempt_id: int, status: ReplicaStatus, launch_error: str | None = None
    ) -> None:
        with self.store.session_scope() as s:
            trial_id = s.get_one(Attempt, attempt_id).trial_id
        self._ingest(trial_id)  # every metric line is in the store before the verdict
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            trial = attempt.trial
            policy = _config(trial).failure_policy
            replica = attempt.replicas[0]
            stalled = read_json(_stall_marker(Path(attempt.run_dir), replica.rank))
            verdict = classify_exit(
                ExitObservation(
                    rank=replica.rank,
                    exit=status.exit,
                    lost=status.phase is ReplicaPhase.LOST and launch_error is None,
                    launch_error=launch_error,
                    log_tail=tail_text(Path(replica.log_path), TAIL_LINES),
                    transient_exit_codes=frozenset(policy.transient_exit_codes),
                    stop_requested=trial.stop_requested or status.stop_requested,
                    stalled=stalled["reason"] if isinstance(stalled, dict) else None,
                )
            )
            _record_replica_end(replica, status, verdict)
            end = _ATTEMPT_END.get(verdict.reason, AttemptState.FAILED)
            transition(
                s, attempt, end, reason=verdict.reason.value, actor=ACTOR, message=verdict.message
            )
            self._apply_policy(s, trial, verdict)

    def _apply_policy(self, s: Session, trial: Trial, verdict: Classification) -> None:
        if TrialState(trial.state).is_terminal() or trial.state == TrialState.SUSPECT.value:
            # Settled already (e.g. reviewed while a process still ran): note it, move nothing.
            _record_decision(s, trial, verdict.reason.value,
                             f"an attempt ended after the trial was {trial.state}: "
                             f"{verdict.message}")
            return
        policy = _config(trial).failure_policy
        decision = decide(verdict.reason, _budgets(trial), policy)
        reason = verdict.reason.value
        if trial.stop_requested and decision.action is not Action.SUCCEED:
            transition(s, trial, TrialState.CANCELED, reason="killed", actor=ACTOR,
                       message=verdict.message)
        elif decision.action is Action.SUCCEED:
            _judge_success(s, trial, verdict)
        elif decision.action is Action.CANCEL:
            transition(s, trial, TrialState.CANCELED, reason=reason, actor=ACTOR,
                       message=verdict.message)
        elif decision.action is Action.FAIL:
            # The give-up is a decision too: it says which budget ran out, or why none applies.
            _record_decision(s, trial, reason, decision.message)
            message = _failure_message(verdict, decision.message)
            transition(s, trial, TrialState.FAILED, reason=reason, actor=ACTOR, message=message)
        elif decision.charge is not None:
            setattr(trial, decision.charge, getattr(trial, decision.charge) + 1)
            _record_decision(s, trial, reason, decision.message)
            # The decision event says what happens next; the move says what ended.
            transition(s, trial, TrialState.RESTARTING, reason=reason, actor=ACTOR,
                       message=verdict.message)
        else:
            raise RuntimeError(f"the failure policy chose {decision.action.value} for trial "
                              f"{trial.id} without naming a budget; this is a bug in muster")

    # -- starting attempts -------------------------------------------------------------

    def _launch_restarting(self) -> None:
        """Start the next attempt of every RESTARTING trial (it keeps the slot it held)."""
        with self.store.session_scope() as s:
            ids = list(s.scalars(
                select(Trial.id).where(Trial.state == TrialState.RESTARTING.value)
            ))
        for trial_id in ids:
            self.start_attempt(trial_id)

    def _admit_queued(self) -> None:
        with self.store.session_scope() as s:
            busy = len(list(s.scalars(select(Trial.id).where(Trial.state.in_(_HOLDING_SLOT)))))
            queued = list(s.scalars(
                select(Trial.id).where(Trial.state == TrialState.QUEUED.value).order_by(Trial.id)
            ))
        for trial_id in queued[: max(0, self.slots - busy)]:
            self.start_attempt(trial_id)

    def _disk_low(self) -> bool:
        """The disk guard: below `min_free_disk` nothing new launches. Queued trials show the
        reason; running ones get one warning event each time the guard trips."""
        shortfall = disk_shortfall(self.home.runs_dir, self.min_free_disk)
        # While low, every pass: a trial queued since the guard tripped shows why it waits,
        # and the free space in the reason changes. The warning is for the trip alone.
        if shortfall is not None or self._disk_warning is not None:
            self._note_disk(shortfall, tripped=self._disk_warning is None)
        self._disk_warning = shortfall
        return shortfall is not None

    def _note_disk(self, shortfall: str | None, tripped: bool) -> None:
        with self.store.session_scope() as s:
            for trial in s.scalars(select(Trial).where(Trial.state.in_(_NOT_ENDED))):
                if trial.state == TrialState.QUEUED.value:
                    trial.queue_reason = shortfall
                elif shortfall is not None and tripped and trial.state in _HOLDING_SLOT:
                    record_event(s, entity="trial", entity_id=trial.id, reason="disk low",
                                 actor=ACTOR, message=shortfall,
                                 experiment_id=trial.experiment_id, trial_id=trial.id)

    def start_attempt(self, trial_id: int) -> None:
        """Record a new attempt (committed first), then prepare its directory and launch it."""
        if not self._scan_data(trial_id):
            return
        planned = self._plan_attempt(trial_id)
        if planned is None:
            return
        spec, attempt_id, hparams = planned
        try:
            _prepare_attempt_dir(spec, hparams)
            shim = self.launcher.submit(spec)
        except LaunchError as exc:
            log.error("launch of trial %s attempt %s failed: %s", trial_id, spec.attempt, exc)
            status = ReplicaStatus(rank=spec.rank, phase=ReplicaPhase.LOST)
            self._finish_attempt(attempt_id, status, launch_error=str(exc))
            return
        with self.store.session_scope() as s:
            replica = s.get_one(Attempt, attempt_id).replicas[0]
            replica.shim_pid, replica.shim_start_ticks = shim.pid, shim.start_ticks

    def _scan_data(self, trial_id: int) -> bool:
        """Scan the trial's data directory once, before its first launch; False if it failed
        (the trial then ends FAILED with the reason)."""
        with self.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            data = _config(trial).data
            if data is None or trial.manifest is not None or trial.stop_requested:
                return True
            path = Path(trial.experiment.context_dir) / Path(data.path).expanduser()
        try:
            manifest = scan_manifest(path, data.manifest.extensions, data.manifest.labels)
        except MusterError as exc:
            self._fail_before_launch(trial_id, f"the data manifest scan failed: {exc}")
            return False
        with self.store.session_scope() as s:
            s.get_one(Trial, trial_id).manifest = manifest.to_json()
        return True

    def _fail_before_launch(self, trial_id: int, message: str) -> None:
        with self.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if trial.state == TrialState.QUEUED.value:
                transition(s, trial, TrialState.STARTING, reason="launching", actor=ACTOR)
            transition(s, trial, TrialState.FAILED, reason=Reason.PERMANENT_ERROR.value,
                       actor=ACTOR, message=message)

    def _plan_attempt(self, trial_id: int) -> tuple[ReplicaSpec, int, dict[str, Any]] | None:
        """Record the attempt; returns its launch plan, its id and the trial's hparams."""
        with self.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if trial.state not in (TrialState.QUEUED.value, TrialState.RESTARTING.value):
                return None
            if trial.stop_requested:
                transition(s, trial, TrialState.CANCELED, reason="killed", actor=ACTOR)
                return None
            trial.queue_reason = None  # it waits no more
            number = len(trial.attempts) + 1
            attempt_dir = self.home.attempt_dir(trial.uuid, number)
            attempt = Attempt(trial=trial, number=number, state=AttemptState.STARTING.value,
                              run_dir=str(attempt_dir))
            replica = Replica(attempt=attempt, rank=0, host=self.host,
                              log_path=str(attempt_dir / "rank-0.log"))
            s.add_all([attempt, replica])
            transition(s, trial, TrialState.STARTING, reason="launching", actor=ACTOR,
                       message=f"starting attempt {number}")
            s.flush()
            spec = self._replica_spec(trial, number, attempt_dir)
            return spec, attempt.id, dict(trial.hparams)

    def _replica_spec(self, trial: Trial, number: int, attempt_dir: Path) -> ReplicaSpec:
        config = _config(trial)
        ctx = ReplicaContext(
            run_dir=attempt_dir.parent, trial_id=trial.id, attempt=number, rank=0,
            world_size=1, master_addr="127.0.0.1", master_port=free_port(),
            hparams_path=attempt_dir / HPARAMS_FILE,
            latest_checkpoint=verification.latest_intact_checkpoint(attempt_dir.parent),
            heartbeat_timeout=config.failure_policy.heartbeat_timeout,
        )
        return ReplicaSpec(
            trial_uuid=trial.uuid, attempt=number, rank=0, argv=list(config.entrypoint),
            env=build_env(os.environ, config.environment.variables, ctx),
            cwd=Path(trial.experiment.context_dir), attempt_dir=attempt_dir,
            stop_grace=config.failure_policy.stop_grace,
        )

    # -- experiments -------------------------------------------------------------------

    def _close_experiments(self) -> None:
        with self.store.session_scope() as s:
            active = s.scalars(
                select(Experiment).where(Experiment.state == ExperimentState.ACTIVE.value)
            )
            for experiment in active:
                states = [TrialState(t.state) for t in experiment.trials]
                if states and all(st.is_terminal() for st in states):
                    end, why = _experiment_end(experiment, states)
                    transition(s, experiment, end, reason=why, actor=ACTOR)


_HOLDING_SLOT = [TrialState.STARTING.value, TrialState.RUNNING.value,
                 TrialState.RESTARTING.value]
_NOT_ENDED = [TrialState.QUEUED.value, *_HOLDING_SLOT]


def _config(trial: Trial) -> ExperimentConfig:
    return ExperimentConfig.model_validate(trial.experiment.config)


def _stall_marker(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.stalled.json"


def _judge_success(s: Session, trial: Trial, verdict: Classification) -> None:
    """Exit 0 is not success until every configured check passed (invariant 1)."""
    config = _config(trial)
    attempts = [a.number for a in trial.attempts]
    run_dir = Path(trial.attempts[-1].run_dir).parent
    manifest_count = (trial.manifest or {}).get("file_count")
    result = verification.verify(
        verification.gather_evidence(run_dir, attempts),
        config.verify,
        manifest_count,
    )
    trial.verification = result.to_json()
    if result.passed:
        transition(s, trial, TrialState.SUCCEEDED, reason=verdict.reason.value, actor=ACTOR,
                   message=verdict.message)
        return
    failed = "; ".join(f"{c.name}: {c.detail}" for c in result.checks if not c.passed)
    transition(s, trial, TrialState.SUSPECT, reason="verification failed", actor=ACTOR,
               message=f"{verdict.message}, but verification failed: {failed}")


def _experiment_end(
    experiment: Experiment, states: list[TrialState]
) -> tuple[ExperimentState, str]:
    if experiment.stop_requested:
        return ExperimentState.CANCELED, "killed"
    if any(st is TrialState.SUCCEEDED for st in states):
        return ExperimentState.COMPLETED, "trials finished"
    return ExperimentState.ERROR, "no trial succeeded"


def _budgets(trial: Trial) -> Budgets:
    return Budgets(
        replica_restarts=trial.replica_restarts,
        trial_retries=trial.trial_retries,
        internal_retries=trial.internal_retries,
        user_error_retries=trial.user_error_retries,
    )


def _prepare_attempt_dir(spec: ReplicaSpec, hparams: dict[str, Any]) -> None:
    """Create the attempt directory and its hparams file, after the attempt is recorded.

    A failure here (a full disk, a home that is not writable) is a failure to launch: the
    attempt ends INTERNAL and the policy retries it, rather than every pass failing anew.
    """
    try:
        spec.attempt_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(spec.attempt_dir / HPARAMS_FILE, hparams)
    except OSError as exc:
        raise LaunchError(
            f"Could not prepare the attempt directory {spec.attempt_dir}: {exc}"
        ) from exc


def _record_decision(s: Session, trial: Trial, reason: str, message: str) -> None:
    record_event(s, entity="trial", entity_id=trial.id, reason=reason, actor=ACTOR,
                 message=message, experiment_id=trial.experiment_id, trial_id=trial.id)


def _failure_message(verdict: Classification, decision_message: str) -> str:
    if verdict.reason is Reason.INTERNAL:
        return f"{decision_message}: {verdict.message}"
    return verdict.message


def _record_replica_end(replica: Replica, status: ReplicaStatus, verdict: Classification) -> None:
    """Every ended replica explains itself (invariant 7)."""
    replica.exit_code = verdict.exit_code
    replica.signal = verdict.signal
    replica.reason = verdict.reason.value
    replica.message = verdict.message
    replica.log_tail = tail_text(Path(replica.log_path), TAIL_LINES)
    if status.exit is not None:
        replica.max_rss_bytes = status.exit.max_rss_bytes
        replica.started_at = status.exit.started_at
        replica.ended_at = status.exit.ended_at
    else:
        replica.ended_at = now()
