"""Reading back what a chaos soak left, for the checks in soak_checks.py: the run
directories (logs, exit records, process identities), the API (trials, logs as served), the
database (every state change) and /proc (what still runs)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy
from soak_checks import (
    LOST_MARKER,
    EntityRow,
    EventRow,
    FinalProcess,
    LogReport,
    ProcessEnd,
    ProcessInfo,
    check_log,
)
from soak_job import WROTE

from muster import api
from muster.atomic import read_json
from muster.client import Client
from muster.launch.identity import read_stat
from muster.rundir import AttemptDir, RankFile, RankFiles, RunDir

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _token(data: Any, pid: str, ticks: str) -> str | None:
    if isinstance(data, dict) and isinstance(data.get(pid), int) \
            and isinstance(data.get(ticks), int):
        return f"{data[pid]}.{data[ticks]}"
    return None


def _json(path: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):
        return read_json(path)
    return None


def _archived(files: RankFiles, kind: RankFile) -> list[Path]:
    """The rank's `kind` files of the incarnations restarted in place, oldest first."""
    name = files.path(kind).name
    found = list(files.attempt_dir.joinpath("restarts").glob(f"{name}.*"))
    return sorted(found, key=lambda p: int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)


def rank_ends(files: RankFiles) -> list[ProcessEnd]:
    """Every exit record of the rank in its attempt: restarted incarnations', then its own."""
    ends = []
    for path in [*_archived(files, RankFile.EXIT), files.exit]:
        data = _json(path)
        token = _token(data, "pid", "start_ticks")
        if token is not None:
            ends.append(ProcessEnd(token, data.get("returncode"),
                                   int(data.get("log_lost_bytes") or 0)))
    return ends


def final_process(files: RankFiles) -> FinalProcess:
    """The rank's latest process in its attempt: from its exit record, else its status."""
    data = _json(files.exit)
    token = _token(data, "pid", "start_ticks")
    if token is not None:
        return FinalProcess(files.rank, token, data.get("started_at"), data.get("ended_at"))
    status = _json(files.status)
    token = _token(status, "child_pid", "child_start_ticks")
    started = status.get("started_at") if isinstance(status, dict) else None
    return FinalProcess(files.rank, token, started, None)


def final_processes(run: RunDir, attempt: int, replicas: int) -> tuple[FinalProcess, ...]:
    directory = run.attempt(attempt)
    return tuple(final_process(directory.rank(rank)) for rank in range(replicas))


def lost_output(run: RunDir, attempt: int) -> tuple[str, ...]:
    """What the attempt's rank logs lost, a line a rank that lost some: the shim's marker
    lines in the log, and the bytes its exit records (every incarnation's) count."""
    found = []
    for rank, log in run.attempt(attempt).ranks_with(RankFile.LOG):
        files = run.attempt(attempt).rank(rank)
        markers = len(LOST_MARKER.findall(log.read_bytes()))
        lost = sum(int(data.get("log_lost_bytes") or 0)
                   for path in [*_archived(files, RankFile.EXIT), files.exit]
                   if isinstance(data := _json(path), dict))
        if markers or lost:
            found.append(f"rank {rank}: {markers} marker lines, {lost:,} bytes lost")
    return tuple(found)


def wrote_before_pipe_broke(run: RunDir) -> dict[str, int]:
    """What soak_job.py left where its pipe broke: records written, by process token."""
    found = {}
    for path in run.workdir.glob(f"{WROTE}*"):
        with contextlib.suppress(OSError, ValueError):
            found[path.name.removeprefix(WROTE)] = int(path.read_text())
    return found


def rank_logs(run: RunDir) -> Iterator[tuple[int, RankFiles]]:
    """(attempt number, rank files) of every rank log of the trial."""
    for number in run.attempt_numbers():
        attempt = run.attempt(number)
        for rank, _ in attempt.ranks_with(RankFile.LOG):
            yield number, attempt.rank(rank)


def check_trial_logs(run: RunDir) -> LogReport:
    """Every rank log of every attempt of the trial, read whole from its file."""
    report = LogReport()
    wrote = wrote_before_pipe_broke(run)
    for number, files in rank_logs(run):
        name = f"trial {run.path.name} attempt {number} rank {files.rank}"
        report.add(check_log(name, files.log.read_bytes(), rank_ends(files), wrote))
    return report


