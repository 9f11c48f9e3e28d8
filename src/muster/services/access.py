"""Who may do what: the one table of actions, roles and ownership, and the check against it.

Every route names the action it performs (`muster.server.auth.allow`), which checks the role
before the request does anything; a service that acts on someone's experiment checks the
ownership with the row it read (`authorize(..., owner=...)`). The table is the whole policy:

| action | viewer | user | admin |
|---|---|---|---|
| read (experiments, trials, logs, metrics, jobs, cluster, events, users) | yes | yes | yes |
| submit an experiment | no | yes | yes |
| kill, pause, activate, set priority, review, dump stacks | no | its own | any |
| own tokens, own password, own display name | yes | yes | yes |
| prune environments, manage users, others' tokens | no | no | yes |
| set quotas, manage groups | no | no | yes |
| run the retention sweep, or see its plan (`muster gc runs`) | no | no | yes |

Priorities better than the cluster config's `priority_floor` are an admin's alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from muster.errors import Forbidden
from muster.states import Role

__all__ = ["RULES", "Action", "Principal", "Rule", "authorize", "check_priority_floor"]


class Action(str, Enum):
    """What a request does, as the authorisation table knows it."""

    READ = "read"
    SUBMIT = "submit"
    KILL = "kill"
    PAUSE = "pause"
    ACTIVATE = "activate"
    RESTART = "restart"  # stop a running trial and queue it again (`muster trial restart`)
    SET_PRIORITY = "set priority"
    REVIEW = "review"
    DUMP = "dump stacks"  # save a running trial's evidence bundle (`muster trial dump`)
    OWN_ACCOUNT = "own account"  # one's own tokens, password and display name
    DELETE = "delete"  # an ended experiment: its files, checkpoints and records
    ARCHIVE = "archive"  # hide from (or show again in) the default lists
    COLLECT = "collect checkpoints"  # apply (or change) an experiment's checkpoint GC policy
    PRUNE_ENVIRONMENTS = "prune environments"
    MANAGE_USERS = "manage users"  # create, change, (de)activate users; others' tokens
    MANAGE_NODES = "manage nodes"  # return a quarantined node to the pool
    REGISTER_MODEL = "register models"  # a trial's checkpoint as a model version
    MANAGE_MODEL = "manage models"  # a version's stage (production, staging, archived)
    DELETE_MODEL = "delete models"  # versions, then the model
    MANAGE_QUOTAS = "manage quotas"  # set and clear limits at runtime (`muster quota set`)
    MANAGE_GROUPS = "manage groups"  # create and delete groups, add and remove members
    SWEEP_RETENTION = "sweep retention"  # the cluster config's retention, now or planned


@dataclass(frozen=True)
class Rule:
    """Which roles may perform an action, and whether, for a user, only on what it owns."""

    roles: frozenset[Role]
    own_only: bool = False  # a user's own experiments only (admins: any)
    verb: str = ""  # how a refusal says it: "kill" in "only alice or an admin can kill it"


_EVERYONE = frozenset(Role)
_SUBMITTERS = frozenset({Role.USER, Role.ADMIN})
_ADMINS = frozenset({Role.ADMIN})

RULES: dict[Action, Rule] = {
    Action.READ: Rule(_EVERYONE, verb="read"),
    Action.SUBMIT: Rule(_SUBMITTERS, verb="submit experiments"),
    Action.KILL: Rule(_SUBMITTERS, own_only=True, verb="kill"),
    Action.PAUSE: Rule(_SUBMITTERS, own_only=True, verb="pause"),
    Action.ACTIVATE: Rule(_SUBMITTERS, own_only=True, verb="activate"),
    Action.RESTART: Rule(_SUBMITTERS, own_only=True, verb="restart"),
    Action.SET_PRIORITY: Rule(_SUBMITTERS, own_only=True, verb="change the priority of"),
    Action.REVIEW: Rule(_SUBMITTERS, own_only=True, verb="review"),
    # As kill: reading a process's stacks pauses it for a moment.
    Action.DUMP: Rule(_SUBMITTERS, own_only=True, verb="dump the stacks of"),
    Action.OWN_ACCOUNT: Rule(_EVERYONE, verb="manage its own tokens"),
    Action.DELETE: Rule(_SUBMITTERS, own_only=True, verb="delete"),
    Action.ARCHIVE: Rule(_SUBMITTERS, own_only=True, verb="archive"),
    Action.COLLECT: Rule(_SUBMITTERS, own_only=True, verb="garbage-collect the checkpoints of"),
    Action.PRUNE_ENVIRONMENTS: Rule(_ADMINS, verb="prune environments"),
    Action.MANAGE_USERS: Rule(_ADMINS, verb="manage users and their tokens"),
    Action.MANAGE_NODES: Rule(_ADMINS, verb="release quarantined nodes"),
    Action.REGISTER_MODEL: Rule(_SUBMITTERS, own_only=True, verb="register a model from"),
    Action.MANAGE_MODEL: Rule(_SUBMITTERS, own_only=True, verb="change the stages of"),
    Action.DELETE_MODEL: Rule(_ADMINS, verb="delete registered models"),
    Action.MANAGE_QUOTAS: Rule(_ADMINS, verb="set quotas"),
    Action.MANAGE_GROUPS: Rule(_ADMINS, verb="manage groups"),
    Action.SWEEP_RETENTION: Rule(_ADMINS, verb="run the retention sweep"),
}

_ROLE_WORDS = {
    Role.VIEWER: "the viewer role only reads",
    Role.USER: "the user role acts on its own experiments only",
    Role.ADMIN: "",
}


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: an active user, and the credential it came with."""

    user_id: int
    name: str
    role: Role
    token_id: str | None = None  # the API token or web session that authenticated it
    via_session: bool = False  # a web session cookie (unsafe requests need the CSRF token)

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


def authorize(principal: Principal, action: Action, *, owner: str | None = None,
              subject: str = "") -> None:
    """Raise Forbidden unless `principal` may perform `action` (on `subject`, owned by
    `owner`, for the actions a user may take on its own only).

    Args:
        owner: the name of the owner of what is acted on; None when it has none (only an
            admin may act on it then) or when the action concerns no one's experiment.
        subject: what is acted on, for the message ("experiment 12").
    """
    rule = RULES[action]
    if principal.role not in rule.roles:
        raise Forbidden(_role_refusal(principal, rule))
    if not rule.own_only or principal.is_admin or not subject:
        return
    if owner != principal.name:
        whose = f"belongs to {owner}" if owner else "has no owner"
        who = f"{owner} or an admin" if owner else "an admin"
        raise Forbidden(f"{subject} {whose}; only {who} can {rule.verb} it")


def _role_refusal(principal: Principal, rule: Rule) -> str:
    allowed = " or ".join(sorted(rule.roles))
    why = _ROLE_WORDS[principal.role]
    hint = ("; an admin can give you the user role (muster user edit "
            f"{principal.name} --role user)" if principal.role is Role.VIEWER
            and Role.USER in rule.roles else "")
    return (f"{principal.role} {principal.name} cannot {rule.verb}: it takes the "
            f"{allowed} role" + (f" ({why})" if why else "") + hint)


def check_priority_floor(principal: Principal, priority: int, floor: int,
                         where: str = "priority") -> None:
    """Raise Forbidden when a non-admin asks for a priority better (lower) than `floor`."""
    if priority < floor and not principal.is_admin:
        raise Forbidden(
            f"{where} {priority} is reserved for admins: {principal.role}s may use "
            f"{floor} to 99 (the cluster config's priority_floor is {floor}; lower runs "
            "first)")
