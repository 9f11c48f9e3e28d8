"""The pure outcome of an attempt, table by table: which end decides it, which verdict it
ends with, and the trial's next move for every stop intent and failure."""

from __future__ import annotations

import pytest

from muster.config import FailurePolicy
from muster.launch.base import ExitRecord, ReplicaStatus
from muster.launch.exits import Classification
from muster.states import AttemptState, EventReason, Reason, ReplicaPhase, StopIntent, TrialState
from muster.supervise.outcome import (
    Move,
    Next,
    attempt_end,
    cause,
    decided_by,
    next_move,
    started,
)
from muster.supervise.policy import INTERNAL_FAILURE_MESSAGE, Budgets

T, R, S = TrialState, Reason, StopIntent
POLICY = FailurePolicy()  # 5 replica restarts, 3 trial retries, 2 internal, 0 user errors
SPENT = Budgets(replica_restarts=5, trial_retries=3, internal_retries=2)


def verdict(reason: Reason) -> Classification:
    return Classification(reason, f"the replica {reason.value}", None, None, None)


def record(returncode: int, ended_at: float = 1.0) -> ExitRecord:
    return ExitRecord(returncode=returncode, exit_code=returncode if returncode >= 0 else None,
                      signal=None if returncode >= 0 else "SIGKILL", pid=1, start_ticks=1,
                      started_at=0.0, ended_at=ended_at, max_rss_bytes=None)


def exited(rank: int, returncode: int, ended_at: float = 1.0) -> ReplicaStatus:
    return ReplicaStatus(rank, ReplicaPhase.EXITED, exit=record(returncode, ended_at))


RUNNING = ReplicaStatus(0, ReplicaPhase.RUNNING)
LOST = ReplicaStatus(1, ReplicaPhase.LOST)


@pytest.mark.parametrize(("state", "intent", "reason", "used", "expected"), [
    # Settled already (reviewed while a process still ran): noted, nothing moves.
    (T.SUSPECT, None, R.INFRA, Budgets(), (Next.NOTE, R.INFRA, None)),
    (T.SUCCEEDED, S.KILL, R.STOPPED, Budgets(), (Next.NOTE, R.STOPPED, None)),
    # A kill: canceled, unless it exited 0 anyway (then verified like any exit 0).
    (T.RUNNING, S.KILL, R.STOPPED, Budgets(), (Next.CANCEL, EventReason.KILLED, None)),
    (T.RUNNING, S.KILL, R.INFRA, Budgets(), (Next.CANCEL, EventReason.KILLED, None)),
    (T.RESTARTING, S.KILL, R.LOST, Budgets(), (Next.CANCEL, EventReason.KILLED, None)),
    (T.RUNNING, S.KILL, R.OK, Budgets(), (Next.VERIFY, R.OK, None)),
    # The searcher's early stop: its results count; a failure first is not restarted.
    (T.RUNNING, S.EARLY_STOP, R.STOPPED, Budgets(), (Next.VERIFY, EventReason.EARLY_STOP,
                                                     None)),
    (T.RUNNING, S.EARLY_STOP, R.OK, Budgets(), (Next.VERIFY, R.OK, None)),
    (T.RUNNING, S.EARLY_STOP, R.INFRA, Budgets(), (Next.FAIL, R.INFRA, None)),
    (T.RUNNING, S.EARLY_STOP, R.TRANSIENT, Budgets(), (Next.FAIL, R.TRANSIENT, None)),
    (T.RUNNING, S.EARLY_STOP, R.USER_ERROR, Budgets(), (Next.FAIL, R.USER_ERROR, None)),
    # Pause and preemption: a stop asked for is no failure; a failure meanwhile still is.
    (T.RUNNING, S.PAUSE, R.STOPPED, Budgets(), (Next.PAUSE, EventReason.PAUSED, None)),
    (T.RUNNING, S.PREEMPT, R.STOPPED, Budgets(), (Next.PAUSE, EventReason.PREEMPTED, None)),
    (T.RUNNING, S.PAUSE, R.INFRA, Budgets(), (Next.RETRY, R.INFRA, "replica_restarts")),
    (T.RUNNING, S.PREEMPT, R.OK, Budgets(), (Next.VERIFY, R.OK, None)),
    # No intent: the failure policy's table.
    (T.RUNNING, None, R.OK, Budgets(), (Next.VERIFY, R.OK, None)),
    (T.RUNNING, None, R.STOPPED, Budgets(), (Next.CANCEL, R.STOPPED, None)),
    (T.RUNNING, None, R.PERMANENT_ERROR, Budgets(), (Next.FAIL, R.PERMANENT_ERROR, None)),
    (T.RUNNING, None, R.USER_ERROR, Budgets(), (Next.FAIL, R.USER_ERROR, None)),
    (T.RUNNING, None, R.OOM, Budgets(), (Next.FAIL, R.OOM, None)),
    (T.RUNNING, None, R.TRANSIENT, Budgets(), (Next.RETRY, R.TRANSIENT, "trial_retries")),
    (T.RUNNING, None, R.TRANSIENT, SPENT, (Next.FAIL, R.TRANSIENT, None)),
    (T.STARTING, None, R.LOST, Budgets(), (Next.RETRY, R.LOST, "replica_restarts")),
    (T.RUNNING, None, R.STALLED, Budgets(replica_restarts=5),
     (Next.RETRY, R.STALLED, "trial_retries")),
    (T.RUNNING, None, R.INFRA, SPENT, (Next.FAIL, R.INFRA, None)),
    (T.STARTING, None, R.INTERNAL, Budgets(), (Next.RETRY, R.INTERNAL, "internal_retries")),
    (T.STARTING, None, R.INTERNAL, SPENT, (Next.FAIL, R.INTERNAL, None)),
])
def test_the_next_move_after_an_attempt(
    state: TrialState, intent: StopIntent | None, reason: Reason, used: Budgets,
    expected: tuple[Next, object, str | None],
) -> None:
    move = next_move(state, intent, verdict(reason), used, POLICY)
    assert (move.next, move.reason, move.charge) == expected
    # A retry and a give-up always say why in a decision event; a stop asked for never does.
    assert (move.decision is not None) == (move.next in (Next.RETRY, Next.FAIL))
    assert move.clear_intent == (move.next is Next.PAUSE or (
        intent is StopIntent.EARLY_STOP and move.next is Next.VERIFY))
    assert move.early_stopped == (move.reason is EventReason.EARLY_STOP)


