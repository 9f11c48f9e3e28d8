"""Groups of users (`muster group`), as Determined's user groups: admins create and delete
them and add and remove members; everyone reads them. A group's quota holds its members
together (`muster.schedule.quotas`); a user may be in several groups, and is held to each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from muster import api
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.services.access import Action, Principal, authorize
from muster.states import EventReason, QuotaSubject
from muster.store import Group, GroupMember, Quota, Store, User, record_event
from muster.words import count

__all__ = ["MAX_GROUPS", "MAX_MEMBERS_PER_REQUEST", "add_members", "create_group",
           "delete_group", "get_group", "list_groups", "remove_members"]

MAX_GROUPS = 1000
MAX_MEMBERS_PER_REQUEST = 1000
MAX_DESCRIPTION = 200
NAME_PATTERN = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")  # as a user's (`services.users`)


def list_groups(store: Store) -> list[api.GroupView]:
    """Every group, by name, with its members."""
    with store.session_scope() as s:
        return [_view(s, group) for group in s.scalars(select(Group).order_by(Group.name))]


def get_group(store: Store, name: str) -> api.GroupView:
    """Raises NotFound for a group that does not exist."""
    with store.session_scope() as s:
        return _view(s, _group(s, name))


def create_group(store: Store, who: Principal, name: str, description: str = ""
                 ) -> api.GroupView:
    """A new, empty group (admins only).

    Raises:
        InvalidRequest: the name or description is not one a group may have.
        Conflict: a group of that name exists, or there are MAX_GROUPS already.
    """
    authorize(who, Action.MANAGE_GROUPS)
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidRequest(f"{name!r} is not a group name: a lowercase letter or '_' first, "
                             "then a-z, 0-9, '_', '.', '-', at most 32 characters")
    if len(description) > MAX_DESCRIPTION or "\x00" in description:
        raise InvalidRequest(f"a group's description is at most {MAX_DESCRIPTION} characters "
                             "(no NUL)")
    with store.session_scope() as s:
        if len(s.scalars(select(Group.id).limit(MAX_GROUPS)).all()) >= MAX_GROUPS:
            raise Conflict(f"there are {MAX_GROUPS} groups already, as many as a server "
                           "keeps; delete some (muster group delete NAME)")
        made = s.scalar(_insert_if_absent(s, Group, {"name": name,
                                                     "description": description})
                        .returning(Group.id))
        if made is None:
            raise Conflict(f"group {name!r} exists already (muster group describe {name})")
        group = _group(s, name)
        _record(s, who, group, "created")
        return _view(s, group)


def delete_group(store: Store, who: Principal, name: str) -> api.GroupView:
    """Delete a group, its memberships and the limits set for it at runtime (its members'
    trials are no longer held to its quota from the next pass on). Returns what it was.

    Raises:
        NotFound: there is no such group.
    """
    authorize(who, Action.MANAGE_GROUPS)
    with store.session_scope() as s:
        group = _group(s, name)
        view = _view(s, group)
        s.execute(delete(Quota).where(Quota.subject == QuotaSubject.GROUP,
                                      Quota.subject_id == group.id))
        s.execute(delete(GroupMember).where(GroupMember.group_id == group.id))
        _record(s, who, group, f"deleted (it had {count(len(view['members']), 'member')})")
        s.delete(group)
        return view


def add_members(store: Store, who: Principal, name: str, users: Sequence[str]
                ) -> api.GroupView:
    """Add users to a group (one already in it stays, once).

    Raises:
        InvalidRequest: no users, or more than MAX_MEMBERS_PER_REQUEST.
        NotFound: no such group, or no such user (then nobody is added).
    """
    authorize(who, Action.MANAGE_GROUPS)
    _check_count(users)
    with store.session_scope() as s:
        group = _group(s, name)
        ids = _user_ids(s, users)
        for user_id in ids.values():
            s.execute(_insert_if_absent(s, GroupMember, {"group_id": group.id,
                                                         "user_id": user_id}))
        _record(s, who, group, f"added {', '.join(sorted(ids))}")
        return _view(s, group)


def remove_members(store: Store, who: Principal, name: str, users: Sequence[str]
                   ) -> api.GroupView:
    """Remove users from a group (one not in it is no error).

    Raises:
        InvalidRequest: no users, or more than MAX_MEMBERS_PER_REQUEST.
        NotFound: no such group, or no such user (then nobody is removed).
    """
    authorize(who, Action.MANAGE_GROUPS)
    _check_count(users)
    with store.session_scope() as s:
        group = _group(s, name)
        ids = _user_ids(s, users)
        s.execute(delete(GroupMember).where(GroupMember.group_id == group.id,
                                            GroupMember.user_id.in_(ids.values())))
        _record(s, who, group, f"removed {', '.join(sorted(ids))}")
        return _view(s, group)


def _check_count(users: Sequence[str]) -> None:
    if not users or len(users) > MAX_MEMBERS_PER_REQUEST:
        raise InvalidRequest(f"name 1 to {MAX_MEMBERS_PER_REQUEST} users, got {len(users)}")


def _group(s: Session, name: str) -> Group:
    group = s.scalar(select(Group).where(Group.name == name))
    if group is None:
        raise NotFound(f"no group {name!r}; `muster group list` shows them")
    return group


def _user_ids(s: Session, names: Sequence[str]) -> dict[str, int]:
    found = {name: user_id for name, user_id in s.execute(
        select(User.name, User.id).where(User.name.in_(set(names))))}
    missing = sorted(set(names) - set(found))
    if missing:
        raise NotFound(f"no user {', '.join(map(repr, missing))}; `muster user list` shows "
                       "them; nobody was changed")
    return found


def _view(s: Session, group: Group) -> api.GroupView:
    members = s.scalars(select(User.name).join(GroupMember, GroupMember.user_id == User.id)
                        .where(GroupMember.group_id == group.id).order_by(User.name)).all()
    return {"name": group.name, "description": group.description, "members": list(members),
            "created_at": group.created_at}


def _insert_if_absent(s: Session, model: type[Group | GroupMember],
                      values: dict[str, object]) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING: a row a concurrent request inserted is kept."""
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    statement: Insert = dialect.insert(model).values(**values).on_conflict_do_nothing()
    return statement


def _record(s: Session, who: Principal, group: Group, what: str) -> None:
    record_event(s, entity="group", entity_id=group.id, reason=EventReason.GROUP_CHANGED,
                 actor=who.name, message=f"group {group.name}: {what}")
