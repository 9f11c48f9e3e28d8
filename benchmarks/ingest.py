"""(i) Metric ingestion: `ingest_trial` against a plain `executemany` of the same rows.

A trial's `rank-0.metrics.jsonl` holds 100,000 report lines of 4 metrics each, written as the
harness writes them. muster ingests them into a fresh, migrated store in one `ingest_trial`
call, and in 100 calls that each find 1,000 new lines (the file grows between calls, as it
does while a trial runs; only the calls are timed). The baseline inserts the same rows,
already parsed and serialized, into the same `metrics` table of a fresh store of the same
kind with one DBAPI `executemany` per batch and a transaction each: the database's own cost,
with no file reading, parsing, validation or cursor. Both on SQLite (WAL, as muster sets it
up) and on PostgreSQL at 127.0.0.1:5432 when it answers. Also timed: a call that finds
nothing new (the supervisor's steady state), and, to show where the time goes, decoding
each line and encoding its metrics with no database at all. Every run must store each line
exactly once.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from measure import expect, interleave, median, ms
from report import Outcome, Table, Target
from sqlalchemy import func, select

from muster.store import Attempt, Experiment, Metric, Store, Trial
from muster.supervise.ingest import ingest_trial

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
CALLS = 100
IDLE_CALLS = 200
COLUMNS = ("trial_id", "attempt", "rank", "kind", "step", "time", "values")


@dataclass(frozen=True)
class Workload:
    lines: int
    repetitions: int


FULL = Workload(100_000, 5)
QUICK = Workload(20_000, 2)


def report_lines(count: int) -> list[bytes]:
    """`count` lines as the harness writes them: a training report of 4 metrics per step."""
    start = 1_700_000_000.0
    return [json.dumps({"kind": "training", "step": step,
                        "metrics": {"loss": 1.0 / (step + 1), "accuracy": step / count,
                                    "lr": 0.001 * 0.999 ** (step // 100), "grad_norm": 1.5},
                        "time": start + step * 0.01, "rank": 0}).encode() + b"\n"
            for step in range(count)]


def baseline_rows(lines: list[bytes], trial_id: int) -> list[tuple[Any, ...]]:
    """The rows muster stores for `lines`, ready for a DBAPI executemany."""
    rows = []
    for line in lines:
        report = json.loads(line)
        rows.append((trial_id, 1, 0, report["kind"], report["step"], report["time"],
                     json.dumps(report["metrics"])))
    return rows


# -- databases -----------------------------------------------------------------------------


@contextmanager
def fresh_store(backend: str, folder: Path) -> Iterator[Store]:
    """A new, migrated store: a new SQLite file, or a new PostgreSQL database (dropped after)."""
    if backend == "sqlite":
        store = Store(f"sqlite:///{folder / f'bench-{secrets.token_hex(4)}.db'}")
        store.upgrade()
        try:
            yield store
        finally:
            store.dispose()
        return
    name = f"muster_bench_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    store = Store(PG_URL.format(name=name))
    try:
        store.upgrade()
        yield store
    finally:
        store.dispose()
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_answers() -> bool:
    try:
        psycopg.connect(PG_ADMIN).close()
    except psycopg.OperationalError as exc:
        print(f"  PostgreSQL is not reachable, measuring SQLite only: {exc}", file=sys.stderr)
        return False
    return True


def add_trial(store: Store, run_dir: Path) -> int:
    """An experiment with one running trial whose attempt 1 lives in `run_dir/attempt-1`."""
    (run_dir / "attempt-1").mkdir(parents=True)
    with store.session_scope() as s:
        exp = Experiment(name="bench", config={"name": "bench"}, config_yaml="name: bench\n",
                         context_dir=str(run_dir), state="ACTIVE")
        trial = Trial(experiment=exp, state="RUNNING")
        s.add_all([exp, trial, Attempt(trial=trial, number=1, state="RUNNING",
                                       run_dir=str(run_dir / "attempt-1"))])
        s.flush()
        return trial.id


def stored_once(store: Store, trial_id: int, lines: int) -> None:
    with store.session_scope() as s:
        count, steps = s.execute(select(func.count(), func.count(func.distinct(Metric.step)))
                                 .where(Metric.trial_id == trial_id)).one()
    expect(count == lines == steps, f"{lines} lines became {count} rows ({steps} steps)")


def executemany(store: Store, rows: list[tuple[Any, ...]]) -> None:
    """One transaction, one DBAPI executemany: the database's cost of storing `rows`."""
    connection = store.engine.raw_connection()
    try:
        cursor = connection.cursor()
        if store.engine.dialect.name == "sqlite":
            sql = f'INSERT INTO metrics ({", ".join(map(quote, COLUMNS))}) VALUES ' \
                  f'({", ".join("?" * len(COLUMNS))})'
            cursor.execute("BEGIN IMMEDIATE")  # as muster's engine begins (see Store)
            cursor.executemany(sql, rows)
            cursor.execute("COMMIT")
        else:
            sql = f'INSERT INTO metrics ({", ".join(map(quote, COLUMNS))}) VALUES ' \
                  f'({", ".join(["%s"] * len(COLUMNS))})'
            cursor.executemany(sql, rows)
            connection.commit()
        cursor.close()
    finally:
        connection.close()


def quote(column: str) -> str:
    return f'"{column}"'


# -- the arms ------------------------------------------------------------------------------


