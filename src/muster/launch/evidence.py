"""Evidence of a stuck replica (invariant 9): what every process of its group was doing, saved
before muster kills it, and whenever someone asks (`muster trial dump`).

    python -m muster.launch.evidence --out DIR --rank R --log LOG --pgid PGID

The shim of the replica runs this as a child (`muster.launch.dumps`) when the server asks for
a bundle; DIR is the rank's part of it, `<attempt>/evidence/<bundle>/rank-<r>/`. It writes:

- `processes.json`: each process of the group (the leader first, at most `MAX_PROCESSES`):
  pid and start ticks (its identity), ppid, state, wchan, CPU seconds, RSS, threads, its
  command line (bounded) and whether it is Python;
- `log-tail.txt`: the rank's last `LOG_TAIL_LINES` lines, byte-exact (read from the end);
- `stacks.txt` and `stacks.json`: every thread of every Python process, from `py-spy dump`
  (`--native` for the first `NATIVE_DUMPS`, where it works), each call bounded in time; for
  a process py-spy could not read, the stacks `faulthandler` printed on the harness's signal
  (`muster.harness.stack_signal`), asked of the registered process only;
- `flight-recorder/`: the dumps torch's flight recorder left where a process's environment
  points it (TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE) when its buffer is
  on (TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE); torch writes them when a
  collective times out in its watchdog (TORCH_NCCL_DUMP_ON_TIMEOUT), and nothing outside the
  process can make it write one, so they are copied when they are there;
- `summary.json`, last and atomically: the rank's part is complete once it exists.

Every step is bounded (processes, py-spy's time, bytes read and written) and every failure is
an entry in the summary's `errors`, never the end of the collection.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from muster.atomic import atomic_write_bytes, atomic_write_json, json_bytes, open_regular
from muster.harness.stack_signal import read_registration
from muster.launch.base import ProcessIdentity
from muster.launch.dumps import SUMMARY
from muster.launch.identity import group_members, send_signal
from muster.launch.logs import FileLog, log_size, read_range, tail_offset
from muster.launch.stacks import (
    ThreadStack,
    main_thread,
    parse_faulthandler,
    parse_py_spy,
    render,
    where,
)
from muster.rundir import RankFiles

__all__ = [
    "PROCESSES", "STACKS", "STACKS_JSON", "SUMMARY", "EvidenceSummary", "Tools",
    "collect", "main", "read_summary",
]

# The files of one rank's part of a bundle (and SUMMARY, last: `muster.launch.dumps`).
PROCESSES = "processes.json"
STACKS = "stacks.txt"
STACKS_JSON = "stacks.json"
LOG_TAIL = "log-tail.txt"
FLIGHT_RECORDER = "flight-recorder"

MAX_PROCESSES = 64  # described in processes.json
MAX_DUMPED = 16  # Python processes whose stacks are read
NATIVE_DUMPS = 4  # of those, read with --native (a second or so each for torch's libraries)
DUMP_WORKERS = 4
PY_SPY_TIMEOUT_S = 5.0
DEADLINE_S = 10.0  # for all the stacks together
FAULTHANDLER_WAIT_S = 2.0
LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 256 * 1024
COMMAND_BYTES = 4096
STACKS_BYTES = 4 * 1024**2  # stacks.txt, and each process's JSON in stacks.json
FAULTHANDLER_BYTES = 1024**2
ENVIRON_BYTES = 1024**2
FLIGHT_FILES = 16
FLIGHT_FILE_BYTES = 32 * 1024**2
FLIGHT_BYTES = 64 * 1024**2
ERROR_CHARS = 300
_PYTHON_EXE = re.compile(r"(python|pypy)[0-9.]*[dmu]*(-dbg)?")
_TRACE_BUFFER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_TRACE_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class MainFrame:
    """The frame the summary line names."""

    pid: int
    function: str
    file: str
    line: int


@dataclass(frozen=True)
class EvidenceSummary:
    """A rank's part of a bundle at a glance (`summary.json`)."""

    rank: int
    collected_at: float
    tool: str | None  # "py-spy" | "faulthandler" | None (no stack could be read)
    errors: list[str]
    processes: int
    main_thread: MainFrame | None
    line: str  # "rank 1 waits in all_reduce at train.py:88"
    flight_recorder: list[str] = field(default_factory=list)  # files in flight-recorder/

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def read_summary(directory: Path) -> EvidenceSummary | None:
    """The summary of the rank's part of a bundle in `directory`; None until it is complete
    (or when what is there is not a summary)."""
    try:
        with os.fdopen(open_regular(directory / SUMMARY), "rb") as file:
            data = json.loads(file.read(1024**2))
        main = data.get("main_thread")
        return EvidenceSummary(
            rank=int(data["rank"]), collected_at=float(data["collected_at"]),
            tool=data.get("tool"), errors=[str(e) for e in data.get("errors") or []],
            processes=int(data.get("processes") or 0),
            main_thread=MainFrame(**main) if isinstance(main, dict) else None,
            line=str(data["line"]),
            flight_recorder=[str(f) for f in data.get("flight_recorder") or []])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


