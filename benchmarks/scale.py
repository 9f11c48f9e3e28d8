"""(z) Scale (issue 19): a supervisor pass and the experiments list with a queue of 10,000.

One store per backend (SQLite as muster sets it up; PostgreSQL too when 127.0.0.1:5432
answers), fresh and migrated, seeded with generated rows, no API calls:

- 1,000 ended experiments (`ui_budget.seed_list`: 1 to 4 trials each, a few validation
  reports per SUCCEEDED trial, so the list has progress and a best value to show);
- 10,100 single-trial experiments, each trial QUEUED, as `POST /experiments` records them
  (the experiment, its trial and their `created` events); entrypoint `sleep 3600`, three
  priorities;

then settled as a long-running store holds it (SQLite's write-ahead log checkpointed,
PostgreSQL's statistics gathered by ANALYZE).

Then a real `Supervisor` in this process (`LocalLauncher`, 100 slots, as pass_sessions.py
builds one) runs passes until the first 100 trials by queue order are RUNNING: real
launches, through the fork server and a shim each, so the steady-state pass follows 100
live attempts by their files and process identities as a server does, and not rows made to
look running. 10,000 trials stay QUEUED. Timed: `Supervisor.tick()`, each pass alone
(after 5 passes to settle), median and p90; a pass must change nothing (no state change,
no attempt, no event), and every queued trial must show its position in the queue.

Then `muster up` on the same home and database (`--slots 100`): it reconciles the 100
running attempts and runs its own passes over the same queue meanwhile, as a server at that
size does. Timed, interleaved, with the admin's bearer token over keep-alive:
`GET /api/v1/experiments?limit=100` (the first page: ended experiments with their best
trials), a later page (`offset=5000`: queued ones), the newest first (`order=desc`, what
the list page shows), and `GET /api/v1/health`, which reads no database (the floor). Each
page must hold 100 experiments in the right order and count them all in `X-Total-Count`.
The server's RSS (`VmRSS`, and its peak `VmHWM`, from /proc/PID/status) is read after the
requests, and compared with a server on an empty store that answered the same requests.

`--quick` uses 1,000 queued and 20 running trials and 100 ended experiments. Run alone:
`.venv/bin/python benchmarks/scale.py [--quick] [--profile]` (`--profile`: cProfile of the
timed passes on SQLite, to stderr).
"""

from __future__ import annotations

import cProfile
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from measure import BenchmarkFailure, expect, interleave, median, ms
from muster_server import ServerProcess, kill_trials
from report import Outcome, Table, Target
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session
from ui_budget import checkpoint_wal, seed_list

from muster.config import load_config
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.local_placement import LocalPlacement
from muster.services.users import bootstrap, principal
from muster.states import EventReason, ExperimentState, TrialState
from muster.store import Attempt, Event, Experiment, Store, Trial
from muster.supervise.reconcile import reconcile_attempts
from muster.supervise.supervisor import Supervisor

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
PASS_TARGET_MS = 50.0
LIST_TARGET_MS = 50.0
PAGE = 100
SETTLE_PASSES = 5
RAMP_TIMEOUT_S = 600.0  # a bound on reaching steady state, not a measure
SERVER_PASSES = 3  # passes the server must have finished before its requests are timed
PER_TRANSACTION = 1000  # seeded experiments per insert
PRIORITIES = (30, 42, 42, 55)  # by experiment number: a queue of three priorities
QUEUED_CONFIG = """\
name: scale-{n:05d}
labels: [scale]
entrypoint: [sleep, "3600"]
resources: {{priority: {priority}}}
failure_policy: {{stop_grace: 1s}}
"""


@dataclass(frozen=True)
class Size:
    queued: int  # QUEUED trials in steady state
    running: int  # RUNNING trials (and slots)
    ended: int  # ended experiments, for the list's best values
    passes: int  # timed supervisor passes
    repetitions: int  # of each HTTP request


FULL = Size(queued=10_000, running=100, ended=1_000, passes=60, repetitions=30)
QUICK = Size(queued=1_000, running=20, ended=100, passes=15, repetitions=8)


@dataclass
class Backend:
    """What one store measured."""

    seeding_s: dict[str, float] = field(default_factory=dict)
    ramp_s: float = 0.0
    passes_s: list[float] = field(default_factory=list)
    requests_s: dict[str, list[float]] = field(default_factory=dict)
    experiments: int = 0  # X-Total-Count
    rss_kib: dict[str, int] = field(default_factory=dict)


