"""What an attempt's ends mean, and what the trial does next. Pure: table-tested, no I/O.

- `decided_by`: the end that decides a live attempt (the primary's, or a failure), if any;
- `cause`: the verdict an ended attempt ends with (the first failure in time, by when each
  end happened, not when it was noticed; else the primary's);
- `next_move`: the whole ladder of what follows an attempt's end, from the trial's state,
  muster's stop intent (kill, pause, preempt, early stop) and the failure policy's
  `decide()`; `muster.supervise.ending` carries the move out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from muster.config import FailurePolicy
from muster.launch.base import ExitRecord, ReplicaStatus
from muster.launch.exits import Classification
from muster.states import AttemptState, EventReason, Reason, ReplicaPhase, StopIntent, TrialState
from muster.supervise.policy import Action, Budget, Budgets, decide

__all__ = ["Move", "Next", "attempt_end", "cause", "decided_by", "end_time", "ended_cleanly",
           "exited_cleanly", "next_move", "started"]

Why = Reason | EventReason


def started(status: ReplicaStatus) -> bool:
    """The replica's training process has started (it may have ended already)."""
    if status.phase is ReplicaPhase.RUNNING:
        return True
    return (status.phase is ReplicaPhase.EXITED and status.exit is not None
            and status.exit.pid is not None)


def ended_cleanly(record: ExitRecord) -> bool:
    return record.spawn_error is None and record.returncode == 0 and record.signal is None


def exited_cleanly(status: ReplicaStatus) -> bool:
    return status.exit is not None and ended_cleanly(status.exit)


def decided_by(statuses: Sequence[ReplicaStatus]) -> ReplicaStatus | None:
    """The end that decides the attempt, if one has happened: the primary (rank 0) ended,
    or another replica failed or was lost. A non-primary that exits 0 decides nothing (it
    finished its share; the primary has the last word)."""
    for status in statuses:
        if status.phase is ReplicaPhase.LOST:
            return status
        if status.phase is ReplicaPhase.EXITED and status.exit is not None and (
            status.rank == 0 or not ended_cleanly(status.exit)
        ):
            return status
    return None


def cause(verdicts: Mapping[int, Classification],
          statuses: Mapping[int, ReplicaStatus]) -> Classification:
    """The verdict the attempt ends with: the first failure in time (the replica the machine
    killed, not its peers that then lost their connection to it); else the primary's (OK,
    or STOPPED when muster was asked to stop the trial). Once the primary has exited 0 it
    has the last word: a peer failing after that (in its teardown, say) is recorded on its
    replica but does not fail the trial.

    Ends are ordered by when they happened, never by when muster noticed them: a LOST
    replica (its node died, say) by the last time it was known alive (`lost_at`), as it may
    have died any moment after. A peer lost before the primary's exit 0 therefore fails the
    attempt even when Ray reports it only later; one whose death time is unknown orders
    last."""
    def ended(rank: int) -> tuple[float, int]:
        return (end_time(statuses[rank]), rank)

    failed = [rank for rank, v in verdicts.items() if v.reason not in (Reason.OK, Reason.STOPPED)]
    primary = verdicts[0]
    if primary.reason is Reason.OK:
        failed = [rank for rank in failed if ended(rank) < ended(0)]
    return verdicts[min(failed, key=ended)] if failed else primary


def end_time(status: ReplicaStatus) -> float:
    """When the replica ended, as far as muster knows: its exit record's time, else (LOST)
    the last time it was known alive; +inf when neither is known."""
    if status.exit is not None:
        return status.exit.ended_at
    if status.lost_at is not None:
        return status.lost_at
    return float("inf")


def attempt_end(reason: Reason) -> AttemptState:
    """The state an attempt ends in, by its cause."""
    if reason is Reason.OK:
        return AttemptState.SUCCEEDED
    if reason is Reason.STOPPED:
        return AttemptState.CANCELED
    return AttemptState.FAILED


class Next(str, Enum):
    """What the trial does once an attempt has ended."""

    NOTE = "note"  # it was at rest already (reviewed while a process ran): record, move nothing
    CANCEL = "cancel"  # CANCELED: muster stopped it on request
    VERIFY = "verify"  # exit 0: verification makes it SUCCEEDED or SUSPECT
    FAIL = "fail"
    RETRY = "retry"  # RESTARTING, charging `Move.charge`
    PAUSE = "pause"  # PAUSED (and back in the queue while its experiment is active)


@dataclass(frozen=True)
class Move:
    """The trial's next move: the reason and message of the move (or the note), and the
    decision event recorded before it, if any."""

    next: Next
    reason: Why
    message: str
    decision: str | None = None  # a decision event's message, recorded with `reason`
    charge: Budget | None = None  # the budget a RETRY uses up
    early_stopped: bool = False  # VERIFY as a run the searcher cut short by design
    clear_intent: bool = False  # the stop intent has done its work


def next_move(state: TrialState, intent: StopIntent | None, verdict: Classification,
              used: Budgets, policy: FailurePolicy) -> Move:
    """The move that follows an attempt that ended with `verdict`.

    Args:
        state: the trial's state now (a review may have resolved it while a process ran).
        intent: why muster was stopping it, if it was (`Trial.intent`: a kill wins).
        used: the budgets the trial has used so far.
    """
    why, message = verdict.reason, verdict.message
    if state.is_at_rest():
        return Move(Next.NOTE, why, f"an attempt ended after the trial was {state}: "
                                    f"{message}")
    decision = decide(why, used, policy)
    if intent is StopIntent.KILL and decision.action is not Action.SUCCEED:
        return Move(Next.CANCEL, EventReason.KILLED, message)
    if intent is StopIntent.EARLY_STOP:
        early = _early_stopped(why, message, decision.charge is not None)
        if early is not None:
            return early
    if intent in StopIntent.pausing() and why is Reason.STOPPED:
        # A stop it asked for: no failure, no budget.
        return Move(Next.PAUSE, intent.event_reason, message, clear_intent=True)
    if decision.action is Action.SUCCEED:
        return Move(Next.VERIFY, why, message)
    if decision.action is Action.CANCEL:
        return Move(Next.CANCEL, why, message)
    if decision.action is Action.FAIL:
        # The give-up is a decision too: it says which budget ran out, or why none applies.
        shown = f"{decision.message}: {message}" if why is Reason.INTERNAL else message
        return Move(Next.FAIL, why, shown, decision=decision.message)
    if decision.charge is None:
        raise ValueError(f"the failure policy chose {decision.action.value} for {why} "
                         "without naming a budget; this is a bug in muster")
    # The decision event says what happens next; the move says what ended.
    return Move(Next.RETRY, why, message, decision=decision.message, charge=decision.charge)


def _early_stopped(why: Reason, message: str, would_retry: bool) -> Move | None:
    """The move of a trial the searcher was stopping, where it differs from the others'."""
    if why is Reason.STOPPED:
        # The searcher's stop: its results up to there count; not a failure.
        return Move(Next.VERIFY, EventReason.EARLY_STOP, message, early_stopped=True,
                    clear_intent=True)
    if why is Reason.OK:
        # It finished its whole run before the stop reached it: an ordinary success.
        return Move(Next.VERIFY, why, message, clear_intent=True)
    if would_retry:
        # It failed before the searcher's stop reached it: a failure, but not restarted.
        return Move(Next.FAIL, why, message,
                    decision="not restarted: the searcher had stopped it early")
    return None