@dataclass(frozen=True)
class Tools:
    """The programs the collector uses: py-spy, where there is one."""

    py_spy: Path | None

    @classmethod
    def find(cls) -> Tools:
        """py-spy beside the running interpreter (muster's venv), else on PATH."""
        beside = Path(sys.executable).parent / "py-spy"
        if os.access(beside, os.X_OK):
            return cls(beside)
        found = shutil.which("py-spy")
        return cls(Path(found) if found else None)


# -- the processes ---------------------------------------------------------------------------


@dataclass
class Process:
    """One process of the group, as /proc showed it."""

    pid: int
    start_ticks: int
    ppid: int
    state: str
    wchan: str
    cpu_seconds: float
    rss_bytes: int
    threads: int
    command: str
    python: bool
    uid: int = field(repr=False)
    caught: int = field(repr=False)  # the signals it handles (SigCgt), a bit per signal

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "ppid": self.ppid,
                "state": self.state, "wchan": self.wchan, "cpu_seconds": self.cpu_seconds,
                "rss_bytes": self.rss_bytes, "threads": self.threads,
                "cmdline": self.command, "python": self.python}

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(pid=self.pid, start_ticks=self.start_ticks)


def group_processes(pgid: int) -> list[Process]:
    """The group's live processes, the leader first, then by start; at most MAX_PROCESSES.
    None for group 0 or 1: the kernel's threads and init are nobody's replica."""
    if pgid <= 1:
        return []
    members = sorted(group_members(pgid), key=lambda m: (m.pid != pgid, m.start_ticks, m.pid))
    described = (_described(member.pid, member.start_ticks) for member in members)
    return [p for p in described if p is not None][:MAX_PROCESSES]


