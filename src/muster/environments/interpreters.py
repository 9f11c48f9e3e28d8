"""The facts of a base interpreter: what a built venv or a trial's layer is made from.

Asked of the interpreter itself (`python -I -c …`, a few tens of milliseconds) and kept in
memory until its site-packages change; the interpreter muster runs on answers in-process.

The path is a user's (`environment.python`), so what answers may be any program: under
`run_as` it runs as the account the asking user's jobs run as, never as root, and always
with a minimal environment (`isolation`); an answer is remembered per account, since one
account's answer is no evidence for another's. Asked as root without an account (the
server runs as root but the caller knows no account), only an interpreter that root's
accounts alone could have written is run (`_root_may_run`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from muster.environments.isolation import as_account, probe_environ
from muster.launch.accounts import Account

__all__ = ["MIN_VERSION", "Interpreter", "InterpreterError", "InterpreterJson", "inspect",
           "own"]

MIN_VERSION = (3, 10)  # what muster.harness runs on
QUERY_TIMEOUT_S = 20.0

# Run inside the interpreter (standard library only, any CPython 3): prints its facts.
_QUERY = r"""
import json, os, platform, re, site, sys
import importlib.metadata as md

def facts():
    sites = [p for p in site.getsitepackages() if os.path.isdir(p)]
    seen = {}
    for dist in md.distributions(path=sites):
        name = dist.metadata["Name"] or ""
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key and key not in seen:
            seen[key] = dist.version
    try:
        import ensurepip, glob
        bundled = sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__),
                                                "_bundled", "pip-*.whl")))
    except ImportError:
        bundled = []
    base = getattr(sys, "_base_executable", None) or sys.executable
    return {
        "implementation": sys.implementation.name,
        "version": platform.python_version(),
        "version_info": list(sys.version_info[:2]),
        "executable": os.path.realpath(base),
        "prefix": sys.prefix,
        "sites": sites,
        "packages": sorted(seen.items()),
        "bundled_pip": bundled[-1] if bundled else None,
    }
"""
_PRINT = "\nprint(json.dumps(facts()))\n"


class InterpreterError(Exception):
    """The path is not a Python interpreter muster can use; the message says why."""


class InterpreterJson(TypedDict):
    """An interpreter as JSON: what `_QUERY`'s `facts()` answers, and (with its path) what a
    build request holds."""

    path: NotRequired[str]  # in a build request; the query's answer has none
    implementation: NotRequired[str]  # in the query's answer: "cpython" is required
    executable: str
    version: str
    version_info: list[int]  # [major, minor]
    prefix: str
    sites: list[str]
    packages: list[list[str]]  # [normalized name, version], sorted
    bundled_pip: str | None


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter, as it answered about itself."""

    path: str  # as named (a venv's bin/python keeps its venv)
    executable: str  # the real binary, links resolved: a new venv's `home`
    version: str  # "3.11.7"
    version_info: tuple[int, int]
    prefix: str  # sys.prefix: a venv's directory, or the installation's
    sites: tuple[str, ...]  # its site-packages, in import order
    packages: tuple[tuple[str, str], ...]  # (normalized name, version) it imports, sorted
    bundled_pip: str | None  # ensurepip's pip wheel: pip for a venv without the network

    @property
    def bin_dir(self) -> str:
        """Where its scripts are (`torchrun`, `pip`): beside the path it was named by."""
        return os.path.dirname(self.path)

    @property
    def lib_dir(self) -> str:
        """`pythonX.Y`, the directory under a venv's `lib/` that holds its site-packages."""
        return "python{}.{}".format(*self.version_info)

    def packages_digest(self) -> str:
        """A digest of what it imports: a built venv that inherits them is built again when
        they change."""
        text = "\n".join(f"{name}=={version}" for name, version in self.packages)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> InterpreterJson:
        return InterpreterJson(path=self.path, executable=self.executable,
                               version=self.version, version_info=list(self.version_info),
                               prefix=self.prefix, sites=list(self.sites),
                               packages=[list(p) for p in self.packages],
                               bundled_pip=self.bundled_pip)

    @classmethod
    def from_json(cls, data: InterpreterJson, path: str) -> Interpreter:
        """Read as an interpreter printed it: each field converted, so a stray type fails
        here (ValueError, TypeError, KeyError) rather than later."""
        info = data["version_info"]
        bundled = data.get("bundled_pip")
        return cls(path=path, executable=str(data["executable"]), version=str(data["version"]),
                   version_info=(int(info[0]), int(info[1])), prefix=str(data["prefix"]),
                   sites=tuple(str(s) for s in data["sites"]),
                   packages=tuple((str(n), str(v)) for n, v in data["packages"]),
                   bundled_pip=None if bundled is None else str(bundled))