def arms(backend: str, folder: Path, lines: list[bytes]) -> dict[str, Callable[[], float]]:
    """Each arm sets up a fresh store and files (untimed) and returns the seconds it timed."""
    per_call = len(lines) // CALLS

    def setup(store: Store) -> tuple[int, Path]:
        run_dir = folder / f"run-{secrets.token_hex(4)}"
        return add_trial(store, run_dir), run_dir / "attempt-1" / "rank-0.metrics.jsonl"

    def muster_one_call() -> float:
        with fresh_store(backend, folder) as store:
            trial_id, path = setup(store)
            path.write_bytes(b"".join(lines))
            start = time.perf_counter()
            ingest_trial(store, trial_id)
            elapsed = time.perf_counter() - start
            stored_once(store, trial_id, len(lines))
        return elapsed

    def muster_calls() -> float:
        with fresh_store(backend, folder) as store:
            trial_id, path = setup(store)
            elapsed = 0.0
            with path.open("ab") as out:
                for call in range(CALLS):
                    out.write(b"".join(lines[call * per_call:(call + 1) * per_call]))
                    out.flush()
                    start = time.perf_counter()
                    ingest_trial(store, trial_id)
                    elapsed += time.perf_counter() - start
            stored_once(store, trial_id, len(lines))
        return elapsed

    def baseline(batches: int) -> Callable[[], float]:
        def arm() -> float:
            with fresh_store(backend, folder) as store:
                trial_id, _path = setup(store)
                rows = baseline_rows(lines, trial_id)
                size = math.ceil(len(rows) / batches)
                start = time.perf_counter()
                for batch in range(batches):
                    executemany(store, rows[batch * size:(batch + 1) * size])
                elapsed = time.perf_counter() - start
                stored_once(store, trial_id, len(lines))
            return elapsed
        return arm

    return {f"{backend}/muster/1": muster_one_call, f"{backend}/baseline/1": baseline(1),
            f"{backend}/muster/{CALLS}": muster_calls, f"{backend}/baseline/{CALLS}":
            baseline(CALLS)}


def idle_call_seconds(backend: str, folder: Path, lines: list[bytes]) -> list[float]:
    """Seconds per `ingest_trial` call that finds nothing new (after all lines are in)."""
    with fresh_store(backend, folder) as store:
        trial_id = add_trial(store, folder / f"idle-{backend}")
        (folder / f"idle-{backend}" / "attempt-1" / "rank-0.metrics.jsonl").write_bytes(
            b"".join(lines))
        ingest_trial(store, trial_id)
        samples = []
        for _ in range(IDLE_CALLS):
            start = time.perf_counter()
            report = ingest_trial(store, trial_id)
            samples.append(time.perf_counter() - start)
            expect(not report.changed, "an ingest of an unchanged run directory stored rows")
    return samples


def json_floor(lines: list[bytes]) -> Callable[[], float]:
    """Decode every line and encode its metrics again: Python's least work per line."""

    def arm() -> float:
        start = time.perf_counter()
        for line in lines:
            json.dumps(json.loads(line)["metrics"])
        return time.perf_counter() - start

    return arm


def run(quick: bool) -> Outcome:
    workload = QUICK if quick else FULL
    backends = ["sqlite", *(["postgresql"] if postgres_answers() else [])]
    lines = report_lines(workload.lines)
    with tempfile.TemporaryDirectory(prefix="muster-bench-ingest-") as tmp:
        folder = Path(tmp)
        every: dict[str, Callable[[], float]] = {"json": json_floor(lines)}
        for backend in backends:
            every.update(arms(backend, folder, lines))
        samples = interleave(every, workload.repetitions)
        idle = {backend: idle_call_seconds(backend, folder, lines) for backend in backends}
    return _outcome(workload, backends, samples, idle)


def _outcome(workload: Workload, backends: list[str], samples: dict[str, list[float]],
             idle: dict[str, list[float]]) -> Outcome:
    def rate(arm: str) -> float:
        return workload.lines / median(samples[arm])

    rows = []
    for backend in backends:
        for calls in (1, CALLS):
            mine, floor = rate(f"{backend}/muster/{calls}"), rate(f"{backend}/baseline/{calls}")
            rows.append([backend, f"{calls} x {workload.lines // calls:,}",
                         f"{mine:,.0f}", f"{floor:,.0f}", f"{100 * mine / floor:.0f}%"])
    table = Table(f"(i) metric ingestion, {workload.lines:,} lines of 4 metrics "
                  "(median rows/s)",
                  ["store", "calls x lines", "`ingest_trial`", "`executemany`",
                   "muster / executemany"], rows)
    idle_table = Table(f"(i) an `ingest_trial` call that finds nothing new (median of "
                       f"{IDLE_CALLS})", ["store", "ms"],
                       [[b, f"{ms(median(idle[b])):.2f}"] for b in backends])
    split = Table(f"(i) where the time goes, one call of {workload.lines:,} lines (median ms)",
                  ["store", "`json.loads` + `json.dumps` per line, no database",
                   "`executemany`", "`ingest_trial`"],
                  [[b, f"{ms(median(samples['json'])):.0f}",
                    f"{ms(median(samples[f'{b}/baseline/1'])):.0f}",
                    f"{ms(median(samples[f'{b}/muster/1'])):.0f}"] for b in backends])
    runs = (len(samples) - 1) * workload.repetitions
    targets = [Target("(i) every line stored exactly once, every run",
                      f"{runs}/{runs} runs", True)]
    notes = [f"{workload.repetitions} interleaved repetitions of each arm, each on a fresh "
             "store; muster's time includes reading the file, parsing and checking each "
             "line, and the cursor; the baseline's rows were parsed and serialized before "
             "its clock started."]
    data = {"samples_s": samples, "idle_s": idle, "lines": workload.lines, "calls": CALLS}
    return Outcome("ingest", [table, split, idle_table], targets, notes, data)
