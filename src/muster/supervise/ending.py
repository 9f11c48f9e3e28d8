"""Ending an attempt: every replica explains how it ended, the attempt ends with the verdict
that decided it, and the trial makes the move `outcome.next_move` chose, in one transaction.

An exit 0 is not success until verification passed (invariant 1): `verify_success` makes
the trial SUCCEEDED or SUSPECT with the failed checks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import job_secrets
from muster.atomic import read_json
from muster.config import ExperimentConfig
from muster.launch.base import ReplicaStatus
from muster.launch.exits import Classification, ExitObservation, classify_exit, replica_name
from muster.launch.logs import masked, tail_text
from muster.rundir import AttemptDir
from muster.search.history import generation_of
from muster.states import (
    AttemptState,
    EventReason,
    ExperimentState,
    Reason,
    ReplicaPhase,
    StopIntent,
    TrialState,
)
from muster.store import (
    ArtifactSet,
    Attempt,
    Checkpoint,
    Replica,
    Trial,
    record_event,
    transition,
)
from muster.store.configs import experiment_config
from muster.store.models import now
from muster.supervise import verification
from muster.supervise.context import ACTOR, SupervisorContext, current_replicas
from muster.supervise.heartbeats import checked_in, stall_evidence, stalled_since
from muster.supervise.ingest import ingest_trial
from muster.supervise.log_errors import RankScan, scan_log
from muster.supervise.log_metrics import LogMetricEvidence, log_metric_evidence
from muster.supervise.log_metrics_ingest import wrote_metrics_files
from muster.supervise.log_samples import count_log_samples
from muster.supervise.outcome import (
    Move,
    Next,
    attempt_end,
    cause,
    exited_cleanly,
    next_move,
    started,
)
from muster.supervise.placement import note_node_end
from muster.supervise.policy import COUNTED_BY_ATTEMPTS, Budgets
from muster.supervise.searching import early_stop_note
from muster.supervise.verification import LogCounts, combine_log_counts

__all__ = ["TAIL_LINES", "Ending", "classify_replica", "mark_started", "note_process",
           "record_decision", "record_replica_end", "started_message"]

log = logging.getLogger(__name__)

TAIL_LINES = 20


@dataclass(frozen=True)
class LogScans:
    """The ended attempt's rank logs, scanned (`log_errors`), and when its primary exited."""

    ranks: list[RankScan]
    primary_ended_at: float
LaunchError = tuple[int, str]  # (the rank that could not be launched, why)