def served_log_differs(client: Client, trial_id: int, attempt: int, files: RankFiles
                       ) -> str | None:
    """Read the rank's log through the API (`GET /trials/{id}/logs?rank=r`) to its end:
    None when it is the file byte for byte, else what differs."""
    expected = files.log.read_bytes()
    served, offset = bytearray(), 0
    while True:
        chunk = client.read_logs(trial_id, attempt=attempt, rank=files.rank, offset=offset,
                                 limit=16 << 20)
        served += chunk.data
        if not chunk.data or chunk.next_offset is None or chunk.next_offset <= offset:
            break
        offset = chunk.next_offset
    if bytes(served) == expected:
        return None
    same = next((i for i, (a, b) in enumerate(zip(served, expected, strict=False)) if a != b),
                min(len(served), len(expected)))
    return (f"trial {trial_id} attempt {attempt} rank {files.rank}: served {len(served):,} "
            f"bytes, the file holds {len(expected):,}; they part at byte {same:,}")


def shim_sessions(runs: Path) -> dict[int, int]:
    """Every shim the run directories name (launch and status files, restarted incarnations'
    too): its pid, which is its session, → its start ticks."""
    sessions = {}
    for trial in sorted(runs.iterdir()) if runs.is_dir() else []:
        run = RunDir(trial)
        for number in run.attempt_numbers():
            attempt = run.attempt(number)
            for kind in (RankFile.LAUNCH, RankFile.STATUS):
                for rank, path in attempt.ranks_with(kind):
                    for each in [*_archived(attempt.rank(rank), kind), path]:
                        data = _json(each)
                        token = _token(data, "shim_pid", "shim_start_ticks")
                        if token is not None:
                            pid, _, ticks = token.partition(".")
                            sessions[int(pid)] = int(ticks)
    return sessions


def scan_processes() -> list[ProcessInfo]:
    """Every process now, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        proc = Path("/proc", entry)
        stat = read_stat(int(entry))
        if stat is None or stat.is_dead:
            continue
        with contextlib.suppress(OSError):
            cgroups = tuple(line.split(":", 2)[2] for line in
                            (proc / "cgroup").read_text().splitlines() if line.count(":") >= 2)
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
            found.append(ProcessInfo(stat.pid, stat.session, stat.start_ticks, cgroups,
                                     cmdline))
    return found


def replica_cgroups(uuids: set[str]) -> list[Path]:
    """Replica memory cgroups (`muster-<trial uuid>-a<n>-r<r>-<pid>`) of these trials still
    there."""
    found = []
    for directory, subdirs, _ in os.walk(CGROUP_ROOT):
        depth = len(Path(directory).relative_to(CGROUP_ROOT).parts)
        for name in subdirs:
            if name.startswith("muster-") and name[7:43] in uuids:
                found.append(Path(directory, name))
        if depth >= 6:
            subdirs.clear()
    return found


@dataclass(frozen=True)
class MachineRows:
    events: list[EventRow]
    rows: list[EntityRow]


def read_machine(db_url: str) -> MachineRows:
    """Every state change of experiments, trials and attempts, and their rows' states."""
    engine = sqlalchemy.create_engine(db_url)
    try:
        with engine.connect() as connection:
            events = [EventRow(*row) for row in connection.execute(sqlalchemy.text(
                "SELECT id, entity, entity_id, from_state, to_state, reason, actor FROM events "
                "WHERE entity IN ('experiment', 'trial', 'attempt') ORDER BY id"))]
            rows = [EntityRow("experiment", row[0], row[1], None) for row in
                    connection.execute(sqlalchemy.text("SELECT id, state FROM experiments"))]
            rows += [EntityRow("trial", *row) for row in connection.execute(
                sqlalchemy.text("SELECT id, state, experiment_id FROM trials"))]
            rows += [EntityRow("attempt", *row) for row in connection.execute(
                sqlalchemy.text("SELECT id, state, trial_id FROM attempts"))]
    finally:
        engine.dispose()
    return MachineRows(events, rows)


def final_attempt(trial: api.TrialDetail) -> int | None:
    """The number of the trial's last attempt that ran (a standby never promoted did not)."""
    ran = [a["number"] for a in trial["attempts"] if not a["standby"]]
    return max(ran, default=None)


def attempt_dir(runs: Path, trial: api.TrialDetail, number: int) -> AttemptDir:
    return RunDir(runs / trial["uuid"]).attempt(number)
