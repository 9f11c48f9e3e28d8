"""Quotas: how much each user's trials may hold at once, on their own and with their groups.

A quota is a few limits (`QuotaLimit`): slots (replicas without GPUs), GPUs, trials that
hold resources (STARTING, RUNNING, RESTARTING: "running"), and trials QUEUED. A user is
held to their own quota and to the quota of every group they are in, each a constraint of
its own; a group's counts are those of all its members together.

Where a limit comes from, for each limit the first that names it (a more specific subject
before a more general one, and at the same subject an admin's runtime limit before the
cluster config's):

- a user: `muster quota set --user`, then the config's `quotas.users.<name>`, then
  `muster quota set --default`, then the config's `quotas.default`;
- a group: `muster quota set --group`, then the config's `quotas.groups.<name>`.

A limit named as null (no limit) ends the search too: it lifts a more general one.

Pure: `plan` asks `Usage.refusal` before it admits a trial and counts each trial it admits
(`Usage.add`), starting from what the running trials hold, read in the same transaction as
the queue (`muster.supervise.admission`): the trials one pass admits never exceed a quota
together. `muster.schedule.quota_book` reads the book from the store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from muster.config.quotas import QuotaLimitsConfig, QuotasConfig
from muster.states import QuotaLimit, QuotaSubject
from muster.words import count

__all__ = ["Charge", "Constraint", "Directory", "QuotaBook", "RuntimeLimits", "Setting",
           "Usage", "build_book", "default_settings", "group_settings", "queued_refusal",
           "user_settings"]

L = QuotaLimit
# What one unit of each limit is called ("8 of 8 GPUs in use").
NOUNS = {L.MAX_SLOTS: "slot", L.MAX_GPUS: "GPU", L.MAX_RUNNING_TRIALS: "running trial",
         L.MAX_QUEUED_TRIALS: "queued trial"}
# The limits admission holds running trials to (the queued one is a create's, and a draw's).
RUNNING_LIMITS = (L.MAX_SLOTS, L.MAX_GPUS, L.MAX_RUNNING_TRIALS)
# Where a limit comes from, as `muster quota` shows it.
FROM_ADMIN, FROM_CONFIG = "set by an admin", "cluster config"
FROM_DEFAULT_ADMIN, FROM_DEFAULT_CONFIG = "default, set by an admin", "default, cluster config"
# An admin's runtime limits: (subject, its id; 0 for the default) -> limit -> value.
RuntimeLimits = Mapping[tuple[QuotaSubject, int], Mapping[QuotaLimit, int | None]]


class Setting(NamedTuple):
    """A limit that applies, and where it comes from; `value` None: no limit."""

    value: int | None
    source: str


@dataclass(frozen=True)
class Charge:
    """What one trial counts against its owner's quotas while it holds resources."""

    owner_id: int
    slots: int = 0
    gpus: int = 0

    @classmethod
    def of(cls, owner_id: int, replicas: int, gpus_per_replica: int) -> Charge:
        """A replica without GPUs takes a slot; one with GPUs takes its GPUs and no slot."""
        return cls(owner_id, 0 if gpus_per_replica else replicas, replicas * gpus_per_replica)

    def amount(self, limit: QuotaLimit) -> int:
        if limit is L.MAX_SLOTS:
            return self.slots
        if limit is L.MAX_GPUS:
            return self.gpus
        return 1 if limit is L.MAX_RUNNING_TRIALS else 0


@dataclass(frozen=True)
class Constraint:
    """One quota a user's trials are held to: their own, or a group's (shared)."""

    subject: QuotaSubject  # USER or GROUP
    subject_id: int
    name: str
    limits: tuple[tuple[QuotaLimit, int], ...]  # only those with a number

    @property
    def holder(self) -> str:
        """How a message names it: "alice's quota", "group vision's quota"."""
        if self.subject is QuotaSubject.GROUP:
            return f"group {self.name}'s quota"
        return f"{self.name}'s quota"

    def limit(self, kind: QuotaLimit) -> int | None:
        return dict(self.limits).get(kind)

    def raising(self, kind: QuotaLimit) -> str:
        """The command an admin raises this limit with."""
        return (f"muster quota set --{self.subject} {self.name} "
                f"--{kind.replace('_', '-')} N")


@dataclass(frozen=True)
class QuotaBook:
    """Every user's constraints, by user id (a user held to none is absent)."""

    constraints: Mapping[int, tuple[Constraint, ...]] = field(default_factory=dict)

    def of(self, owner_id: int | None) -> tuple[Constraint, ...]:
        return () if owner_id is None else self.constraints.get(owner_id, ())

    def limits_running(self, owner_id: int | None) -> bool:
        """Whether any of the owner's constraints limits what runs."""
        return any(c.limit(kind) is not None for c in self.of(owner_id)
                   for kind in RUNNING_LIMITS)


@dataclass(frozen=True)
class Directory:
    """Who is who: users and groups by id, and each group's members."""

    users: Mapping[int, str]
    groups: Mapping[int, str]
    members: Mapping[int, Sequence[int]]  # group id -> user ids