@dataclass
class Ending:
    ctx: SupervisorContext

    def ingest(self, trial_id: int) -> None:
        """Bring the trial's metrics and checkpoints into the store (cheap when unchanged)."""
        try:
            ingest_trial(self.ctx.store, trial_id)
        except OSError as exc:
            log.error("could not read the run directory of trial %s: %s", trial_id, exc)

    def log_tail(self, replica: Replica) -> str:
        """The last lines of the replica's log, as its launcher serves it, its trial's
        secrets masked (the tail's exception line becomes the trial's message)."""
        experiment = replica.attempt.trial.experiment
        secrets = job_secrets.masked_values(experiment_config(experiment).environment.secrets,
                                            self.ctx.home, experiment.uuid)
        log = masked(self.ctx.launcher.log(Path(replica.attempt.run_dir), replica.rank),
                     secrets)
        return tail_text(log, TAIL_LINES)

    def finish(self, attempt_id: int, trial_id: int, statuses: Sequence[ReplicaStatus],
               launch_error: LaunchError | None = None, *, ingested: bool = False,
               config: ExperimentConfig | None = None) -> None:
        """Classify every replica's end, end the attempt with the one that decided it, and
        make the trial's next move, in one transaction (with the attempt's start, where no
        pass recorded it yet).

        `ingested`: the caller brought every metric line into the store after every
        replica had exited. `config`: the experiment's, where the caller has it at hand.
        """
        if not ingested:
            self.ingest(trial_id)  # every metric line is in the store before the verdict
        # Counted and scanned outside the transaction: they read whole logs, in children.
        counts = self._log_counts(trial_id, statuses, config)
        scans = self._log_scans(attempt_id, statuses, config)
        log_metrics = self._log_metrics(trial_id, statuses, config)
        with self.ctx.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            trial = attempt.trial
            by_rank = {status.rank: status for status in statuses}
            verdicts: dict[int, Classification] = {}
            for rank, replica in sorted(current_replicas(attempt).items()):
                if replica.pid is None:  # started and ended since the last pass
                    note_process(replica, by_rank[rank])
                tail = self.log_tail(replica)
                verdict = classify_replica(replica, by_rank[rank], trial, tail, launch_error)
                record_replica_end(replica, by_rank[rank], verdict, tail)
                note_node_end(s, replica, verdict, self.ctx.breaker)
                verdicts[rank] = verdict
            decisive = cause(verdicts, by_rank)
            if attempt.state == AttemptState.STARTING and any(map(started, statuses)):
                # It ran: its start is recorded now (it began and ended between two passes),
                # or it ended before every replica had started (the primary finished while
                # a peer was still starting, and muster stopped the peer), or, with
                # `harness: true`, before every one had checked in.
                harness = experiment_config(trial.experiment).harness
                everyone = all(map(started, statuses)) and (not harness or all(
                    checked_in(Path(attempt.run_dir), st.rank) for st in statuses))
                trial.queue_reason = None
                mark_started(s, attempt, started_message(len(statuses), harness) if everyone
                             else "ended before every replica had "
                             + ("checked in" if harness else "started"))
            transition(s, attempt, attempt_end(decisive.reason), reason=decisive.reason,
                       actor=ACTOR, message=decisive.message)
            self._move(s, trial, decisive, counts, scans, log_metrics)
            note_artifacts(s, trial, attempt)
            placed = (trial.uuid, attempt.number)
        # After the commit: a server killed in between leaves it to the sweep.
        self.ctx.placement.release(*placed)

    def _log_counts(self, trial_id: int, statuses: Sequence[ReplicaStatus],
                    config: ExperimentConfig | None) -> LogCounts | None:
        """The samples `verify.samples_from_log` finds in every rank log of the trial's
        attempts; None when the config asks for none or the primary did not exit 0."""
        primary = next((st for st in statuses if st.rank == 0), None)
        if primary is None or not exited_cleanly(primary):
            return None
        if config is not None and config.verify.samples_from_log is None:
            return None
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            pattern = experiment_config(trial.experiment).verify.samples_from_log
            logs = {a.number: (Path(a.run_dir), sorted({r.rank for r in a.replicas}))
                    for a in trial.attempts if not a.standby}
        if pattern is None:
            return None
        return combine_log_counts({
            number: {rank: count_log_samples(self.ctx.launcher.log(where, rank), pattern)
                     for rank in ranks}
            for number, (where, ranks) in logs.items()})

    def _log_scans(self, attempt_id: int, statuses: Sequence[ReplicaStatus],
                   config: ExperimentConfig | None) -> LogScans | None:
        """Every rank log of the ended attempt, scanned for what contradicts an exit 0
        (`verify.log_errors`); None when that is off or the primary did not exit 0."""
        primary = next((st for st in statuses if st.rank == 0), None)
        if primary is None or not exited_cleanly(primary):
            return None
        with self.ctx.store.session_scope() as s:
            attempt = s.get_one(Attempt, attempt_id)
            mode = (config or experiment_config(attempt.trial.experiment)).verify.log_errors
            where = Path(attempt.run_dir)
        if mode == "off":
            return None
        assert primary.exit is not None  # exited_cleanly
        return LogScans([scan_log(self.ctx.launcher.log(where, st.rank)) for st in statuses],
                        primary.exit.ended_at)

    def _log_metrics(self, trial_id: int, statuses: Sequence[ReplicaStatus],
                     config: ExperimentConfig | None) -> LogMetricEvidence | None:
        """What the rank logs of every attempt say of the trial's metrics
        (`verify.metrics_from_log`, the built-in recognisers); None when the primary did
        not exit 0."""
        primary = next((st for st in statuses if st.rank == 0), None)
        if primary is None or not exited_cleanly(primary):
            return None
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            config = config or experiment_config(trial.experiment)
            logs = {a.number: (Path(a.run_dir), sorted({r.rank for r in a.replicas}))
                    for a in trial.attempts if not a.standby}
        wrote_metrics = any(wrote_metrics_files(where) for where, _ in logs.values())
        return log_metric_evidence(self.ctx.launcher, logs, config, wrote_metrics)

    def _move(self, s: Session, trial: Trial, verdict: Classification,
              counts: LogCounts | None, scans: LogScans | None = None,
              log_metrics: LogMetricEvidence | None = None) -> None:
        policy = experiment_config(trial.experiment).failure_policy
        intent = trial.intent
        move = next_move(trial.state, intent, verdict, _budgets(trial), policy)
        if move.clear_intent:
            trial.stop_intent = None
        if move.decision is not None or move.next is Next.NOTE:
            record_decision(s, trial, move.reason, move.decision or move.message)
        if move.next is Next.NOTE:
            return
        if move.next is Next.VERIFY:
            trial.early_stopped = trial.early_stopped or move.early_stopped
            verify_success(s, trial, move, counts, scans, log_metrics)
        elif move.next is Next.PAUSE:
            pause(s, trial, move, intent)
        elif move.next is Next.RETRY:
            assert move.charge is not None, "a retry always names its budget (next_move)"
            if move.charge not in COUNTED_BY_ATTEMPTS:
                setattr(trial, move.charge, getattr(trial, move.charge) + 1)
            transition(s, trial, TrialState.RESTARTING, reason=move.reason, actor=ACTOR,
                       message=move.message)
        else:
            end = TrialState.CANCELED if move.next is Next.CANCEL else TrialState.FAILED
            transition(s, trial, end, reason=move.reason, actor=ACTOR, message=move.message)