def test_messages_of_the_moves() -> None:
    settled = next_move(T.SUSPECT, None, verdict(R.OK), Budgets(), POLICY)
    assert settled.message == "an attempt ended after the trial was SUSPECT: the replica OK"
    early_failure = next_move(T.RUNNING, S.EARLY_STOP, verdict(R.INFRA), Budgets(), POLICY)
    assert early_failure.decision == "not restarted: the searcher had stopped it early"
    retry = next_move(T.RUNNING, None, verdict(R.TRANSIENT), Budgets(trial_retries=1), POLICY)
    assert retry == Move(Next.RETRY, R.TRANSIENT, "the replica TRANSIENT",
                         decision="TRANSIENT failure; retrying the trial (retry 2 of 3)",
                         charge="trial_retries")
    internal = next_move(T.STARTING, None, verdict(R.INTERNAL), SPENT, POLICY)
    assert internal.message == f"{INTERNAL_FAILURE_MESSAGE}: the replica INTERNAL"
    assert internal.decision == INTERNAL_FAILURE_MESSAGE


def test_user_errors_are_retried_only_when_asked() -> None:
    policy = FailurePolicy(retry_user_errors=1)
    first = next_move(T.RUNNING, None, verdict(R.USER_ERROR), Budgets(), policy)
    assert (first.next, first.charge) == (Next.RETRY, "user_error_retries")
    spent = next_move(T.RUNNING, None, verdict(R.USER_ERROR),
                      Budgets(user_error_retries=1), policy)
    assert spent.next is Next.FAIL


@pytest.mark.parametrize(("statuses", "deciding_rank"), [
    ([RUNNING], None),
    ([exited(0, 0)], 0),
    ([exited(0, 1)], 0),
    ([RUNNING, exited(1, 0)], None),  # a peer that finished its share decides nothing
    ([RUNNING, exited(1, 3)], 1),  # a peer that failed decides
    ([RUNNING, LOST], 1),
    ([ReplicaStatus(0, ReplicaPhase.STARTING), RUNNING], None),
])
def test_which_end_decides_the_attempt(
    statuses: list[ReplicaStatus], deciding_rank: int | None
) -> None:
    decided = decided_by(statuses)
    assert (decided.rank if decided else None) == deciding_rank


