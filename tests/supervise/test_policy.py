"""decide: the failure policy table, budget by budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from muster.config import FailurePolicy
from muster.states import Reason
from muster.supervise.policy import (
    INTERNAL_FAILURE_MESSAGE,
    Action,
    Budgets,
    Decision,
    decide,
)

DEFAULT = FailurePolicy()
NONE_USED = Budgets()
RETRY, FAIL = Action.RETRY, Action.FAIL


@pytest.mark.parametrize(
    ("reason", "used", "policy", "action", "charge"),
    [
        (Reason.OK, NONE_USED, DEFAULT, Action.SUCCEED, None),
        (Reason.OK, Budgets(9, 9, 9, 9), DEFAULT, Action.SUCCEED, None),
        (Reason.STOPPED, NONE_USED, DEFAULT, Action.CANCEL, None),
        (Reason.PERMANENT_ERROR, NONE_USED, DEFAULT, FAIL, None),
        (Reason.PERMANENT_ERROR, NONE_USED, FailurePolicy(retry_user_errors=5), FAIL, None),
        # user errors: only when the experiment asks for retries
        (Reason.USER_ERROR, NONE_USED, DEFAULT, FAIL, None),
        (
            Reason.USER_ERROR,
            NONE_USED,
            FailurePolicy(retry_user_errors=2),
            RETRY,
            "user_error_retries",
        ),
        (
            Reason.USER_ERROR,
            Budgets(user_error_retries=1),
            FailurePolicy(retry_user_errors=2),
            RETRY,
            "user_error_retries",
        ),
        (
            Reason.USER_ERROR,
            Budgets(user_error_retries=2),
            FailurePolicy(retry_user_errors=2),
            FAIL,
            None,
        ),
        # out of memory: not retried unless oom_retries allows it, whatever the other budgets
        (Reason.OOM, NONE_USED, DEFAULT, FAIL, None),
        (Reason.OOM, NONE_USED, FailurePolicy(retry_user_errors=5, trial_retries=5), FAIL, None),
        (Reason.OOM, NONE_USED, FailurePolicy(oom_retries=1), RETRY, "oom_retries"),
        (Reason.OOM, Budgets(oom_retries=1), FailurePolicy(oom_retries=1), FAIL, None),
        (Reason.OOM, Budgets(trial_retries=3), FailurePolicy(oom_retries=1), RETRY,
         "oom_retries"),
        # transient: the whole trial again
        (Reason.TRANSIENT, NONE_USED, DEFAULT, RETRY, "trial_retries"),
        (Reason.TRANSIENT, Budgets(trial_retries=2), DEFAULT, RETRY, "trial_retries"),
        (Reason.TRANSIENT, Budgets(trial_retries=3), DEFAULT, FAIL, None),
        (Reason.TRANSIENT, Budgets(replica_restarts=0, trial_retries=3), DEFAULT, FAIL, None),
        (Reason.TRANSIENT, NONE_USED, FailurePolicy(trial_retries=0), FAIL, None),
        # infra and lost: replica restarts first, then trial retries
        (Reason.INFRA, NONE_USED, DEFAULT, RETRY, "replica_restarts"),
        (Reason.INFRA, Budgets(replica_restarts=4), DEFAULT, RETRY, "replica_restarts"),
        (Reason.INFRA, Budgets(replica_restarts=5), DEFAULT, RETRY, "trial_retries"),
        (
            Reason.INFRA,
            Budgets(replica_restarts=5, trial_retries=2),
            DEFAULT,
            RETRY,
            "trial_retries",
        ),
        (Reason.INFRA, Budgets(replica_restarts=5, trial_retries=3), DEFAULT, FAIL, None),
        (Reason.INFRA, NONE_USED, FailurePolicy(replica_restarts=0), RETRY, "trial_retries"),
        (
            Reason.INFRA,
            NONE_USED,
            FailurePolicy(replica_restarts=0, trial_retries=0),
            FAIL,
            None,
        ),
        (Reason.LOST, NONE_USED, DEFAULT, RETRY, "replica_restarts"),
        (Reason.LOST, Budgets(replica_restarts=5), DEFAULT, RETRY, "trial_retries"),
        (Reason.LOST, Budgets(replica_restarts=5, trial_retries=3), DEFAULT, FAIL, None),
        (Reason.STALLED, NONE_USED, DEFAULT, RETRY, "replica_restarts"),
        (Reason.STALLED, Budgets(replica_restarts=5), DEFAULT, RETRY, "trial_retries"),
        (Reason.STALLED, Budgets(replica_restarts=5, trial_retries=3), DEFAULT, FAIL, None),
        # internal: muster's own failures
        (Reason.INTERNAL, NONE_USED, DEFAULT, RETRY, "internal_retries"),
        (Reason.INTERNAL, Budgets(internal_retries=1), DEFAULT, RETRY, "internal_retries"),
        (Reason.INTERNAL, Budgets(internal_retries=2), DEFAULT, FAIL, None),
        (Reason.INTERNAL, NONE_USED, FailurePolicy(internal_retries=0), FAIL, None),
    ],
)
def test_decisions(
    reason: Reason, used: Budgets, policy: FailurePolicy, action: Action, charge: str | None
) -> None:
    decision = decide(reason, used, policy)
    assert (decision.action, decision.charge) == (action, charge)


@pytest.mark.parametrize(
    ("reason", "used", "policy", "message"),
    [
        (
            Reason.TRANSIENT,
            Budgets(trial_retries=1),
            DEFAULT,
            "TRANSIENT failure; retrying the trial (retry 2 of 3)",
        ),
        (
            Reason.TRANSIENT,
            Budgets(trial_retries=3),
            DEFAULT,
            "TRANSIENT failure; giving up after 3 retries",
        ),
        (
            Reason.TRANSIENT,
            Budgets(trial_retries=1),
            FailurePolicy(trial_retries=1),
            "TRANSIENT failure; giving up after 1 retry",
        ),
        (
            Reason.INFRA,
            NONE_USED,
            DEFAULT,
            "INFRA failure; restarting the trial's replicas (restart 1 of 5)",
        ),
        (
            Reason.INFRA,
            Budgets(replica_restarts=2),
            FailurePolicy(restart_scope="replica"),
            "INFRA failure; restarting the replica (restart 3 of 5)",
        ),
        (
            Reason.LOST,
            Budgets(replica_restarts=5, trial_retries=1),
            DEFAULT,
            "LOST failure; retrying the trial (retry 2 of 3)",
        ),
        (
            Reason.LOST,
            Budgets(replica_restarts=5, trial_retries=3),
            DEFAULT,
            "LOST failure; giving up after 5 replica restarts and 3 trial retries",
        ),
        (
            Reason.USER_ERROR,
            NONE_USED,
            DEFAULT,
            "USER_ERROR failure; not retried (retry_user_errors is 0)",
        ),
        (
            Reason.USER_ERROR,
            NONE_USED,
            FailurePolicy(retry_user_errors=2),
            "USER_ERROR failure; retrying the trial (retry 1 of 2)",
        ),
        (
            Reason.USER_ERROR,
            Budgets(user_error_retries=2),
            FailurePolicy(retry_user_errors=2),
            "USER_ERROR failure; giving up after 2 retries",
        ),
        (
            Reason.PERMANENT_ERROR,
            NONE_USED,
            DEFAULT,
            "PERMANENT_ERROR failure; not retried, since a retry would fail the same way",
        ),
        (
            Reason.OOM,
            NONE_USED,
            DEFAULT,
            "OOM failure; not retried (oom_retries is 0), since a retry would run out of "
            "memory the same way",
        ),
        (
            Reason.OOM,
            Budgets(oom_retries=1),
            FailurePolicy(oom_retries=2),
            "OOM failure; retrying the trial (retry 2 of 2)",
        ),
        (
            Reason.OOM,
            Budgets(oom_retries=2),
            FailurePolicy(oom_retries=2),
            "OOM failure; giving up after 2 retries",
        ),
        (
            Reason.INTERNAL,
            NONE_USED,
            DEFAULT,
            "INTERNAL failure; retrying the attempt (retry 1 of 2)",
        ),
        (
            Reason.INTERNAL,
            Budgets(internal_retries=2),
            DEFAULT,
            "Internal error occurred for the current attempt",
        ),
        (Reason.OK, NONE_USED, DEFAULT, "OK; the attempt succeeded, pending verification"),
        (Reason.STOPPED, NONE_USED, DEFAULT, "STOPPED by muster on request; not a failure"),
    ],
)
def test_messages(reason: Reason, used: Budgets, policy: FailurePolicy, message: str) -> None:
    assert decide(reason, used, policy).message == message


def test_internal_failure_message_is_exact() -> None:
    decision = decide(Reason.INTERNAL, Budgets(internal_retries=2), DEFAULT)
    assert decision == Decision(Action.FAIL, None, INTERNAL_FAILURE_MESSAGE)
    assert INTERNAL_FAILURE_MESSAGE == "Internal error occurred for the current attempt"


def test_budgets_charged_counts_one_use() -> None:
    used = Budgets(replica_restarts=1).charged("replica_restarts").charged("trial_retries")
    assert used == Budgets(replica_restarts=2, trial_retries=1)


def test_infra_walks_through_every_budget_then_fails() -> None:
    """Five in-place restarts, then three trial retries, then the trial fails."""
    used, charges = NONE_USED, []
    while (decision := decide(Reason.INFRA, used, DEFAULT)).action is RETRY:
        assert decision.charge is not None
        charges.append(decision.charge)
        used = used.charged(decision.charge)
    assert charges == ["replica_restarts"] * 5 + ["trial_retries"] * 3
    assert used.user_error_retries == 0 and used.internal_retries == 0


_BUDGETS = st.builds(Budgets, *(st.integers(0, 8) for _ in range(5)))
_POLICIES = st.builds(
    FailurePolicy,
    replica_restarts=st.integers(0, 6),
    trial_retries=st.integers(0, 6),
    internal_retries=st.integers(0, 6),
    retry_user_errors=st.integers(0, 6),
    oom_retries=st.integers(0, 6),
    restart_scope=st.sampled_from(["trial", "replica"]),
)
_LIMIT = {
    "replica_restarts": "replica_restarts",
    "trial_retries": "trial_retries",
    "internal_retries": "internal_retries",
    "user_error_retries": "retry_user_errors",
    "oom_retries": "oom_retries",
}


@given(st.sampled_from(Reason), _BUDGETS, _POLICIES)
def test_a_retry_always_fits_its_budget(
    reason: Reason, used: Budgets, policy: FailurePolicy
) -> None:
    decision = decide(reason, used, policy)
    assert decision.message
    if decision.action is RETRY:
        assert decision.charge is not None
        assert getattr(used, decision.charge) < getattr(policy, _LIMIT[decision.charge])
    else:
        assert decision.charge is None


@given(
    st.sampled_from([Reason.INFRA, Reason.LOST, Reason.TRANSIENT, Reason.INTERNAL]),
    _BUDGETS,
    _POLICIES,
)
def test_infrastructure_never_charges_the_user_budget(
    reason: Reason, used: Budgets, policy: FailurePolicy
) -> None:
    assert decide(reason, used, policy).charge != "user_error_retries"


@given(_BUDGETS, _POLICIES)
def test_oom_charges_its_own_budget_alone(used: Budgets, policy: FailurePolicy) -> None:
    """An OOM retry never uses the budgets of other failures, nor they its."""
    assert decide(Reason.OOM, used, policy).charge in (None, "oom_retries")
    for reason in Reason:
        if reason is not Reason.OOM:
            assert decide(reason, used, policy).charge != "oom_retries"
