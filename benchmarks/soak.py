"""A chaos soak for muster (issue 37): a steady stream of real experiments while a seeded
schedule of faults fires, then every invariant checked and printed as figures.

    .venv/bin/python benchmarks/soak.py --minutes 5 --seed 1 --store sqlite [--json out.json]
    make soak MINUTES=60 STORE=postgres

What it runs: a real server (`python -m muster up`, 4 slots, in a session of its own) on a
fresh home whose `runs/` is a tmpfs of its own (so the disk it fills is that one), on SQLite
in the home or on a fresh PostgreSQL database (`soak_<hex>` at 127.0.0.1:5432, dropped
afterwards). Experiments come from soak_workload.py (single and 2-rank trials, harness and
plain scripts, random searches, with and without `verify`, some built to misbehave), 5
unfinished trials at a time, each a few seconds of soak_job.py writing numbered records.

The faults (soak_faults.py), one every 3-7 s, drawn by a `random.Random` seeded with
`--seed`: SIGKILL of the server (then started again with the same argv), of a rank's
training process, or of its shim; SIGSTOP of a rank (a hang muster must find: the configs
set `silence_timeout: 10s`); the runs' disk filled to the last byte and freed 4-10 s later
(with `--min-free-disk 16MiB`, so the disk guard holds launches meanwhile); PostgreSQL
restarted (`--store postgres`); a burst of 50 log follows held 3-6 s and cut; an
experiment upload cut mid-body. No server kill and no PostgreSQL restart in the window's
second half, so the last server lives long enough for its warm-up and its end to be
compared.

Then it drains (no more faults or submissions; at most 4 minutes for every experiment to be
at rest), kills what is left, runs `muster down`, and checks (soak_checks.py): every record
of every process in its log exactly once, and the logs as the API serves them equal to the
files; no false success; nothing stuck; no orphan process; the last server's RSS and open
descriptors (the database's connection pool apart) at the end within 10% of their level
after its warm-up (10% of the window, 60 s to 5 min, after it first answered, and not
before the first burst of follows it served); the database's state machine. It exits 1
when any of them fails, 2 when it cannot run (not root: it mounts a tmpfs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
import soak_readback as readback
from muster_server import kill_trials
from report import Outcome, describe_machine, render_markdown
from soak_checks import (
    Fault,
    FaultKind,
    LogReport,
    ProcessInfo,
    Sample,
    TrialOutcome,
    check_growth,
    check_state_machine,
    find_orphans,
    judge_trials,
    stuck_trials,
)
from soak_faults import Ballast, Burst, Server, cut_upload, process_fault, restart_postgres
from soak_report import Checked, Record, Served, outcome
from soak_workload import BY_NAME, LABEL, NAME_PREFIX, Submission, next_submission

from muster import api
from muster.client import Client
from muster.errors import MusterError
from muster.launch.base import ProcessIdentity
from muster.launch.identity import send_signal
from muster.rundir import RunDir
from muster.states import ExperimentState, TrialState

JOB = Path(__file__).resolve().parent / "soak_job.py"
SLOTS = 4
IN_FLIGHT = 5  # unfinished trials the stream keeps
FIRST_FAULT_S = 10.0
FAULT_GAP_S = (3.0, 7.0)
CALM_TAIL = 0.5  # no server kill or PostgreSQL restart in this last part of the window
DISK_HOLD_S = (4.0, 10.0)
FOLLOWERS = 50
FOLLOW_HOLD_S = (3.0, 6.0)
SAMPLE_EVERY_S = 5.0
DRAIN_S = 240.0
SETTLE_S = 90.0  # after the kill at the end, for every trial to be at rest
ORPHAN_GRACE_S = 10.0
MIN_FREE_DISK = "16MiB"
GROWTH_LIMIT = 1.10
PG_ADMIN = "host=127.0.0.1 port={port} user=postgres dbname=test connect_timeout=5"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:{port}/{name}"
WEIGHTS = {
    FaultKind.KILL_RANK: 3.0,
    FaultKind.KILL_SHIM: 1.5,
    FaultKind.STOP_RANK: 1.5,
    FaultKind.KILL_SERVER: 1.2,
    FaultKind.FILL_DISK: 1.2,
    FaultKind.RESTART_POSTGRES: 1.0,
    FaultKind.FOLLOWERS: 1.0,
    FaultKind.CUT_UPLOAD: 1.0,
}
SERVER_FAULTS = frozenset({FaultKind.KILL_SERVER, FaultKind.RESTART_POSTGRES})


@dataclass(frozen=True)
class Settings:
    minutes: float
    seed: int
    store: str
    pg_port: int = 5432
    keep: bool = False

    @property
    def window_s(self) -> float:
        return self.minutes * 60.0

    @property
    def warm_up_s(self) -> float:
        return min(max(0.1 * self.window_s, 60.0), 300.0)

    @property
    def tmpfs_mib(self) -> int:
        return int(128 + 8 * self.minutes)


class Soak:
    """One soak: its root (home, context, tmpfs), database and server, set up and torn
    down; `run()` drives the stream, the faults and the drain, then reads back and checks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = Path(tempfile.mkdtemp(prefix="muster-soak-"))
        self.home = self.root / "home"
        self.runs = self.home / "runs"
        self.context = self.root / "context"
        self.fault_rng = random.Random(f"{settings.seed}-faults")
        self.work_rng = random.Random(f"{settings.seed}-work")
        self.record = Record()
        self.submitted: dict[str, Submission] = {}
        self.cut_names: list[str] = []
        self.pg_name = ""
        self.pg_cluster = ""
        self.db_url = f"sqlite:///{self.home / 'muster.db'}"
        self.server: Server | None = None
        self.follower_tokens: list[str] = []
        self.ballast: Ballast | None = None
        self.fill: Fault | None = None  # the disk is full: since when, and until when
        self.burst: Burst | None = None
        self._mounted = False

    # -- set up and tear down ------------------------------------------------------------

    def __enter__(self) -> Soak:
        try:
            self._set_up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _set_up(self) -> None:
        self.context.mkdir()
        shutil.copy(JOB, self.context / JOB.name)
        self.runs.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o",
                        f"size={self.settings.tmpfs_mib}m,mode=0700", "tmpfs",
                        str(self.runs)], check=True)
        self._mounted = True
        self.ballast = Ballast(self.runs)
        if self.settings.store == "postgres":
            self._create_database()
        self.server = Server(self.home, self.db_url, SLOTS, MIN_FREE_DISK)
        self.server.start()
        with self.server.client() as client:
            self.follower_tokens = [follower_token(client, n) for n in range(2)]

    def _create_database(self) -> None:
        port = self.settings.pg_port
        self.pg_cluster = postgres_cluster(port)
        self.pg_name = f"soak_{secrets.token_hex(4)}"
        with psycopg.connect(PG_ADMIN.format(port=port), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.pg_name}"')
        self.db_url = PG_URL.format(port=port, name=self.pg_name)

    def __exit__(self, *exc: object) -> None:
        if self.burst is not None:
            self.burst.close()
        if self.ballast is not None:
            self.ballast.free()
        if self.server is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.server.kill()
        if self.home.exists():
            kill_trials(self.home)
        if self._mounted and self.settings.keep:
            shutil.copytree(self.runs, self.root / "runs-kept", symlinks=True,
                            ignore_dangling_symlinks=True, dirs_exist_ok=True)
        if self._mounted:
            subprocess.run(["umount", "-l", str(self.runs)], check=False)
        if self.pg_name:
            with contextlib.suppress(psycopg.Error), psycopg.connect(
                    PG_ADMIN.format(port=self.settings.pg_port), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')
        if self.settings.keep:
            print(f"kept {self.root}", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> Outcome:
        started = time.monotonic()
        self._stream()
        self.record.timings["window_s"] = time.monotonic() - started
        self._drain()
        self.record.timings["drain_s"] = time.monotonic() - started - \
            self.record.timings["window_s"]
        self._sample()
        checked = self._read_back()
        self.record.timings["total_s"] = time.monotonic() - started
        return outcome(asdict(self.settings), self.record, checked)

    @property
    def client(self) -> Client:
        assert self.server is not None
        return self.server.client()

    def _stream(self) -> None:
        """Submissions and faults for the whole window."""
        assert self.server is not None
        began = time.monotonic()
        end = began + self.settings.window_s
        calm_from = end - CALM_TAIL * self.settings.window_s
        next_fault, next_sample = began + FIRST_FAULT_S, began
        with self.client as client:
            while (now := time.monotonic()) < end:
                if self.server.watch():
                    progress("the server exited on its own; started again")
                self._top_up(client)
                if now >= next_sample and self.burst is None:
                    self._sample()
                    next_sample = now + SAMPLE_EVERY_S
                if now >= next_fault:
                    self._fire(self._draw(server_faults=now < calm_from))
                    next_fault = time.monotonic() + self.fault_rng.uniform(*FAULT_GAP_S)
                self._tick(0.25)
        self._end_windows()

    def _draw(self, server_faults: bool) -> FaultKind:
        kinds = [k for k in WEIGHTS if (server_faults or k not in SERVER_FAULTS)
                 and (k is not FaultKind.RESTART_POSTGRES or self.pg_name)]
        return self.fault_rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]

    def _top_up(self, client: Client) -> None:
        """Submit the stream's next experiment while fewer than IN_FLIGHT trials are
        unfinished (the server's job list: running, queued, paused)."""
        try:
            if len(client.list_jobs()) >= IN_FLIGHT:
                return
        except MusterError:
            return
        submission = next_submission(len(self.submitted), self.work_rng)
        self.submitted[submission.name] = submission
        self.record.submitted += 1
        self.record.submitted_at.append(time.time())
        try:
            client.create_experiment(submission.config, self.context)
        except MusterError as exc:
            self.record.submit_errors += 1
            progress(f"submitting {submission.name}: {exc}")

    def _sample(self) -> None:
        assert self.server is not None
        now = self.server.sample()
        if now is not None:
            self.record.samples.append(Sample(time.time(), len(self.server.incarnations) - 1,
                                              *now))

    def _fire(self, kind: FaultKind) -> None:
        assert self.server is not None and self.ballast is not None
        if (kind is FaultKind.FILL_DISK and self.fill is not None) \
                or (kind is FaultKind.FOLLOWERS and self.burst is not None):
            self.record.missed[kind] += 1  # one at a time
            return
        fault = self._act(kind)
        if fault is None:
            self.record.missed[kind] += 1
            return
        if fault.kind is not FaultKind.FILL_DISK:
            self.record.faults.append(fault)
        progress(f"{kind}" + (f": trial {fault.trial} attempt {fault.attempt} rank "
                              f"{fault.rank}" if fault.trial else "")
                 + ("" if fault.landed else " (did not land)"))

    def _act(self, kind: FaultKind) -> Fault | None:
        assert self.server is not None and self.ballast is not None
        if kind.hits_process():
            return process_fault(kind, self.runs, self.fault_rng)
        at = time.time()
        if kind is FaultKind.KILL_SERVER:
            landed = self.server.kill()
            self.server.start()
            return Fault(kind, at, landed=landed)
        if kind is FaultKind.RESTART_POSTGRES:
            landed, said = restart_postgres(self.pg_cluster)
            return Fault(kind, at, landed=landed, detail=said[-200:])
        if kind is FaultKind.FILL_DISK:
            size = self.ballast.fill()
            hold = self.fault_rng.uniform(*DISK_HOLD_S)
            self.fill = Fault(kind, self.ballast.filled_at or at, until=time.time() + hold,
                              detail=f"{size:,} bytes of ballast")
            return self.fill
        if kind is FaultKind.FOLLOWERS:
            return self._open_burst(at)
        name = f"{NAME_PREFIX}cut-{len(self.cut_names):04d}"
        self.cut_names.append(name)
        self.record.cut_uploads += 1
        sent = cut_upload(self.server.port, self.follower_tokens[0], self.context, name,
                          self.fault_rng)
        return Fault(kind, at, detail=f"{name}: {sent} bytes of the body sent")

    def _open_burst(self, at: float) -> Fault | None:
        assert self.server is not None
        try:
            with self.client as client:
                running = [j["trial_id"] for j in client.list_jobs()
                           if j["state"] == TrialState.RUNNING]
        except MusterError:
            return None
        if not running:
            return None
        targets = [(self.fault_rng.choice(running), self.follower_tokens[i % 2], i % 3 == 0)
                   for i in range(FOLLOWERS)]
        self.burst = Burst()
        self.burst.open(self.server.port, targets, self.fault_rng.uniform(*FOLLOW_HOLD_S))
        return Fault(FaultKind.FOLLOWERS, at, detail=f"{len(self.burst.followers)} follows")

    def _tick(self, seconds: float) -> None:
        """Wait `seconds`, feeding the open follows, and end the windows that are due."""
        if self.burst is not None:
            self.burst.pump(seconds)
            if time.monotonic() >= self.burst.until:
                self._close_burst()
        else:
            time.sleep(seconds)
        if self.fill is not None and self.fill.until is not None \
                and time.time() >= self.fill.until:
            self._free_disk()

    def _close_burst(self) -> None:
        assert self.burst is not None
        self.record.followers.update(self.burst.close())
        self.record.burst_ends.append(time.time())
        self.burst = None

    def _free_disk(self) -> None:
        """Free the disk; the fault is recorded with the time it was full until."""
        assert self.ballast is not None and self.fill is not None
        self.ballast.free()
        self.record.faults.append(Fault(self.fill.kind, self.fill.at, until=time.time(),
                                        detail=self.fill.detail))
        self.fill = None
        progress("disk freed")

    def _end_windows(self) -> None:
        if self.burst is not None:
            self._close_burst()
        if self.fill is not None:
            self._free_disk()

    # -- the drain -----------------------------------------------------------------------

    def _drain(self) -> None:
        """No more faults or submissions: wait until every experiment is at rest."""
        assert self.server is not None
        deadline = time.monotonic() + DRAIN_S
        next_sample = time.monotonic()
        with self.client as client:
            while time.monotonic() < deadline:
                self.server.watch()
                if time.monotonic() >= next_sample:
                    self._sample()
                    next_sample = time.monotonic() + SAMPLE_EVERY_S
                with contextlib.suppress(MusterError):
                    if all(settled(e) for e in our_experiments(client, active=True)):
                        return
                time.sleep(1.0)
        progress(f"the drain ended after {DRAIN_S:.0f} s with experiments not at rest")

    # -- reading back ----------------------------------------------------------------------

    def _read_back(self) -> Checked:
        """Read back through the API, stop everything, `muster down`, then the files, /proc
        and the database."""
        assert self.server is not None
        with self.client as client:  # every experiment of the home, a cut upload's too
            details = [client.get_experiment(e["id"])
                       for e in our_experiments(client, label=None)]
            trials = self._trial_outcomes(details)
            served = self._served_logs(client, details)
            self._stop_everything(client, details)
        progress(f"muster down: {self.server.down()}")
        uuids = {t.uuid for t in trials}
        logs = LogReport()
        for uuid in sorted(uuids):
            logs.add(readback.check_trial_logs(RunDir(self.runs / uuid)))
        orphans = self._orphans(uuids)
        cgroups = readback.replica_cgroups(uuids)
        machine = readback.read_machine(self.db_url)
        self._clean_up(orphans, cgroups)
        return Checked(
            trials=trials, experiments=len(details), logs=logs, served=served,
            judgements=judge_trials(trials, self.record.faults, logs.ended),
            stuck=stuck_trials(trials), orphans=[f"{o.pid} {o.cmdline}" for o in orphans],
            cgroups=[str(c) for c in cgroups],
            machine=check_state_machine(machine.events, machine.rows),
            growth=check_growth(self.record.samples, self._warm_from(), GROWTH_LIMIT),
            unexpected_exits=self.server.unexpected_exits,
            phantoms=sorted(e["name"] for e in details if e["name"] not in self.submitted),
            incarnations=len(self.server.incarnations))

    def _warm_from(self) -> float:
        """When the last server's warm-up ended: `warm_up_s` after it first answered, and
        not before the first burst of follows it served had ended (the burst grows the
        database's connection pool to its working size, each connection with its cache)."""
        assert self.server is not None
        started = self.server.incarnations[-1].started_at
        bursts = [at for at in self.record.burst_ends if at > started]
        return max(started + self.settings.warm_up_s, min(bursts, default=started))

    def _orphans(self, uuids: set[str]) -> list[ProcessInfo]:
        """muster's processes still alive after `muster down`: in the session of a shim or
        a server the soak saw, or in a replica cgroup of its trials. A process that is
        exiting gets ORPHAN_GRACE_S to be gone."""
        assert self.server is not None
        sessions = readback.shim_sessions(self.runs)
        sessions.update({i.pid: i.start_ticks for i in self.server.incarnations})
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while (found := find_orphans(readback.scan_processes(), sessions, uuids)) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        return found

    def _trial_outcomes(self, details: list[api.ExperimentDetail]) -> list[TrialOutcome]:
        found = []
        for experiment in details:
            submission = self.submitted.get(experiment["name"])
            kind = submission.kind if submission else BY_NAME["plain"]
            for trial in experiment["trials"]:
                run, number = RunDir(self.runs / trial["uuid"]), readback.final_attempt(trial)
                final = () if number is None else readback.final_processes(run, number,
                                                                            kind.replicas)
                lost = () if number is None else readback.lost_output(run, number)
                found.append(TrialOutcome(
                    trial["id"], trial["uuid"], experiment["name"], kind.name,
                    trial["state"], trial["verified"], kind.misbehaves is not None, final,
                    lost, trial["verdict"]))
        return found

    def _served_logs(self, client: Client, details: list[api.ExperimentDetail]) -> Served:
        """Every at-rest trial's rank logs through the API, against their files."""
        served = Served()
        for experiment in details:
            for trial in experiment["trials"]:
                if not TrialState(trial["state"]).is_at_rest():
                    continue
                run = RunDir(self.runs / trial["uuid"])
                for number, files in readback.rank_logs(run):
                    try:
                        differs = readback.served_log_differs(client, trial["id"], number,
                                                              files)
                    except MusterError as exc:
                        differs = f"trial {trial['id']} attempt {number}: {exc}"
                    served.logs += 1
                    served.bytes += files.log.stat().st_size
                    if differs is not None:
                        served.differ.append(differs)
        return served

    def _stop_everything(self, client: Client, details: list[api.ExperimentDetail]) -> None:
        """Kill every experiment not ended, and wait for its trials to be at rest."""
        for experiment in details:
            if not ExperimentState(experiment["state"]).is_terminal():
                with contextlib.suppress(MusterError):
                    client.kill_experiment(experiment["id"])
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            with contextlib.suppress(MusterError):
                if all(TrialState(s).is_at_rest() for e in our_experiments(client, active=True)
                       for s in e["trial_states"]):
                    return
            time.sleep(1.0)

    def _clean_up(self, orphans: list[ProcessInfo], cgroups: list[Path]) -> None:
        """Leave the machine as it was: what the checks found is killed and removed."""
        for orphan in orphans:
            send_signal(ProcessIdentity(orphan.pid, orphan.start_ticks), signal.SIGKILL)
        for cgroup in cgroups:
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def follower_token(client: Client, number: int) -> str:
    """A token of a viewer of its own: the follows of a burst are split between two users
    (a user holds at most 32 at once)."""
    return client.create_user(f"soak-follower-{number}", "viewer")["token"]


def postgres_cluster(port: int) -> str:
    """`VERSION/NAME` of the local cluster listening on `port` (pg_lsclusters)."""
    done = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True,
                          check=True)
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == str(port):
            return f"{fields[0]}/{fields[1]}"
    raise RuntimeError(f"no PostgreSQL cluster listens on port {port} (pg_lsclusters)")


