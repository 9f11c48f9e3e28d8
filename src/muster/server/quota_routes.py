"""HTTP routes of quotas and groups (`muster quota`, `muster group`). Thin, like
`muster.server.routes`: everyone reads; the services let admins alone change anything."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi import Path as InPath

from muster import api as shapes
from muster.server import api
from muster.server.routes import COMMON, PREFIX, Reader, State, _errors, allow, authenticated
from muster.services import groups, quotas
from muster.services.access import Action, Principal
from muster.states import QuotaLimit, QuotaSubject

__all__ = ["router"]

router = APIRouter(prefix=PREFIX, dependencies=[Depends(authenticated)],
                   responses=_errors(*COMMON))
QuotaAdmin = Annotated[Principal, Depends(allow(Action.MANAGE_QUOTAS))]
GroupAdmin = Annotated[Principal, Depends(allow(Action.MANAGE_GROUPS))]
_NAME = r"^[a-z_][a-z0-9_.-]*$"
UserPath = Annotated[str, InPath(min_length=1, max_length=32, pattern=_NAME,
                                 description="a user's name")]
GroupPath = Annotated[str, InPath(min_length=1, max_length=32, pattern=_NAME,
                                  description="a group's name")]
Limits = Annotated[list[QuotaLimit] | None, Query(
    max_length=len(QuotaLimit),
    description="the limits to clear (repeat it); none: every limit set at runtime")]


@router.get("/quotas", response_model=api.many(api.QuotaView))
def list_quotas(state: State, _: Reader) -> list[shapes.QuotaView]:
    """The default quota, every user's and group's that limits anything, with what their
    users hold now, and where each limit comes from (an admin's, or the cluster config's)."""
    return quotas.list_quotas(state.store, state.platform.quotas)


@router.get("/quotas/users/{name}", response_model=api.UserQuotas, responses=_errors(404))
def get_user_quotas(state: State, _: Reader, name: UserPath) -> shapes.UserQuotas:
    """What one user is held to: their own quota and each of their groups'."""
    return quotas.user_quotas(state.store, state.platform.quotas, name)


@router.patch("/quotas/users/{name}", response_model=api.QuotaView, responses=_errors(400, 404))
def set_user_quota(state: State, name: UserPath, body: api.QuotaSetRequest, who: QuotaAdmin
                   ) -> shapes.QuotaView:
    """Set limits of a user's own quota (admins); they win over the cluster config's."""
    return _set(state, who, QuotaSubject.USER, name, body)


@router.patch("/quotas/groups/{name}", response_model=api.QuotaView, responses=_errors(400, 404))
def set_group_quota(state: State, name: GroupPath, body: api.QuotaSetRequest,
                    who: QuotaAdmin) -> shapes.QuotaView:
    """Set limits of a group's quota, which its members share (admins)."""
    return _set(state, who, QuotaSubject.GROUP, name, body)


@router.patch("/quotas/default", response_model=api.QuotaView, responses=_errors(400))
def set_default_quota(state: State, body: api.QuotaSetRequest, who: QuotaAdmin
                      ) -> shapes.QuotaView:
    """Set limits of the default quota: each user's own, where nothing more specific names
    the limit (admins)."""
    return _set(state, who, QuotaSubject.DEFAULT, None, body)


@router.delete("/quotas/users/{name}", response_model=api.QuotaView, responses=_errors(404))
def clear_user_quota(state: State, name: UserPath, who: QuotaAdmin, limit: Limits = None
                     ) -> shapes.QuotaView:
    """Clear limits an admin set for a user: the cluster config's apply again."""
    return _clear(state, who, QuotaSubject.USER, name, limit)


@router.delete("/quotas/groups/{name}", response_model=api.QuotaView, responses=_errors(404))
def clear_group_quota(state: State, name: GroupPath, who: QuotaAdmin, limit: Limits = None
                      ) -> shapes.QuotaView:
    """Clear limits an admin set for a group: the cluster config's apply again."""
    return _clear(state, who, QuotaSubject.GROUP, name, limit)


@router.delete("/quotas/default", response_model=api.QuotaView)
def clear_default_quota(state: State, who: QuotaAdmin, limit: Limits = None
                        ) -> shapes.QuotaView:
    """Clear limits an admin set for the default: the cluster config's apply again."""
    return _clear(state, who, QuotaSubject.DEFAULT, None, limit)


def _set(state: State, who: Principal, subject: QuotaSubject, name: str | None,
         body: api.QuotaSetRequest) -> shapes.QuotaView:
    view = quotas.set_limits(state.store, state.platform.quotas, who, subject, name,
                             body.named())
    state.orchestrator.wake.set()  # the queue may start what the new limits allow
    return view


def _clear(state: State, who: Principal, subject: QuotaSubject, name: str | None,
           limits: list[QuotaLimit] | None) -> shapes.QuotaView:
    view = quotas.clear_limits(state.store, state.platform.quotas, who, subject, name,
                               limits or ())
    state.orchestrator.wake.set()
    return view


@router.get("/groups", response_model=api.many(api.GroupView))
def list_groups(state: State, _: Reader) -> list[shapes.GroupView]:
    """Every group, with its members."""
    return groups.list_groups(state.store)


@router.post("/groups", status_code=201, response_model=api.GroupView,
             responses=_errors(400, 409))
def create_group(state: State, body: api.GroupCreateRequest, who: GroupAdmin
                 ) -> shapes.GroupView:
    """A new, empty group (admins)."""
    return groups.create_group(state.store, who, body.name, body.description)


@router.get("/groups/{name}", response_model=api.GroupView, responses=_errors(404))
def get_group(state: State, _: Reader, name: GroupPath) -> shapes.GroupView:
    return groups.get_group(state.store, name)


@router.delete("/groups/{name}", response_model=api.GroupView, responses=_errors(404))
def delete_group(state: State, name: GroupPath, who: GroupAdmin) -> shapes.GroupView:
    """Delete a group, its memberships and its runtime limits (admins)."""
    view = groups.delete_group(state.store, who, name)
    state.orchestrator.wake.set()
    return view


@router.post("/groups/{name}/members", response_model=api.GroupView,
             responses=_errors(400, 404))
def add_members(state: State, name: GroupPath, body: api.GroupMembersRequest,
                who: GroupAdmin) -> shapes.GroupView:
    """Add users to a group (admins); nobody is added when one of them does not exist."""
    view = groups.add_members(state.store, who, name, body.users)
    state.orchestrator.wake.set()
    return view


@router.delete("/groups/{name}/members/{user}", response_model=api.GroupView,
               responses=_errors(404))
def remove_member(state: State, name: GroupPath, user: UserPath, who: GroupAdmin
                  ) -> shapes.GroupView:
    """Remove a user from a group (admins)."""
    view = groups.remove_members(state.store, who, name, [user])
    state.orchestrator.wake.set()
    return view
