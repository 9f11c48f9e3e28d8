"""The chaos soak's invariants (benchmarks/soak.py), as pure functions over what it recorded.

The soak drives a real server and records every fault it fires (`Fault`); afterwards it reads
back every rank log, exit record, trial, event and process, and hands them to the checks
here, which say what holds and what does not. Nothing here touches a process, a file or the
network, so each rule is table-tested (tests/test_soak.py) with made-up inputs.

The checks, one per invariant of issue 37:

- `check_log`: every record each process wrote is in its log exactly once (soak_job.py's
  numbered records), except where the log itself says output was lost (the shim's marker
  line for a full disk) or a process was cut off (its last record, with no end record).
- `judge_trials`: no false success. Which faults must keep a trial from SUCCEEDED-verified
  is spelled out at `judge_trial`.
- `stuck_trials`: nothing left unfinished after the drain.
- `find_orphans`: no process of muster's left after `muster down`.
- `check_growth`: the server's RSS and open descriptors, end against warm-up.
- `check_state_machine`: every recorded state change a legal move, in an unbroken chain
  from the entity's first state to its current one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from soak_job import PREFIX, payload

from muster.states import (
    ATTEMPT_MOVES,
    EXPERIMENT_MOVES,
    REVIEW_ONLY_MOVES,
    REVIEW_REASONS,
    TRIAL_MOVES,
    AttemptState,
    ExperimentState,
    TrialState,
)

END = b"end"
# The shim's line where output a full disk refused was dropped (muster.launch.log_limit).
LOST_MARKER = re.compile(rb"\xe2\x94\x80\xe2\x94\x80 muster: .* of output lost here: ")
_TOKEN = re.compile(rb"[0-9]+\.[0-9]+")


class FaultKind(StrEnum):
    """What the soak does to muster (or to what muster runs)."""

    KILL_SERVER = "kill server"  # SIGKILL of the server; the soak starts it again
    KILL_RANK = "kill rank"  # SIGKILL of a replica's training process
    KILL_SHIM = "kill shim"  # SIGKILL of a replica's shim
    STOP_RANK = "stop rank"  # SIGSTOP of a replica's training process: a hang
    FILL_DISK = "fill disk"  # the runs' file system filled, then freed
    RESTART_POSTGRES = "restart postgres"  # pg_ctlcluster ... restart
    FOLLOWERS = "followers"  # a burst of concurrent log follows, then cut
    CUT_UPLOAD = "cut upload"  # an experiment upload that stops mid-body

    def hits_process(self) -> bool:
        """Whether the fault is aimed at one training process (its shim's child)."""
        return self in _PROCESS_FAULTS


_PROCESS_FAULTS = frozenset({FaultKind.KILL_RANK, FaultKind.KILL_SHIM, FaultKind.STOP_RANK})


@dataclass(frozen=True)
class Fault:
    """One fault as fired: when, at what, and whether it landed."""

    kind: FaultKind
    at: float  # wall-clock time it was fired
    until: float | None = None  # the end of its window (a full disk: when it was freed)
    trial: str | None = None  # the trial's uuid, for a fault aimed at a process
    attempt: int | None = None
    rank: int | None = None
    target: str | None = None  # the training process's token, "<pid>.<start ticks>"
    landed: bool = True  # the signal reached that very process; the action took
    detail: str = ""


def token_ticks(token: str) -> int:
    """The start ticks of a process token, "<pid>.<start ticks>"."""
    return int(token.partition(".")[2])


# -- 1. every byte in its log exactly once ------------------------------------------------


@dataclass(frozen=True)
class ProcessEnd:
    """What the shim recorded of one process of a rank (an exit record)."""

    token: str
    returncode: int | None
    lost_bytes: int = 0  # output the shim could not write to the log (a full disk)


@dataclass
class LogReport:
    """What the logs held, and what broke the exactly-once rule."""

    logs: int = 0
    bytes: int = 0  # every byte of the logs read
    record_bytes: int = 0  # bytes of records found whole and correct
    records: int = 0  # records found (whole or cut)
    processes: int = 0  # processes (tokens) found in the logs
    ended: set[str] = field(default_factory=set)  # tokens whose end record is there
    cut_tails: int = 0  # processes whose output stops before their end record
    cut_records: int = 0  # records cut short: mid-write SIGKILL, or a full disk
    lost_markers: int = 0  # the shim's "output lost here" lines
    gaps_at_markers: int = 0  # records missing where a marker says output was lost
    lost_with_shim: int = 0  # records a process wrote that died with its SIGKILLed shim
    lost_whole: int = 0  # processes whose every byte its exit record counts as lost
    problems: list[str] = field(default_factory=list)

    def add(self, other: LogReport) -> None:
        for name in ("logs", "bytes", "record_bytes", "records", "processes", "cut_tails",
                     "cut_records", "lost_markers", "gaps_at_markers", "lost_with_shim",
                     "lost_whole"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.ended |= other.ended
        self.problems += other.problems


@dataclass(frozen=True)
class _Record:
    token: str | None  # None: cut before its token was whole
    number: int | None  # None: an end record, or cut before its number
    whole: bool
    size: int
    end_count: int | None = None


@dataclass
class _Stream:
    """One process's records as the log shows them, in order."""

    expected: int = 0  # the number its next record should have
    end: int | None = None  # the count its end record gave
    markers: int = 0  # lost-output markers in the log before its latest record
    cut_open: bool = False  # its latest record was cut short


def check_log(name: str, data: bytes, ends: Sequence[ProcessEnd] = (),
              wrote: Mapping[str, int] | None = None) -> LogReport:
    """Read one rank log of one attempt: each process's records 0, 1, 2, ... exactly once.

    A process's records must follow each other with no duplicate and no gap, except a gap
    where the shim's marker line says output was lost (a full disk) between them. Its
    output may stop early (no end record: it was killed, stopped, or its shim died), and
    its last record may then be cut short; a record cut short anywhere else must be
    followed by a marker. A process whose exit record says it exited 0 must have its end
    record there, unless a marker follows its last record; output an exit record counts as
    lost needs a marker in the log (muster's promise: the log says so). `wrote` holds, for
    a process whose shim was SIGKILLed, how many records it counted as written: those its
    log lacks died in the pipe with their only reader (counted, not a violation).

    Args:
        name: how the problems name this log.
        data: the whole log.
        ends: the exit records of the processes that ran in this rank of this attempt.
        wrote: records written, by token, of the processes that outlived their shim.
    """
    report = LogReport(logs=1, bytes=len(data))
    streams: dict[str, _Stream] = {}
    markers = 0
    for item in _items(data):
        if item is None:
            markers += 1
            report.lost_markers += 1
        else:
            _take(f"{name}: process {item.token}", item, streams, markers, report)
    _close(name, streams, markers, {end.token: end for end in ends}, wrote or {}, report)
    return report


def _items(data: bytes) -> Iterable[_Record | None]:
    """The log's records in order, None for each lost-output marker."""
    lines = data.split(b"\n")
    for index, line in enumerate(lines):
        terminated = index < len(lines) - 1
        if LOST_MARKER.search(line):
            yield None
            continue
        parts = line.split(PREFIX)
        for part_index, part in enumerate(parts[1:], start=1):
            last = part_index == len(parts) - 1
            yield _parse(part, whole_possible=terminated and last)


def _parse(part: bytes, whole_possible: bool) -> _Record:
    fields = part.split(b" ", 3)
    token = fields[0].decode() if _TOKEN.fullmatch(fields[0]) and len(fields) > 1 else None
    if token is None or len(fields) < 3 or not fields[2].isdigit():
        return _Record(token, None, False, len(part))
    if fields[1] == END:
        return _Record(token, None, whole_possible and len(fields) == 3, len(part),
                       end_count=int(fields[2]))
    if not fields[1].isdigit():
        return _Record(token, None, False, len(part))
    number, length = int(fields[1]), int(fields[2])
    body = fields[3] if len(fields) == 4 else b""
    whole = whole_possible and body == payload(token, number, length)
    return _Record(token, number, whole, len(PREFIX) + len(part) + 1)


def _take(where: str, item: _Record, streams: dict[str, _Stream], markers: int,
          report: LogReport) -> None:
    """One record of the log, against what came before it of its process."""
    if item.token is None:  # cut inside its token: a killed process's last bytes
        report.cut_records += 1
        return
    stream = streams.setdefault(item.token, _Stream())
    marked = markers > stream.markers  # output was lost since its previous record
    if stream.end is not None:
        report.problems.append(f"{where}: output after its end record")
    if stream.cut_open and not marked:
        report.problems.append(f"{where}: a record is cut short, yet more of its output "
                               "follows and no marker says why")
    stream.markers, stream.cut_open = markers, False
    if item.end_count is not None:
        stream.end = item.end_count
        if item.end_count != stream.expected and not marked:
            report.problems.append(f"{where}: its end record counts {item.end_count} records, "
                                   f"the log holds {stream.expected}")
        if item.whole:
            report.ended.add(item.token)
        return
    if item.number is None or not item.whole:
        report.cut_records += 1
        stream.cut_open = True
    if item.number is None:
        return
    report.records += 1
    if item.whole:
        report.record_bytes += item.size
    if item.number < stream.expected:
        report.problems.append(f"{where}: record {item.number} again (after "
                               f"{stream.expected - 1}): a duplicate")
    elif item.number > stream.expected:
        if marked:
            report.gaps_at_markers += 1
        else:
            report.problems.append(f"{where}: records {stream.expected}.."
                                   f"{item.number - 1} are missing, and no marker says why")
    stream.expected = max(stream.expected, item.number + 1)


def _close(name: str, streams: dict[str, _Stream], markers: int,
           ends: dict[str, ProcessEnd], wrote: Mapping[str, int], report: LogReport) -> None:
    """Each process's output as a whole: how it stops, against how it ended."""
    report.processes += len(streams)
    for token, stream in streams.items():
        if stream.end is not None:
            continue
        report.cut_tails += 1
        if token in wrote and wrote[token] > stream.expected:
            report.lost_with_shim += wrote[token] - stream.expected
        end = ends.get(token)
        if end is not None and end.returncode == 0 and markers == stream.markers:
            report.problems.append(f"{name}: process {token} exited 0, but its log stops "
                                   f"after record {stream.expected - 1}, before its end "
                                   "record")
    for token, end in ends.items():
        if end.lost_bytes and not markers:
            report.problems.append(f"{name}: process {token}: its exit record counts "
                                   f"{end.lost_bytes:,} bytes of output lost, and no marker "
                                   "line in the log says so")
        elif token in streams or end.returncode != 0:
            continue
        elif end.lost_bytes:  # it ran its whole short life on a full disk
            report.lost_whole += 1
        else:
            report.problems.append(f"{name}: process {token} exited 0 and left no record")


# -- 2. no false success --------------------------------------------------------------------


@dataclass(frozen=True)
class FinalProcess:
    """The last process of one rank of a trial's final attempt, as its files tell."""

    rank: int
    token: str | None  # None: it never started a training process
    started_at: float | None
    ended_at: float | None  # None: no exit record


@dataclass(frozen=True)
class TrialOutcome:
    """A trial as it ended, and what ran in its final attempt."""

    trial_id: int
    uuid: str
    experiment: str
    kind: str  # the soak's workload kind
    state: str
    verified: bool | None
    misbehaves: bool  # its script is built to end it FAILED or SUSPECT
    final: tuple[FinalProcess, ...] = ()
    # Output its final attempt's logs lost (a full disk), one line a rank: the shim's
    # marker lines in the log, and the bytes its exit records count as lost.
    lost_output: tuple[str, ...] = ()
    verdict: str = ""  # as muster says it (`muster.verdicts`)


@dataclass(frozen=True)
class Judgement:
    trial: TrialOutcome
    reasons: tuple[str, ...]  # why it must not be SUCCEEDED-verified; empty: it may be
    recovered: int  # faults on its processes that a later, clean process made good
    late: int  # faults that landed after their process had finished its work

    @property
    def false_success(self) -> bool:
        if not self.reasons:
            return False
        if self.trial.misbehaves:
            return self.trial.state == TrialState.SUCCEEDED
        return self.trial.state == TrialState.SUCCEEDED and self.trial.verified is True

    @property
    def unverified_success(self) -> bool:
        """Hit, SUCCEEDED and not verified: allowed by the rule, listed all the same."""
        return (bool(self.reasons) and not self.false_success
                and self.trial.state == TrialState.SUCCEEDED)


def judge_trial(trial: TrialOutcome, faults: Sequence[Fault], ended: set[str]) -> Judgement:
    """Whether `trial` must not end SUCCEEDED-verified, and why.

    What should fail or flag a trial, and what may rightly end in a verified success:

    - A SIGKILL or SIGSTOP of one of its training processes, or a SIGKILL of that process's
      shim (the process then dies writing into a pipe nobody reads), stops that process
      short of its work. The trial may still succeed, verified, if muster ran that rank
      again and the final attempt's last process of the rank is a later one (a restart in
      place, or a new attempt): that process did the whole run. If the final attempt's
      last process of the rank is the one the soak hit (or an earlier one), muster counted
      a process that never finished: it must not be verified. A fault that landed after its
      process wrote its end record (its work was done; it was exiting) hit nothing: rank
      0 writes it just before `exit`, the other ranks before they let rank 0 pass the
      final barrier.
    - A full disk: where the final attempt's log lost output to it (the shim's marker line
      is in the log, or an exit record counts lost bytes), the log is incomplete and
      `log_complete` must fail: SUSPECT, never verified. A process that ran while the disk
      was full and lost nothing may succeed: a log's last page often has room for a few
      seconds of output (tmpfs, like most file systems, allocates whole pages), and a
      gap without a marker is `check_log`'s to find.
    - A script built to misbehave (it reports fewer samples than it trained, or exits
      non-zero) must never end SUCCEEDED at all, verified or not.

    Faults on the server, PostgreSQL, followers and uploads fail nothing by themselves: a
    trial that runs through them may succeed.
    """
    reasons: list[str] = []
    recovered = late = 0
    finals = {process.rank: process for process in trial.final}
    for fault in faults:
        if fault.trial != trial.uuid or not fault.landed:
            continue
        if fault.kind.hits_process() and fault.target is not None and fault.rank is not None:
            if fault.target in ended:
                late += 1
                continue
            final = finals.get(fault.rank)
            if final is None or final.token is None \
                    or token_ticks(final.token) <= token_ticks(fault.target):
                reasons.append(f"{fault.kind} of rank {fault.rank} (process {fault.target}, "
                               f"attempt {fault.attempt}) at {fault.at:.1f}, and the final "
                               "attempt ran no later process of that rank")
            else:
                recovered += 1
    reasons += [f"its final attempt's log lost output: {lost}" for lost in trial.lost_output]
    if trial.misbehaves:
        reasons.append(f"its script is built to fail ({trial.kind})")
    return Judgement(trial, tuple(reasons), recovered, late)


def judge_trials(trials: Iterable[TrialOutcome], faults: Sequence[Fault],
                 ended: set[str]) -> list[Judgement]:
    by_trial: dict[str | None, list[Fault]] = {}
    for fault in faults:
        by_trial.setdefault(fault.trial, []).append(fault)
    return [judge_trial(t, by_trial.get(t.uuid, []), ended) for t in trials]


# -- 3. nothing stuck ------------------------------------------------------------------------


def stuck_trials(trials: Iterable[TrialOutcome]) -> list[TrialOutcome]:
    """Trials still unfinished (queued, starting, running, restarting, paused): a SUSPECT
    trial is at rest, waiting for a person's review."""
    return [t for t in trials if TrialState(t.state).is_unfinished()]


# -- 4. no orphans ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessInfo:
    """One process from /proc."""

    pid: int
    session: int
    start_ticks: int
    cgroups: tuple[str, ...]  # the paths of /proc/<pid>/cgroup
    cmdline: str


def find_orphans(processes: Iterable[ProcessInfo], sessions: Mapping[int, int],
                 trial_uuids: Iterable[str]) -> list[ProcessInfo]:
    """The processes left of muster's: in the session of a shim or server the soak saw
    (`sessions`: session leader pid → its start ticks; a member must have started no
    earlier, and a session whose leader lives with other start ticks is a recycled pid's
    new session, not the shim's: a restarted PostgreSQL's, say), or in a replica cgroup
    of one of its trials (`muster-<trial uuid>-a<n>-r<r>-<pid>`)."""
    processes = list(processes)
    marks = tuple(f"/muster-{uuid}-" for uuid in trial_uuids)
    leaders = {p.pid: p.start_ticks for p in processes if p.pid == p.session}
    return [p for p in processes
            if (p.session in sessions and p.start_ticks >= sessions[p.session]
                and leaders.get(p.session, sessions[p.session]) == sessions[p.session])
            or any(mark in path for path in p.cgroups for mark in marks)]


# -- 5. the server's RSS and descriptors ---------------------------------------------------


@dataclass(frozen=True)
class Sample:
    at: float
    incarnation: int  # which start of the server (0 for the first)
    rss_bytes: int
    fds: int  # every open descriptor
    database_fds: int = 0  # those the database's connections hold (its pool's, bounded)

    @property
    def own_fds(self) -> int:
        """The descriptors outside the database's connection pool, which opens connections
        as load asks (up to its bound) and keeps them."""
        return self.fds - self.database_fds


@dataclass(frozen=True)
class Growth:
    incarnation: int
    warm: Sample
    end: Sample
    limit: float  # the most end may be, as a fraction of warm

    @property
    def rss_ratio(self) -> float:
        return self.end.rss_bytes / self.warm.rss_bytes

    @property
    def fd_ratio(self) -> float:
        return self.end.own_fds / self.warm.own_fds

    @property
    def holds(self) -> bool:
        return self.rss_ratio <= self.limit and self.fd_ratio <= self.limit


def check_growth(samples: Sequence[Sample], warm_from: float,
                 limit: float = 1.10) -> Growth | None:
    """The last incarnation's first sample at or after `warm_from` (its warm-up's end)
    against its last sample; None when it has no sample that late. Growth only: a server
    that ends smaller than it warmed up (trials ended, connections closed) holds."""
    last = max((s.incarnation for s in samples), default=None)
    mine = [s for s in samples if s.incarnation == last]
    warm = next((s for s in mine if s.at >= warm_from), None)
    if warm is None or last is None:
        return None
    return Growth(last, warm, mine[-1], limit)


# -- 6. the state machine, from the events ------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    id: int
    entity: str  # experiment | trial | attempt
    entity_id: int
    from_state: str | None
    to_state: str | None
    reason: str
    actor: str


@dataclass(frozen=True)
class EntityRow:
    entity: str
    id: int
    state: str
    parent: int | None = None  # a trial's experiment, an attempt's trial


@dataclass
class MachineReport:
    entities: int = 0
    transitions: int = 0
    violations: list[str] = field(default_factory=list)


_MACHINES: dict[str, tuple[str, Mapping[str, frozenset[str]]]] = {
    "experiment": (ExperimentState.ACTIVE, EXPERIMENT_MOVES),
    "trial": (TrialState.QUEUED, TRIAL_MOVES),
    "attempt": (AttemptState.STARTING, ATTEMPT_MOVES),
}
_REVIEW_ONLY = {(str(a), str(b)) for a, b in REVIEW_ONLY_MOVES}
_REVIEWS = {str(reason) for reason in REVIEW_REASONS}


def check_state_machine(events: Iterable[EventRow], rows: Iterable[EntityRow]) -> MachineReport:
    """Walk every experiment's, trial's and attempt's state changes, oldest first: each must
    start where the last one ended (the first at the entity's first state), be a legal move
    (a review's only by a review), and the last must end in the row's state. At rest
    afterwards: every attempt ended, every trial ended or SUSPECT (awaiting review), no
    ended trial with an attempt still live."""
    report = MachineReport()
    entities = {(row.entity, row.id): row for row in rows}
    chains: dict[tuple[str, int], list[EventRow]] = {key: [] for key in entities}
    for event in sorted(events, key=lambda e: e.id):
        if event.to_state is None:
            continue
        key = (event.entity, event.entity_id)
        if key not in chains:
            report.violations.append(f"{event.entity} {event.entity_id}: event {event.id} "
                                     "names no such row")
            continue
        chains[key].append(event)
    for key, chain in chains.items():
        report.entities += 1
        report.transitions += len(chain)
        report.violations += _walk(entities[key], chain)
    report.violations += _at_rest(entities.values())
    return report


def _walk(row: EntityRow, chain: list[EventRow]) -> list[str]:
    first, moves = _MACHINES[row.entity]
    where = f"{row.entity} {row.id}"
    problems = []
    current = str(first)
    for event in chain:
        if event.from_state != current:
            problems.append(f"{where}: event {event.id} moves from {event.from_state}, but it "
                            f"was {current}")
        source = event.from_state or current
        if event.to_state not in {str(s) for s in moves.get(source, frozenset())}:
            problems.append(f"{where}: event {event.id}: {source} → {event.to_state} is not "
                            "a legal move")
        if (source, event.to_state) in _REVIEW_ONLY and event.reason not in _REVIEWS:
            problems.append(f"{where}: event {event.id}: {source} → {event.to_state} without "
                            f"a review ({event.reason!r} by {event.actor})")
        current = str(event.to_state)
    if current != row.state:
        problems.append(f"{where}: its events end at {current}, its row says {row.state}")
    return problems


def _at_rest(rows: Iterable[EntityRow]) -> list[str]:
    rows = list(rows)
    live_attempts = {r.parent for r in rows
                     if r.entity == "attempt" and not AttemptState(r.state).is_terminal()}
    problems = [f"attempt {r.id}: still {r.state}" for r in rows
                if r.entity == "attempt" and not AttemptState(r.state).is_terminal()]
    for row in rows:
        if row.entity != "trial":
            continue
        state = TrialState(row.state)
        if not state.is_at_rest():
            problems.append(f"trial {row.id}: still {row.state}")
        elif state.is_terminal() and row.id in live_attempts:
            problems.append(f"trial {row.id}: {row.state} with an attempt still live")
    return problems