_cache: dict[tuple[str, int | None], tuple[tuple[int, ...], Interpreter]] = {}
_lock = threading.Lock()


def own() -> Interpreter:
    """The interpreter muster runs on (asked in-process)."""
    return inspect(sys.executable)


def inspect(path: str, account: Account | None = None) -> Interpreter:
    """The facts of the interpreter at `path` (absolute), asked of it (as `account`, when
    given) or remembered.

    Raises:
        InterpreterError: it is missing, not executable, not CPython 3.10 or newer, did
            not answer, or (as root without an account) others than root could change it.
    """
    path = os.path.expanduser(path)
    key = (path, None if account is None else account.uid)
    with _lock:
        cached = _cache.get(key)
    stamp = _stamp(path, cached[1].sites if cached else ())
    if cached is not None and cached[0] == stamp:
        return cached[1]
    found = _ask(path, account)
    with _lock:
        _cache[key] = (_stamp(path, found.sites), found)
    return found


def _stamp(path: str, sites: tuple[str, ...]) -> tuple[int, ...]:
    """What changes when the interpreter or its packages do: modification times."""
    stamps = []
    for item in (path, *sites):
        try:
            stamps.append(os.stat(item).st_mtime_ns)
        except OSError:
            stamps.append(-1)
    return tuple(stamps)


def _ask(path: str, account: Account | None) -> Interpreter:
    data = (_in_process() if path == sys.executable and account is None
            else _subprocess(path, account))
    if data.get("implementation") != "cpython":
        raise InterpreterError(f"{path} is {data.get('implementation')}, not CPython; muster "
                               "builds venvs for CPython only")
    found = Interpreter.from_json(data, path)
    if found.version_info < MIN_VERSION:
        raise InterpreterError(f"{path} is Python {found.version}; muster.harness needs "
                               "{}.{} or newer".format(*MIN_VERSION))
    return found


def _in_process() -> InterpreterJson:
    namespace: dict[str, object] = {}
    exec(compile(_QUERY, "<muster interpreter query>", "exec"), namespace)
    facts = namespace["facts"]
    assert callable(facts)
    return cast(InterpreterJson, facts())  # `_QUERY`'s answer, read by `from_json`


def _subprocess(path: str, account: Account | None) -> InterpreterJson:
    target = Path(path)
    if not target.exists():
        raise InterpreterError(f"{path} does not exist on the server")
    if target.is_dir() or not os.access(target, os.X_OK):
        raise InterpreterError(f"{path} is not an executable file")
    if account is None and os.geteuid() == 0:
        _root_may_run(path)
    try:
        done = subprocess.run([path, "-I", "-c", _QUERY + _PRINT], capture_output=True,
                              timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False,
                              env=probe_environ(account), cwd="/", **as_account(account))
    except subprocess.TimeoutExpired as exc:
        raise InterpreterError(f"{path} did not answer within {QUERY_TIMEOUT_S:g} s") from exc
    except OSError as exc:
        raise InterpreterError(f"{path} cannot be run: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        said = f": {last[0][:300]}" if "Error" in last[0] else ""
        raise InterpreterError(f"{path} is not a Python interpreter muster can use (asked "
                               f"to run Python code, it exited {done.returncode}{said})")
    try:
        answer: InterpreterJson = json.loads(done.stdout)  # read by `from_json`
    except ValueError as exc:
        raise InterpreterError(f"{path} did not answer as a Python interpreter does") from exc
    return answer


def _root_may_run(path: str) -> None:
    """Refuse, as root, an interpreter that an account other than root could have changed:
    its file, or a directory on its way (as named: a venv's `pyvenv.cfg` decides what it
    imports; and resolved), is not root's or is writable by others than root (a
    sticky directory such as /tmp excepted: nobody else can replace root's entries)."""
    named = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    for item in dict.fromkeys([real, *real.parents, *named.parents]):
        try:
            info = os.stat(item)
        except OSError as exc:
            raise InterpreterError(f"{path} cannot be checked: {exc}") from exc
        writable = info.st_mode & 0o022 and not (stat.S_ISDIR(info.st_mode)
                                                 and info.st_mode & stat.S_ISVTX)
        if info.st_uid != 0 or writable:
            raise InterpreterError(
                f"{path} is not run as root: {item} is not root's alone (owner uid "
                f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}); use an interpreter "
                "only root can change, or run jobs as accounts (run_as in the cluster "
                "config)")
