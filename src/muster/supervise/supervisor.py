"""The supervisor: starts queued trials, follows their attempts, applies the failure policy.

Each `tick()` is one pass over the store; the server's orchestrator calls it in a loop and
tests call it directly. Every state change goes through `muster.store.transition`; every
process action goes through the `Launcher`. The order of a pass is chosen for crash
safety: a decision is committed before the side effect it leads to, so a server killed
between the two finds the decision on restart and carries it out (see `reconcile`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.orm import Session, object_session, selectinload

from muster.atomic import atomic_write_json, read_json
from muster.config import ExperimentConfig, FailurePolicy, GpuReleaseConfig
from muster.errors import GpuError, LaunchError, MusterError
from muster.gpus import GpuInventory, NoGpus
from muster.harness.standby import GO_VARIABLE
from muster.home import Home
from muster.launch.base import (
    ExitRecord,
    Launcher,
    ProcessIdentity,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from muster.launch.environment import ReplicaContext, build_env, free_port
from muster.launch.exits import Classification, ExitObservation, classify_exit, replica_name
from muster.launch.logs import tail_text
from muster.states import AttemptState, ExperimentState, Reason, TrialState
from muster.store import Attempt, Experiment, Replica, Store, Trial, record_event, transition
from muster.store.models import now
from muster.supervise import verification
from muster.supervise.configs import experiment_config
from muster.supervise.disk import disk_shortfall
from muster.supervise.gpu_pool import GpuPool
from muster.supervise.heartbeats import (
    check_in_overdue,
    checked_in,
    heartbeat_path,
    stall_reason,
)
from muster.supervise.ingest import ingest_trial
from muster.supervise.manifest import scan_manifest
from muster.supervise.policy import Action, Budgets, decide
from muster.supervise.scheduler import Capacity, Demand, Holding, plan
from muster.supervise.searching import EARLY_STOP, Searching, early_stop_note, trial_seed
from muster.words import count, rank_list

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
    gpus: GpuInventory = field(default_factory=lambda: NoGpus("no GPUs: none configured"))
    gpu_release: GpuReleaseConfig = field(default_factory=GpuReleaseConfig)
    preemption: bool = False
    _disk_warning: str | None = field(default=None, init=False)
    _pool: GpuPool = field(init=False)
    _search: Searching = field(init=False)

    def __post_init__(self) -> None:
        self._pool = GpuPool(self.store, self.gpus, self.gpu_release)
        self._search = Searching(self.store)

    def tick(self) -> None:
        """One pass: settle running attempts, start what may start, close finished experiments."""
        for attempt_id in self.active_attempt_ids():
            self.settle_attempt(attempt_id)
        self._drop_unneeded_standbys()
        self._pool.settle()  # GPUs of trials that ended go back once their memory is free
        self._search.top_up()  # each search's next trials, drawn before admission
        if not self._disk_low():  # the disk guard: nothing new launches while it is low
            self._launch_restarting()
            self._admit_queued()
        self._close_experiments()

    # -- following attempts ------------------------------------------------------------

    def active_attempt_ids(self) -> list[int]:
        live = [AttemptState.STARTING.value, AttemptState.RUNNING.value]
        with self.store.session_scope() as s:
            return list(s.scalars(select(Attempt.id).where(
                Attempt.state.in_(live), Attempt.standby.is_(False))))

    def settle_attempt(self, attempt_id: int) -> None:
        """Look at one live attempt's replicas and record whatever has happened to them.

        The replicas of an attempt start and end together: once one end decides the attempt
        (the primary, rank 0, exited; or any replica failed), muster stops the others, and
        the attempt ends when every replica has ended (`_decided_by`, `_cause`).
        """
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            ranks = sorted(_current(attempt))
            trial = attempt.trial
            # A kill, a pause or a preemption: the replicas get SIGTERM and stop_grace.
            run_dir, stop = Path(attempt.run_dir), _stopping(trial)
            config = _config(trial)
            policy = config.failure_policy
        self._ingest(trial.id)
        if not stop:
            # The pruner may stop it early: the stop goes out in this very pass.
            stop = self._search.judge(trial.id)
        statuses = [self.launcher.describe(run_dir, rank) for rank in ranks]
        if policy.restart_scope == "replica" and not stop:
            statuses = [self._restart_in_place(attempt_id, status) or status
                        for status in statuses]
        decided_by = _decided_by(statuses)
        winding_down = stop or decided_by is not None
        # After a failure the survivors' collectives are broken: a short grace, not the
        # graceful one a requested stop or a finished primary gets.
        grace = (policy.failure_grace if not stop and decided_by is not None
                 and not _exited_cleanly(decided_by) else None)
        for status in statuses:
            if status.phase is ReplicaPhase.LOST:
                # A shim that never published its child in time may still be alive: make sure
                # it cannot start a second copy of the trial next to the retry.
                self.launcher.cancel(run_dir, status.rank)
            elif status.phase is ReplicaPhase.EXITED:
                continue
            elif winding_down and not status.stop_requested:
                self.launcher.cancel(run_dir, status.rank, grace)
            elif status.phase is ReplicaPhase.RUNNING and not winding_down:
                self._check_progress(attempt_id, run_dir, status, policy.heartbeat_timeout,
                                     config.harness)
        # With `harness: true`, RUNNING waits for every rank's check-in as well.
        waiting = _not_checked_in(run_dir, statuses) if config.harness else []
        if all(_started(status) for status in statuses) and not waiting:
            self._mark_running(attempt_id, statuses, config.harness)
            if policy.warm_standby:
                self._ensure_standby(attempt_id)
        elif waiting:
            self._note_check_ins(attempt_id, statuses, waiting)
        if all(st.phase in (ReplicaPhase.EXITED, ReplicaPhase.LOST) for st in statuses):
            self._finish_attempt(attempt_id, statuses)

    def _restart_in_place(self, attempt_id: int, status: ReplicaStatus) -> ReplicaStatus | None:
        """With `restart_scope: replica`: relaunch a replica that ended for an
        infrastructure reason (INFRA, LOST, STALLED) on its own, in the same attempt, while
        the others run on; at most `replica_restarts` times per rank and attempt. Returns
        the new incarnation's status, or None when the replica was left as it is (it then
        decides the attempt as usual, and the policy retries the trial)."""
        if status.phase not in (ReplicaPhase.EXITED, ReplicaPhase.LOST) or _exited_cleanly(status):
            return None
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            trial, replica = attempt.trial, _current(attempt)[status.rank]
            policy = _config(trial).failure_policy
            run_dir = Path(attempt.run_dir)
            verdict = _classify(replica, status, run_dir, trial, policy, None)
            if verdict.reason not in _IN_PLACE or replica.incarnation >= policy.replica_restarts:
                return None
            _record_replica_end(replica, status, verdict)
            number = replica.incarnation + 1
            trial.replica_restarts += 1
            _record_decision(s, trial, verdict.reason.value,
                             f"{verdict.reason.value} failure of the replica "
                             f"{replica_name(status.rank)}; restarting it in place (restart "
                             f"{number} of {policy.replica_restarts} in attempt "
                             f"{attempt.number})")
            s.add(Replica(attempt=attempt, rank=status.rank, incarnation=number,
                          host=self.host, log_path=replica.log_path))
            spec = self._replica_specs(trial, attempt.number, run_dir, _replicas(trial),
                                       attempt.master_port, number)[status.rank]
        self.launcher.archive(run_dir, status.rank, number - 1)
        for path in (_stall_marker(run_dir, status.rank), heartbeat_path(run_dir, status.rank)):
            _move_aside(path, number - 1)
        try:
            shim = self.launcher.submit(spec)
        except LaunchError as exc:
            log.error("restart in place of trial %s rank %s failed: %s", trial.id,
                      status.rank, exc)
            return ReplicaStatus(rank=status.rank, phase=ReplicaPhase.LOST)
        with self.store.session_scope() as s:
            restarted = _current(s.get_one(Attempt, attempt_id))[status.rank]
            restarted.shim_pid, restarted.shim_start_ticks = shim.pid, shim.start_ticks
        return self.launcher.describe(run_dir, status.rank)

    def _check_progress(self, attempt_id: int, run_dir: Path, status: ReplicaStatus,
                        timeout: float, harness: bool) -> None:
        """Stop a replica that checked in through the harness but has made no progress for
        `heartbeat_timeout`, or that should have checked in (`harness: true`) and has not
        within `heartbeat_timeout` of starting; the marker makes its end STALLED, not
        STOPPED."""
        rank = status.rank
        marker = _stall_marker(run_dir, rank)
        if marker.exists():
            return
        now = time.time()
        if checked_in(run_dir, rank):
            why = stall_reason(run_dir, rank, timeout, now)
        elif harness and (since := _waiting_since(run_dir, status)) is not None:
            why = check_in_overdue(since, timeout, now)
        else:
            why = None
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

    def _mark_running(self, attempt_id: int, statuses: list[ReplicaStatus],
                      harness: bool) -> None:
        """RUNNING once every replica's training process has started (and, with
        `harness: true`, checked in)."""
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            by_rank = {status.rank: status for status in statuses}
            for rank, replica in _current(attempt).items():
                if replica.pid is None:  # (a replica restarted in place starts later)
                    _note_process(replica, by_rank[rank])
            if attempt.state != AttemptState.STARTING.value:
                return
            attempt.trial.queue_reason = None  # it waits no more
            self._mark_started(s, attempt, _started_message(len(statuses), harness))

    def _note_check_ins(self, attempt_id: int, statuses: list[ReplicaStatus],
                      waiting: list[int]) -> None:
        """Say on a STARTING trial which ranks it waits for (written when that changes)."""
        started = sum(map(_started, statuses))
        ended = [st.rank for st in statuses if st.rank in waiting
                 and st.phase is not ReplicaPhase.RUNNING]
        running = [rank for rank in waiting if rank not in ended]
        parts = [f"waiting for {rank_list(running)} to check in through muster.harness.init()"
                 ] if running else []
        parts += [f"{rank_list(ended)} ended without checking in"] if ended else []
        reason = (f"{'; '.join(parts)} ({started} of {count(len(statuses), 'replica')} "
                  "started)")
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            trial = attempt.trial
            if (attempt.state == AttemptState.STARTING.value and not attempt.standby
                    and trial.queue_reason != reason):
                trial.queue_reason = reason

    def _mark_started(self, s: Session, attempt: Attempt, message: str) -> None:
        transition(s, attempt, AttemptState.RUNNING, reason="started", actor=ACTOR,
                   message=message)
        if attempt.trial.state == TrialState.STARTING.value:
            transition(s, attempt.trial, TrialState.RUNNING, reason="started", actor=ACTOR)

    def _finish_attempt(
        self, attempt_id: int, statuses: list[ReplicaStatus],
        launch_error: tuple[int, str] | None = None,
    ) -> None:
        """Classify every replica's end, end the attempt with the one that decided it, and
        let the failure policy decide what the trial does next."""
        with self.store.session_scope() as s:
            trial_id = s.get_one(Attempt, attempt_id).trial_id
        self._ingest(trial_id)  # every metric line is in the store before the verdict
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            trial = attempt.trial
            policy = _config(trial).failure_policy
            by_rank = {status.rank: status for status in statuses}
            verdicts: dict[int, Classification] = {}
            for _, replica in sorted(_current(attempt).items()):
                status = by_rank[replica.rank]
                verdict = _classify(replica, status, Path(attempt.run_dir), trial, policy,
                                    launch_error)
                _record_replica_end(replica, status, verdict)
                verdicts[replica.rank] = verdict
            cause = _cause(verdicts, by_rank)
            end = _ATTEMPT_END.get(cause.reason, AttemptState.FAILED)
            if attempt.state == AttemptState.STARTING.value and any(map(_started, statuses)):
                # It ran, but ended before every replica had started (the primary finished
                # while a peer was still starting, and muster stopped the peer), or, with
                # `harness: true`, before every one had checked in.
                self._mark_started(s, attempt, "ended before every replica had "
                                   + ("checked in" if _config(trial).harness else "started"))
            transition(
                s, attempt, end, reason=cause.reason.value, actor=ACTOR, message=cause.message
            )
            self._apply_policy(s, trial, cause)

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
        early_stop = trial.pause_requested == EARLY_STOP and not trial.stop_requested
        if trial.stop_requested and decision.action is not Action.SUCCEED:
            transition(s, trial, TrialState.CANCELED, reason="killed", actor=ACTOR,
                       message=verdict.message)
        elif early_stop and verdict.reason is Reason.STOPPED:
            # The searcher's stop: its results up to there count; not a failure.
            trial.pause_requested, trial.early_stopped = None, True
            _judge_success(s, trial, verdict, early_stopped=True)
        elif early_stop and verdict.reason is Reason.OK:
            # It finished its whole run before the stop reached it: an ordinary success.
            trial.pause_requested = None
            _judge_success(s, trial, verdict)
        elif early_stop and decision.charge is not None:
            # It failed before the searcher's stop reached it: a failure, but not restarted.
            _record_decision(s, trial, reason, "not restarted: the searcher had stopped it "
                                               "early")
            transition(s, trial, TrialState.FAILED, reason=reason, actor=ACTOR,
                       message=verdict.message)
        elif trial.pause_requested is not None and verdict.reason is Reason.STOPPED:
            _pause(s, trial, verdict.message)  # a stop it asked for: no failure, no budget
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
            with self.store.session_scope() as s:
                trial = s.get_one(Trial, trial_id)
                if trial.pause_requested is not None and not trial.stop_requested:
                    _pause(s, trial, "paused between two attempts")
                    continue
                if not trial.stop_requested and not self._pool.released_for_restart(s, trial):
                    continue  # its GPUs still hold the last attempt's memory
            self.start_attempt(trial_id)

    def _admit_queued(self) -> None:
        """Start the queued trials the scheduler admits (`supervise/scheduler.py`: priority,
        then first come, first served; whole replica sets; slots and GPUs), note why the
        others wait, and preempt where it says so."""
        with self.store.session_scope() as s:
            queued = list(s.scalars(select(Trial).options(selectinload(Trial.experiment))
                                    .where(Trial.state == TrialState.QUEUED.value)
                                    .order_by(Trial.priority, Trial.id)))
            if not queued:
                return
            shown = {trial.id: trial.queue_reason for trial in queued}
            demands = [_demand(trial) for trial in queued]
            held = self._pool.held(s)
            holdings = [_holding(trial, held.get(trial.id, ())) for trial in s.scalars(
                select(Trial).options(selectinload(Trial.experiment))
                .where(Trial.state.in_(_HOLDING_SLOT)))]
            capacity = Capacity(self.slots, self._pool.slots(s))
        decided = plan(demands, holdings, capacity, self.preemption)
        for admit in decided.admit:
            self.start_attempt(admit.trial_id, admit.gpus)
        # One statement for every reason that changed (positions shift whenever the head
        # starts), and only for trials still QUEUED.
        changed = [{"waiting_id": trial_id, "waiting_reason": reason}
                   for trial_id, reason in decided.waiting.items() if shown[trial_id] != reason]
        if changed:
            with self.store.session_scope() as s:
                trials = cast(Table, Trial.__table__)
                s.connection().execute(
                    update(trials).where(trials.c.id == bindparam("waiting_id"),
                                         trials.c.state == TrialState.QUEUED.value)
                    .values(queue_reason=bindparam("waiting_reason")), changed)
        for victim, beneficiary in decided.preempt.items():
            self._preempt(victim, beneficiary)

    def _preempt(self, trial_id: int, for_trial_id: int) -> None:
        """Stop a trial to make room for a waiting one of better priority. It goes back to
        the queue and resumes from its latest checkpoint; not a failure, no restart counted.
        The next pass stops its replicas (SIGTERM, `stop_grace`, so it can checkpoint)."""
        with self.store.session_scope() as s:
            trial, waiting = s.get_one(Trial, trial_id), s.get_one(Trial, for_trial_id)
            if trial.state not in _HOLDING_SLOT or _stopping(trial):
                return
            trial.pause_requested = PREEMPTED
            _record_decision(s, trial, PREEMPTED,
                             f"preempted by trial {waiting.id} (priority {waiting.priority}, "
                             f"better than this trial's {trial.priority}); it goes back to the "
                             "queue and resumes from its latest checkpoint")

    def slots_in_use(self) -> int:
        """One slot per replica without GPUs of every trial that holds its resources
        (started, or between attempts); replicas with GPUs take GPUs instead."""
        with self.store.session_scope() as s:
            return sum(_replicas(t) for t in s.scalars(
                select(Trial).where(Trial.state.in_(_HOLDING_SLOT)))
                if not _config(t).resources.gpus_per_replica)

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

    def start_attempt(self, trial_id: int, gpus: tuple[tuple[int, ...], ...] = ()) -> None:
        """Record a new attempt (committed first, with the GPUs a queued trial is given),
        then prepare its directory and launch its replicas; if one cannot be launched, the
        ones already launched are stopped."""
        if not self._scan_data(trial_id):
            return
        if self._promote_standby(trial_id):
            return
        planned = self._plan_attempt(trial_id, gpus)
        if planned is None:
            return
        specs, attempt_id, hparams = planned
        launched: list[tuple[int, ProcessIdentity]] = []
        try:
            _prepare_attempt_dir(specs[0], hparams)
            for spec in specs:
                launched.append((spec.rank, self.launcher.submit(spec)))
        except LaunchError as exc:
            rank = specs[len(launched)].rank
            log.error("launch of trial %s attempt %s rank %s failed: %s", trial_id,
                      specs[0].attempt, rank, exc)
            # The failed rank too: a shim may have started without its launch being
            # recorded (a fork server that died before it answered); the stop marker
            # stops it as soon as it looks.
            for stopped_rank in [r for r, _ in launched] + [rank]:
                self.launcher.cancel(specs[0].attempt_dir, stopped_rank)
            statuses = [ReplicaStatus(rank=spec.rank, phase=ReplicaPhase.LOST) for spec in specs]
            self._finish_attempt(attempt_id, statuses, launch_error=(rank, str(exc)))
            return
        with self.store.session_scope() as s:
            shims = dict(launched)
            for replica in s.get_one(Attempt, attempt_id).replicas:
                shim = shims[replica.rank]
                replica.shim_pid, replica.shim_start_ticks = shim.pid, shim.start_ticks

    # -- warm standby ------------------------------------------------------------------

    def _ensure_standby(self, attempt_id: int) -> None:
        """With `warm_standby`, start the next attempt's replicas while this one runs; they
        wait in `muster.harness.init()` until a retry promotes them (`_promote_standby`)."""
        with self.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            trial = attempt.trial
            policy = _config(trial).failure_policy
            if (policy.restart_scope != "trial" or _stopping(trial)
                    or trial.state != TrialState.RUNNING.value
                    or _standby_of(trial) is not None):
                return
            # Called once every rank checked in: the config requires `harness: true` with a
            # standby (one that never calls init() would not wait there, and its standby
            # would run the training twice).
            number = len(trial.attempts) + 1
            world_size = _replicas(trial)
            attempt_dir = self.home.attempt_dir(trial.uuid, number)
            standby = Attempt(trial=trial, number=number, state=AttemptState.STARTING.value,
                              run_dir=str(attempt_dir), standby=True, master_port=free_port())
            s.add_all([standby, *(Replica(attempt=standby, rank=rank, host=self.host,
                                          log_path=str(attempt_dir / f"rank-{rank}.log"))
                                  for rank in range(world_size))])
            s.flush()
            record_event(s, entity="attempt", entity_id=standby.id, reason="standby",
                         actor=ACTOR, message=f"starting attempt {number} as a warm standby",
                         experiment_id=trial.experiment_id, trial_id=trial.id)
            specs = [_as_standby(spec) for spec in self._replica_specs(
                trial, number, attempt_dir, world_size, standby.master_port)]
            standby_id, hparams = standby.id, dict(trial.hparams)
        try:
            _prepare_attempt_dir(specs[0], hparams)
            for spec in specs:
                shim = self.launcher.submit(spec)
                with self.store.session_scope() as s:
                    replica = _current(s.get_one(Attempt, standby_id))[spec.rank]
                    replica.shim_pid, replica.shim_start_ticks = shim.pid, shim.start_ticks
        except LaunchError as exc:
            log.error("the warm standby of trial %s could not start: %s", trial.id, exc)
            self._drop_standby(standby_id, f"the warm standby could not start: {exc}")

    def _promote_standby(self, trial_id: int) -> bool:
        """Make the trial's warm standby its next attempt; False when there is none alive
        (one that died is dropped, and the caller starts a fresh attempt)."""
        with self.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            standby = _standby_of(trial)
            if standby is None or _stopping(trial):
                return False
            standby_id, run_dir = standby.id, Path(standby.run_dir)
            ranks = sorted(_current(standby))
        statuses = [self.launcher.describe(run_dir, rank) for rank in ranks]
        if not all(st.phase in (ReplicaPhase.STARTING, ReplicaPhase.RUNNING) for st in statuses):
            self._drop_standby(standby_id, "a replica of the warm standby ended while it "
                               "waited; starting a fresh attempt")
            return False
        with self.store.session_scope() as s:
            standby = s.get_one(Attempt, standby_id)
            trial = standby.trial
            latest = verification.latest_intact_checkpoint(run_dir.parent)
            go = {"env": {"MUSTER_LATEST_CHECKPOINT": str(latest) if latest else None}}
            for rank in ranks:
                atomic_write_json(run_dir / f"rank-{rank}.{STANDBY_GO}", go)
            standby.standby = False
            trial.queue_reason = None
            transition(s, trial, TrialState.STARTING, reason="launching", actor=ACTOR,
                       message=f"starting attempt {standby.number} (the warm standby)")
        return True

    def _drop_unneeded_standbys(self) -> None:
        """Stop the standbys of trials that have settled or are being stopped."""
        with self.store.session_scope() as s:
            unneeded = [a.id for a in s.scalars(select(Attempt).where(
                Attempt.standby.is_(True), Attempt.state == AttemptState.STARTING.value))
                if _stopping(a.trial) or TrialState(a.trial.state).is_settled()]
        for standby_id in unneeded:
            self._drop_standby(standby_id, "the warm standby was not needed")

    def _drop_standby(self, standby_id: int, message: str) -> None:
        with self.store.session_scope() as s:
            standby = s.get_one(Attempt, standby_id)
            run_dir, ranks = Path(standby.run_dir), sorted(_current(standby))
            for replica in standby.replicas:
                replica.reason, replica.message = Reason.STOPPED.value, message
                replica.ended_at = now()
            transition(s, standby, AttemptState.CANCELED, reason="standby", actor=ACTOR,
                       message=message)
        for rank in ranks:
            self.launcher.cancel(run_dir, rank, grace=0.0)

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

    def _plan_attempt(
        self, trial_id: int, gpus: tuple[tuple[int, ...], ...] = ()
    ) -> tuple[list[ReplicaSpec], int, dict[str, Any]] | None:
        """Record the attempt and its replicas (and a queued trial's GPUs); returns their
        launch plans (by rank), the attempt's id and the trial's hparams."""
        with self.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if trial.state not in (TrialState.QUEUED.value, TrialState.RESTARTING.value):
                return None
            if trial.stop_requested:
                transition(s, trial, TrialState.CANCELED, reason="killed", actor=ACTOR)
                return None
            if gpus and trial.state == TrialState.QUEUED.value:
                try:
                    self._pool.allocate(s, trial.id, gpus)
                except GpuError as exc:  # a stale plan: it waits for the next pass
                    log.warning("%s", exc)
                    return None
            trial.queue_reason = None  # it waits no more
            number = len(trial.attempts) + 1
            world_size = _replicas(trial)
            attempt_dir = self.home.attempt_dir(trial.uuid, number)
            attempt = Attempt(trial=trial, number=number, state=AttemptState.STARTING.value,
                              run_dir=str(attempt_dir))
            replicas = [Replica(attempt=attempt, rank=rank, host=self.host,
                                log_path=str(attempt_dir / f"rank-{rank}.log"))
                        for rank in range(world_size)]
            s.add_all([attempt, *replicas])
            transition(s, trial, TrialState.STARTING, reason="launching", actor=ACTOR,
                       message=f"starting attempt {number}"
                       + (f" ({world_size} replicas)" if world_size > 1 else ""))
            attempt.master_port = free_port()
            s.flush()
            specs = self._replica_specs(trial, number, attempt_dir, world_size,
                                        attempt.master_port)
            return specs, attempt.id, dict(trial.hparams)

    def _replica_specs(
        self, trial: Trial, number: int, attempt_dir: Path, world_size: int,
        port: int | None, incarnation: int = 0,
    ) -> list[ReplicaSpec]:
        """One launch plan per rank, with the torchrun environment: one MASTER_PORT per
        attempt (a restarted rendezvous never meets the last attempt's stragglers)."""
        config = _config(trial)
        port = port if port is not None else free_port()
        latest = verification.latest_intact_checkpoint(attempt_dir.parent)
        session = object_session(trial)
        assert session is not None, "the trial must belong to a session"
        gpus = self._pool.of_trial(session, trial.id)
        # With GPUs to schedule, a replica sees exactly its own (none, without any).
        scheduled = bool(gpus) or bool(self.gpus.gpus())
        specs = []
        for rank in range(world_size):
            ctx = ReplicaContext(
                run_dir=attempt_dir.parent, trial_id=trial.id, attempt=number, rank=rank,
                world_size=world_size, master_addr="127.0.0.1", master_port=port,
                hparams_path=attempt_dir / HPARAMS_FILE, latest_checkpoint=latest,
                heartbeat_timeout=config.failure_policy.heartbeat_timeout,
                incarnation=incarnation, gpus=gpus.get(rank, ()) if scheduled else None,
                max_length=config.searcher.max_length,
                seed=trial_seed(trial.experiment, config, trial.number),
            )
            specs.append(ReplicaSpec(
                trial_uuid=trial.uuid, attempt=number, rank=rank, argv=list(config.entrypoint),
                env=build_env(os.environ, config.environment.variables, ctx),
                cwd=Path(trial.experiment.context_dir), attempt_dir=attempt_dir,
                stop_grace=config.failure_policy.stop_grace,
                memory_limit=config.resources.memory_limit,
            ))
        return specs

    # -- experiments -------------------------------------------------------------------

    def _close_experiments(self) -> None:
        """End the experiments whose trials have all ended (selected in SQL: a pass must not
        load every running experiment's trials)."""
        terminal = [state.value for state in TrialState if state.is_terminal()]
        # Every trial it runs exists (a search draws them as it goes), or it was killed.
        created = (select(func.count(Trial.id)).where(Trial.experiment_id == Experiment.id)
                   .scalar_subquery())
        # (A search killed before its first draw has no trial at all.)
        has_trials = (((created > 0) & (created >= Experiment.max_trials))
                      | Experiment.stop_requested.is_(True))
        unfinished = select(Trial.id).where(Trial.experiment_id == Experiment.id,
                                            Trial.state.not_in(terminal)).exists()
        with self.store.session_scope() as s:
            active = s.scalars(select(Experiment).options(selectinload(Experiment.trials)).where(
                (Experiment.state == ExperimentState.ACTIVE.value)
                | ((Experiment.state == ExperimentState.PAUSED.value)
                   & Experiment.stop_requested.is_(True)),
                has_trials, ~unfinished))
            for experiment in active:
                states = [TrialState(t.state) for t in experiment.trials]
                if (states or experiment.stop_requested) and all(
                        st.is_terminal() for st in states):
                    end, why = _experiment_end(experiment, states)
                    transition(s, experiment, end, reason=why, actor=ACTOR)


_HOLDING_SLOT = [TrialState.STARTING.value, TrialState.RUNNING.value,
                 TrialState.RESTARTING.value]
_NOT_ENDED = [TrialState.QUEUED.value, *_HOLDING_SLOT]


def _config(trial: Trial) -> ExperimentConfig:
    return experiment_config(trial.experiment)


PAUSED, PREEMPTED = "paused", "preempted"  # values of Trial.pause_requested


def _stopping(trial: Trial) -> bool:
    """Muster is stopping the trial: killed, paused or preempted."""
    return trial.stop_requested or trial.pause_requested is not None


def _pause(s: Session, trial: Trial, message: str) -> None:
    """The trial stopped as asked: PAUSED; back in the queue at once when it was preempted
    (or its experiment was activated again meanwhile)."""
    why = trial.pause_requested or PAUSED
    trial.pause_requested = None
    transition(s, trial, TrialState.PAUSED, reason=why, actor=ACTOR, message=message)
    if trial.experiment.state == ExperimentState.ACTIVE.value:
        transition(s, trial, TrialState.QUEUED, reason="requeued", actor=ACTOR,
                   message=f"back in the queue after it was {why}; it resumes from its "
                           "latest checkpoint")


def _demand(trial: Trial) -> Demand:
    resources = _config(trial).resources
    return Demand(trial.id, trial.experiment_id, trial.priority, resources.replicas,
                  resources.gpus_per_replica, resources.gpu_type, resources.max_slots)


def _holding(trial: Trial, gpus: tuple[int, ...]) -> Holding:
    resources = _config(trial).resources
    return Holding(trial.id, trial.experiment_id, trial.priority, resources.replicas, gpus,
                   stopping=trial.stop_requested or trial.pause_requested is not None,
                   gpus_per_replica=resources.gpus_per_replica)


def _replicas(trial: Trial) -> int:
    return _config(trial).resources.replicas



_IN_PLACE = (Reason.INFRA, Reason.LOST, Reason.STALLED)
STANDBY_GO = "standby-go.json"  # rank-<r>.standby-go.json: a standby's promotion


def _standby_of(trial: Trial) -> Attempt | None:
    return next((a for a in trial.attempts if a.standby
                 and a.state == AttemptState.STARTING.value), None)


def _as_standby(spec: ReplicaSpec) -> ReplicaSpec:
    go = spec.attempt_dir / f"rank-{spec.rank}.{STANDBY_GO}"
    return dataclasses.replace(spec, env={**spec.env, GO_VARIABLE: str(go)})


def _current(attempt: Attempt) -> dict[int, Replica]:
    """Each rank's latest incarnation (the one that runs, or ran last)."""
    current: dict[int, Replica] = {}
    for replica in sorted(attempt.replicas, key=lambda r: r.incarnation):
        current[replica.rank] = replica
    return current


def _move_aside(path: Path, incarnation: int) -> None:
    """Keep an ended incarnation's file under `restarts/`, out of the next one's way."""
    if path.exists():
        target = path.parent / "restarts" / f"{path.name}.{incarnation}"
        target.parent.mkdir(exist_ok=True)
        path.rename(target)


def _started(status: ReplicaStatus) -> bool:
    """The replica's training process has started (it may have ended already)."""
    if status.phase is ReplicaPhase.RUNNING:
        return True
    return (status.phase is ReplicaPhase.EXITED and status.exit is not None
            and status.exit.pid is not None)


def _started_message(world_size: int, harness: bool) -> str:
    started = "started" if world_size == 1 else f"all {world_size} replicas started"
    return f"{started} and checked in" if harness else started


def _not_checked_in(attempt_dir: Path, statuses: list[ReplicaStatus]) -> list[int]:
    """The ranks whose training process started (it may have ended since) but has not
    checked in through the harness."""
    return [status.rank for status in statuses
            if _started(status) and not checked_in(attempt_dir, status.rank)]


def _waiting_since(attempt_dir: Path, status: ReplicaStatus) -> float | None:
    """Since when a running replica is expected to check in: its start, or, for a warm
    standby, its promotion (it waits in init() by design until then)."""
    if status.started_at is None:
        return None
    go = attempt_dir / f"rank-{status.rank}.{STANDBY_GO}"
    try:
        return max(status.started_at, go.stat().st_mtime)
    except FileNotFoundError:
        return status.started_at



def _note_process(replica: Replica, status: ReplicaStatus) -> None:
    if status.child is not None:
        replica.pid, replica.start_ticks = status.child.pid, status.child.start_ticks
    elif status.exit is not None:
        replica.pid, replica.start_ticks = status.exit.pid, status.exit.start_ticks
    replica.started_at = status.started_at


def _ended_cleanly(record: ExitRecord) -> bool:
    return record.spawn_error is None and record.returncode == 0 and record.signal is None


def _exited_cleanly(status: ReplicaStatus) -> bool:
    return status.exit is not None and _ended_cleanly(status.exit)


def _decided_by(statuses: list[ReplicaStatus]) -> ReplicaStatus | None:
    """The end that decides the attempt, if one has happened: the primary (rank 0) ended,
    or another replica failed or was lost. A non-primary that exits 0 decides nothing (it
    finished its share; the primary has the last word)."""
    for status in statuses:
        if status.phase is ReplicaPhase.LOST:
            return status
        if status.phase is ReplicaPhase.EXITED and status.exit is not None and (
            status.rank == 0 or not _ended_cleanly(status.exit)
        ):
            return status
    return None


def _classify(
    replica: Replica, status: ReplicaStatus, attempt_dir: Path, trial: Trial,
    policy: FailurePolicy, launch_error: tuple[int, str] | None,
) -> Classification:
    """Why this replica ended. It counts as stopped by muster only if the stop was asked
    before it ended: a replica that crashed first and was told to stop a moment later
    (while its exit record was being written) crashed."""
    if launch_error is not None:
        failed_rank, error = launch_error
        if replica.rank == failed_rank:
            return classify_exit(ExitObservation(rank=replica.rank, exit=None,
                                                 launch_error=error))
        return Classification(
            Reason.STOPPED, f"The replica {replica_name(replica.rank)} was stopped by muster: "
            f"rank {failed_rank} could not be launched", None, None, None)
    record = status.exit
    stopped = trial.stop_requested or status.stop_requested
    if record is not None and status.stop_requested_at is not None and not trial.stop_requested \
            and record.ended_at < status.stop_requested_at:
        stopped = False
        record = dataclasses.replace(record, stop_requested=False)
    stalled = read_json(_stall_marker(attempt_dir, replica.rank))
    return classify_exit(
        ExitObservation(
            rank=replica.rank,
            exit=record,
            lost=status.phase is ReplicaPhase.LOST,
            log_tail=tail_text(Path(replica.log_path), TAIL_LINES),
            transient_exit_codes=frozenset(policy.transient_exit_codes),
            stop_requested=stopped,
            stalled=stalled["reason"] if isinstance(stalled, dict) else None,
        )
    )


def _cause(verdicts: dict[int, Classification],
           statuses: dict[int, ReplicaStatus]) -> Classification:
    """The verdict the attempt ends with: the first failure in time (the replica the machine
    killed, not its peers that then lost their connection to it); else the primary's (OK,
    or STOPPED when muster was asked to stop the trial). Once the primary has exited 0 it
    has the last word: a peer failing after that (in its teardown, say) is recorded on its
    replica but does not fail the trial."""
    def ended(rank: int) -> tuple[float, int]:
        record = statuses[rank].exit
        return (record.ended_at if record is not None else float("inf"), rank)

    failed = [rank for rank, v in verdicts.items() if v.reason not in (Reason.OK, Reason.STOPPED)]
    primary = verdicts[0]
    if primary.reason is Reason.OK:
        failed = [rank for rank in failed if ended(rank) < ended(0)]
    return verdicts[min(failed, key=ended)] if failed else primary


def _stall_marker(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.stalled.json"


def _judge_success(s: Session, trial: Trial, verdict: Classification,
                   early_stopped: bool = False) -> None:
    """Exit 0 is not success until every configured check passed (invariant 1).

    A trial the searcher stopped early ran part of its training by design: its sample
    counts are not checked (the last epoch is cut short), nor its metrics for NaN (a
    diverging trial is what a pruner stops); its checkpoint and check-ins are.
    """
    config = _config(trial)
    # A warm standby, waiting or dropped, ran none of the training: it is no evidence.
    attempts = [a.number for a in trial.attempts if not a.standby]
    run_dir = Path(trial.attempts[-1].run_dir).parent
    manifest_count = (trial.manifest or {}).get("file_count")
    checks = config.verify
    if early_stopped:
        manifest_count = None
        checks = checks.model_copy(update={"expected_samples": None, "finite_metrics": False})
    result = verification.verify(
        verification.gather_evidence(run_dir, attempts),
        checks,
        manifest_count,
        harness_ranks=config.resources.replicas if config.harness else None,
    )
    trial.verification = result.to_json()
    if result.passed:
        if early_stopped:
            transition(s, trial, TrialState.SUCCEEDED, reason="early stopped", actor=ACTOR,
                       message=early_stop_note(trial))
        else:
            transition(s, trial, TrialState.SUCCEEDED, reason=verdict.reason.value,
                       actor=ACTOR, message=verdict.message)
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