def _described(pid: int, start_ticks: int) -> Process | None:
    """The process at `pid` if it is still the one that started at `start_ticks`."""
    proc = Path("/proc", str(pid))
    try:
        fields = (proc / "stat").read_text(errors="replace").rpartition(")")[2].split()
        status = _status_fields((proc / "status").read_text(errors="replace"))
        # field N of proc(5) is fields[N - 3]
        if int(fields[19]) != start_ticks:
            return None
        command = _read_bounded(proc / "cmdline", COMMAND_BYTES)
        return Process(
            pid=pid, start_ticks=start_ticks, ppid=int(fields[1]), state=fields[0],
            wchan=_read_bounded(proc / "wchan", 256).decode(errors="replace") or "0",
            cpu_seconds=round((int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, 2),
            rss_bytes=int(fields[21]) * _PAGE_BYTES, threads=int(fields[17]),
            command=command.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace"),
            python=_is_python(proc, command), uid=int(status.get("Uid", "0").split()[1]),
            caught=int(status.get("SigCgt", "0"), 16))
    except (OSError, ValueError, IndexError):
        return None  # it ended meanwhile


def _status_fields(text: str) -> dict[str, str]:
    return {key: value.strip() for key, _, value in
            (line.partition(":") for line in text.splitlines())}


def _read_bounded(path: Path, limit: int) -> bytes:
    with open(path, "rb") as file:
        return file.read(limit)


def _is_python(proc: Path, command: bytes) -> bool:
    """A Python interpreter: by its executable's name, or the libpython it has mapped, or
    (where neither can be read: another user's process) the program its command names."""
    try:
        if _PYTHON_EXE.fullmatch(os.path.basename(os.readlink(proc / "exe"))):
            return True
        with open(proc / "maps", "rb") as maps:
            return any(b"/libpython" in line for line in maps)
    except PermissionError:
        program = command.partition(b"\0")[0].decode(errors="replace")
        return bool(_PYTHON_EXE.fullmatch(os.path.basename(program)))
    except OSError:
        return False


# -- stacks ----------------------------------------------------------------------------------


@dataclass
class Dumped:
    """What one tool read of one process."""

    pid: int
    tool: str
    threads: list[ThreadStack]
    text: str
    raw: object = None  # py-spy's own JSON


def _py_spy(py_spy: Path, process: Process, native: bool, deadline: float) -> Dumped:
    """`py-spy dump --json` of `process` (with --native when asked; without it again if
    --native fails).

    Raises:
        RuntimeError: py-spy could not read the process (its message).
    """
    try:
        output = _run_py_spy(py_spy, process.pid, native, deadline)
    except RuntimeError:
        if not native:
            raise
        output = _run_py_spy(py_spy, process.pid, False, deadline)
    if len(output) > STACKS_BYTES:
        raise RuntimeError(f"py-spy printed {len(output)} bytes for pid {process.pid}, more "
                           f"than the {STACKS_BYTES} kept")
    raw = json.loads(output)
    threads = parse_py_spy(output, process.pid)
    return Dumped(process.pid, "py-spy", threads,
                  render(process.pid, process.command, threads), raw)


def _run_py_spy(py_spy: Path, pid: int, native: bool, deadline: float) -> bytes:
    argv = [str(py_spy), "dump", "--json", "--pid", str(pid), *(["--native"] if native else [])]
    timeout = min(PY_SPY_TIMEOUT_S, deadline - time.monotonic())
    if timeout <= 0:
        raise RuntimeError(f"no time left to read pid {pid} (the stacks get {DEADLINE_S:.0f} s)")
    with tempfile.TemporaryFile() as out:
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.PIPE, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"py-spy did not read pid {pid} within {timeout:.1f} s") from None
        if done.returncode != 0:
            message = done.stderr.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"py-spy could not read pid {pid}: "
                               f"{(message or ['exit ' + str(done.returncode)])[-1]}")
        out.seek(0)
        return out.read(STACKS_BYTES + 1)


def _dump_with_py_spy(py_spy: Path, processes: Sequence[Process],
                      errors: list[str]) -> dict[int, Dumped]:
    """py-spy's dump of each process, several at once, within DEADLINE_S in all."""
    deadline = time.monotonic() + DEADLINE_S
    found: dict[int, Dumped] = {}
    with concurrent.futures.ThreadPoolExecutor(DUMP_WORKERS) as pool:
        futures = {pool.submit(_py_spy, py_spy, p, i < NATIVE_DUMPS, deadline): p.pid
                   for i, p in enumerate(processes)}
        for future in concurrent.futures.as_completed(futures):
            try:
                found[futures[future]] = future.result()
            except (RuntimeError, ValueError, OSError) as exc:
                errors.append(_bounded(str(exc)))
    return found


def _dump_with_faulthandler(files: RankFiles, processes: Sequence[Process],
                            errors: list[str]) -> Dumped | None:
    """The stacks faulthandler prints on the harness's signal, from the one process that
    registered for it, while it is still that process and still catches the signal."""
    registration = read_registration(files.stack_signal)
    if registration is None:
        return None
    process = next((p for p in processes if p.pid == registration.pid
                    and p.start_ticks == registration.start_ticks), None)
    if process is None:
        return None
    if not process.caught >> (registration.signum - 1) & 1:
        errors.append(f"pid {process.pid} no longer catches signal {registration.signum}: "
                      "not sent (it would end the process)")
        return None
    before = _size(files.faulthandler)
    if not send_signal(process.identity, registration.signum):
        return None
    text = _new_output(files.faulthandler, before)
    if not text:
        errors.append(f"pid {process.pid} printed no stacks within {FAULTHANDLER_WAIT_S:.0f} s "
                      f"of signal {registration.signum}")
        return None
    threads = parse_faulthandler(text, process.pid)
    return Dumped(process.pid, "faulthandler", threads,
                  f"Process {process.pid}: {process.command} (faulthandler)\n{text}")


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _new_output(path: Path, offset: int) -> str:
    """What was written to `path` past `offset` once it stops growing (a few polls)."""
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    size = offset
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _size(path)
        if now > offset and now == size:
            break
        size = now
    if size <= offset:
        return ""
    try:
        with os.fdopen(open_regular(path), "rb") as file:
            file.seek(offset)
            return file.read(min(size - offset, FAULTHANDLER_BYTES)).decode(errors="replace")
    except OSError:
        return ""