class Usage:
    """What each constraint's users hold, as `plan` hands resources out."""

    def __init__(self, book: QuotaBook, held: Iterable[Charge] = ()) -> None:
        self._book = book
        self._used: Counter[tuple[QuotaSubject, int, QuotaLimit]] = Counter()
        for charge in held:
            self.add(charge)

    def add(self, charge: Charge) -> None:
        for constraint in self._book.of(charge.owner_id):
            for kind in RUNNING_LIMITS:
                self._used[constraint.subject, constraint.subject_id, kind] += \
                    charge.amount(kind)

    def in_use(self, constraint: Constraint, kind: QuotaLimit) -> int:
        return self._used[constraint.subject, constraint.subject_id, kind]

    def beyond(self, charge: Charge) -> str | None:
        """Why a trial can never run under its owner's quotas (it needs more than one
        allows, whatever else runs), or None."""
        for constraint, kind, limit in self._limits(charge):
            if charge.amount(kind) > limit:
                return (f"{constraint.holder} allows {count(limit, NOUNS[kind])}, but this "
                        f"trial needs {charge.amount(kind)}; an admin can raise it "
                        f"({constraint.raising(kind)}), or lower resources.replicas"
                        + (" or gpus_per_replica" if kind is L.MAX_GPUS else ""))
        return None

    def refusal(self, charge: Charge) -> str | None:
        """Why a trial must wait for its owner's trials to end ("alice's quota: 8 of 8 GPUs
        in use"), or None when every constraint has room for it."""
        for constraint, kind, limit in self._limits(charge):
            used = self.in_use(constraint, kind)
            if used + charge.amount(kind) > limit:
                needs = ("" if charge.amount(kind) <= 1
                         else f", and this trial needs {charge.amount(kind)}")
                return f"{constraint.holder}: {used} of {count(limit, NOUNS[kind])} in use{needs}"
        return None

    def _limits(self, charge: Charge) -> Iterable[tuple[Constraint, QuotaLimit, int]]:
        for constraint in self._book.of(charge.owner_id):
            for kind in RUNNING_LIMITS:
                limit = constraint.limit(kind)
                if limit is not None and charge.amount(kind):
                    yield constraint, kind, limit


def queued_refusal(constraint: Constraint, queued: int, adding: int) -> str | None:
    """Why a create of `adding` queued trials is refused under `constraint`, whose users
    have `queued` trials QUEUED now; None when it fits."""
    limit = constraint.limit(L.MAX_QUEUED_TRIALS)
    if limit is None or queued + adding <= limit:
        return None
    return (f"{constraint.holder}: {queued} of {count(limit, 'queued trial')}, and this "
            f"submission queues {adding} more; wait for some to start or end, kill some "
            f"(muster job list), or ask an admin to raise it "
            f"({constraint.raising(L.MAX_QUEUED_TRIALS)})")


def user_settings(config: QuotasConfig, runtime: RuntimeLimits, user_id: int, name: str
                  ) -> dict[QuotaLimit, Setting]:
    """The limits that apply to a user's own quota, each with where it comes from."""
    return _first_named([
        (runtime.get((QuotaSubject.USER, user_id), {}), FROM_ADMIN),
        (_declared(config.users.get(name)), FROM_CONFIG),
        (runtime.get((QuotaSubject.DEFAULT, 0), {}), FROM_DEFAULT_ADMIN),
        (_declared(config.default), FROM_DEFAULT_CONFIG)])


def group_settings(config: QuotasConfig, runtime: RuntimeLimits, group_id: int, name: str
                   ) -> dict[QuotaLimit, Setting]:
    """The limits that apply to a group's quota, each with where it comes from."""
    return _first_named([(runtime.get((QuotaSubject.GROUP, group_id), {}), FROM_ADMIN),
                         (_declared(config.groups.get(name)), FROM_CONFIG)])


def default_settings(config: QuotasConfig, runtime: RuntimeLimits) -> dict[QuotaLimit, Setting]:
    """The default's limits (each user's own, unless more specific ones name them)."""
    return _first_named([(runtime.get((QuotaSubject.DEFAULT, 0), {}), FROM_ADMIN),
                         (_declared(config.default), FROM_CONFIG)])


def build_book(config: QuotasConfig, runtime: RuntimeLimits, directory: Directory
               ) -> QuotaBook:
    """Every user's constraints: their own quota, then each of their groups' (by id)."""
    groups = {group_id: _constraint(QuotaSubject.GROUP, group_id, name,
                                    group_settings(config, runtime, group_id, name))
              for group_id, name in directory.groups.items()}
    of_user: dict[int, list[int]] = {}
    for group_id, user_ids in sorted(directory.members.items()):
        for user_id in user_ids:
            of_user.setdefault(user_id, []).append(group_id)
    book: dict[int, tuple[Constraint, ...]] = {}
    for user_id, name in directory.users.items():
        own = _constraint(QuotaSubject.USER, user_id, name,
                          user_settings(config, runtime, user_id, name))
        found = [c for c in (own, *(groups.get(g) for g in of_user.get(user_id, ())))
                 if c is not None]
        if found:
            book[user_id] = tuple(found)
    return QuotaBook(book)


def _constraint(subject: QuotaSubject, subject_id: int, name: str,
                settings: Mapping[QuotaLimit, Setting]) -> Constraint | None:
    limits = tuple((kind, s.value) for kind, s in sorted(settings.items())
                   if s.value is not None)
    return Constraint(subject, subject_id, name, limits) if limits else None


def _declared(entry: QuotaLimitsConfig | None) -> Mapping[QuotaLimit, int | None]:
    return {} if entry is None else entry.declared()


def _first_named(layers: Sequence[tuple[Mapping[QuotaLimit, int | None], str]]
                 ) -> dict[QuotaLimit, Setting]:
    found: dict[QuotaLimit, Setting] = {}
    for limits, source in layers:
        for kind, value in limits.items():
            found.setdefault(kind, Setting(value, source))
    return found
