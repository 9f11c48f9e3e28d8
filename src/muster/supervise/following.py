"""Following a live attempt: whatever has happened to its replicas since the last pass.

For a `LiveAttempt` (read once per pass): ingest its new metrics and checkpoints, let the
searcher's pruner judge new validation values, describe every replica, restart one in place
(`restart_scope: replica`), stop the others once an end decides the attempt (or muster was
asked to stop the trial), stop a replica that makes no progress, mark the attempt RUNNING
(and start a warm standby) once every replica has started and, with `harness: true`,
checked in, and end it once every replica has ended. The store is written only for what
changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select, update

from muster.atomic import atomic_write_json, read_json
from muster.diagnostics import read_rank_parts
from muster.launch.base import ReplicaStatus
from muster.launch.dumps import SUMMARY, request_dump
from muster.rundir import AttemptDir
from muster.states import (
    AttemptState,
    EventReason,
    EvidenceReason,
    Reason,
    ReplicaPhase,
    TrialState,
)
from muster.store import Attempt, Event, Trial, record_event
from muster.supervise.context import ACTOR, LiveAttempt, SupervisorContext, current_replicas
from muster.supervise.ending import Ending, mark_started, note_process, started_message
from muster.supervise.heartbeats import (
    Stall,
    check_in_overdue,
    checked_in,
    integration_of,
    silence_reason,
    stall_reason,
)
from muster.supervise.ingest import IngestReport, ingest_trial
from muster.supervise.log_metrics_ingest import ingest_log_metrics
from muster.supervise.outcome import decided_by, exited_cleanly, started
from muster.supervise.restart_in_place import RestartInPlace
from muster.supervise.searching import Searching
from muster.supervise.standby import Standby
from muster.supervise.verification import rank_differences
from muster.words import count, rank_list

__all__ = ["Following"]

log = logging.getLogger(__name__)

# How often a live attempt's logs are scanned for metrics (`verify.metrics_from_log`, the
# built-in recognisers): each scan is a child process per rank.
LOG_SCAN_INTERVAL_S = 5.0
# How long a stalled replica's stop waits for its evidence bundle (the shim bounds the
# collector to COLLECT_LIMIT_S; this covers a shim that cannot collect at all).
EVIDENCE_WAIT_S = 40.0


@dataclass
class Following:
    ctx: SupervisorContext
    searching: Searching
    ending: Ending
    standby: Standby
    restart: RestartInPlace
    # Live attempts whose trial's validation values this supervisor has shown the pruner at
    # least once: afterwards only a pass that ingested new lines has anything new to show.
    _judged: set[int] = field(default_factory=set, init=False)
    # Live attempts whose ranks' snapshots were compared once every rank had written one.
    _compared: set[int] = field(default_factory=set, init=False)
    # Live attempts whose rank 0's integration (`heartbeats.integration_of`) was noted.
    _integrations: set[int] = field(default_factory=set, init=False)
    # Live attempts' last scan of their logs for metrics (time.monotonic()).
    _log_scanned: dict[int, float] = field(default_factory=dict, init=False)
    # (attempt, rank) of stalls found that could not be marked yet (a full run directory):
    # said once, as an event; the stall is marked and stopped once there is room.
    _unmarked: set[tuple[int, int]] = field(default_factory=set, init=False)

    def forget_all_but(self, live: Sequence[LiveAttempt]) -> None:
        """Keep notes only on attempts that are still live."""
        ids = {attempt.id for attempt in live}
        self._judged.intersection_update(ids)
        self._compared.intersection_update(ids)
        self._integrations.intersection_update(ids)
        self._log_scanned = {k: v for k, v in self._log_scanned.items() if k in ids}
        self._unmarked = {key for key in self._unmarked if key[0] in ids}

    def reconcile(self, live: LiveAttempt) -> None:
        """Record whatever has happened to the attempt's replicas.

        The replicas of an attempt start and end together: once one end decides the attempt
        (the primary, rank 0, exited; or any replica failed), muster stops the others, and
        the attempt ends when every replica has ended (`outcome.decided_by`, `cause`).
        """
        # Described before the ingest: a replica that had exited then wrote every line it
        # will ever write, so the ingest below has them all and the end needs no other.
        statuses = [self.ctx.launcher.describe(live.dir.path, rank) for rank in live.ranks]
        report = self._ingest(live)
        self._note_integration(live)
        exited = all(st.phase is ReplicaPhase.EXITED for st in statuses)
        self._ingest_log_metrics(live, report, final=exited)
        # A kill, a pause or a preemption: the replicas get SIGTERM and stop_grace.
        stop = live.trial.intent is not None
        if not stop and self._may_judge(live, report):
            # The pruner may stop it early: the stop goes out in this very pass.
            stop = self.searching.judge(live.trial.id)
        policy = live.config.failure_policy
        if policy.restart_scope == "replica" and not stop:
            statuses = [self.restart.maybe_restart(live, status) or status
                        for status in statuses]
        self._stop_or_watch(live, statuses, stop)
        ended = all(st.phase in (ReplicaPhase.EXITED, ReplicaPhase.LOST) for st in statuses)
        if ended:
            # Started and ended since the last pass, or ended after it started: the end's
            # one transaction records the start too (`Ending.finish`).
            # The pass's ingest stands for the end's only if it read them all (a failed read
            # is tried again there) and no replica was lost (a lost one may still write).
            exited = all(st.phase is ReplicaPhase.EXITED for st in statuses)
            self.ending.finish(live.id, live.trial.id, statuses,
                               ingested=exited and report is not None, config=live.config)
            return
        # With `harness: true`, RUNNING waits for every rank's check-in as well.
        waiting = _not_checked_in(live.dir, statuses) if live.config.harness else []
        if all(map(started, statuses)) and not waiting:
            running = self._mark_running(live, statuses)
            self.standby.ensure(live, trial_running=running)
            if running:
                self._compare_ranks(live)
        elif waiting:
            self._note_check_ins(live, statuses, waiting)

    def _ingest(self, live: LiveAttempt) -> IngestReport | None:
        """Bring the trial's metrics and checkpoints into the store (cheap when unchanged)."""
        try:
            return ingest_trial(self.ctx.store, live.trial.id, live.known)
        except OSError as exc:
            log.error("could not read the run directory of trial %s: %s", live.trial.id, exc)
            return None

    def _note_integration(self, live: LiveAttempt) -> None:
        """Record on the trial what connected its rank 0 (`trials.integration`), once it
        checked in (a stat per pass until then; a plain script never does)."""
        if live.id in self._integrations or live.standby:
            return
        found = integration_of(live.dir.path)
        if found is None:
            return
        self._integrations.add(live.id)
        with self.ctx.store.session_scope() as s:
            s.execute(update(Trial).where(Trial.id == live.trial.id,
                                          Trial.integration.is_distinct_from(found))
                      .values(integration=found))

    def _ingest_log_metrics(self, live: LiveAttempt, report: IngestReport | None,
                            final: bool) -> None:
        """Store the metrics the attempt's logs gained (every `LOG_SCAN_INTERVAL_S`, and
        once more when every replica has exited); they count as new lines of `report`."""
        now = time.monotonic()
        if not final and now - self._log_scanned.get(live.id, -LOG_SCAN_INTERVAL_S) \
                < LOG_SCAN_INTERVAL_S:
            return
        self._log_scanned[live.id] = now
        try:
            added = ingest_log_metrics(self.ctx.store, self.ctx.launcher, live.trial.id,
                                       live.number, live.dir.path, live.ranks, live.config,
                                       final=final)
        except OSError as exc:
            log.error("could not read the logs of trial %s: %s", live.trial.id, exc)
            return
        if report is not None:
            report.metrics_added += added

    def _may_judge(self, live: LiveAttempt, report: IngestReport | None) -> bool:
        """Whether the pruner may have something new to judge: the trial runs, its searcher
        prunes, and new lines came in (or this supervisor has not judged it yet)."""
        if live.trial.state is not TrialState.RUNNING or not live.config.searcher.prunes():
            return False
        new = report is None or report.metrics_added > 0 or live.id not in self._judged
        self._judged.add(live.id)
        return new

    def _stop_or_watch(self, live: LiveAttempt, statuses: Sequence[ReplicaStatus],
                       stop: bool) -> None:
        """Stop the replicas once the attempt is decided or muster asked for a stop; else
        look for replicas that make no progress."""
        decided = decided_by(statuses)
        winding_down = stop or decided is not None
        # After a failure the survivors' collectives are broken: a short grace, not the
        # graceful one a requested stop or a finished primary gets.
        policy = live.config.failure_policy
        grace = (policy.failure_grace if not stop and decided is not None
                 and not exited_cleanly(decided) else None)
        for status in statuses:
            if status.phase is ReplicaPhase.LOST:
                # A shim that never published its child in time may still be alive: make sure
                # it cannot start a second copy of the trial next to the retry.
                self.ctx.launcher.cancel(live.dir.path, status.rank)
            elif status.phase is ReplicaPhase.EXITED:
                continue
            elif winding_down and not status.stop_requested:
                self.ctx.launcher.cancel(live.dir.path, status.rank, grace)
            elif status.phase is ReplicaPhase.RUNNING and not winding_down:
                self._check_progress(live, status, statuses)

    def _check_progress(self, live: LiveAttempt, status: ReplicaStatus,
                        statuses: Sequence[ReplicaStatus]) -> None:
        """Stop a replica that makes no progress: checked in through the harness but no
        progress for `heartbeat_timeout`; should have checked in (`harness: true`) and has
        not within `heartbeat_timeout` of starting; or no output and no CPU for
        `silence_timeout`. Evidence first (invariant 9): the stall asks the shim of every
        running rank for its part of one evidence bundle, and the stop follows once the
        bundle is in (or `EVIDENCE_WAIT_S` passed). The marker makes its end STALLED, not
        STOPPED; one stall per attempt (the others' ends follow from it)."""
        files = live.dir.rank(status.rank)
        marker = read_json(files.stalled)
        if isinstance(marker, dict):
            self._stop_with_evidence(live, status, marker)
            return
        stall = self._stall(live, status)
        if stall is None or any(live.dir.rank(other.rank).stalled.exists() for other in statuses
                                if other.rank != status.rank):
            return  # (the others are looked at only for a stall: no N² stats per pass)
        ranks = [other.rank for other in statuses if other.phase is ReplicaPhase.RUNNING]
        try:
            bundle: str | None = request_dump([live.dir.rank(rank) for rank in ranks],
                                              EvidenceReason.STALLED)
        except OSError as exc:  # no room for the request: stopped without evidence
            log.warning("trial %s attempt %s: no evidence for rank %s's stall: %s",
                        live.trial.id, live.number, status.rank, exc)
            bundle = None
        # `since` becomes the replica's `stalled_since` when it ends (`ending`).
        marker = {"reason": stall.reason, "since": stall.since, "time": time.time(),
                  "bundle": bundle, "ranks": ranks}
        try:
            atomic_write_json(files.stalled, marker)
        except OSError as exc:  # a full run directory: its end could not say STALLED
            self._say_unmarked(live, status.rank, stall.reason, exc)
            return
        with self.ctx.store.session_scope() as s:
            record_event(s, entity="attempt", entity_id=live.id, reason=Reason.STALLED,
                         actor=ACTOR, message=f"stopping rank {status.rank}: {stall.reason}",
                         experiment_id=live.trial.experiment_id, trial_id=live.trial.id)
        self._stop_with_evidence(live, status, marker)

    def _say_unmarked(self, live: LiveAttempt, rank: int, reason: str, exc: OSError) -> None:
        """A stall found while its marker cannot be written: the replica is stopped once
        it can be (the next passes try again), so that its end says STALLED; said once."""
        if (live.id, rank) in self._unmarked:
            return
        self._unmarked.add((live.id, rank))
        with self.ctx.store.session_scope() as s:
            record_event(s, entity="attempt", entity_id=live.id, reason=Reason.STALLED,
                         actor=ACTOR, message=f"rank {rank} is stalled ({reason}), but its "
                         f"run directory has no room to record it ({exc.strerror or exc}): "
                         "it is stopped once there is room",
                         experiment_id=live.trial.experiment_id, trial_id=live.trial.id)

    def _stall(self, live: LiveAttempt, status: ReplicaStatus) -> Stall | None:
        rank, attempt_dir = status.rank, live.dir.path
        policy = live.config.failure_policy
        timeout = policy.heartbeat_timeout
        now = time.time()
        if checked_in(attempt_dir, rank):
            stall = stall_reason(attempt_dir, rank, timeout, now)
        elif live.config.harness and (since := _waiting_since(live.dir, status)) is not None:
            stall = check_in_overdue(since, timeout, now)
        else:
            stall = None
        if stall is None and policy.silence_timeout is not None \
                and (since := _waiting_since(live.dir, status)) is not None:
            stall = silence_reason(live.dir.rank(rank), since, policy.silence_timeout, now)
        return stall

    def _stop_with_evidence(self, live: LiveAttempt, status: ReplicaStatus,
                            marker: dict[str, object]) -> None:
        """Stop a stalled replica once the evidence bundle is complete for every rank it was
        asked of, or once waiting took `EVIDENCE_WAIT_S` (a shim that cannot collect must
        not keep its slot)."""
        if status.stop_requested:
            return
        bundle, asked, ranks = marker.get("bundle"), marker.get("time"), marker.get("ranks")
        waited = time.time() - asked if isinstance(asked, int | float) else EVIDENCE_WAIT_S
        collected = bundle is None or (  # None: none could be asked for (a full disk)
            isinstance(bundle, str) and isinstance(ranks, list)
            and all(_bundle_complete(live.dir, bundle, rank) for rank in ranks
                    if isinstance(rank, int)))
        if collected or waited >= EVIDENCE_WAIT_S:
            self.ctx.launcher.cancel(live.dir.path, status.rank)

    def _mark_running(self, live: LiveAttempt, statuses: Sequence[ReplicaStatus]) -> bool:
        """RUNNING once every replica's training process has started (and, with
        `harness: true`, checked in); True when the trial is RUNNING now."""
        unnoted = [rank for rank, replica in live.replicas.items() if replica.pid is None]
        if live.state is not AttemptState.STARTING and not unnoted:
            return live.trial.state is TrialState.RUNNING
        with self.ctx.store.session_scope() as s:
            attempt = s.get_one(Attempt, live.id)
            by_rank = {status.rank: status for status in statuses}
            for rank, replica in current_replicas(attempt).items():
                if replica.pid is None:  # (a replica restarted in place starts later)
                    note_process(replica, by_rank[rank])
            if attempt.state == AttemptState.STARTING:
                attempt.trial.queue_reason = None  # it waits no more
                mark_started(s, attempt, started_message(len(statuses), live.config.harness))
            return attempt.trial.state == TrialState.RUNNING

    def _compare_ranks(self, live: LiveAttempt) -> None:
        """Warn at start, with an event, when the ranks of an attempt run on different
        libraries or numerics settings (`verify.consistent_ranks` judges it at the end).
        Once every rank checked in and wrote its snapshot (`muster.harness.snapshot`)."""
        if (live.id in self._compared or len(live.ranks) < 2 or live.standby
                or live.config.verify.consistent_ranks == "off"):
            return
        if not all(checked_in(live.dir.path, rank) for rank in live.ranks):
            return  # (a stat per rank and pass, until they do: a script without the
            # harness never does)
        parts = read_rank_parts(live.dir.path)
        if len(parts) < len(live.ranks):
            return  # a rank writes its snapshot just after its check-in: the next pass
        self._compared.add(live.id)
        detail = rank_differences(parts)
        if detail is None:
            return
        with self.ctx.store.session_scope() as s:
            said = s.scalar(select(Event.id).where(  # before a restart of muster
                Event.entity == "attempt", Event.entity_id == live.id,
                Event.reason == EventReason.RANKS_DIFFER).limit(1))
            if said is None:
                record_event(s, entity="attempt", entity_id=live.id,
                             reason=EventReason.RANKS_DIFFER, actor=ACTOR,
                             message=f"warning: {detail}",
                             experiment_id=live.trial.experiment_id, trial_id=live.trial.id)

    def _note_check_ins(self, live: LiveAttempt, statuses: Sequence[ReplicaStatus],
                        waiting: list[int]) -> None:
        """Say on a STARTING trial which ranks it waits for (written when that changes)."""
        started_count = sum(map(started, statuses))
        ended = [st.rank for st in statuses if st.rank in waiting
                 and st.phase is not ReplicaPhase.RUNNING]
        running = [rank for rank in waiting if rank not in ended]
        parts = [f"waiting for {rank_list(running)} to check in through muster.harness.init()"
                 ] if running else []
        parts += [f"{rank_list(ended)} ended without checking in"] if ended else []
        reason = (f"{'; '.join(parts)} ({started_count} of "
                  f"{count(len(statuses), 'replica')} started)")
        if (live.state is not AttemptState.STARTING or live.standby
                or live.trial.queue_reason == reason):
            return
        with self.ctx.store.session_scope() as s:
            attempt = s.get_one(Attempt, live.id)
            if attempt.state == AttemptState.STARTING and not attempt.standby:
                attempt.trial.queue_reason = reason


def _bundle_complete(attempt_dir: AttemptDir, bundle: str, rank: int) -> bool:
    """True once the rank's part of evidence bundle `bundle` was written to its end."""
    try:
        return (attempt_dir.evidence_of(bundle, rank) / SUMMARY).exists()
    except ValueError:  # not a bundle id: nothing to wait for
        return True


def _not_checked_in(attempt_dir: AttemptDir, statuses: Sequence[ReplicaStatus]) -> list[int]:
    """The ranks whose training process started (it may have ended since) but has not
    checked in through the harness."""
    return [status.rank for status in statuses
            if started(status) and not checked_in(attempt_dir.path, status.rank)]


def _waiting_since(attempt_dir: AttemptDir, status: ReplicaStatus) -> float | None:
    """Since when a running replica is expected to check in: its start, or, for a warm
    standby, its promotion (it waits in init() by design until then)."""
    if status.started_at is None:
        return None
    go = attempt_dir.rank(status.rank).standby_go
    try:
        return max(status.started_at, go.stat().st_mtime)
    except FileNotFoundError:
        return status.started_at