# -- the stores --------------------------------------------------------------------------------

@contextmanager
def databases(root: Path) -> Iterator[Iterator[tuple[str, str]]]:
    """(backend, URL) of a fresh SQLite file, then of a fresh PostgreSQL database where a
    server answers (dropped at the end)."""
    made: list[str] = []

    def each() -> Iterator[tuple[str, str]]:
        yield "sqlite", f"sqlite:///{root / 'sqlite' / 'home' / 'muster.db'}"
        name = f"muster_bench_scale_{secrets.token_hex(4)}"
        try:
            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
        except psycopg.OperationalError as exc:
            print(f"  PostgreSQL skipped: {' '.join(str(exc).split())}", file=sys.stderr)
            return
        made.append(name)
        yield "postgresql", PG_URL.format(name=name)

    try:
        yield each()
    finally:
        for name in made:
            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seed_queue(store: Store, home: Home, owner: tuple[int, str], count: int) -> None:
    """`count` single-trial experiments, each trial QUEUED, the rows and events that
    `services.experiments.create_experiment` records, inserted a thousand at a time. They
    share one (empty) context snapshot: each trial's first launch copies it."""
    context = home.experiments_dir / "scale-context" / "context"
    context.mkdir(parents=True, exist_ok=True)
    configs = {p: load_config(QUEUED_CONFIG.format(n=0, priority=p)) for p in set(PRIORITIES)}
    for start in range(0, count, PER_TRANSACTION):
        numbers = range(start, min(count, start + PER_TRANSACTION))
        with store.session_scope() as s:
            _seed_batch(s, numbers, configs, str(context), owner)


def _seed_batch(s: Session, numbers: range, configs: dict[int, Any], context: str,
                owner: tuple[int, str]) -> None:
    owner_id, owner_name = owner
    rows = []
    for n in numbers:
        priority = PRIORITIES[n % len(PRIORITIES)]
        text = QUEUED_CONFIG.format(n=n, priority=priority)
        config = configs[priority].to_json_dict()
        config["name"] = f"scale-{n:05d}"
        rows.append({"name": config["name"], "description": "", "labels": ["scale"],
                     "config": config, "config_yaml": text, "context_dir": context,
                     "state": ExperimentState.ACTIVE.value, "priority": priority,
                     "max_trials": 1, "owner_id": owner_id})
    ids = list(s.scalars(insert(Experiment).returning(Experiment.id,
                                                      sort_by_parameter_order=True), rows))
    trial_ids = list(s.scalars(insert(Trial).returning(Trial.id, sort_by_parameter_order=True),
                               [{"experiment_id": i, "state": TrialState.QUEUED.value,
                                 "priority": row["priority"], "hparams": {}}
                                for i, row in zip(ids, rows, strict=True)]))
    created = EventReason.CREATED.value
    s.execute(insert(Event), [
        *({"entity": "experiment", "entity_id": i, "experiment_id": i, "reason": created,
           "actor": owner_name, "message": f"experiment {row['name']!r} created"}
          for i, row in zip(ids, rows, strict=True)),
        *({"entity": "trial", "entity_id": t, "experiment_id": i, "trial_id": t,
           "reason": created, "actor": owner_name, "message": "trial queued"}
          for i, t in zip(ids, trial_ids, strict=True))])


def settle_store(store: Store, backend: str) -> None:
    """The seeded store as a long-running one holds it: SQLite's write-ahead log folded in,
    PostgreSQL's planner statistics gathered (autovacuum's ANALYZE would have, a minute on:
    without them it plans the closing step's query over 10,000 experiments badly)."""
    if backend == "sqlite":
        checkpoint_wal(store)
        return
    with store.engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")


def _timed(seconds: dict[str, float], name: str, call: Callable[[], object]) -> None:
    started = time.monotonic()
    call()
    seconds[name] = time.monotonic() - started
    print(f"  seeding {name}: {seconds[name]:.0f} s", file=sys.stderr, flush=True)


# -- the supervisor pass -----------------------------------------------------------------------