# -- the log and the flight recorder -------------------------------------------------------


def _log_tail(log: Path) -> bytes:
    """The last LOG_TAIL_LINES lines of the log (within its last LOG_TAIL_BYTES), read
    around any range `resources.log_limit` dropped (never its NULs) and never through a
    link (`FileLog`)."""
    if not stat.S_ISREG(os.lstat(log).st_mode):  # (missing: FileNotFoundError)
        raise OSError(errno.EINVAL, "not a regular file")
    replica = FileLog(0, log)
    end = log_size(replica)
    lines_start, bytes_start = tail_offset(replica, LOG_TAIL_LINES), end - LOG_TAIL_BYTES
    offset = max(lines_start, bytes_start)
    parts: list[bytes] = []
    while offset < end:
        data, offset = read_range(replica, offset, end - offset)
        if not data:
            break
        parts.append(data)
    data = b"".join(parts)
    if bytes_start > lines_start and b"\n" in data:
        data = data[data.index(b"\n") + 1:]  # the first line is cut
    return data


def _environ(pid: int) -> dict[str, str]:
    try:
        data = _read_bounded(Path("/proc", str(pid), "environ"), ENVIRON_BYTES)
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in data.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _flight_recorder(processes: Sequence[Process], into: Path,
                     errors: list[str]) -> list[str]:
    """Copy the flight recorder's dumps of each process that has its buffer on."""
    copied: list[str] = []
    seen: set[Path] = set()
    budget = FLIGHT_BYTES
    for process in processes:
        env = _environ(process.pid)
        if not any(_positive_int(env.get(name)) for name in _TRACE_BUFFER):
            continue
        prefix = next((env[name] for name in _TRACE_FILE if env.get(name)), "")
        if not prefix.startswith("/"):
            errors.append(f"pid {process.pid} records collectives (flight recorder) but names "
                          "no absolute TORCH_FR_DUMP_TEMP_FILE: its dumps are not collected")
            continue
        for path in _dumps_at(Path(prefix)):
            if path in seen or len(copied) >= FLIGHT_FILES or budget <= 0:
                continue
            seen.add(path)
            try:
                budget -= _copy_owned(path, into, process.uid, min(budget, FLIGHT_FILE_BYTES))
                copied.append(path.name)
            except OSError as exc:
                errors.append(_bounded(f"flight recorder dump {path}: {exc}"))
    return copied


def _positive_int(value: str | None) -> bool:
    try:
        return value is not None and int(value) > 0
    except ValueError:
        return False


def _dumps_at(prefix: Path) -> list[Path]:
    """The files whose path starts with `prefix` (torch appends the rank, sometimes more)."""
    try:
        names = sorted(os.listdir(prefix.parent))
    except OSError:
        return []
    return [prefix.parent / name for name in names if name.startswith(prefix.name)]


def _copy_owned(source: Path, into: Path, uid: int, limit: int) -> int:
    """Copy a regular file that `uid` owns (never through a link: the path came from the
    job's environment) into `into`, at most `limit` bytes; the bytes copied.

    Raises:
        OSError: it is not such a file, or cannot be read or written.
    """
    with os.fdopen(open_regular(source), "rb") as file:
        if os.fstat(file.fileno()).st_uid != uid:
            raise PermissionError("not the process's own file: not copied")
        data = file.read(limit)
    into.mkdir(exist_ok=True)
    atomic_write_bytes(into / source.name, data)
    return len(data)


def _bounded(message: str) -> str:
    return message if len(message) <= ERROR_CHARS else message[:ERROR_CHARS - 1] + "…"


# -- the bundle ------------------------------------------------------------------------------


