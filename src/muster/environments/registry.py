"""The server's view of its environments: built, building, failed; what a trial runs in.

The files under `$MUSTER_HOME/envs/` are the truth (`layout`): a published link means
built, a `.result.json` that says failed means failed. The builds running now are this
process's children (`build`), started by the supervisor's pass and only looked at by it:
a build never holds up a pass, and a restarted server starts again whatever was being
built (the killed build left nothing that looks built).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from muster.atomic import atomic_write_json, read_json
from muster.config import ExperimentConfig
from muster.environments.build import EXIT_BUSY, tree_size
from muster.environments.interpreters import Interpreter, InterpreterError, inspect, own
from muster.environments.layers import Script, lower_scripts, site_packages, write_layer
from muster.environments.layout import RECORD, EnvHome, is_hash
from muster.environments.request import BuildRequest
from muster.environments.runtime_base import RuntimeBase, RuntimeBaseError
from muster.errors import LaunchError, NotFound
from muster.launch.accounts import Account
from muster.states import EnvironmentState, Reason

__all__ = ["EnvState", "EnvSummary", "Environments", "PruneResult", "TrialEnvironment",
           "keep_request"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class EnvState:
    state: EnvironmentState
    stage: str | None = None  # BUILDING: what it does now
    seconds: float | None = None  # BUILDING: how long it has run
    reason: Reason | None = None  # FAILED: PERMANENT_ERROR, INFRA or INTERNAL
    message: str | None = None  # FAILED: the resolver's (or the command's) own words


@dataclass(frozen=True)
class EnvSummary:
    """One environment, as `muster env list` shows it."""

    hash: str
    python: str
    inherit: bool
    packages: list[str]
    setup: list[list[str]]
    state: EnvironmentState
    size_bytes: int | None
    built_at: float | None
    last_used: float | None
    message: str | None


@dataclass(frozen=True)
class PruneResult:
    removed: list[str]
    kept_in_use: list[str]
    freed_bytes: int


@dataclass(frozen=True)
class TrialEnvironment:
    """What a trial runs in: its own layer (`RunDir.env`) over a built venv or the base
    interpreter itself, and the `bin` directories first on its PATH."""

    layer: Path
    base: Interpreter
    built: Path | None  # the built venv below the layer, if any
    inherit: bool
    key: str | None

    @property
    def path(self) -> tuple[str, ...]:
        dirs = [str(self.layer / "bin")]
        if self.built is not None:
            dirs.append(str(self.built / "bin"))
        if self.built is None or self.inherit:
            dirs.append(self.base.bin_dir)  # programs that are not Python scripts
        return tuple(dict.fromkeys(dirs))

    @property
    def lower_sites(self) -> tuple[str, ...]:
        if self.built is not None:
            return (str(site_packages(self.built, self.base)),)
        return self.base.sites

    def freeze(self) -> str | None:
        if self.built is None:
            return None
        try:
            return (self.built / RECORD / "freeze.txt").read_text()
        except OSError:
            return None


@dataclass(frozen=True)
class _Template:
    """What a trial layer is made of; layers of one template are alike, whatever their
    name (their scripts are relocatable): one made ahead of time serves any trial of it."""

    digest: str
    base: Interpreter
    lower_sites: Sequence[str]
    scripts: Sequence[Script]


@dataclass
class _Build:
    child: subprocess.Popen[bytes]
    err: IO[bytes]
    started: float


@dataclass
class Environments:
    """The environments of one home: requests kept at submission, builds started and
    followed by the supervisor's pass, trial layers made at a trial's first launch."""

    root: Path  # $MUSTER_HOME/envs
    # Jobs run as other accounts (`run_as`): builds are readable by everyone (umask 022).
    shared: bool = False
    # The cluster config's `base_environment`: what trials without an environment block
    # run on instead of the computed runtime base (`runtime_base`).
    base_environment: str | None = None
    _running: dict[str, _Build] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _making: set[str] = field(default_factory=set)  # spares being made, by template digest

    def __post_init__(self) -> None:
        self.layout = EnvHome(self.root).ensure(self.shared)
        self.harness = self.layout.ensure_harness(self.shared)
        self.runtime = RuntimeBase(self.layout, self.shared, self.base_environment)
        # Spares of an earlier server: cheap to make again, and they may be of a template
        # no trial uses any more (its interpreter or scripts changed).
        for path in _children(self.layout.spares):
            shutil.rmtree(path, ignore_errors=True)

    # -- at submission ---------------------------------------------------------------
    def keep_request(self, request: BuildRequest) -> str:
        return keep_request(self.layout, request)

    # -- the pass --------------------------------------------------------------------
    def state(self, key: str) -> EnvState:
        """Where the environment stands; a build that has ended is read here."""
        with self._lock:
            build = self._running.get(key)
        if build is not None and build.child.poll() is not None:
            self._ended(key, build)
            build = None
        if self.layout.built(key) is not None:
            return EnvState(EnvironmentState.READY)
        if build is not None:
            stage = _read_text(self.layout.stage(key)) or "starting"
            return EnvState(EnvironmentState.BUILDING, stage=stage,
                            seconds=time.monotonic() - build.started)
        found = read_json(self.layout.result(key))
        if found is not None and found.get("state") == "failed":
            return EnvState(EnvironmentState.FAILED, reason=_failure_reason(found.get("reason")),
                            message=str(found.get("message", "")))
        return EnvState(EnvironmentState.MISSING)

    def reap(self) -> None:
        """Read the builds that have ended (each pass: none is left a zombie)."""
        with self._lock:
            ended = [(k, b) for k, b in self._running.items() if b.child.poll() is not None]
        for key, build in ended:
            self._ended(key, build)

    def start(self, key: str) -> EnvState:
        """Start building `key` (it must have a request), unless it runs already."""
        with self._lock:
            running = key in self._running
        if running:
            return self.state(key)
        with self._lock:
            if not self.layout.request(key).is_file():
                atomic_write_json(self.layout.result(key), {
                    "state": "failed", "reason": Reason.INTERNAL, "at": time.time(),
                    "message": "what to build was not kept (requests/ was removed); submit "
                               "the experiment again"}, 0o600)
                return self.state(key)
            self.layout.result(key).unlink(missing_ok=True)  # what it says next is this build's
            err = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _ended
            child = subprocess.Popen(
                [sys.executable, "-P", "-m", "muster.environments.build", str(self.root), key,
                 str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
                umask=0o022 if self.shared else -1)
            self._running[key] = _Build(child, err, time.monotonic())
        log.info("building environment %s (pid %d)", key, child.pid)
        return EnvState(EnvironmentState.BUILDING, stage="starting", seconds=0.0)

    def forget_failure(self, key: str) -> None:
        """Drop a failed result, so that the next look builds it again (an INFRA failure
        the policy retries)."""
        self.layout.result(key).unlink(missing_ok=True)

    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def pids(self) -> list[int]:
        """The build processes running now."""
        with self._lock:
            return [build.child.pid for build in self._running.values()]

    def stop_all(self) -> None:
        """Stop every build this process runs (the server is shutting down)."""
        with self._lock:
            builds = list(self._running.items())
        for key, build in builds:
            _kill_group(build.child)
            self._ended(key, build)

    def _ended(self, key: str, build: _Build) -> None:
        with self._lock:
            if self._running.get(key) is not build:
                return
            del self._running[key]
        code = build.child.wait()
        build.err.seek(0)
        err = build.err.read().decode("utf-8", errors="replace")
        build.err.close()
        _kill_group(build.child)  # what it started and left behind (killed, say)
        if code == EXIT_BUSY:
            log.warning("environment %s is being built by another process", key)
            return
        if code != 0 and not self.layout.result(key).is_file():
            why = (f"the environment build was killed ({signal.Signals(-code).name})"
                   if code < 0 else f"the environment build failed unexpectedly (exit {code})")
            tail = err.strip().splitlines()[-1:] or []
            atomic_write_json(self.layout.result(key), {
                "state": "failed", "reason": Reason.INFRA if code < 0 else Reason.INTERNAL,
                "message": why + (f": {tail[0][:500]}" if tail else ""),
                "at": time.time()}, 0o600)
            log.error("environment %s: %s\n%s", key, why, err[-4000:])

    # -- trials ----------------------------------------------------------------------
    def for_trial(self, config: ExperimentConfig, key: str | None, layer: Path,
                  account: Account | None = None) -> TrialEnvironment:
        """What a trial of `config` (its experiment's environment hash `key`) runs in, its
        own layer at `layer`; the base interpreter is asked as `account` (the one its jobs
        run as, under `run_as`). Without `python`, that base is the runtime base (or the
        configured one) unless a clean venv (`inherit: false`) was built: the base of the
        trial's layer is the base its build inherits (`request.build_request`).

        Raises:
            LaunchError: the base interpreter or the runtime base cannot be used now, or
                `key` is not built.
        """
        python = config.environment.python
        inherit = config.environment.inherit is not False
        try:
            if python is None and (key is None or inherit):
                base = self.runtime.interpreter(account)
            else:
                base = own() if python is None else inspect(python, account)
        except RuntimeBaseError as exc:
            raise LaunchError(str(exc)) from exc
        except (InterpreterError, OSError) as exc:
            raise LaunchError(f"environment.python cannot be used: {exc}") from exc
        built = None
        if key is not None:
            built = self.layout.built(key)
            if built is None:
                raise LaunchError(f"environment {key} is not built")
        return TrialEnvironment(layer=layer, base=base, built=built, inherit=inherit, key=key)

    def prepare(self, env: TrialEnvironment) -> bool:
        """Make the trial's own layer, once (every attempt shares it: what it installed
        stays); True when made now. Made under a temporary name and renamed into place.

        Raises:
            LaunchError: it could not be made (a full disk); nothing is left of it.
        """
        if env.built is not None:
            _touch(env.built / RECORD / "last_used")
        if env.layer.is_dir():
            return False
        template = self._template(env)
        tmp = env.layer.with_name(f".{env.layer.name}.tmp-{os.getpid()}")
        try:
            env.layer.parent.mkdir(parents=True, exist_ok=True)
            if not self._claim_spare(template, env.layer):
                shutil.rmtree(tmp, ignore_errors=True)
                self._write(template, tmp)
                tmp.rename(env.layer)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise LaunchError(f"Could not make the trial's environment layer in "
                              f"{env.layer}: {exc}") from exc
        self._make_spare_soon(template)
        return True

    # -- layers made ahead of time ---------------------------------------------------
    # A layer is some 60 small files (a copy of each lower script): made at a launch they
    # cost the launch as many file creations, which a busy disk makes slow (0.7 ms each
    # was measured here). The next trial's layer of the same template is made on a thread
    # after each launch, and the launch renames it into place.
    def _template(self, env: TrialEnvironment) -> _Template:
        lower_bin = str(env.built / "bin") if env.built is not None else env.base.bin_dir
        try:
            stamp = os.stat(lower_bin).st_mtime_ns
        except OSError:
            stamp = None
        scripts = lower_scripts(lower_bin)
        facts = [env.base.executable, env.base.version, list(env.lower_sites),
                 str(self.harness), lower_bin, stamp]
        digest = hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]
        return _Template(digest, env.base, env.lower_sites, scripts)

    def _write(self, template: _Template, root: Path) -> None:
        write_layer(root, template.base, template.lower_sites, template.scripts, self.harness)

    def _claim_spare(self, template: _Template, layer: Path) -> bool:
        """Rename the template's spare layer to `layer`; False when there is none."""
        try:
            os.rename(self.layout.spares / template.digest, layer)
        except FileNotFoundError:
            return False
        except OSError as exc:  # another file system (EXDEV): made in place, as before
            log.warning("a trial layer made ahead of time cannot be moved to %s: %s", layer,
                        exc)
            return False
        return True

    def _make_spare_soon(self, template: _Template) -> None:
        with self._lock:
            if template.digest in self._making:
                return
            self._making.add(template.digest)
        threading.Thread(target=self._make_spare, args=(template,), daemon=True,
                         name="muster-spare-layer").start()

    def _make_spare(self, template: _Template) -> None:
        spare = self.layout.spares / template.digest
        tmp = self.layout.spares / f".{template.digest}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            if not spare.exists():
                self._write(template, tmp)
                tmp.rename(spare)  # (onto a spare made meanwhile: ENOTEMPTY, dropped)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if spare.is_dir():
                return
            log.warning("could not make a trial layer ahead of time in %s: %s (each trial's "
                        "is made at its launch instead)", self.layout.spares, exc)
        finally:
            with self._lock:
                self._making.discard(template.digest)

    # -- listing, logs, pruning ------------------------------------------------------
    def summaries(self) -> list[EnvSummary]:
        return [self.summary(key) for key in self.layout.hashes()]

    def summary(self, key: str) -> EnvSummary:
        """The environment `key` as its request, its record and its state say."""
        request = read_json(self.layout.request(key)) or {}
        built = self.layout.built(key)
        record = read_json(built / RECORD / "env.json") if built is not None else None
        state = self.state(key)
        base = request.get("base") or {}
        return EnvSummary(
            hash=key, python=str((record or {}).get("python") or base.get("path", "?")),
            inherit=bool((record or request).get("inherit", True)),
            packages=list((record or {}).get("packages") or [
                x for x in request.get("requirements", []) if not x.startswith("-")]),
            setup=list((record or request).get("setup", [])), state=state.state,
            size_bytes=None if record is None else int(record.get("size_bytes", 0)),
            built_at=None if record is None else float(record["built_at"]),
            last_used=_mtime(built / RECORD / "last_used") if built else None,
            message=state.message)

    def resolve(self, prefix: str) -> str:
        """The hash `prefix` starts (at least 4 hex digits, unambiguous).

        Raises:
            NotFound: no environment, or several, start with it.
        """
        matches = [k for k in self.layout.hashes() if k.startswith(prefix.lower())]
        if len(prefix) < 4 or len(matches) != 1:
            what = "several environments start with" if len(matches) > 1 else "no environment"
            raise NotFound(f"{what} {prefix!r}; `muster env list` shows them "
                           "(give at least 4 digits of a hash)")
        return matches[0]

    def log_path(self, key: str) -> Path:
        return self.layout.log(key)

    def prune(self, older_than_s: float, in_use: Collection[str]) -> PruneResult:
        """Remove built environments last used longer ago than `older_than_s`, never one
        in `in_use` (a trial not ended needs it) nor one building; failed records and the
        leftovers of killed builds go too."""
        removed, kept, freed = [], [], 0
        cutoff = time.time() - older_than_s
        running = set(self.running())
        for summary in self.summaries():
            key = summary.hash
            if key in running:
                continue
            if key in in_use:
                kept.append(key)
                continue
            if summary.state is EnvironmentState.READY:
                used = summary.last_used or summary.built_at or 0.0
                if used > cutoff:
                    continue
                built = self.layout.built(key)
                self.layout.published(key).unlink(missing_ok=True)
                if built is not None:
                    shutil.rmtree(built, ignore_errors=True)
                freed += summary.size_bytes or 0
            elif summary.state is EnvironmentState.BUILDING:
                continue
            for path in (self.layout.request(key), self.layout.result(key),
                         self.layout.log(key), self.layout.stage(key)):
                path.unlink(missing_ok=True)
            removed.append(key)
        linked = {self.layout.built(k) for k in self.layout.hashes()}
        for path in _children(self.layout.store):
            key = path.name.split("-", 1)[0]
            if path.resolve() not in linked and key not in running and is_hash(key):
                freed += tree_size(path)
                shutil.rmtree(path, ignore_errors=True)
        return PruneResult(removed, kept, freed)


def keep_request(layout: EnvHome, request: BuildRequest) -> str:
    """Store what to build under its hash (once), at submission; a failed build of it is
    forgotten, so that a new submission builds it again. Returns the hash."""
    key = request.key
    layout.ensure()
    path = layout.request(key)
    if not path.is_file():
        atomic_write_json(path, request.to_json(), 0o600)
    found = read_json(layout.result(key))
    if found is not None and found.get("state") == "failed":
        layout.result(key).unlink(missing_ok=True)
    return key


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _failure_reason(word: object) -> Reason:
    """The reason a failed build's result names; a word muster does not know (or none) is
    muster's own failure."""
    try:
        return Reason(str(word))
    except ValueError:
        return Reason.INTERNAL


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _touch(path: Path) -> None:
    try:
        path.touch()
    except OSError as exc:
        log.warning("could not note the use of %s: %s", path.parent.parent, exc)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _children(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except FileNotFoundError:
        return []

