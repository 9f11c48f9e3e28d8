"""Why a replica ended: one pure function from what was observed to a classified reason.

The rules are ARCHITECTURE.md's "Exit classification" table, applied in order; the first
that matches wins. The failure policy (`muster.supervise.policy`) then decides what to do.
Every classification carries a one-line message in one pattern, e.g.
`The replica worker-1 (rank 1) exited with a non-zero status of 1. Termination reason:
ValueError: bad shape (see the last 20 log lines)`, or for a replica whose process group ran
out of memory `The replica worker-0 (rank 0) ran out of memory and exited with a non-zero
status of 137: killed by the kernel's OOM killer at 21.3 GiB (machine 24 GiB, no
memory_limit set): set resources.memory_limit or use less memory`.
"""

from __future__ import annotations

import errno
import re
import signal
from dataclasses import dataclass

from muster.launch.base import ExitRecord, OomKill
from muster.sizes import format_size
from muster.states import OomSource, Reason

__all__ = [
    "Classification",
    "ExitObservation",
    "classify_exit",
    "replica_name",
    "termination_reason",
]

# The program itself cannot be run: retrying the same command cannot help.
_PERMANENT_SPAWN_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR}
)
# Crashes that are often a flaky node or library rather than the user's code.
_TRANSIENT_SIGNALS = frozenset({"SIGABRT", "SIGSEGV", "SIGBUS"})
# Exceptions that the same code raises again on every run.
_SYNTAX_ERRORS = frozenset({"SyntaxError", "IndentationError", "TabError"})
_PERMANENT_EXCEPTIONS = _SYNTAX_ERRORS | {"ModuleNotFoundError", "ImportError"}
_USAGE_EXIT_CODE = 2  # argparse and most CLIs: bad command line
# The last exception says the process ran out of memory (torch: `torch.OutOfMemoryError:
# CUDA out of memory. ...`; older torch: `RuntimeError: CUDA out of memory. ...`; torch on
# the CPU: `RuntimeError: [enforce fail at alloc_cpu.cpp:127] ... DefaultCPUAllocator: can't
# allocate memory: ...`).
_OUT_OF_MEMORY_EXCEPTIONS = frozenset({"MemoryError", "OutOfMemoryError"})
_OUT_OF_MEMORY_TEXT = re.compile(
    r"CUDA (?:error: )?out of memory|DefaultCPUAllocator: can't allocate memory", re.IGNORECASE
)
_MAX_SIGNAL = 64
# A kernel OOM kill with a peak this close to the memory limit was the limit's doing.
_AT_LIMIT = 0.97
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'\s+File "[^"]*", line \d+')
_TRACEBACK_FRAME = re.compile(r'\s+File "[^"]*", line \d+, in ')
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::|$)")


@dataclass(frozen=True)
class ExitObservation:
    """Everything known about how one replica ended, gathered by the supervisor."""

    rank: int
    exit: ExitRecord | None
    lost: bool = False  # no exit record and nothing alive
    launch_error: str | None = None  # muster could not start the shim
    log_tail: str = ""  # the last ~20 lines of the replica's log, decoded
    transient_exit_codes: frozenset[int] = frozenset()
    stop_requested: bool = False  # muster asked it to stop
    stalled: str | None = None  # muster stopped it for making no progress: what it saw


@dataclass(frozen=True)
class Classification:
    """The verdict on one replica's end: the reason and the message shown to people."""

    reason: Reason
    message: str
    exit_code: int | None  # shell-style: 128+N for signal N
    signal: str | None  # e.g. "SIGKILL"
    termination_reason: str | None  # the last exception line of the log tail's traceback


def classify_exit(obs: ExitObservation) -> Classification:
    """Classify how a replica ended. Pure: never raises, never looks outside `obs`."""
    name = replica_name(obs.rank)
    if obs.launch_error is not None:
        message = f"muster could not launch the replica {name}: {obs.launch_error}"
        return Classification(Reason.INTERNAL, message, None, None, None)
    if obs.lost:
        return Classification(Reason.LOST, _lost_message(name), None, None, None)
    if obs.exit is None:
        message = f"muster has no exit record for the replica {name}, yet it is not lost"
        return Classification(Reason.INTERNAL, message, None, None, None)
    if obs.exit.spawn_error is not None:
        return _spawn_failure(name, obs.exit)
    return _classify_status(obs, obs.exit)