def collect(out: Path, rank: int, log: Path, pgid: int,
            tools: Tools | None = None) -> EvidenceSummary:
    """Collect rank `rank`'s part of a bundle into `out` (made if missing); `summary.json`
    last. `log` is the rank's log; its other files (the harness's registration) sit beside.

    Raises:
        OSError: `out` cannot be made or written.
    """
    out.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    processes = group_processes(pgid)
    atomic_write_json(out / PROCESSES, [p.to_json() for p in processes])
    _save_log_tail(log, out, errors)
    dumped = _stacks(RankFiles(log.parent, rank), processes, (tools or Tools.find()), errors)
    _save_stacks(out, dumped)
    flight = _flight_recorder(processes, out / FLIGHT_RECORDER, errors)
    summary = _summary(rank, processes, dumped, errors, flight)
    atomic_write_json(out / SUMMARY, summary.to_json())
    return summary


def _save_log_tail(log: Path, out: Path, errors: list[str]) -> None:
    try:
        tail = _log_tail(log)
    except OSError as exc:
        errors.append(_bounded(f"the log {log}: {exc.strerror or exc}"))
        tail = b""
    atomic_write_bytes(out / LOG_TAIL, tail)


def _stacks(files: RankFiles, processes: Sequence[Process], tools: Tools,
            errors: list[str]) -> list[Dumped]:
    """Each Python process's stacks, in the group's order: py-spy's, else faulthandler's."""
    python = [p for p in processes if p.python][:MAX_DUMPED]
    if len([p for p in processes if p.python]) > MAX_DUMPED:
        errors.append(f"only the first {MAX_DUMPED} Python processes of the group were read")
    if tools.py_spy is None:
        errors.append("py-spy is not installed beside muster's Python or on PATH")
        found: dict[int, Dumped] = {}
    else:
        found = _dump_with_py_spy(tools.py_spy, python, errors)
    missing = [p for p in python if p.pid not in found]
    if missing and (fallback := _dump_with_faulthandler(files, missing, errors)):
        found[fallback.pid] = fallback
    return [found[p.pid] for p in python if p.pid in found]


def _save_stacks(out: Path, dumped: Sequence[Dumped]) -> None:
    text = "\n".join(d.text for d in dumped).encode(errors="replace")
    if len(text) > STACKS_BYTES:
        text = text[:STACKS_BYTES] + b"\n[cut at %d bytes]\n" % STACKS_BYTES
    atomic_write_bytes(out / STACKS, text)
    atomic_write_bytes(out / STACKS_JSON, json_bytes(
        [{"pid": d.pid, "tool": d.tool, "threads": d.raw} for d in dumped if d.raw is not None]))


def _summary(rank: int, processes: Sequence[Process], dumped: Sequence[Dumped],
             errors: list[str], flight: list[str]) -> EvidenceSummary:
    tools = {d.tool for d in dumped}
    thread = main_thread([d.threads for d in dumped])
    spot = where(thread) if thread is not None else None
    if spot is not None and thread is not None:
        line = f"rank {rank} {spot.text}"
    elif not processes:
        line = f"rank {rank}: no process left in its group"
    else:
        line = f"rank {rank}: no stack could be read" + (f" ({errors[0]})" if errors else "")
    frame = spot.frame if spot is not None else None
    return EvidenceSummary(
        rank=rank, collected_at=time.time(),
        tool="py-spy" if "py-spy" in tools else ("faulthandler" if tools else None),
        errors=errors, processes=len(processes),
        main_thread=None if frame is None or thread is None else MainFrame(
            thread.pid, frame.function, frame.short, frame.line),
        line=line, flight_recorder=flight)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m muster.launch.evidence",
                                     description="Collect one rank's part of an evidence bundle.")
    parser.add_argument("--out", type=Path, required=True, help="the rank's bundle directory")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True, help="the rank's log")
    parser.add_argument("--pgid", type=int, required=True, help="the replica's process group")
    args = parser.parse_args(argv)
    try:
        summary = collect(args.out, args.rank, args.log, args.pgid)
    except OSError as exc:
        print(f"muster evidence: cannot write the bundle at {args.out}: {exc}", file=sys.stderr)
        return 1
    print(summary.line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