def classify_replica(replica: Replica, status: ReplicaStatus, trial: Trial, log_tail: str,
                     launch_error: LaunchError | None = None) -> Classification:
    """Why this replica ended. It counts as stopped by muster only if the stop was asked
    before it ended: a replica that crashed first and was told to stop a moment later
    (while its exit record was being written) crashed."""
    policy = experiment_config(trial.experiment).failure_policy
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
    attempt_dir = AttemptDir(Path(replica.attempt.run_dir))
    stalled = read_json(attempt_dir.rank(replica.rank).stalled)
    stall = stalled["reason"] if isinstance(stalled, dict) else None
    evidence = stall_evidence(attempt_dir, replica.rank) if stall is not None else None
    if stall is not None and evidence is not None:
        stack = ("stacks: " + "; ".join(evidence.lines) if evidence.lines
                 else "no stacks could be collected in time")
        stall = f"{stall}; {stack} (evidence: {evidence.bundle})"
    return classify_exit(
        ExitObservation(
            rank=replica.rank,
            exit=record,
            lost=status.phase is ReplicaPhase.LOST,
            log_tail=log_tail,
            transient_exit_codes=frozenset(policy.transient_exit_codes),
            stop_requested=stopped,
            stalled=stall,
        )
    )


def note_artifacts(s: Session, trial: Trial, attempt: Attempt) -> None:
    """When this attempt ended the trial (terminal, or SUSPECT awaiting review) and its
    config names artifacts: their set, `pending` for the storage worker to copy (in this
    transaction, so a server killed now still copies them)."""
    if not (trial.state.is_terminal() or trial.state is TrialState.SUSPECT):
        return
    if not experiment_config(trial.experiment).artifact_patterns:
        return
    # Written during the attempt: after it was recorded, before anything of it ran (its
    # `started_at` is when a pass saw it run, which a quick script's files may precede).
    s.add(ArtifactSet(trial_id=trial.id, attempt=attempt.number, since=attempt.created_at))


def record_replica_end(replica: Replica, status: ReplicaStatus, verdict: Classification,
                       log_tail: str) -> None:
    """Every ended replica explains itself (invariant 7)."""
    replica.exit_code = verdict.exit_code
    replica.signal = verdict.signal
    replica.reason = verdict.reason
    replica.message = verdict.message
    replica.log_tail = log_tail
    if verdict.reason is Reason.STALLED:
        attempt_dir = AttemptDir(Path(replica.attempt.run_dir))
        evidence = stall_evidence(attempt_dir, replica.rank)
        if evidence is not None:
            replica.evidence, replica.stack_summary = evidence.bundle, evidence.summary
        replica.stalled_since = stalled_since(attempt_dir, replica.rank)
    if status.exit is not None:
        replica.max_rss_bytes = status.exit.max_rss_bytes
        replica.log_lost_bytes = status.exit.log_lost_bytes
        replica.peak_rss_bytes = status.exit.peak_rss_bytes
        oom = status.exit.oom
        replica.oom_source = oom.source if oom is not None else None
        replica.oom_limit_bytes = oom.limit_bytes if oom is not None else None
        replica.started_at = status.exit.started_at
        replica.ended_at = status.exit.ended_at
    else:
        replica.ended_at = now()


