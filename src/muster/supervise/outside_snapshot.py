"""What muster knows of an attempt from outside its process (issue 30, item 9).

A script without the harness writes no snapshot of its own (`rank-<r>.snapshot.json`), so
at each attempt's launch the server records what it can know without the process: the
interpreter's version and implementation and the packages its environment layer imports,
as the trial's own `python` answers them, and the code's tree hash (the submitted context
snapshot's). Every attempt gets one, with the harness or without: the launch cannot know
whether the script will import it, and the harness's rank parts win where both speak
(`muster.diagnostics.diff`).

The question is asked of the layer's `python -I -S`: no site-packages on its path and no
`.pth` file read, so nothing of the user's is imported; under `run_as` as the job's account,
with a minimal environment (`environments.isolation`), a timeout and a bounded answer. The
packages are the `Name`/`Version` headers of the `*.dist-info/METADATA` (and
`*.egg-info/PKG-INFO`) in the layer's site-packages, then the lower ones', in import order
(the first of a name wins, as an import would): pip is not run. The record is the server's
file beside the attempt's directory (`RunDir.outside_snapshot`), out of the job's reach;
it is written on a thread of its own, so no launch waits for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from muster.atomic import atomic_write_json
from muster.diagnostics import (
    MAX_SNAPSHOT_BYTES,
    OUTSIDE_SOURCE,
    OutsideInterpreter,
    OutsidePart,
)
from muster.diagnostics.code_tree import CodeTree, tree_of
from muster.environments.interpreters import InterpreterError, own
from muster.environments.isolation import as_account, probe_environ
from muster.environments.layers import site_packages
from muster.environments.registry import TrialEnvironment
from muster.launch.accounts import Account
from muster.launch.base import ReplicaSpec
from muster.rundir import AttemptDir, RunDir

__all__ = ["PROBE_TIMEOUT_S", "ProbeError", "Question", "capture", "question_for",
           "record", "record_soon"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
MAX_PACKAGES = 10_000  # distributions listed; a site holding more is cut off (and said so)
MAX_SITE_ENTRIES = 50_000  # entries of one site-packages directory looked at
MAX_HEADER_BYTES = 64 << 10  # of a METADATA file: its headers come first
MAX_WORD = 200  # characters of a name or version kept

# Run by the trial's interpreter under `-I -S` (standard library only, any CPython 3):
# prints its facts and the packages of the site directories named in argv, in that order
# (after the three bounds).
_PROBE = r"""
import json, os, platform, re, stat, sys
MAX_PACKAGES, MAX_ENTRIES, HEAD = map(int, sys.argv[1:4])

