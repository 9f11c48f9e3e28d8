"""The failure policy: what to do after a replica ended, given why and what is used up.

One pure function, `decide`; the supervisor applies its decision (state changes, budget
counters, new attempts). The budgets and their defaults are ARCHITECTURE.md's table, set
per experiment in `failure_policy`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Literal, assert_never

from muster.config.schema import FailurePolicy
from muster.states import Reason
from muster.words import count

__all__ = ["COUNTED_BY_ATTEMPTS", "INTERNAL_FAILURE_MESSAGE", "Action", "Budget", "Budgets",
           "Decision", "decide"]

INTERNAL_FAILURE_MESSAGE = "Internal error occurred for the current attempt"

Budget = Literal["replica_restarts", "trial_retries", "internal_retries", "user_error_retries",
                 "oom_retries"]
# Budgets the trial's attempts count themselves (a retry is a new attempt ended for that
# reason), rather than a counter on the trial that a retry increments.
COUNTED_BY_ATTEMPTS: frozenset[Budget] = frozenset({"oom_retries"})


class Action(str, Enum):
    SUCCEED = "SUCCEED"  # go on to verification
    FAIL = "FAIL"
    RETRY = "RETRY"  # start a new attempt, charging `Decision.charge`
    CANCEL = "CANCEL"  # muster stopped it on request: not a failure


@dataclass(frozen=True)
class Budgets:
    """How many restarts/retries of each kind a trial has used so far."""

    replica_restarts: int = 0
    trial_retries: int = 0
    internal_retries: int = 0
    user_error_retries: int = 0
    oom_retries: int = 0

    def charged(self, budget: Budget) -> Budgets:
        """These budgets after one more use of `budget`."""
        used: int = getattr(self, budget)
        return dataclasses.replace(self, **{budget: used + 1})


@dataclass(frozen=True)
class Decision:
    action: Action
    charge: Budget | None  # the `Budgets` field a RETRY uses up; None for other actions
    message: str


def decide(reason: Reason, used: Budgets, policy: FailurePolicy) -> Decision:
    """What to do about a replica that ended for `reason`."""
    if reason is Reason.OK:
        return Decision(Action.SUCCEED, None, "OK; the attempt succeeded, pending verification")
    if reason is Reason.STOPPED:
        return Decision(Action.CANCEL, None, "STOPPED by muster on request; not a failure")
    if reason is Reason.PERMANENT_ERROR:
        message = "PERMANENT_ERROR failure; not retried, since a retry would fail the same way"
        return Decision(Action.FAIL, None, message)
    if reason is Reason.USER_ERROR:
        return _user_error(used, policy)
    if reason is Reason.OOM:
        return _oom(used, policy)
    if reason is Reason.TRANSIENT:
        return _trial_retry(reason, used, policy) or _give_up(
            f"{reason} failure; giving up after {count(policy.trial_retries, 'retry')}"
        )
    if reason is Reason.INFRA or reason is Reason.LOST or reason is Reason.STALLED:
        return _infra(reason, used, policy)
    if reason is Reason.INTERNAL:
        return _internal(used, policy)
    if reason is Reason.CAPACITY:  # no replica ends so: the wait is before any launch, and
        # its retries are `capacity_retries` (`supervise/placement.py`)
        return _give_up("CAPACITY failure; the cluster had no room for the replica set")
    assert_never(reason)  # mypy fails here when a new Reason has no rule yet


def _user_error(used: Budgets, policy: FailurePolicy) -> Decision:
    """The user's code failed: retried only when the experiment asks for it."""
    limit = policy.retry_user_errors
    if limit == 0:
        return _give_up("USER_ERROR failure; not retried (retry_user_errors is 0)")
    if used.user_error_retries < limit:
        attempt = used.user_error_retries + 1
        message = f"USER_ERROR failure; retrying the trial (retry {attempt} of {limit})"
        return Decision(Action.RETRY, "user_error_retries", message)
    return _give_up(f"USER_ERROR failure; giving up after {count(limit, 'retry')}")


def _oom(used: Budgets, policy: FailurePolicy) -> Decision:
    """Out of memory: a retry would most likely run out of memory the same way, so only
    as many as the experiment asks for."""
    limit = policy.oom_retries
    if limit == 0:
        return _give_up("OOM failure; not retried (oom_retries is 0), since a retry would run "
                        "out of memory the same way")
    if used.oom_retries < limit:
        attempt = used.oom_retries + 1
        message = f"OOM failure; retrying the trial (retry {attempt} of {limit})"
        return Decision(Action.RETRY, "oom_retries", message)
    return _give_up(f"OOM failure; giving up after {count(limit, 'retry')}")


def _infra(reason: Reason, used: Budgets, policy: FailurePolicy) -> Decision:
    """The machine, not the code, failed: restart in place first, then retry the trial.

    Never charged to the user-error budget: a flaky node is not the user's fault.
    """
    limit = policy.replica_restarts
    if used.replica_restarts < limit:
        what = "the replica" if policy.restart_scope == "replica" else "the trial's replicas"
        number = used.replica_restarts + 1
        message = f"{reason} failure; restarting {what} (restart {number} of {limit})"
        return Decision(Action.RETRY, "replica_restarts", message)
    return _trial_retry(reason, used, policy) or _give_up(
        f"{reason} failure; giving up after {count(limit, 'replica restart')} "
        f"and {count(policy.trial_retries, 'trial retry')}"
    )


def _internal(used: Budgets, policy: FailurePolicy) -> Decision:
    """muster itself failed; the wording of the final failure is fixed by the spec."""
    limit = policy.internal_retries
    if used.internal_retries < limit:
        attempt = used.internal_retries + 1
        message = f"INTERNAL failure; retrying the attempt (retry {attempt} of {limit})"
        return Decision(Action.RETRY, "internal_retries", message)
    return _give_up(INTERNAL_FAILURE_MESSAGE)


def _trial_retry(reason: Reason, used: Budgets, policy: FailurePolicy) -> Decision | None:
    """A RETRY charged to `trial_retries`, or None when they are used up."""
    limit = policy.trial_retries
    if used.trial_retries >= limit:
        return None
    attempt = used.trial_retries + 1
    message = f"{reason} failure; retrying the trial (retry {attempt} of {limit})"
    return Decision(Action.RETRY, "trial_retries", message)


def _give_up(message: str) -> Decision:
    return Decision(Action.FAIL, None, message)

