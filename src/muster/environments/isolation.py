"""Who environment builds and interpreter probes run as, and with which variables.

Both run what a user wrote: a probe runs `environment.python` (which may be a script), a
build runs uv (which runs packages' build backends) and `environment.setup`. So neither
ever sees the server's own environment (tokens, `AWS_*`, `MUSTER_*`): each gets a minimal
one made here, `PATH` a fixed system path (and the venv's `bin`), `HOME`/`USER`/`LOGNAME`
of the account it runs as, `LANG`, and uv's settings: the ones muster sets, and those of
`PASSED_TO_UV` that the server's environment holds (how an admin points every build at an
index, a proxy or a CA bundle; they are visible to the builds' accounts, so an index's
credentials there are too). Under `run_as`, each runs as the account the trial's jobs run
as (`muster.launch.accounts`), never as root: `as_account` gives the `Popen` arguments.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from muster.launch.accounts import Account, job_identity

__all__ = ["PASSED_TO_UV", "SYSTEM_PATH", "RunAsArguments", "as_account", "build_environ",
           "identity", "probe_environ", "uv_cache"]

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LANG = "C.UTF-8"
# The server's variables a build's uv gets, when set: where packages come from and how
# they are fetched. Nothing else of the server's environment reaches a build.
PASSED_TO_UV = (
    "UV_DEFAULT_INDEX", "UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
    "UV_NO_INDEX", "UV_OFFLINE", "UV_HTTP_RETRIES", "UV_HTTP_TIMEOUT",
    "UV_CONCURRENT_DOWNLOADS", "UV_NATIVE_TLS", "UV_LINK_MODE", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy",
    "https_proxy", "all_proxy", "no_proxy",
)
# What muster sets for every uv it runs: plain output, and never a Python downloaded.
_UV_SETTINGS = {"NO_COLOR": "1", "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"}


def identity(account: Account | None) -> dict[str, str]:
    """HOME, USER and LOGNAME of `account`, or of the server's own user."""
    if account is not None:
        return job_identity(account)
    try:
        entry = pwd.getpwuid(os.geteuid())
    except KeyError:  # a uid without a passwd entry (a container's): its HOME as given
        name = str(os.geteuid())
        return {"HOME": os.environ.get("HOME", "/"), "USER": name, "LOGNAME": name}
    return {"HOME": entry.pw_dir or "/", "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def probe_environ(account: Account | None) -> dict[str, str]:
    """The whole environment of an interpreter probe."""
    return {"PATH": SYSTEM_PATH, "LANG": LANG, **identity(account)}


def build_environ(account: Account | None, server: Mapping[str, str],
                  cache: Path | None, venv: Path | None = None) -> dict[str, str]:
    """The whole environment of a build's command: `server`'s variables of
    `PASSED_TO_UV`, uv's cache at `cache` (None: uv's default, in HOME), and with `venv`,
    that venv active (a setup command's)."""
    env = probe_environ(account)
    env.update({name: server[name] for name in PASSED_TO_UV if name in server})
    env.update(_UV_SETTINGS)
    if cache is not None:
        env["UV_CACHE_DIR"] = str(cache)
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}:{SYSTEM_PATH}"
    return env


def uv_cache(envs_root: Path, account: Account | None, server: Mapping[str, str]
             ) -> Path | None:
    """Where a build's uv keeps its cache: without an account, the server's
    `UV_CACHE_DIR` or uv's default (None); under `run_as`, one per account that only it
    reads and writes (`envs/cache/<uid>`), made here: a shared cache would let one
    account's build plant files another's installs."""
    if account is None:
        found = server.get("UV_CACHE_DIR")
        return Path(found) if found else None
    parent = envs_root / "cache"
    parent.mkdir(mode=0o711, exist_ok=True)
    parent.chmod(0o711)
    cache = parent / str(account.uid)
    cache.mkdir(mode=0o700, exist_ok=True)
    info = cache.lstat()
    if (info.st_uid, info.st_gid) != (account.uid, account.gid):
        os.lchown(cache, account.uid, account.gid)
    return cache


class RunAsArguments(TypedDict, total=False):
    """`subprocess.Popen`'s arguments that set the child's account (none: inherited)."""

    user: int
    group: int
    extra_groups: list[int]


def as_account(account: Account | None) -> RunAsArguments:
    """`subprocess.Popen` arguments that run the child as `account` (none: as this
    process's user). A build's commands stay in the build's process group, which the
    server stops when the build ends: what they left running goes with it."""
    if account is None:
        return RunAsArguments()
    return RunAsArguments(user=account.uid, group=account.gid,
                          extra_groups=list(account.groups))
