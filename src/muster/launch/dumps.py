"""The shim's side of evidence bundles: run the collector when the server asks.

The server asks for one rank's part of an evidence bundle by writing the request file
`rank-<r>.dump.json` (`{"bundle", "reason", "requested_at"}`): before it stops a STALLED
replica, and on `muster trial dump`. The shim, which runs where the replica runs and owns its
process group, notices the request within a marker check and starts the collector
(`python -m muster.launch.evidence`) as a child of its own, so its loop goes on copying the
log meanwhile. The collector writes `evidence/<bundle>/rank-<r>/`, `summary.json` last.

A stop that arrives while the collector runs waits for it (at most `COLLECT_LIMIT_S`):
invariant 9, evidence before destruction.

Under `run_as` the job owns the attempt's directory, and the shim runs as root. So a request
is taken only from root when the shim is root (as the spec is), the bundle id must have the
shape `rundir.BUNDLE_ID`, and the bundle's directories are made one at a time through
directory descriptors, each refused unless it is a real directory of the shim's own user;
the collector gets the last one as an inherited descriptor (`/proc/self/fd/N`), so a link
put in the path meanwhile cannot redirect what it writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from muster.atomic import atomic_write_json, open_regular
from muster.rundir import BUNDLE_ID, EVIDENCE, RankFiles, new_bundle_id
from muster.states import EvidenceReason

__all__ = ["COLLECT_LIMIT_S", "SUMMARY", "DumpRequests", "request_dump"]

log = logging.getLogger("muster.shim")

COLLECT_LIMIT_S = 30.0  # a collector still running after this is killed: its files stay
REQUEST_BYTES = 4096
SUMMARY = "summary.json"  # a rank's part of a bundle is complete once this exists


def request_dump(ranks: list[RankFiles], reason: EvidenceReason) -> str:
    """Ask the shims of `ranks` for their parts of a new evidence bundle; returns its id."""
    bundle = new_bundle_id(reason)
    request = {"bundle": bundle, "reason": reason, "requested_at": time.time()}
    for files in ranks:
        atomic_write_json(files.dump, request)
    return bundle


class DumpRequests:
    """Notices evidence requests for one rank and runs the collector for each, one at a time."""

    def __init__(self, files: RankFiles) -> None:
        self._files = files
        self._done: set[str] = set()
        self._running: subprocess.Popen[bytes] | None = None
        self._bundle = ""
        self._out_fd: int | None = None
        self._started = 0.0

    @property
    def busy(self) -> bool:
        return self._running is not None

    def poll(self, pgid: int) -> None:
        """Reap a collector that ended (or ran too long); start one for a new request."""
        if self._running is not None:
            self._reap(block=False)
        if self._running is None:
            request = self._new_request()
            if request is not None:
                self._start(request, pgid)

    def wait(self) -> None:
        """Let a running collector finish (bounded by `COLLECT_LIMIT_S` since its start)."""
        while self._running is not None:
            self._reap(block=True)

    def close(self) -> None:
        """End a collector still running (the shim is leaving) and release its directory."""
        if self._running is not None:
            self._running.kill()
            self._reap(block=True)

    def _new_request(self) -> str | None:
        """The bundle id of a request not handled yet, or None."""
        path = self._files.dump
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot open the evidence request %s: %s", path, exc)
            return None
        with os.fdopen(fd, "rb") as file:
            owner = os.fstat(file.fileno()).st_uid
            data = file.read(REQUEST_BYTES)
        bundle = _bundle_of(data)
        if bundle is None or bundle in self._done:
            return None
        self._done.add(bundle)
        if os.geteuid() == 0 and owner != 0:
            log.warning("ignoring the evidence request %s: it is not root's", path)
            return None
        return bundle

    def _start(self, bundle: str, pgid: int) -> None:
        try:
            out_fd = _make_bundle_dir(self._files.attempt_dir, bundle, self._files.rank)
        except OSError as exc:
            log.error("cannot make the evidence directory of bundle %s: %s", bundle, exc)
            return
        argv = [sys.executable, "-m", "muster.launch.evidence", "--out",
                f"/proc/self/fd/{out_fd}", "--rank", str(self._files.rank),
                "--log", str(self._files.log), "--pgid", str(pgid)]
        try:
            self._running = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(out_fd,),
                                             start_new_session=True)
        except OSError as exc:
            log.error("cannot start the evidence collector for bundle %s: %s", bundle, exc)
            os.close(out_fd)
            return
        self._bundle, self._out_fd, self._started = bundle, out_fd, time.monotonic()
        log.info("collecting evidence bundle %s (pid %d)", bundle, self._running.pid)

    def _reap(self, block: bool) -> None:
        proc = self._running
        assert proc is not None
        left = COLLECT_LIMIT_S - (time.monotonic() - self._started)
        try:
            code = proc.wait(timeout=max(left, 0.0)) if block else proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None and left <= 0:
            log.error("the evidence collector of bundle %s ran past %.0f s: killed; the "
                      "bundle keeps what it wrote", self._bundle, COLLECT_LIMIT_S)
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        if code is None:
            return
        if code != 0:
            log.error("the evidence collector of bundle %s ended with status %d",
                      self._bundle, code)
        self._running = None
        if self._out_fd is not None:
            os.close(self._out_fd)
            self._out_fd = None


def _bundle_of(data: bytes) -> str | None:
    """The bundle id a request names, if it is one."""
    try:
        request = json.loads(data)
    except ValueError:
        return None
    bundle = request.get("bundle") if isinstance(request, dict) else None
    return bundle if isinstance(bundle, str) and BUNDLE_ID.fullmatch(bundle) else None


def _make_bundle_dir(attempt_dir: Path, bundle: str, rank: int) -> int:
    """`attempt_dir/evidence/<bundle>/rank-<r>`, made or found one level at a time; returns
    a descriptor of the last. Raises OSError for a level that is not a real directory of
    this process's user."""
    fd = os.open(attempt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in (EVIDENCE, bundle, f"rank-{rank}"):
            fd = _enter(fd, name)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _enter(parent: int, name: str) -> int:
    """Make (or find) directory `name` in `parent` and open it; closes `parent`."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent)
    finally:
        os.close(parent)
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{name} is not this user's directory")
    return fd