def our_experiments(client: Client, active: bool = False, label: str | None = LABEL
                    ) -> Iterator[api.ExperimentSummary]:
    """The stream's experiments (`label`; None: every one), only those not ended with
    `active`, a page at a time."""
    offset, state = 0, ExperimentState.ACTIVE if active else None
    while page := client.list_experiments(label=label, state=state, offset=offset, limit=200,
                                          sort="id"):
        yield from page
        offset += len(page)


def settled(experiment: api.ExperimentSummary) -> bool:
    """Ended, or held open only by SUSPECT trials awaiting review, none to come."""
    if ExperimentState(experiment["state"]).is_terminal():
        return True
    progress_ = experiment["progress"]
    states = [TrialState(s) for s in experiment["trial_states"]]
    return (all(s.is_at_rest() for s in states) and TrialState.SUSPECT in states
            and progress_["ended"] >= progress_["total"])


def progress(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0,
                        help="how long faults fire (the drain and checks come after)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--json", type=Path, help="write every figure and fault here")
    parser.add_argument("--pg-port", type=int, default=5432,
                        help="the local PostgreSQL cluster to use (and to restart)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the soak's directory (home, context, server log, and a "
                             "copy of the runs as runs-kept/)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("the soak needs root: it mounts a tmpfs as the runs' disk, to fill it",
              file=sys.stderr)
        return 2
    settings = Settings(args.minutes, args.seed, args.store, args.pg_port, args.keep)
    command = shlex.join([Path(sys.executable).name, "benchmarks/soak.py",
                          *(sys.argv[1:] if argv is None else argv)])
    machine = describe_machine()
    with Soak(settings) as soak:
        result = soak.run()
    print(render_markdown(machine, [result], command), end="")
    if args.json is not None:
        args.json.write_text(json.dumps({"command": command, "machine": machine,
                                         "soak": asdict(result)}, indent=2) + "\n")
    failed = [t.what for t in result.targets if not t.met]
    progress("every invariant holds" if not failed else f"failed: {'; '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