def _classify_status(obs: ExitObservation, record: ExitRecord) -> Classification:
    name = replica_name(obs.rank)
    code, sig = _exit_status(record)
    term = termination_reason(obs.log_tail)
    if obs.stalled is not None:
        message = (f"The replica {name} made no progress: {obs.stalled}; muster killed its "
                   "process group" + _stop_detail(record, sig))
        return Classification(Reason.STALLED, message, code, sig, term)
    if obs.stop_requested or record.stop_requested:
        message = f"The replica {name} was stopped by muster" + _stop_detail(record, sig)
        return Classification(Reason.STOPPED, message, code, sig, term)
    if code is None:
        message = f"The replica {name} ended, but its exit record has no exit status"
        return Classification(Reason.INTERNAL, message, None, None, term)
    if code == 0 and sig is None:
        message = f"The replica {name} exited with status 0"
        return Classification(Reason.OK, message, code, sig, term)
    if record.memory_error is not None:
        limit = (format_size(record.memory_limit_bytes) if record.memory_limit_bytes
                 else "its limit")
        message = (f"The replica {name} was stopped by muster: its memory limit of {limit} "
                   f"could not be enforced ({record.memory_error}), and it must not run "
                   "without it")
        return Classification(Reason.INTERNAL, message, code, sig, term)
    reason = _failure_reason(obs, record, code, sig, term)
    if reason is Reason.OOM and record.oom is not None:
        message = _oom_kill_message(name, code, record, record.oom)
    elif reason is Reason.OOM:
        message = _failure_message(name, code, sig, term, obs.log_tail, "ran out of memory and ")
    else:
        message = _failure_message(name, code, sig, term, obs.log_tail)
    return Classification(reason, message, code, sig, term)


def _failure_reason(
    obs: ExitObservation, record: ExitRecord, code: int, sig: str | None, term: str | None
) -> Reason:
    # An OOM kill comes first: the SIGKILL of the kernel's OOM killer (or the one that
    # enforced the limit) is not an INFRA failure.
    if record.oom is not None:
        return Reason.OOM
    if sig is not None:
        return Reason.TRANSIENT if sig in _TRANSIENT_SIGNALS else Reason.INFRA
    if code in obs.transient_exit_codes:
        return Reason.TRANSIENT
    if term and _is_out_of_memory(term):
        return Reason.OOM
    if code == _USAGE_EXIT_CODE or (term and _exception_name(term) in _PERMANENT_EXCEPTIONS):
        return Reason.PERMANENT_ERROR
    return Reason.USER_ERROR


def _spawn_failure(name: str, record: ExitRecord) -> Classification:
    """The shim ran but could not exec the entrypoint: missing program, not executable, ..."""
    message = f"The replica {name} could not start: {record.spawn_error}"
    if record.spawn_errno in _PERMANENT_SPAWN_ERRNOS:
        return Classification(Reason.PERMANENT_ERROR, message, None, None, None)
    return Classification(Reason.INTERNAL, message, None, None, None)


def _exit_status(record: ExitRecord) -> tuple[int | None, str | None]:
    """Shell-style exit code and signal name, whichever of the record's fields are set.

    A negative returncode is a signal; so is a shell-style 128+N code, which a wrapper
    script (bash, torchrun) reports when its child died of signal N.
    """
    code = record.exit_code
    if code is None and record.returncode is not None:
        rc = record.returncode
        code = 128 - rc if rc < 0 else rc
    sig = record.signal
    if sig is None and record.returncode is not None and record.returncode < 0:
        sig = _signal_name(-record.returncode)
    if sig is None and code is not None and 128 < code <= 128 + _MAX_SIGNAL:
        sig = _signal_name(code - 128)
    return code, sig


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def termination_reason(log_tail: str) -> str | None:
    """The exception line of the last Python traceback in `log_tail`, e.g. "ValueError: x".

    With chained exceptions this is the last one raised. A syntax error in the main script
    has no "Traceback" header, only a bare `File "...", line N` frame, and is found too. A
    script that ends with `raise SystemExit("msg")` prints no traceback, and gets None.
    """
    lines = log_tail.splitlines()
    headers = [i for i, line in enumerate(lines) if line.rstrip().endswith(_TRACEBACK)]
    if headers:
        header = lines[headers[-1]].rstrip()
        # Launchers such as torchrun prefix every line ("[rank0]: "); the header shows which.
        prefix = header[: len(header) - len(_TRACEBACK)]
        return _first_unindented(lines[headers[-1] + 1 :], prefix)
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    line = _first_unindented(lines[frames[-1] + 1 :], "") if frames else None
    if line is None:
        return None
    if _exception_name(line) in _SYNTAX_ERRORS:
        return line
    # A traceback longer than the tail (urllib's, say) lost its header, not its exception;
    # faulthandler's bare frames ("line 3 in f", no comma) are followed by none.
    traceback_frame = _TRACEBACK_FRAME.match(lines[frames[-1]]) is not None
    return line if traceback_frame and _EXCEPTION_LINE.match(line) else None


