"""The Unix accounts jobs run as (the cluster config's `run_as`).

With `run_as`, the server runs as root and each replica's shim starts its training process
as an unprivileged account (`drop_to`: setgroups, setgid, setuid between fork and exec, after
the child joined its memory cgroup), so a job can read neither muster's home (database,
tokens, secrets) nor another owner's runs. `RunAs` says whose account a trial's jobs get:
none (the server's own user, the default), its experiment owner's (`owner`: the muster
user's `unix_user`, else the account named like them), or one account for every job.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import TypedDict

from muster.errors import ConfigError

__all__ = ["Account", "AccountError", "AccountJson", "RunAs", "account_from_json",
           "check_can_switch", "drop_to", "job_identity", "lookup_account"]


class AccountError(ConfigError):
    """A job's account cannot be used: missing on this machine, or root."""


class AccountJson(TypedDict):
    """An `Account` in a replica's spec."""

    name: str
    uid: int
    gid: int
    groups: list[int]
    home: str


@dataclass(frozen=True)
class Account:
    """A Unix account a job runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # its supplementary groups (the primary one included)
    home: str

    def to_json(self) -> AccountJson:
        return AccountJson(name=self.name, uid=self.uid, gid=self.gid,
                           groups=list(self.groups), home=self.home)


def account_from_json(data: object) -> Account | None:
    if not isinstance(data, dict):
        return None
    return Account(name=str(data["name"]), uid=int(data["uid"]), gid=int(data["gid"]),
                   groups=tuple(int(g) for g in data.get("groups", [])),
                   home=str(data.get("home", "/")))


def lookup_account(name: str) -> Account:
    """The account called `name` on this machine.

    Raises:
        AccountError: there is none, or it is root (a job run as root could read anything).
    """
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise AccountError(f"there is no Unix account {name!r} on this machine; create it "
                           f"(useradd --no-create-home {name}) or choose another") from None
    if entry.pw_uid == 0:
        raise AccountError(f"Unix account {name!r} is root; jobs must run as an "
                           "unprivileged account")
    groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
    return Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups,
                   home=entry.pw_dir or "/")


@dataclass(frozen=True)
class RunAs:
    """Whom a trial's jobs run as: the cluster config's `run_as`, made usable."""

    owner: bool = False  # `run_as: owner`
    account: str | None = None  # `run_as: {user: NAME}`

    def account_name(self, owner: str | None, owner_unix_user: str | None) -> str:
        """The account of a job whose experiment `owner` (a muster user) submitted."""
        if not self.owner:
            assert self.account is not None
            return self.account
        if owner is None:
            raise AccountError("run_as: owner, but the experiment has no owner; an admin "
                               "can run it only with run_as: {user: NAME}")
        return owner_unix_user or owner

    def account_for(self, owner: str | None, owner_unix_user: str | None) -> Account:
        """The account a job runs as (see `account_name`).

        Raises:
            AccountError: that account is missing or root; the message names the muster user.
        """
        name = self.account_name(owner, owner_unix_user)
        try:
            return lookup_account(name)
        except AccountError as exc:
            if not self.owner:
                raise AccountError(f"run_as.user: {exc}") from None
            raise AccountError(
                f"run_as: owner: the jobs of muster user {owner} run as Unix account "
                f"{name!r}, and {exc}; an admin can link another account (muster user edit "
                f"{owner} --unix-user NAME)") from None


def drop_to(account: Account) -> None:
    """Become `account` for good: groups first, then the group, then the user (real,
    effective and saved ids alike, so there is no way back). In a child, before exec."""
    os.setgroups(list(account.groups))
    os.setresgid(account.gid, account.gid, account.gid)
    os.setresuid(account.uid, account.uid, account.uid)


def job_identity(account: Account) -> dict[str, str]:
    """The variables that say who the job is, for the account's own."""
    return {"HOME": account.home, "USER": account.name, "LOGNAME": account.name}


def check_can_switch() -> None:
    """Raise AccountError unless this process may start jobs as other accounts (root)."""
    if os.geteuid() != 0:
        raise AccountError("run_as needs the server to run as root (it drops each job to "
                           "its account before the job starts); start `muster up` as root, "
                           "or remove run_as from the cluster config")
