"""The authorisation table (`muster.services.access`) as a table: every action, every role,
on one's own experiment and on someone else's."""

from __future__ import annotations

import pytest

from muster.errors import Forbidden
from muster.services.access import RULES, Action, Principal, authorize, check_priority_floor
from muster.states import Role

ALICE = {role: Principal(user_id=1, name="alice", role=role) for role in Role}
OWN, OTHERS = "alice", "bob"

A = Action
# action: (viewer, user on its own, user on another's, admin on another's)
TABLE = {
    A.READ: (True, True, True, True),
    A.SUBMIT: (False, True, True, True),
    A.KILL: (False, True, False, True),
    A.PAUSE: (False, True, False, True),
    A.ACTIVATE: (False, True, False, True),
    A.RESTART: (False, True, False, True),
    A.SET_PRIORITY: (False, True, False, True),
    A.REVIEW: (False, True, False, True),
    A.DUMP: (False, True, False, True),
    A.DELETE: (False, True, False, True),
    A.ARCHIVE: (False, True, False, True),
    A.COLLECT: (False, True, False, True),
    A.OWN_ACCOUNT: (True, True, True, True),
    A.PRUNE_ENVIRONMENTS: (False, False, False, True),
    A.MANAGE_USERS: (False, False, False, True),
    A.MANAGE_NODES: (False, False, False, True),
    A.REGISTER_MODEL: (False, True, False, True),
    A.MANAGE_MODEL: (False, True, False, True),
    A.DELETE_MODEL: (False, False, False, True),
    A.MANAGE_QUOTAS: (False, False, False, True),
    A.MANAGE_GROUPS: (False, False, False, True),
    A.SWEEP_RETENTION: (False, False, False, True),
}


def allowed(principal: Principal, action: Action, owner: str) -> bool:
    try:
        authorize(principal, action, owner=owner, subject="experiment 12")
    except Forbidden:
        return False
    return True


def test_the_table_covers_every_action() -> None:
    assert set(TABLE) == set(Action) == set(RULES)


@pytest.mark.parametrize("action", list(Action))
def test_who_may(action: Action) -> None:
    viewer, user_own, user_other, admin_other = TABLE[action]
    assert allowed(ALICE[Role.VIEWER], action, OWN) is viewer
    assert allowed(ALICE[Role.USER], action, OWN) is user_own
    assert allowed(ALICE[Role.USER], action, OTHERS) is user_other
    assert allowed(ALICE[Role.ADMIN], action, OTHERS) is admin_other


def test_a_refusal_names_the_owner_and_who_may() -> None:
    with pytest.raises(Forbidden) as refused:
        authorize(ALICE[Role.USER], A.KILL, owner=OTHERS, subject="experiment 12")
    assert str(refused.value) == ("experiment 12 belongs to bob; only bob or an admin can "
                                  "kill it")
    with pytest.raises(Forbidden, match="experiment 3 has no owner; only an admin can pause"):
        authorize(ALICE[Role.USER], A.PAUSE, owner=None, subject="experiment 3")


def test_a_role_refusal_says_which_role_it_takes_and_how_to_get_it() -> None:
    with pytest.raises(Forbidden) as refused:
        authorize(ALICE[Role.VIEWER], A.KILL)
    assert str(refused.value) == (
        "viewer alice cannot kill: it takes the admin or user role (the viewer role only "
        "reads); an admin can give you the user role (muster user edit alice --role user)")
    with pytest.raises(Forbidden, match=r"user alice cannot manage users .* admin role"):
        authorize(ALICE[Role.USER], A.MANAGE_USERS)


@pytest.mark.parametrize(("role", "priority", "ok"), [
    (Role.USER, 10, True), (Role.USER, 9, False), (Role.USER, 1, False),
    (Role.ADMIN, 1, True), (Role.USER, 99, True),
])
def test_priorities_better_than_the_floor_are_admins_alone(
    role: Role, priority: int, ok: bool
) -> None:
    if ok:
        check_priority_floor(ALICE[role], priority, floor=10)
        return
    with pytest.raises(Forbidden, match=f"priority {priority} is reserved for admins: users "
                                        "may use 10 to 99"):
        check_priority_floor(ALICE[role], priority, floor=10)
