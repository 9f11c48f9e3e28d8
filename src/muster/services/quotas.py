"""Quotas as people see and set them: `muster quota list | show | set | clear`, the quota
part of `muster cluster status`, and the account and cluster pages.

What the limits are and where each comes from is `muster.schedule.quotas`' (the cluster
config's `quotas`, under the limits admins set here, which are stored in the `quotas`
table); what the users hold now is counted from their trials, as admission counts it. Only
admins set and clear limits (`Action.MANAGE_QUOTAS`); everyone reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from muster import api
from muster.config.quotas import QuotasConfig
from muster.errors import InvalidRequest, NotFound
from muster.schedule.quota_book import read_directory, read_runtime
from muster.schedule.quotas import (
    NOUNS,
    Charge,
    Directory,
    RuntimeLimits,
    Setting,
    default_settings,
    group_settings,
    user_settings,
)
from muster.services.access import Action, Principal, authorize
from muster.states import EventReason, QuotaLimit, QuotaSubject, TrialState, values
from muster.store import Experiment, Group, Quota, Store, Trial, User, record_event
from muster.store.configs import experiment_resources
from muster.store.models import now
from muster.words import count

__all__ = ["clear_limits", "list_quotas", "set_limits", "user_quotas"]

_USE = {QuotaLimit.MAX_SLOTS: "slots", QuotaLimit.MAX_GPUS: "gpus",
        QuotaLimit.MAX_RUNNING_TRIALS: "running_trials",
        QuotaLimit.MAX_QUEUED_TRIALS: "queued_trials"}
_NONE = Counter[str]()


@dataclass(frozen=True)
class _World:
    """What every view of one request is made from, read in one transaction."""

    config: QuotasConfig
    runtime: RuntimeLimits
    directory: Directory
    held: Mapping[int, Counter[str]]  # user id -> slots, gpus, running_trials, queued_trials

    def user_view(self, user_id: int, name: str) -> api.QuotaView:
        settings = user_settings(self.config, self.runtime, user_id, name)
        return _view(QuotaSubject.USER, name, settings, self.held.get(user_id, _NONE), [])

    def group_view(self, group_id: int, name: str) -> api.QuotaView:
        members = self.directory.members.get(group_id, ())
        held = sum((self.held.get(u, _NONE) for u in members), Counter[str]())
        settings = group_settings(self.config, self.runtime, group_id, name)
        return _view(QuotaSubject.GROUP, name, settings, held,
                     sorted(self.directory.users[u] for u in members))

    def default_view(self) -> api.QuotaView:
        return _view(QuotaSubject.DEFAULT, None, default_settings(self.config, self.runtime),
                     None, [])


def list_quotas(store: Store, config: QuotasConfig) -> list[api.QuotaView]:
    """The default (when it limits anything), every user and group something limits, and
    what the cluster config names that this server does not know."""
    with store.session_scope() as s:
        world = _read_world(s, config)
    views = [world.default_view()]
    users = {name: i for i, name in world.directory.users.items()}
    groups = {name: i for i, name in world.directory.groups.items()}
    views += [world.user_view(i, name) for name, i in sorted(users.items())]
    views += [world.group_view(i, name) for name, i in sorted(groups.items())]
    views += [_unknown(QuotaSubject.USER, name, config.users[name].declared())
              for name in sorted(set(config.users) - set(users))]
    views += [_unknown(QuotaSubject.GROUP, name, config.groups[name].declared())
              for name in sorted(set(config.groups) - set(groups))]
    return [view for view in views if view["limits"]]


def user_quotas(store: Store, config: QuotasConfig, name: str) -> api.UserQuotas:
    """What `name` is held to: their own quota, then each of their groups' (those without a
    limit left out), with what each one's users hold now.

    Raises:
        NotFound: there is no such user.
    """
    with store.session_scope() as s:
        user_id = _user_id(s, name)
        world = _read_world(s, config)
    groups = sorted((world.directory.groups[g], g) for g, members
                    in world.directory.members.items() if user_id in members)
    quotas = [world.user_view(user_id, name),
              *(world.group_view(g, group) for group, g in groups)]
    shown = [q for q in quotas if q["limits"]]
    return {"user": name, "groups": [group for group, _ in groups], "quotas": shown,
            "summary": "; ".join(f"{_holder(q)}: {q['summary']}" for q in shown)}


def set_limits(store: Store, config: QuotasConfig, who: Principal, subject: QuotaSubject,
               name: str | None, limits: Mapping[QuotaLimit, int | None]) -> api.QuotaView:
    """Set limits of a user's, a group's or the default quota at runtime (None: no limit);
    they win over the cluster config's, and the next supervisor pass admits by them.
    Returns the quota as it is then.

    Raises:
        Forbidden: `who` is not an admin.
        InvalidRequest: `limits` names none.
        NotFound: there is no such user or group.
    """
    authorize(who, Action.MANAGE_QUOTAS)
    if not limits:
        raise InvalidRequest("name a limit to set: max_slots, max_gpus, max_running_trials "
                             "or max_queued_trials (null: no limit)")
    with store.session_scope() as s:
        subject_id = _subject_id(s, subject, name)
        before = _runtime_of(s, subject, subject_id)
        for kind, value in sorted(limits.items()):
            s.execute(_upsert(s, subject, subject_id, kind, value, who.name))
        changed = [f"{kind} {_shown(before.get(kind, _UNSET))} → {_shown(value)}"
                   for kind, value in sorted(limits.items())]
        _record(s, who, subject, subject_id, name, "set " + ", ".join(changed))
    return _one_view(store, config, subject, name)


def clear_limits(store: Store, config: QuotasConfig, who: Principal, subject: QuotaSubject,
                 name: str | None, kinds: Collection[QuotaLimit] = ()) -> api.QuotaView:
    """Remove limits an admin set at runtime (`kinds`, or all of the subject's), so that the
    cluster config's apply again. Returns the quota as it is then.

    Raises:
        Forbidden: `who` is not an admin.
        NotFound: there is no such user or group.
    """
    authorize(who, Action.MANAGE_QUOTAS)
    with store.session_scope() as s:
        subject_id = _subject_id(s, subject, name)
        gone = delete(Quota).where(Quota.subject == subject, Quota.subject_id == subject_id)
        if kinds:
            gone = gone.where(Quota.kind.in_(values(kinds)))
        removed = sorted(_runtime_of(s, subject, subject_id).keys() & set(kinds or QuotaLimit))
        s.execute(gone)
        if removed:
            _record(s, who, subject, subject_id, name, "cleared " + ", ".join(removed)
                    + " (the cluster config's apply)")
    return _one_view(store, config, subject, name)


def _one_view(store: Store, config: QuotasConfig, subject: QuotaSubject, name: str | None
              ) -> api.QuotaView:
    with store.session_scope() as s:
        world = _read_world(s, config)
        if subject is QuotaSubject.DEFAULT:
            return world.default_view()
        subject_id = _subject_id(s, subject, name)
    assert name is not None, "a user or group has a name (checked by _subject_id)"
    if subject is QuotaSubject.GROUP:
        return world.group_view(subject_id, name)
    return world.user_view(subject_id, name)


def _read_world(s: Session, config: QuotasConfig) -> _World:
    return _World(config, read_runtime(s), read_directory(s), _held_by_user(s))


def _held_by_user(s: Session) -> dict[int, Counter[str]]:
    """What each user's trials hold now (as admission counts it), and how many are QUEUED."""
    held: dict[int, Counter[str]] = {}
    resources: dict[int, Charge] = {}
    for owner_id, experiment_id, uuid, stored in s.execute(
            select(Experiment.owner_id, Experiment.id, Experiment.uuid, Experiment.config)
            .join(Trial, Trial.experiment_id == Experiment.id)
            .where(Trial.state.in_(values(TrialState.active())),
                   Experiment.owner_id.is_not(None))):
        if experiment_id not in resources:
            resources[experiment_id] = _charge(owner_id, uuid, stored)
        charge = resources[experiment_id]
        held.setdefault(owner_id, Counter()).update(
            slots=charge.slots, gpus=charge.gpus, running_trials=1)
    for owner, queued in s.execute(
            select(Experiment.owner_id, func.count(Trial.id))
            .join(Trial, Trial.experiment_id == Experiment.id)
            .where(Trial.state == TrialState.QUEUED, Experiment.owner_id.is_not(None))
            .group_by(Experiment.owner_id)):
        if owner is not None:  # (the query leaves those out; mypy cannot know)
            held.setdefault(owner, Counter())["queued_trials"] = queued
    return held


def _charge(owner_id: int, uuid: str, stored: dict[str, Any]) -> Charge:
    """What a running trial of the experiment holds; of a config no longer valid (which the
    supervisor ends its trials for), a trial alone: a view never fails for it."""
    try:
        found = experiment_resources(uuid, stored)
    except ValidationError:
        return Charge(owner_id)
    return Charge.of(owner_id, found.replicas, found.gpus_per_replica)


def _view(subject: QuotaSubject, name: str | None, settings: Mapping[QuotaLimit, Setting],
          held: Counter[str] | None, members: list[str]) -> api.QuotaView:
    limits: list[api.QuotaLimitView] = [
        {"limit": kind, "value": setting.value, "source": setting.source}
        for kind, setting in sorted(settings.items())]
    in_use: api.QuotaUsage | None = None if held is None else {
        "slots": held["slots"], "gpus": held["gpus"],
        "running_trials": held["running_trials"], "queued_trials": held["queued_trials"]}
    return {"subject": subject, "name": name, "limits": limits, "in_use": in_use,
            "members": members, "known": True, "summary": _summary(settings, held)}


def _unknown(subject: QuotaSubject, name: str, declared: Mapping[QuotaLimit, int | None]
             ) -> api.QuotaView:
    view = _view(subject, name, {k: Setting(v, "cluster config") for k, v in declared.items()},
                 None, [])
    return {**view, "known": False,
            "summary": f"no {subject} {name} on this server: the cluster config's limits "
                       f"hold nobody (muster {subject} list)"}


def _summary(settings: Mapping[QuotaLimit, Setting], held: Counter[str] | None) -> str:
    """ "2 of 8 GPUs, 1 of 4 running trials, no limit on slots" (the default: "8 GPUs")."""
    parts = []
    for kind, setting in sorted(settings.items()):
        noun = NOUNS[kind]
        if setting.value is None:
            parts.append(f"no limit on {noun}s")
        elif held is None:
            parts.append(count(setting.value, noun))
        else:
            parts.append(f"{held[_USE[kind]]} of {count(setting.value, noun)}")
    return ", ".join(parts)


def _holder(view: api.QuotaView) -> str:
    if view["subject"] is QuotaSubject.GROUP:
        return f"group {view['name']}'s quota"
    return f"{view['name']}'s quota"


_UNSET = object()


def _shown(value: object) -> str:
    if value is _UNSET:
        return "(config)"
    return "no limit" if value is None else str(value)


def _runtime_of(s: Session, subject: QuotaSubject, subject_id: int
                ) -> dict[QuotaLimit, int | None]:
    return {kind: value for kind, value in s.execute(select(Quota.kind, Quota.value).where(
        Quota.subject == subject, Quota.subject_id == subject_id))}


def _upsert(s: Session, subject: QuotaSubject, subject_id: int, kind: QuotaLimit,
            value: int | None, by: str) -> Insert:
    """INSERT ... ON CONFLICT DO UPDATE: two admins setting one limit at once, the last wins."""
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    row = {"subject": subject, "subject_id": subject_id, "kind": kind, "value": value,
           "set_by": by, "set_at": now()}
    statement: Insert = dialect.insert(Quota).values(**row).on_conflict_do_update(
        index_elements=["subject", "subject_id", "kind"],
        set_={"value": value, "set_by": by, "set_at": row["set_at"]})
    return statement


def _subject_id(s: Session, subject: QuotaSubject, name: str | None) -> int:
    if subject is QuotaSubject.DEFAULT:
        return 0
    if subject is QuotaSubject.USER:
        return _user_id(s, name)
    found = s.scalar(select(Group.id).where(Group.name == name))
    if found is None:
        raise NotFound(f"no group {name!r}; `muster group list` shows them, and an admin "
                       f"makes one with `muster group create {name}`")
    return found


def _user_id(s: Session, name: str | None) -> int:
    found = s.scalar(select(User.id).where(User.name == name))
    if found is None:
        raise NotFound(f"no user {name!r}; `muster user list` shows them")
    return found


def _record(s: Session, who: Principal, subject: QuotaSubject, subject_id: int,
            name: str | None, what: str) -> None:
    entity = "quota" if subject is QuotaSubject.DEFAULT else str(subject)
    whose = "the default quota" if name is None else f"{subject} {name}'s quota"
    record_event(s, entity=entity, entity_id=subject_id, reason=EventReason.QUOTA_CHANGED,
                 actor=who.name, message=f"{whose}: {what}")