@dataclass(frozen=True)
class Census:
    """What the store holds, to check that timed passes changed nothing."""

    states: dict[str, int]
    attempts: int
    last_event: int
    positioned: int  # QUEUED trials whose queue reason gives their position

    @classmethod
    def of(cls, store: Store) -> Census:
        with store.session_scope() as s:
            states = dict(s.execute(select(Trial.state, func.count())
                                    .group_by(Trial.state)).all())
            return cls(states=states,
                       attempts=s.scalar(select(func.count(Attempt.id))) or 0,
                       last_event=s.scalar(select(func.max(Event.id))) or 0,
                       positioned=s.scalar(select(func.count(Trial.id)).where(
                           Trial.state == TrialState.QUEUED.value,
                           Trial.queue_reason.like("position %"))) or 0)


def ramp_up(supervisor: Supervisor, size: Size) -> float:
    """Pass until `size.running` trials run and the rest wait with their positions; then
    `SETTLE_PASSES` more. Returns the seconds it took."""
    started = time.monotonic()
    reconcile_attempts(supervisor)  # as a server does before its first pass (nothing yet)
    while True:
        supervisor.tick()
        census = Census.of(supervisor.store)
        if (census.states.get(TrialState.RUNNING.value) == size.running
                and census.positioned == size.queued):
            break
        expect(time.monotonic() - started < RAMP_TIMEOUT_S,
               f"no steady state within {RAMP_TIMEOUT_S:.0f} s: {census}")
    for _ in range(SETTLE_PASSES):
        supervisor.tick()
    return time.monotonic() - started


def time_passes(supervisor: Supervisor, size: Size, profile: cProfile.Profile | None
                ) -> list[float]:
    before = Census.of(supervisor.store)
    expect(before.states == {TrialState.QUEUED.value: size.queued,
                             TrialState.RUNNING.value: size.running,
                             **_ended_states(supervisor.store)},
           f"not the steady state to time: {before.states}")
    times = []
    for _ in range(size.passes):
        if profile is not None:
            profile.enable()
        started = time.perf_counter()
        supervisor.tick()
        times.append(time.perf_counter() - started)
        if profile is not None:
            profile.disable()
    after = Census.of(supervisor.store)
    expect(after == before, f"the timed passes changed the store: {before} -> {after}")
    return times


def _ended_states(store: Store) -> dict[str, int]:
    """The states of the ended experiments' trials (seeded; no pass touches them)."""
    with store.session_scope() as s:
        return dict(s.execute(
            select(Trial.state, func.count()).join(Experiment)
            .where(Experiment.state != ExperimentState.ACTIVE.value)
            .group_by(Trial.state)).all())


# -- the server --------------------------------------------------------------------------------

def _get(http: httpx.Client, path: str, check: Callable[[httpx.Response], None]
         ) -> Callable[[], float]:
    def arm() -> float:
        started = time.perf_counter()
        response = http.get(path)
        elapsed = time.perf_counter() - started
        expect(response.status_code == 200, f"GET {path}: {response.status_code}")
        check(response)
        return elapsed
    return arm


def _page_check(total: int, descending: bool) -> Callable[[httpx.Response], None]:
    """A page of `PAGE` experiments, in order, that counts all `total`."""
    def check(response: httpx.Response) -> None:
        ids = [row["id"] for row in response.json()]
        expect(len(ids) == PAGE, f"a page of {len(ids)} experiments, not {PAGE}")
        expect(ids == sorted(ids, reverse=descending), "a page out of order")
        expect(response.headers["X-Total-Count"] == str(total),
               f"X-Total-Count {response.headers['X-Total-Count']}, not {total}")
    return check


def _health_check(response: httpx.Response) -> None:
    expect(response.json()["status"] == "ok", f"health: {response.text[:200]}")


def list_arms(http: httpx.Client, total: int) -> dict[str, Callable[[], float]]:
    later = min(5000, total - PAGE)
    return {
        "GET /api/v1/health (floor)": _get(http, "/api/v1/health", _health_check),
        f"GET /api/v1/experiments?limit={PAGE} (first page)": _get(
            http, f"/api/v1/experiments?limit={PAGE}", _page_check(total, False)),
        f"GET /api/v1/experiments?limit={PAGE}&offset={later}": _get(
            http, f"/api/v1/experiments?limit={PAGE}&offset={later}",
            _page_check(total, False)),
        f"GET /api/v1/experiments?limit={PAGE}&order=desc (newest)": _get(
            http, f"/api/v1/experiments?limit={PAGE}&order=desc",
            _page_check(total, True)),
    }


