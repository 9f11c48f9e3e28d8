"""Data manifest scans, off the supervisor's pass.

A scan walks a directory the experiment names, which may hold millions of files or sit on a
slow network disk (a scan of `/usr` took 17.6 s inside a pass, holding up every other
trial). So each scan runs in a child process (`python -m muster.supervise.manifest`) that
the passes only look at: a trial whose scan is still running waits in the queue, saying so;
the others go on. A scan is bounded: the child stops itself at its deadline and at
`MAX_SCAN_FILES`, and the parent kills it a little after the deadline. The walk itself is
`muster.supervise.manifest`'s, so a scan counts the same files whichever process runs it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from muster.supervise.manifest import LabelMode, Manifest

__all__ = ["SCAN_TIMEOUT_S", "DataScans", "ScanFailed"]

log = logging.getLogger(__name__)

SCAN_TIMEOUT_S = 600.0
KILL_AFTER_S = 10.0  # past the deadline the child keeps itself to, the parent kills it


@dataclass(frozen=True)
class ScanFailed:
    """Why a scan produced no manifest, as the trial's message says it."""

    why: str


@dataclass
class _Running:
    child: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]
    started: float


@dataclass
class DataScans:
    """The scans running now, by trial id (in memory: a restarted server starts them
    again, as the trial still has no manifest)."""

    timeout_s: float = SCAN_TIMEOUT_S
    kill_after_s: float = KILL_AFTER_S
    _running: dict[int, _Running] = field(default_factory=dict)

    def poll(self, trial_id: int, path: Path, extensions: Sequence[str] | None,
             labels: LabelMode) -> Manifest | ScanFailed | None:
        """The trial's manifest once its scan has ended (or why it failed); None while it
        runs. The first call starts it."""
        running = self._running.get(trial_id)
        if running is None:
            self._running[trial_id] = self._start(path, extensions, labels)
            return None
        if running.child.poll() is None:
            if time.monotonic() - running.started < self.timeout_s + self.kill_after_s:
                return None
            running.child.kill()
            running.child.wait()
            self._close(trial_id)
            return ScanFailed(f"the scan of {path} took longer than {self.timeout_s:g} s; "
                              "point data.path at the data set itself")
        try:
            return _result(running)
        finally:
            self._close(trial_id)

    def seconds(self, trial_id: int) -> float:
        """How long the trial's scan has run."""
        running = self._running.get(trial_id)
        return 0.0 if running is None else time.monotonic() - running.started

    def running(self) -> list[int]:
        """The trials whose scans run now."""
        return list(self._running)

    def pids(self) -> list[int]:
        return [running.child.pid for running in self._running.values()]

    def forget_all_but(self, trial_ids: Collection[int]) -> None:
        """Stop the scans of trials that no longer wait for one (killed, paused)."""
        for trial_id in [t for t in self._running if t not in trial_ids]:
            self._running[trial_id].child.kill()
            self._running[trial_id].child.wait()
            self._close(trial_id)

    def _start(self, path: Path, extensions: Sequence[str] | None,
               labels: LabelMode) -> _Running:
        args = [sys.executable, "-P", "-m", "muster.supervise.manifest", str(path),
                "--labels", labels, "--seconds", f"{self.timeout_s:g}"]
        for extension in extensions or ():
            args += ["--extension", extension]
        # Files, not pipes: nobody reads while the child runs, and a pipe would fill.
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 - closed by _close
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        return _Running(child, out, err, time.monotonic())

    def _close(self, trial_id: int) -> None:
        running = self._running.pop(trial_id)
        running.out.close()
        running.err.close()


def _result(running: _Running) -> Manifest | ScanFailed:
    running.out.seek(0)
    running.err.seek(0)
    out, err = running.out.read(), running.err.read()
    if running.child.returncode != 0:
        last = err.decode("utf-8", errors="replace").strip().splitlines()[-1:] or ["?"]
        log.error("a data scan failed (exit %s): %s", running.child.returncode,
                  err.decode("utf-8", errors="replace")[-2000:])
        return ScanFailed(f"the scan failed unexpectedly (exit {running.child.returncode}: "
                          f"{last[0]})")
    answer = json.loads(out)
    if "error" in answer:
        return ScanFailed(str(answer["error"]))
    return Manifest.from_json(answer["manifest"])