def record_decision(s: Session, trial: Trial, reason: Reason | EventReason, message: str) -> None:
    record_event(s, entity="trial", entity_id=trial.id, reason=reason, actor=ACTOR,
                 message=message, experiment_id=trial.experiment_id, trial_id=trial.id)


def note_process(replica: Replica, status: ReplicaStatus) -> None:
    """The replica's training process, as its shim published it."""
    if status.child is not None:
        replica.pid, replica.start_ticks = status.child.pid, status.child.start_ticks
    elif status.exit is not None:
        replica.pid, replica.start_ticks = status.exit.pid, status.exit.start_ticks
    replica.started_at = status.started_at


def started_message(world_size: int, harness: bool) -> str:
    started_text = "started" if world_size == 1 else f"all {world_size} replicas started"
    return f"{started_text} and checked in" if harness else started_text


def mark_started(s: Session, attempt: Attempt, message: str) -> None:
    """The attempt is RUNNING, and so is its trial if it was STARTING."""
    transition(s, attempt, AttemptState.RUNNING, reason=EventReason.STARTED, actor=ACTOR,
               message=message)
    if attempt.trial.state == TrialState.STARTING:
        transition(s, attempt.trial, TrialState.RUNNING, reason=EventReason.STARTED,
                   actor=ACTOR)


def pause(s: Session, trial: Trial, move: Move, intent: StopIntent | None) -> None:
    """The trial stopped as asked (`intent`, one of `StopIntent.pausing()`): PAUSED; back in
    the queue at once when its experiment is ACTIVE (it was preempted or restarted, or its
    experiment was activated again meanwhile), unless a person paused this trial alone."""
    trial.stop_intent = None
    transition(s, trial, TrialState.PAUSED, reason=move.reason, actor=ACTOR,
               message=move.message)
    if intent is StopIntent.PAUSE_TRIAL:
        return
    if trial.experiment.state == ExperimentState.ACTIVE:
        after = "its restart" if intent is StopIntent.RESTART else f"it was {move.reason}"
        transition(s, trial, TrialState.QUEUED, reason=EventReason.REQUEUED, actor=ACTOR,
                   message=f"back in the queue after {after}; it resumes from its latest "
                           "checkpoint")


