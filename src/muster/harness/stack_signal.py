"""Stacks on a signal: the fallback of muster's evidence collector where py-spy cannot attach.

py-spy reads a process's stacks from outside, but only where ptrace is allowed (root, or a
kernel that lets a user trace its own processes). A harness process prepares a second way
in at `init()`: `faulthandler` prints every thread's stack into `rank-<r>.faulthandler.txt`
when `SIGNAL` arrives, and `rank-<r>.stack-signal.json` says which process (pid and start
ticks) did that and with which signal. The collector (`muster.launch.evidence`) sends the
signal only to that very process and only while it still catches it: the signal's default
action ends a process, so a process that never registered must never get it.

SIGUSR2 because nothing in muster or torch's launchers uses it (the harness takes over
SIGTERM; torchrun's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT). A script that set
its own SIGUSR2 handler before `init()` keeps it, and no registration is written.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeGuard

from muster.atomic import atomic_write_json, read_json
from muster.rundir import RankFiles

__all__ = ["SIGNAL", "StackSignal", "read_registration"]

SIGNAL = signal.SIGUSR2


@dataclass(frozen=True)
class Registration:
    """The process that prints its stacks on `signum`, by identity (pid, start ticks)."""

    pid: int
    start_ticks: int
    signum: int


def read_registration(path: Path) -> Registration | None:
    """The registration at `path`; None where there is none or it is not one (a link, a
    file of another shape: the collector then sends no signal at all)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid, start_ticks, signum = (data.get(key) for key in ("pid", "start_ticks", "signal"))
    if not (_positive(pid) and _positive(start_ticks) and _positive(signum)):
        return None
    return Registration(pid, start_ticks, signum)


def _positive(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _own_start_ticks() -> int:
    """This process's start time in clock ticks since boot (field 22 of /proc/self/stat),
    the identity muster's launchers check (`muster.launch.identity`, which the harness
    cannot import). The command name may hold ')' and spaces: fields count from the last."""
    with open("/proc/self/stat", encoding="utf-8", errors="replace") as file:
        text = file.read()
    return int(text.rpartition(")")[2].split()[19])


class StackSignal:
    """`install()` at init, `uninstall()` at the end of the harness's block."""

    def __init__(self, files: RankFiles) -> None:
        self._output = files.faulthandler
        self._registration = files.stack_signal
        self._file: IO[str] | None = None

    def install(self) -> None:
        """Print the stacks on `SIGNAL` and say so; only from the main thread (Python sets
        signal handlers there only), only where nobody handles `SIGNAL` yet, and never an
        error: the fallback missing is no reason to stop a training run."""
        if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None):
            return
        try:
            self._file = open(self._output, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
            faulthandler.register(SIGNAL, file=self._file, all_threads=True, chain=False)
            atomic_write_json(self._registration, {
                "pid": os.getpid(), "start_ticks": _own_start_ticks(), "signal": int(SIGNAL)})
        except (OSError, ValueError, RuntimeError) as exc:
            warnings.warn(f"muster.harness: cannot prepare stack dumps on {SIGNAL.name} "
                          f"({exc}); muster's evidence of a hang relies on py-spy alone",
                          RuntimeWarning, stacklevel=2)
            self.uninstall()

    def uninstall(self) -> None:
        """Give the signal back to its default and remove the registration (the collector
        checks the process still catches the signal anyway), and the output file unless
        something was printed into it."""
        if self._file is None:
            return
        faulthandler.unregister(SIGNAL)
        printed = os.fstat(self._file.fileno()).st_size > 0
        self._file.close()
        self._file = None
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._registration)
                if not printed:
                    os.unlink(self._output)
        except OSError as exc:
            warnings.warn(f"muster.harness: cannot remove {self._registration} ({exc})",
                          RuntimeWarning, stacklevel=2)
