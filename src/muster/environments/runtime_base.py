"""The runtime base, built and published: what a trial without an `environment:` block runs on.

```
$MUSTER_HOME/envs/runtime/current                -> <key>-<nonce>: the published base (a link)
$MUSTER_HOME/envs/runtime/<key>-<nonce>/         a venv of the interpreter muster runs on:
    lib/pythonX.Y/site-packages/                 links to the included distributions' files
    bin/                                         their scripts (rebased) and programs (links)
    .muster/base.json                            what it holds, and its key
```

What it holds is `runtime_plan`'s (muster's own installation less muster's dependencies);
the key covers the interpreter and every included distribution's name and version. It is
built on a thread when the server starts (`RuntimeBase.start`) and again at the next
launch after the packages where muster runs changed (`interpreters.own` notices: their
site-packages' mtime), under a lock (flock `locks/runtime.lock`), in a directory of a fresh
name, and published by replacing the link `current` (atomic); then the bases it no longer
names are removed. A trial's layer names `current/...`, never the directory behind it: the
base is a view of what is installed where muster runs (an old one's links would point at
files an upgrade replaced), so the next attempt of a long trial sees the base as it is then.

The cluster config's `base_environment` names another base, an interpreter or a venv:
trials without an environment block run on it as they would on `environment.python` (its
packages, and `muster.harness`).

A built environment without `environment.python` that inherits (the default) stands on the
same base (`request.build_request`): its build sees the base's packages (torch is not
downloaded again) and its hash covers the base's key (`TrialBase.key`), so a new base gives
new builds to the submissions that follow.

A base that cannot be built is an error that fails the trials needing it (the message
names the fix), never a silent fall-back to the server's own packages.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import hashlib
import importlib.metadata as md
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from muster.atomic import atomic_write_json, fsync_dir, read_json
from muster.environments.interpreters import Interpreter, InterpreterError, inspect, own
from muster.environments.layers import lower_scripts, site_packages, write_layer, write_scripts
from muster.environments.layout import RECORD, EnvHome
from muster.environments.runtime_plan import (
    DistFacts,
    included_distributions,
    link_plan,
    normalize,
)
from muster.launch.accounts import Account

__all__ = ["BaseSummary", "RuntimeBase", "RuntimeBaseError", "TrialBase",
           "check_base_environment", "configured_python", "ensure_base"]

log = logging.getLogger(__name__)

RUNTIME_LAYOUT = 1  # bumped when the base's layout changes: every key changes with it
BASE_RECORD = "base.json"
LOCK_NAME = "runtime"
RETRY_AFTER_S = 30.0  # a base that could not be built is tried again this much later
_BUILT_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{8}")
_NOT_PROGRAMS = re.compile(r"(python[0-9.]*|activate.*|deactivate.*|pydoc.*)")


class RuntimeBaseError(Exception):
    """The base of trials without an environment block cannot be used; the message says
    why and what to do."""


@dataclass(frozen=True)
class BaseSummary:
    """The runtime base, as `muster cluster status` shows it."""

    source: Literal["computed", "configured"]
    path: str  # the published link, or the configured interpreter or venv
    python: str | None  # its version; None when it cannot be used (`error`)
    packages: tuple[tuple[str, str], ...]  # (normalized name, version), sorted
    error: str | None


@dataclass(frozen=True)
class TrialBase:
    """What trials stand on when their experiment names no `environment.python`: the base
    as an interpreter, and a key that changes whenever what it holds does (a built
    environment's hash covers it)."""

    interpreter: Interpreter
    key: str


@dataclass(frozen=True)
class _Installed:
    facts: DistFacts
    dist: md.Distribution


def check_base_environment(path: str, *, run_as: bool) -> None:
    """Check the cluster config's `base_environment` when the server starts: a CPython 3
    interpreter muster can use (asked here; under `run_as` only that it is a program, since
    each trial asks it as its own account).

    Raises:
        InterpreterError: it is not, and why.
    """
    python = configured_python(path)
    if not run_as:
        inspect(python)
    elif not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise InterpreterError(f"{python} is not an executable file on the server")


def configured_python(path: str) -> str:
    """The interpreter `base_environment` names: the path itself, or a venv's `bin/python`.

    Raises:
        InterpreterError: a directory that is not a venv.
    """
    found = Path(path)
    if not found.is_dir():
        return path
    python = found / "bin" / "python"
    if not python.exists():
        raise InterpreterError(f"{path} is a directory without bin/python; name a venv or "
                               "an interpreter")
    return str(python)


@dataclass
class RuntimeBase:
    """The base of one home's trials without an environment block: computed from the
    installation muster runs on, or `configured` (the cluster config's
    `base_environment`)."""

    layout: EnvHome
    shared: bool = False  # jobs run as other accounts: the base is readable by everyone
    configured: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ready: tuple[Interpreter, TrialBase] | None = None  # (what it was computed from, it)
    # The last failure (what it was computed from, when, why): told again for a while
    # rather than tried at every launch and every look at the cluster page.
    _failed: tuple[Interpreter, float, str] | None = None

    def start(self) -> None:
        """Build the base now, on a thread, so that the first launch finds it ready (a
        configured one is checked at the server's start, and asked at each launch)."""
        if self.configured is not None:
            return
        threading.Thread(target=self._warm, daemon=True, name="muster-runtime-base").start()

    def _warm(self) -> None:
        try:
            self.interpreter()
        except RuntimeBaseError as exc:
            log.error("%s", exc)

    def interpreter(self, account: Account | None = None) -> Interpreter:
        """The base, as an interpreter whose site-packages a trial's layer reads (asked as
        `account`, the one the trial's jobs run as, when configured); built first if the
        installation changed since.

        Raises:
            RuntimeBaseError: it cannot be built, or the configured one cannot be used.
        """
        return self.base(account).interpreter

    def base(self, account: Account | None = None) -> TrialBase:
        """The base with its key (`interpreter`'s, for what a built environment's hash
        covers).

        Raises:
            RuntimeBaseError: as `interpreter`.
        """
        if self.configured is not None:
            try:
                found = inspect(configured_python(self.configured), account)
            except InterpreterError as exc:
                raise RuntimeBaseError(
                    f"base_environment {self.configured} (the cluster config) cannot be "
                    f"used: {exc}; fix it or remove it from the cluster config") from exc
            return TrialBase(found, _configured_key(found))
        server = own()
        with self._lock:
            if self._ready is not None and self._ready[0] is server:
                return self._ready[1]
            failed = self._failed
            if (failed is not None and failed[0] is server
                    and time.monotonic() - failed[1] < RETRY_AFTER_S):
                raise RuntimeBaseError(failed[2])
            try:
                base = _ensure(self.layout, server, self.shared)
            except (OSError, LookupError) as exc:
                why = (f"the runtime base (what a trial without an environment block imports) "
                       f"cannot be built in {self.layout.runtime}: {exc}; fix that, name an "
                       "interpreter or venv as base_environment in the cluster config, or "
                       "give the experiment environment.python")
                self._failed = (server, time.monotonic(), why)
                raise RuntimeBaseError(why) from exc
            self._ready, self._failed = (server, base), None
            return base

    def summary(self) -> BaseSummary:
        source: Literal["computed", "configured"] = (
            "computed" if self.configured is None else "configured")
        path = self.configured or str(self.layout.runtime_current)
        try:
            base = self.interpreter()
        except RuntimeBaseError as exc:
            return BaseSummary(source, path, None, (), str(exc))
        return BaseSummary(source, path, base.version, base.packages, None)


def ensure_base(layout: EnvHome, server: Interpreter, shared: bool = False) -> Interpreter:
    """The runtime base of `server` (the interpreter muster runs on), built and published
    under `layout` unless the published one holds the same.

    Raises:
        OSError: it could not be built (nothing half made is published).
        LookupError: muster's own distribution is not installed (`runtime_plan`).
    """
    return _ensure(layout, server, shared).interpreter


def _ensure(layout: EnvHome, server: Interpreter, shared: bool) -> TrialBase:
    """`ensure_base`, with the base's key."""
    installed = _installed(server.sites)
    names = included_distributions({name: item.facts for name, item in installed.items()})
    packages = tuple((name, installed[name].facts.version) for name in names)
    key = _key(server, packages, shared)
    if _published_key(layout) != key:
        layout.ensure()
        layout.runtime.mkdir(mode=0o700, exist_ok=True)
        layout.runtime.chmod(0o711 if shared else 0o700)
        with _held(layout.lock(LOCK_NAME)):
            if _published_key(layout) != key:
                built = _build(layout, server, installed, names, key, shared)
                _publish(layout, built)
                _remove_others(layout, built)
    current = layout.runtime_current
    return TrialBase(dataclasses.replace(server, path=str(current / "bin" / "python"),
                                         prefix=str(current),
                                         sites=(str(site_packages(current, server)),),
                                         packages=packages), key)


def _installed(sites: Sequence[str]) -> dict[str, _Installed]:
    """The distributions `sites` hold, the first of each name (as imports find them)."""
    found: dict[str, _Installed] = {}
    for dist in md.distributions(path=list(sites)):
        name = normalize(dist.metadata["Name"] or "")
        if name and name not in found:
            facts = DistFacts(name, dist.version, tuple(dist.requires or ()),
                              tuple(dist.metadata.get_all("Provides-Extra") or ()))
            found[name] = _Installed(facts, dist)
    return found


def _key(server: Interpreter, packages: Sequence[tuple[str, str]], shared: bool) -> str:
    """What the base is made of: a server that starts running jobs as other accounts
    (`shared`) builds one they can read."""
    identity = {"layout": RUNTIME_LAYOUT, "python": [server.executable, server.version],
                "sites": list(server.sites), "packages": [list(p) for p in packages],
                "shared": shared}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _configured_key(base: Interpreter) -> str:
    """What a configured base is made of, as far as muster can see: its interpreter, its
    venv, and the packages it imports."""
    identity = {"configured": [base.path, base.executable, base.prefix, base.version],
                "sites": list(base.sites), "packages": base.packages_digest()}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _published_key(layout: EnvHome) -> str | None:
    record = read_json(layout.runtime_current / RECORD / BASE_RECORD)
    return None if record is None else str(record.get("key"))


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """The lock at `path`, held (flock): one process builds a base at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _build(layout: EnvHome, server: Interpreter, installed: dict[str, _Installed],
           names: Sequence[str], key: str, shared: bool) -> Path:
    """A new base directory holding the distributions `names` of `installed`; removed
    again if it cannot be finished."""
    started = time.monotonic()
    root = layout.runtime / f"{key}-{secrets.token_hex(4)}"
    try:
        write_layer(root, server, (), (), None)
        # Every distribution's files: a directory an included one shares with a left-out
        # one (a namespace package) is told apart by its owners.
        files = {name: _files(item.dist) for name, item in installed.items()}
        dists = [installed[name] for name in names]
        links, unlisted = _link_site(site_packages(root, server), server, files, set(names))
        programs = _link_programs(root / "bin", server, dists, files)
        (root / RECORD).mkdir()
        atomic_write_json(root / RECORD / BASE_RECORD, {
            "key": key, "python": server.version, "executable": server.executable,
            "from": list(server.sites), "packages": [[d.facts.name, d.facts.version]
                                                     for d in dists],
            "links": links, "programs": programs, "unlisted": unlisted,
            "built_at": time.time(), "build_seconds": round(time.monotonic() - started, 3)})
        if shared:
            _open_to_all(root)
    except OSError:
        shutil.rmtree(root, ignore_errors=True)
        raise
    log.info("runtime base %s built in %.2f s: %d distributions, %d links", key,
             time.monotonic() - started, len(dists), links)
    return root


def _link_site(site: Path, server: Interpreter, files: dict[str, list[tuple[str, ...]] | None],
               included: set[str]) -> tuple[int, list[str]]:
    """Links in `site` to the `included` distributions' entries in the server's
    site-packages (`files`: every installed one's, by name); returns how many, and the
    included distributions that list no files (left out, and named in the record)."""
    owned: list[tuple[Sequence[str], str]] = []
    unlisted = []
    for name, paths in files.items():
        if paths is None:
            if name in included:
                unlisted.append(name)
            continue
        owned += [(parts, name) for parts in paths if parts[0] != ".."]
    count = 0
    for parts in link_plan(owned, included):
        source = next((Path(s, *parts) for s in server.sites if os.path.lexists(Path(s, *parts))),
                      None)
        if source is None:
            continue  # named in a RECORD, since removed
        target = site.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)
        count += 1
    if unlisted:
        log.warning("the runtime base leaves out %s: installed without a list of their files "
                    "(RECORD)", ", ".join(unlisted))
    return count, unlisted


def _files(dist: md.Distribution) -> list[tuple[str, ...]] | None:
    """The files a distribution installed, as path parts relative to its site-packages;
    None when it does not say. Its RECORD is read directly (torch's names some 15,000
    files: parsing each as a `PackagePath` costs a tenth of a second)."""
    text = dist.read_text("RECORD")
    if text is None:
        files = dist.files
        return None if files is None else [tuple(f.parts) for f in files if f.parts]
    found = []
    for line in text.splitlines():
        # A path with a comma or a quote in it is quoted, as CSV does.
        path = next(csv.reader([line]))[0] if line.startswith('"') else line.split(",", 1)[0]
        parts = tuple(p for p in path.split("/") if p not in ("", "."))
        if parts:
            found.append(parts)
    return found


def _link_programs(bin_dir: Path, server: Interpreter, dists: Sequence[_Installed],
                   files: dict[str, list[tuple[str, ...]] | None]) -> int:
    """The included distributions' programs in the base's `bin`: Python scripts rebased
    onto its `python`, others linked; returns how many."""
    names = set()
    real_bin = os.path.realpath(server.bin_dir)
    for item in dists:
        site = str(item.dist.locate_file(""))
        for parts in files[item.facts.name] or ():
            if parts[0] != "..":
                continue
            path = os.path.normpath(os.path.join(site, *parts))
            if os.path.dirname(os.path.realpath(path)) == real_bin and not _NOT_PROGRAMS.fullmatch(
                    parts[-1]):
                names.add(parts[-1])
    scripts = [s for s in lower_scripts(server.bin_dir) if s.name in names]
    write_scripts(bin_dir, scripts)
    for name in sorted(names - {s.name for s in scripts}):
        source = Path(server.bin_dir, name)
        if source.is_file():
            (bin_dir / name).symlink_to(source)
    return len(names)


def _open_to_all(root: Path) -> None:
    """Readable (and its programs runnable) by every account: jobs run as theirs."""
    for folder, _dirs, files in os.walk(root):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o755 if mode & 0o100 else 0o644)


def _publish(layout: EnvHome, built: Path) -> None:
    """Point `current` at `built` (a relative link, replaced atomically)."""
    tmp = layout.runtime / f".current.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(built.name)
    os.replace(tmp, layout.runtime_current)
    fsync_dir(layout.runtime)


def _remove_others(layout: EnvHome, built: Path) -> None:
    """The bases `current` no longer names, and what killed builds left (the lock is
    held: no other build runs)."""
    for path in layout.runtime.iterdir():
        if path != built and _BUILT_NAME.fullmatch(path.name) and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
