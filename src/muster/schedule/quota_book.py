"""The quotas as the store and the cluster config hold them (`muster.schedule.quotas`
decides with them), and the one check of queued trials that creates and the searcher's
draws share.

A user's queued trials are counted, and new ones recorded, under a lock on the user's row
and on each of their groups' rows (in that order: the user, then the groups by id), in the
transaction that inserts them: two creates of one user, or of two members of one group,
cannot both see room for one more. (SQLite's transactions, BEGIN IMMEDIATE, are one at a
time anyway.)
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from muster.config.quotas import QuotasConfig
from muster.schedule.quotas import (
    Constraint,
    Directory,
    QuotaBook,
    RuntimeLimits,
    build_book,
    queued_refusal,
)
from muster.states import QuotaLimit, QuotaSubject, TrialState
from muster.store import Experiment, Group, GroupMember, Quota, Trial, User

__all__ = ["lock_and_refuse_queued", "queued_counts", "read_book", "read_directory",
           "read_runtime"]


def read_runtime(s: Session) -> RuntimeLimits:
    """The limits admins set (`muster quota set`), by subject."""
    found: dict[tuple[QuotaSubject, int], dict[QuotaLimit, int | None]] = defaultdict(dict)
    for subject, subject_id, kind, value in s.execute(
            select(Quota.subject, Quota.subject_id, Quota.kind, Quota.value)):
        found[subject, subject_id][kind] = value
    return found


def read_directory(s: Session) -> Directory:
    """Every user and group, and each group's members."""
    members: dict[int, list[int]] = defaultdict(list)
    for group_id, user_id in s.execute(select(GroupMember.group_id, GroupMember.user_id)
                                       .order_by(GroupMember.group_id, GroupMember.user_id)):
        members[group_id].append(user_id)
    users = {user_id: name for user_id, name in s.execute(select(User.id, User.name))}
    groups = {group_id: name for group_id, name in s.execute(select(Group.id, Group.name))}
    return Directory(users=users, groups=groups, members=members)


def read_book(s: Session, config: QuotasConfig) -> QuotaBook:
    """Every user's constraints now; one small query when nothing is limited anywhere."""
    runtime = read_runtime(s)
    if not runtime and config.empty:
        return QuotaBook()
    return build_book(config, runtime, read_directory(s))


def queued_counts(s: Session, constraints: tuple[Constraint, ...]) -> dict[Constraint, int]:
    """How many trials the users of each constraint have QUEUED now."""
    counts = {}
    queued = (select(func.count(Trial.id)).join(Experiment, Trial.experiment_id == Experiment.id)
              .where(Trial.state == TrialState.QUEUED))
    for constraint in constraints:
        owners = (select(GroupMember.user_id).where(GroupMember.group_id == constraint.subject_id)
                  if constraint.subject is QuotaSubject.GROUP
                  else select(User.id).where(User.id == constraint.subject_id))
        counts[constraint] = s.scalar(queued.where(Experiment.owner_id.in_(owners))) or 0
    return counts


def lock_and_refuse_queued(s: Session, book: QuotaBook, owner_id: int, adding: int
                           ) -> str | None:
    """Why `adding` more queued trials of `owner_id`'s would pass one of their quotas'
    `max_queued_trials`, or None; the rows that keep a concurrent create or draw from
    counting the same room are locked until the caller's transaction ends."""
    constraints = tuple(c for c in book.of(owner_id)
                        if c.limit(QuotaLimit.MAX_QUEUED_TRIALS) is not None)
    if not constraints:
        return None
    s.execute(select(User.id).where(User.id == owner_id).with_for_update())
    groups = sorted(c.subject_id for c in constraints if c.subject is QuotaSubject.GROUP)
    if groups:
        s.execute(select(Group.id).where(Group.id.in_(groups)).order_by(Group.id)
                  .with_for_update())
    for constraint, queued in queued_counts(s, constraints).items():
        refused = queued_refusal(constraint, queued, adding)
        if refused is not None:
            return refused
    return None