def test_the_first_failure_in_time_is_the_cause() -> None:
    statuses = {0: exited(0, -9, ended_at=3.0), 1: exited(1, -9, ended_at=2.0),
                2: exited(2, 1, ended_at=2.5)}
    verdicts = {0: verdict(R.INFRA), 1: verdict(R.TRANSIENT), 2: verdict(R.USER_ERROR)}
    assert cause(verdicts, statuses).reason is R.TRANSIENT


def test_once_the_primary_exited_0_a_later_failure_is_no_cause() -> None:
    statuses = {0: exited(0, 0, ended_at=1.0), 1: exited(1, 1, ended_at=2.0)}
    assert cause({0: verdict(R.OK), 1: verdict(R.USER_ERROR)}, statuses).reason is R.OK
    earlier = {0: exited(0, 0, ended_at=3.0), 1: exited(1, 1, ended_at=2.0)}
    assert cause({0: verdict(R.OK), 1: verdict(R.USER_ERROR)}, earlier).reason is R.USER_ERROR


def lost(rank: int, lost_at: float | None) -> ReplicaStatus:
    return ReplicaStatus(rank, ReplicaPhase.LOST, lost_at=lost_at)


@pytest.mark.parametrize(("statuses", "verdicts", "reason"), [
    # Rank 1 was last seen alive before the primary's exit 0 (its node died; Ray said so
    # later): its share of the work was not done, so the attempt fails.
    ({0: exited(0, 0, ended_at=10.0), 1: lost(1, 9.0)}, {0: R.OK, 1: R.LOST}, R.LOST),
    # Still alive after the primary's exit 0: lost in its teardown, no cause.
    ({0: exited(0, 0, ended_at=10.0), 1: lost(1, 11.0)}, {0: R.OK, 1: R.LOST}, R.OK),
    # No time of death known: ordered last, as before.
    ({0: exited(0, 0, ended_at=10.0), 1: lost(1, None)}, {0: R.OK, 1: R.LOST}, R.OK),
    # The first failure in time: the lost rank, not the peer that then lost its connection
    # to it and failed first in muster's eyes.
    ({0: exited(0, 1, ended_at=10.0), 1: lost(1, 5.0)}, {0: R.USER_ERROR, 1: R.LOST}, R.LOST),
    ({0: exited(0, 1, ended_at=10.0), 1: lost(1, 12.0)}, {0: R.USER_ERROR, 1: R.LOST},
     R.USER_ERROR),
    # Two losses: the earlier death is the cause.
    ({0: lost(0, 8.0), 1: lost(1, 3.0), 2: exited(2, 0, ended_at=9.0)},
     {0: R.LOST, 1: R.LOST, 2: R.OK}, R.LOST),
])
def test_a_lost_replica_is_ordered_by_when_it_was_last_alive(
    statuses: dict[int, ReplicaStatus], verdicts: dict[int, Reason], reason: Reason
) -> None:
    named = {rank: Classification(why, f"rank {rank}: {why.value}", None, None, None)
             for rank, why in verdicts.items()}
    decided = cause(named, statuses)
    assert decided.reason is reason
    if reason is R.LOST:  # the earliest loss
        first = min((s.lost_at or 0.0, r) for r, s in statuses.items() if s.lost_at)[1]
        assert decided.message == f"rank {first}: LOST"


def test_stopped_peers_are_no_cause() -> None:
    statuses = {0: exited(0, -15), 1: exited(1, -15)}
    assert cause({0: verdict(R.STOPPED), 1: verdict(R.STOPPED)}, statuses).reason is R.STOPPED


@pytest.mark.parametrize(("status", "has_started"), [
    (RUNNING, True),
    (exited(0, 0), True),
    (ReplicaStatus(0, ReplicaPhase.EXITED, exit=ExitRecord(
        returncode=None, exit_code=None, signal=None, pid=None, start_ticks=None,
        started_at=None, ended_at=1.0, max_rss_bytes=None, spawn_error="ENOENT")), False),
    (ReplicaStatus(0, ReplicaPhase.STARTING), False),
    (LOST, False),
])
def test_started(status: ReplicaStatus, has_started: bool) -> None:
    assert started(status) is has_started


@pytest.mark.parametrize(("reason", "end"), [
    (R.OK, AttemptState.SUCCEEDED), (R.STOPPED, AttemptState.CANCELED),
    *((reason, AttemptState.FAILED) for reason in R if reason not in (R.OK, R.STOPPED)),
])
def test_attempt_end(reason: Reason, end: AttemptState) -> None:
    assert attempt_end(reason) is end
