"""(z3) An experiment's learning curves at 1,000 trials: `GET /experiments/{id}/curves` read
from each curve's coarse copy (`metric_series.coarse`, 32 buckets) against the same search
read from its whole curves (250 buckets each), as every answer was read before the copies.

One server (SQLite), two identical searches seeded as `ui_budget.py` seeds its big one
(1,000 SUCCEEDED trials, `points` validation reports each: from 500 on a curve is kept as
its full 250 buckets, so a longer run costs the read no more); the second search's copies
are then cleared, as rows written before migration 0030 have none. Both answers must be
drawn at the same points a curve and end at the same steps. Interleaved requests, medians,
with `GET /health` as the floor. `--quick`: 300 trials, 5 repetitions.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from describe_pages import Size, _search_size
from measure import expect, interleave, median, ms
from muster_server import ServerProcess
from report import Outcome, Table, Target
from sqlalchemy import select, update
from ui_budget import _admin_id, checkpoint_wal, seed_search

from muster.home import Home
from muster.store import MetricSeries, Store, Trial

TARGET_RATIO = 0.5  # the copies at least halve the read


FULL = Size(trials=1_000, points=500, repetitions=15)
QUICK = Size(trials=300, points=500, repetitions=5)


def _get(http: httpx.Client, path: str, bodies: dict[str, Any]) -> Callable[[], float]:
    def once() -> float:
        start = time.perf_counter()
        response = http.get(path)
        elapsed = time.perf_counter() - start
        expect(response.status_code == 200, f"GET {path}: {response.status_code}")
        bodies[path] = response.json()
        return elapsed
    return once


def run(quick: bool) -> Outcome:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="muster-bench-curves-") as tmp, \
            ServerProcess(Path(tmp) / "server", slots=1) as server:
        token = Home(server.home).token_path.read_text().strip()
        store = Store(f"sqlite:///{server.home / 'muster.db'}")
        try:
            owner, runs = _admin_id(store), Home(server.home).runs_dir
            coarse = seed_search(store, owner, runs, _search_size(size))
            whole = seed_search(store, owner, runs, _search_size(size))
            with store.session_scope() as s:
                s.execute(update(MetricSeries).where(MetricSeries.trial_id.in_(
                    select(Trial.id).where(Trial.experiment_id == whole)))
                    .values(coarse=None))
            checkpoint_wal(store)
        finally:
            store.dispose()
        bodies: dict[str, Any] = {}
        paths = {"GET /api/v1/health (floor)": "/api/v1/health",
                 "curves from the coarse copies": f"/api/v1/experiments/{coarse}/curves",
                 "curves from the whole curves (before)": f"/api/v1/experiments/{whole}/curves"}
        with httpx.Client(base_url=server.url, timeout=300,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            arms = {arm: _get(http, path, bodies) for arm, path in paths.items()}
            times = interleave(arms, size.repetitions)
    new, old = (bodies[paths[arm]] for arm in list(paths)[1:])
    expect(new["points_per_trial"] == old["points_per_trial"], "different points a curve")
    expect(len(new["trials"]) == len(old["trials"]) == size.trials, "a curve is missing")
    for a, b in zip(new["trials"], old["trials"], strict=True):
        expect((a["steps"][0], a["steps"][-1]) == (b["steps"][0], b["steps"][-1]),
               f"trial {a['number']}: its ends differ")
        expect(max(a["values"]) == max(b["values"]) and min(a["values"]) == min(b["values"]),
               f"trial {a['number']}: its extremes differ")
    rows = [[arm, f"{ms(median(times[arm])):.1f}", f"{ms(min(times[arm])):.1f}"]
            for arm in arms]
    fast, slow = (ms(median(times[arm])) for arm in list(arms)[1:])
    table = Table(f"(z3) an experiment's learning curves at {size.trials:,} trials, "
                  f"{new['points_per_trial']} points a curve (ms, {size.repetitions} "
                  "interleaved requests)", ["request", "median", "min"], rows)
    return Outcome("curves_coarse", [table], [Target(
        f"(z3) /curves at {size.trials:,} trials: coarse copies / whole curves ≤ "
        f"{TARGET_RATIO}", f"{fast / slow:.2f} ({fast:.0f} / {slow:.0f} ms)",
        fast / slow <= TARGET_RATIO)], [], {"times": times})