def header(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None, None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, None
        data = os.read(fd, HEAD)
    finally:
        os.close(fd)
    found = {}
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep:
            found.setdefault(key.strip().lower(), value.strip())
    return found.get("name"), found.get("version")

packages, cut = {}, False
for site in sys.argv[4:]:
    try:
        with os.scandir(site) as entries:
            names = sorted(e.name for _, e in zip(range(MAX_ENTRIES + 1), entries))
    except OSError:
        continue
    cut = cut or len(names) > MAX_ENTRIES
    for entry in names[:MAX_ENTRIES]:
        meta = ("METADATA" if entry.endswith(".dist-info")
                else "PKG-INFO" if entry.endswith(".egg-info") else None)
        if meta is None:
            continue
        path = os.path.join(site, entry)
        name, version = header(os.path.join(path, meta) if os.path.isdir(path) else path)
        if name and version:
            key = re.sub(r"[-_.]+", "-", name).lower()
            if key not in packages and len(packages) >= MAX_PACKAGES:
                cut = True
                break
            packages.setdefault(key, version)

print(json.dumps({"implementation": sys.implementation.name,
                  "version": platform.python_version(),
                  "packages": packages, "cut": cut}))
"""


class ProbeError(Exception):
    """The trial's interpreter did not answer as one; the message says how."""


@dataclass(frozen=True)
class Question:
    """Whom to ask and where to look: the trial's `python`, its site directories in import
    order, the account it runs as, and the context snapshot its code came from."""

    python: str
    sites: tuple[str, ...]
    account: Account | None
    context: Path


def question_for(environment: TrialEnvironment | None, account: Account | None,
                 context: Path) -> Question:
    """The question of a trial running in `environment` (None: on muster's own
    interpreter, as plans made by hand in tests do)."""
    if environment is None:
        return Question(sys.executable, tuple(own().sites), account, context)
    layer_site = str(site_packages(environment.layer, environment.base))
    return Question(str(environment.layer / "bin" / "python"),
                    (layer_site, *environment.lower_sites), account, context)


class Facts(TypedDict):
    """What the interpreter said of itself, checked: strings, bounded."""

    version: str
    implementation: str
    packages: dict[str, str]  # normalized name → version, as it would import them
    cut: bool  # it stopped at MAX_PACKAGES or MAX_SITE_ENTRIES


def capture(question: Question, attempt: int) -> OutsidePart:
    """The outside part of attempt `attempt` (`muster.diagnostics`); what could not be
    known is null, with why in `unknown`."""
    unknown: dict[str, str] = {}
    facts: Facts | None = None
    try:
        facts = _ask(question)
    except ProbeError as exc:
        unknown["python"] = str(exc)
    code: CodeTree | None = None
    try:
        if not question.context.is_dir():
            raise FileNotFoundError(f"{question.context} is not a directory")
        code = tree_of(question.context)
    except OSError as exc:
        unknown["code"] = f"the context snapshot cannot be read: {exc}"
    if facts is not None and facts["cut"]:
        unknown["packages"] = (f"more than {MAX_PACKAGES:,} distributions or "
                               f"{MAX_SITE_ENTRIES:,} entries in a site directory: cut off")
    python = (OutsideInterpreter(version=None, implementation=None) if facts is None else
              OutsideInterpreter(version=facts["version"],
                                 implementation=facts["implementation"]))
    return OutsidePart(source=OUTSIDE_SOURCE, attempt=attempt, recorded_at=time.time(),
                       python=python, packages=None if facts is None else facts["packages"],
                       code=code, unknown=unknown)


def record(run_dir: RunDir, attempt: int, question: Question) -> None:
    """Capture attempt `attempt`'s outside part and write it (atomic, the server's alone)
    beside the attempt's directory; a file that cannot be written is logged, not raised."""
    part = capture(question, attempt)
    try:
        atomic_write_json(run_dir.outside_snapshot(attempt), part, 0o600)
    except OSError as exc:
        log.warning("the outside snapshot of %s attempt %d cannot be written: %s",
                    run_dir.path, attempt, exc)


# One thread, started at the first record, in launch order: a burst of launches asks its
# interpreters one after another (some 40 ms each), not all at once. At exit what is queued
# is still recorded, each probe within PROBE_TIMEOUT_S, so none outlives the server.
_recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outside-snapshot")


def record_soon(spec: ReplicaSpec, environment: TrialEnvironment | None,
                context: Path) -> None:
    """`record` the attempt of `spec` (any of its replicas') on the recorder's thread: a
    launch never waits for an interpreter's answer."""
    try:
        question = question_for(environment, spec.account, context)
    except InterpreterError as exc:
        log.warning("attempt %s is not seen from outside: %s", spec.attempt_dir, exc)
        return
    run_dir = AttemptDir(spec.attempt_dir).run
    _recorder.submit(record, run_dir, spec.attempt, question).add_done_callback(_said)


def _said(done: Future[None]) -> None:
    failure = done.exception()
    if failure is not None:
        log.error("an outside snapshot failed", exc_info=failure)


def _ask(question: Question) -> Facts:
    """The facts the interpreter printed, checked: strings, bounded."""
    argv = [question.python, "-I", "-S", "-c", _PROBE, str(MAX_PACKAGES),
            str(MAX_SITE_ENTRIES), str(MAX_HEADER_BYTES), *question.sites]
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, env=probe_environ(question.account),
                                 cwd="/", start_new_session=True,
                                 **as_account(question.account))
    except OSError as exc:
        raise ProbeError(f"{question.python} cannot be run: {exc.strerror or exc}") from exc
    try:
        out = _read_bounded(child, question.python)
        code = child.wait(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"{question.python} did not exit within {PROBE_TIMEOUT_S:g} s") from exc
    finally:
        _end(child)
    if code != 0:
        raise ProbeError(f"{question.python} exited {code} when asked what it is")
    try:
        return _checked(json.loads(out))
    except (ValueError, TypeError) as exc:
        raise ProbeError(f"{question.python} did not answer as a Python interpreter "
                         f"does: {exc}") from exc


def _read_bounded(child: subprocess.Popen[bytes], python: str) -> bytes:
    """The child's stdout up to its end: at most MAX_SNAPSHOT_BYTES, within the timeout."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as ready:
        ready.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProbeError(f"{python} did not answer within {PROBE_TIMEOUT_S:g} s")
            if not ready.select(left):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_SNAPSHOT_BYTES:
                raise ProbeError(f"{python} answered more than {MAX_SNAPSHOT_BYTES:,} bytes")
            chunks.append(chunk)


def _end(child: subprocess.Popen[bytes]) -> None:
    """Kill the probe's group if it still runs (it is not reaped yet, so its id is its
    own), and reap it."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it ended after the poll
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    if child.stdout is not None:
        child.stdout.close()


def _checked(said: Any) -> Facts:
    if not isinstance(said, Mapping):
        raise TypeError("its answer is not a JSON object")
    packages = said.get("packages")
    if not isinstance(packages, Mapping) or len(packages) > MAX_PACKAGES:
        raise TypeError(f"its packages are not a map of at most {MAX_PACKAGES:,} names")
    return Facts(version=_word(said.get("version")),
                 implementation=_word(said.get("implementation")),
                 packages={_word(name): _word(version) for name, version in packages.items()},
                 cut=said.get("cut") is True)


def _word(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_WORD:
        raise TypeError(f"{value!r:.60} is not a name or version of at most {MAX_WORD} "
                        "characters")
    return value