def wait_for_passes(http: httpx.Client, passes: int) -> None:
    """Until the server has reconciled and finished `passes` supervisor passes."""
    seen: set[float] = set()
    deadline = time.monotonic() + RAMP_TIMEOUT_S
    while len(seen) < passes:
        health = http.get("/api/v1/health").json()
        expect(not health["degraded"], f"the server's passes fail: {health}")
        at = health["supervisor"]["last_pass_at"]
        if at is not None:
            seen.add(at)
        expect(time.monotonic() < deadline, f"the server did {len(seen)} passes in "
               f"{RAMP_TIMEOUT_S:.0f} s")
        time.sleep(0.1)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid`, in KiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def serve(root: Path, url: str, size: Size, measured: Backend, total: int) -> None:
    """The list and the server's memory, on the seeded store with its queue."""
    with ServerProcess(root, slots=size.running, db=url) as server, httpx.Client(
            base_url=server.url, timeout=120, headers=_bearer(server)) as http:
        wait_for_passes(http, SERVER_PASSES)
        arms = list_arms(http, total)
        measured.requests_s = interleave(arms, size.repetitions)
        measured.experiments = total
        measured.rss_kib = memory_kib(server.pid)


def empty_server(root: Path, size: Size) -> dict[str, int]:
    """The memory of a server on an empty store after the same kind of requests."""
    with ServerProcess(root / "empty", slots=size.running) as server, httpx.Client(
            base_url=server.url, timeout=60, headers=_bearer(server)) as http:
        wait_for_passes(http, SERVER_PASSES)
        for _ in range(size.repetitions):
            for path in ("/api/v1/health", f"/api/v1/experiments?limit={PAGE}"):
                expect(http.get(path).status_code == 200, f"GET {path} on an empty server")
        return memory_kib(server.pid)


def _bearer(server: ServerProcess) -> dict[str, str]:
    token = Home(server.home).token_path.read_text().strip()
    return {"Authorization": f"Bearer {token}"}


# -- the run -----------------------------------------------------------------------------------

@contextmanager
def steady_state(root: Path, backend: str, url: str, size: Size, measured: Backend
                 ) -> Iterator[Supervisor]:
    """A supervisor in this process over the seeded store, `size.running` trials running
    and `size.queued` queued; every trial killed at the end."""
    home = Home(root / "home").ensure()
    store = Store(url)
    try:
        store.upgrade()
        admin = principal(store, bootstrap(store, home.token_path))
        expect(admin.user_id is not None, "the bootstrap made no admin")
        owner = (int(admin.user_id or 0), admin.name)
        _timed(measured.seeding_s, "ended", lambda: seed_list(store, owner[0], size.ended))
        _timed(measured.seeding_s, "queue",
               lambda: seed_queue(store, home, owner, size.queued + size.running))
        settle_store(store, backend)
        supervisor = Supervisor(store, LocalLauncher(), home,
                                LocalPlacement(store, size.running), min_free_disk=0)
        measured.ramp_s = ramp_up(supervisor, size)
        print(f"  {backend}: {size.running} running after {measured.ramp_s:.0f} s; timing "
              f"{size.passes} passes", file=sys.stderr, flush=True)
        yield supervisor
    finally:
        kill_trials(home.root)
        store.dispose()


def measure(root: Path, backend: str, url: str, size: Size) -> Backend:
    measured = Backend()
    with steady_state(root, backend, url, size, measured) as supervisor:
        measured.passes_s = time_passes(supervisor, size, None)
        states = Census.of(supervisor.store).states
        serve(root, url, size, measured, size.ended + size.queued + size.running)
        after = Census.of(supervisor.store).states
        expect(after == states, f"the server changed trials' states: {states} -> {after}")
    return measured


def run(quick: bool) -> Outcome:
    size = QUICK if quick else FULL
    results: dict[str, Backend] = {}
    with tempfile.TemporaryDirectory(prefix="muster-bench-scale-") as tmp:
        root = Path(tmp)
        with databases(root) as each:
            for backend, url in each:
                print(f"  {backend}...", file=sys.stderr, flush=True)
                results[backend] = measure(root / backend, backend, url, size)
        empty = empty_server(root, size)
    return _outcome(size, results, empty)


def profile_passes(quick: bool) -> None:
    """The timed passes alone, on SQLite, under cProfile; the profile goes to stderr."""
    size = QUICK if quick else FULL
    profile = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="muster-bench-scale-") as tmp:
        root = Path(tmp) / "sqlite"
        url = f"sqlite:///{root / 'home' / 'muster.db'}"
        with steady_state(root, "sqlite", url, size, Backend()) as supervisor:
            passes = time_passes(supervisor, size, profile)
    print(f"{len(passes)} passes (profiled): median {ms(median(passes)):.1f} ms",
          file=sys.stderr)
    stats = pstats.Stats(profile, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def _outcome(size: Size, results: dict[str, Backend], empty: dict[str, int]) -> Outcome:
    backends = list(results)
    passes = Table(
        f"(z) one supervisor pass, {size.queued:,} QUEUED + {size.running} RUNNING trials "
        f"(ms, {size.passes} passes)", ["backend", "median", "p90", "min", "max"],
        [[b, *(f"{ms(f(results[b].passes_s)):.1f}"
               for f in (median, _p90, min, max))] for b in backends])
    arms = list(results[backends[0]].requests_s)
    lists = Table(
        f"(z) the experiments list at {results[backends[0]].experiments:,} experiments, "
        f"while the server passes over its queue (median ms per request; p90)",
        ["request", *backends],
        [[arm, *(f"{ms(median(results[b].requests_s[arm])):.1f} "
                 f"({ms(_p90(results[b].requests_s[arm])):.1f})" for b in backends)]
         for arm in arms])
    memory = Table("(z) the server's memory (MiB)", ["server", "VmRSS", "VmHWM (peak)"],
                   [["empty store (SQLite)", *_mib(empty)],
                    *([f"at size ({b})", *_mib(results[b].rss_kib)] for b in backends)])
    targets = []
    for b in backends:
        value = ms(median(results[b].passes_s))
        targets.append(Target(f"(z) a supervisor pass with {size.queued:,} queued and "
                              f"{size.running} running trials ≤ {PASS_TARGET_MS:.0f} ms ({b})",
                              f"{value:.1f} ms", value <= PASS_TARGET_MS))
        worst = max(ms(median(v)) for arm, v in results[b].requests_s.items()
                    if "floor" not in arm)
        targets.append(Target(
            f"(z) a page of {PAGE} of the experiments list at "
            f"{results[b].experiments:,} experiments ≤ {LIST_TARGET_MS:.0f} ms (the slowest "
            f"page; {b})", f"{worst:.1f} ms", worst <= LIST_TARGET_MS))
    notes = [
        f"Passes: `Supervisor.tick()` in this process, timed one by one after "
        f"{SETTLE_PASSES} settling passes; the {size.running} running trials are real "
        "(`sleep 3600` under a shim each, launched by the same supervisor).",
        f"Requests: interleaved, {size.repetitions} repetitions, keep-alive, the admin's "
        "bearer token; the server runs its own passes over the same queue meanwhile.",
        *(f"{b}: seeding " + ", ".join(f"{k} {v:.0f} s" for k, v in r.seeding_s.items())
          + f"; {size.running} trials running after {r.ramp_s:.0f} s"
          for b, r in results.items()),
    ]
    data = {b: {"passes_s": r.passes_s, "requests_s": r.requests_s, "rss_kib": r.rss_kib,
                "experiments": r.experiments, "seeding_s": r.seeding_s, "ramp_s": r.ramp_s}
            for b, r in results.items()}
    data["empty_server_kib"] = empty
    return Outcome("scale", [passes, lists, memory], targets, notes, data)


def _mib(kib: dict[str, int]) -> list[str]:
    return [f"{kib[key] / 1024:.0f}" for key in ("VmRSS", "VmHWM")]


def main() -> int:
    """Run alone (`.venv/bin/python benchmarks/scale.py [--quick] [--profile]`), reported
    and saved as `run.py --only scale` does; `--profile`: the passes alone, profiled."""
    args = sys.argv[1:]
    if "--profile" not in args:
        import run as benchmarks

        return benchmarks.main(["--only", "scale", *args])
    try:
        profile_passes("--quick" in args)
    except BenchmarkFailure as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