def verify_success(s: Session, trial: Trial, move: Move, counts: LogCounts | None = None,
                   scans: LogScans | None = None,
                   log_metrics: LogMetricEvidence | None = None) -> None:
    """Exit 0 is not success until every configured check passed (invariant 1).

    A trial the searcher stopped early ran part of its training by design: its sample
    counts are not checked (the last epoch is cut short), nor its metrics for NaN (a
    diverging trial is what a pruner stops); its checkpoint and check-ins are.
    """
    config = experiment_config(trial.experiment)
    # A warm standby, waiting or dropped, ran none of the training: it is no evidence.
    attempts = [a.number for a in trial.attempts if not a.standby]
    run_dir = AttemptDir(Path(trial.attempts[-1].run_dir)).run
    manifest_count = (trial.manifest or {}).get("file_count")
    checks, diagnostics = config.verify, config.diagnostics
    if move.early_stopped:
        diagnostics = diagnostics.model_copy(update={"finite_all_ranks": "off"})
        manifest_count = None
        checks = checks.model_copy(update={"expected_samples": None, "finite_metrics": False,
                                           "samples_from_log": None, "outputs": []})
    # Written during the run: after its first attempt was recorded (before anything ran).
    began = min((a.created_at for a in trial.attempts if not a.standby), default=None)
    final = next(a for a in reversed(trial.attempts) if not a.standby)
    saves = [(c.step, c.attempt, c.created_at) for c in
             s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial.id))]
    evidence = verification.gather_evidence(
        run_dir.path, attempts, log_counts=counts, outputs=checks.outputs, started_at=began,
        outputs_before=final.outputs_before, saves=saves,
        log_scans=scans.ranks if scans is not None else None, log_metrics=log_metrics,
        primary_ended_at=scans.primary_ended_at if scans is not None else None,
        log_lost=_log_lost(final), warm_start=_warm_start(s, trial))
    result = verification.verify(
        evidence,
        checks,
        manifest_count,
        harness_ranks=config.resources.replicas if config.harness else None,
        diagnostics=diagnostics,
        searcher_length=verification.searcher_length(
            config.searcher, config.searcher.length_of(generation_of(trial.search_state))),
        early_stopped=move.early_stopped,
    )
    trial.verification = result.to_json()
    if result.passed:
        message = early_stop_note(trial) if move.early_stopped else move.message
        if not result.verified:
            message = f"{message}; {verification.NOT_VERIFIED}: {result.why_not_verified()}"
        transition(s, trial, TrialState.SUCCEEDED, reason=move.reason, actor=ACTOR,
                   message=message)
        return
    failed = "; ".join(f"{c.name}: {c.detail}" for c in result.checks if not c.passed)
    transition(s, trial, TrialState.SUSPECT, reason=EventReason.VERIFICATION_FAILED,
               actor=ACTOR, message=f"{move.message}, but verification failed: {failed}")


def _warm_start(s: Session, trial: Trial) -> verification.WarmStartFrom | None:
    """The checkpoint the trial began from: its own source (a PBT parent's checkpoint), else
    its experiment's warm start as recorded at submission (`api.WarmStartView`); None
    without either. With it, the epochs its trial had trained there (`_source_epochs`)."""
    if trial.source_checkpoint_id is not None:
        row = s.get(Checkpoint, trial.source_checkpoint_id)
        return None if row is None else verification.WarmStartFrom(
            row.step, f"checkpoint {row.name} of trial {row.trial_id} (its parent)",
            _source_epochs(s, row.trial_id, row.id))
    source = trial.experiment.source
    if trial.experiment.source_checkpoint_id is None or not source:
        return None
    return verification.WarmStartFrom(
        int(source["step"]), f"checkpoint {source['checkpoint']} of trial {source['trial_id']}",
        _source_epochs(s, int(source["trial_id"]), trial.experiment.source_checkpoint_id))


def _source_epochs(s: Session, trial_id: int,
                   checkpoint_id: int) -> verification.SourceEpochs | None:
    """The whole epochs trial `trial_id` had trained at checkpoint `checkpoint_id`: what its
    passing verdict counted, when that checkpoint is the newest it saved (saved at its end);
    None otherwise (a SUSPECT source's epochs are not evidence), and a trial that starts
    from it counts its own epochs alone."""
    source = s.get(Trial, trial_id)
    if (source is None or not isinstance(source.verification, dict)
            or source.verification.get("passed") is not True):
        return None
    newest = s.scalar(select(Checkpoint.id).where(Checkpoint.trial_id == trial_id)
                      .order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(1))
    if newest != checkpoint_id:
        return None
    return verification.SourceEpochs.from_json(source.verification.get("epochs"))


def _log_lost(attempt: Attempt) -> dict[int, int]:
    """The bytes each rank of `attempt` could not write to its log, every incarnation's."""
    lost: dict[int, int] = {}
    for replica in attempt.replicas:
        lost[replica.rank] = lost.get(replica.rank, 0) + (replica.log_lost_bytes or 0)
    return lost


def _budgets(trial: Trial) -> Budgets:
    """What the trial has used, when its newest attempt (not a standby) has just ended: every
    earlier attempt that ended OOM was an OOM retry."""
    ran = [a for a in trial.attempts if not a.standby]
    return Budgets(
        replica_restarts=trial.replica_restarts,
        trial_retries=trial.trial_retries,
        internal_retries=trial.internal_retries,
        user_error_retries=trial.user_error_retries,
        oom_retries=sum(a.reason == Reason.OOM for a in ran[:-1]),
    )