def _is_out_of_memory(term: str) -> bool:
    """True for `MemoryError`, `torch.OutOfMemoryError: ...`, `...: CUDA out of memory. ...`."""
    return _exception_name(term) in _OUT_OF_MEMORY_EXCEPTIONS or bool(
        _OUT_OF_MEMORY_TEXT.search(term)
    )


def _exception_name(line: str) -> str:
    """`mod.sub.KeyError: 'x'` -> `KeyError`."""
    return line.split(":", 1)[0].rsplit(".", 1)[-1].strip()


def _first_unindented(lines: list[str], prefix: str) -> str | None:
    for raw in lines:
        line = raw.removeprefix(prefix)
        if line.strip() and not line[0].isspace():
            return line.strip()
    return None


def _failure_message(
    name: str, code: int, sig: str | None, term: str | None, log_tail: str, cause: str = ""
) -> str:
    message = f"The replica {name} {cause}exited with a non-zero status of {code}"
    if sig is not None:
        message += f" ({sig})"
    if term is not None:
        message += f". Termination reason: {term}"
    lines = len(log_tail.splitlines()) if log_tail.strip() else 0
    if lines:
        message += f" (see the last {lines} log line{'' if lines == 1 else 's'})"
    return message


def _oom_kill_message(name: str, code: int, record: ExitRecord, oom: OomKill) -> str:
    """`... ran out of memory and exited with a non-zero status of 137: killed by the
    kernel's OOM killer at 21.3 GiB (machine 24 GiB, no memory_limit set): set
    resources.memory_limit or use less memory`; with a limit `... at its memory_limit of
    4 GiB (peak 4 GiB): raise resources.memory_limit or use less memory`."""
    lead = f"The replica {name} ran out of memory and exited with a non-zero status of {code}"
    peak = record.peak_rss_bytes if record.peak_rss_bytes is not None \
        else record.peak_memory_bytes
    limit = oom.limit_bytes
    killer = ("muster's memory watchdog" if oom.source is OomSource.WATCHDOG
              else "the kernel's OOM killer")
    if limit is not None and (oom.source is OomSource.WATCHDOG or peak is None
                              or peak >= limit * _AT_LIMIT):
        shown = f" (peak {format_size(peak)})" if peak is not None else ""
        return (f"{lead}: killed by {killer} at its memory_limit of {format_size(limit)}"
                f"{shown}: raise resources.memory_limit or use less memory")
    at = f" at {format_size(peak)}" if peak is not None else ""
    machine = f"machine {format_size(oom.machine_bytes)}, " if oom.machine_bytes else ""
    if limit is None:
        return (f"{lead}: killed by {killer}{at} ({machine}no memory_limit set): set "
                "resources.memory_limit or use less memory")
    return (f"{lead}: killed by {killer}{at} ({machine}below its memory_limit of "
            f"{format_size(limit)}): the machine ran out of memory first; use less memory")


def _stop_detail(record: ExitRecord, sig: str | None) -> str:
    """Name the signal that ended it, or else the last one muster sent."""
    shown = sig or (record.signals_sent[-1] if record.signals_sent else None)
    return f" ({shown})" if shown else ""


def _lost_message(name: str) -> str:
    return (
        f"The replica {name} was lost: there is no exit record and its shim and process "
        "are gone (e.g. the machine restarted or the shim was killed)"
    )


def replica_name(rank: int) -> str:
    """How messages name a replica: `worker-1 (rank 1)`."""
    return f"worker-{rank} (rank {rank})"
