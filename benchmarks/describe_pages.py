"""(z2) An experiment's description at 10,000 trials: `GET /api/v1/experiments/{id}`, paged.

One search of 10,000 SUCCEEDED trials (each with one attempt of one replica, 8
hyperparameters and 20 validation reports of two metrics: `ui_budget.seed_search`) in the
SQLite store of a real server (`muster up`). Timed, interleaved, with the admin's bearer
token over keep-alive: the description's first page of 100 trials, a last page of 100
(`offset=9900`), the default page (1,000 trials, what `muster experiment describe --json`
asks), the experiment's overview fragment that its web page polls, and `GET
/api/v1/health` (the floor). Each answer's size is its body's bytes; each page must hold
the trials asked for, count all 10,000 (`trials_total`, `X-Total-Count`) and say where the
next starts. Before paging, one answer held every trial: 76 MB at 10,000 (the issue's
measurement at 451eac5).

`--quick`: 2,000 trials, 5 reports each, 5 repetitions. Run alone:
`.venv/bin/python benchmarks/describe_pages.py [--quick]`.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from measure import expect, interleave, median, ms
from muster_server import ServerProcess
from report import Outcome, Table, Target
from ui_budget import Size as SearchSize
from ui_budget import _admin_id, checkpoint_wal, seed_search

from muster.home import Home
from muster.store import Store

PAGE_TARGET_MS = 100.0
PAGE_TARGET_BYTES = 1_000_000
SMALL_PAGE = 100


@dataclass(frozen=True)
class Size:
    trials: int
    points: int
    repetitions: int


FULL = Size(trials=10_000, points=20, repetitions=15)
QUICK = Size(trials=2_000, points=5, repetitions=5)


def _search_size(size: Size) -> SearchSize:
    return SearchSize(experiments=0, more_experiments=None, trials=size.trials,
                      points=size.points, log_mb=0, repetitions=size.repetitions, visits=0,
                      ticks=0, chatty_lines=0)


def _arm(http: httpx.Client, path: str, check: Callable[[httpx.Response], None],
         sizes: dict[str, int]) -> Callable[[], float]:
    """One GET of `path`, checked; its body's bytes go to `sizes[path]`."""
    def once() -> float:
        start = time.perf_counter()
        response = http.get(path)
        elapsed = time.perf_counter() - start
        expect(response.status_code == 200, f"GET {path}: {response.status_code}")
        check(response)
        sizes[path] = len(response.content)
        return elapsed
    return once


def _page(total: int, offset: int, count: int) -> Callable[[httpx.Response], None]:
    def check(response: httpx.Response) -> None:
        body: dict[str, Any] = response.json()
        numbers = [t["number"] for t in body["trials"]]
        expect(numbers == list(range(offset, offset + count)),
               f"page from {offset}: trials {numbers[:3]}... ({len(numbers)})")
        after = offset + count
        expect(body["trials_next_offset"] == (after if after < total else None),
               f"page from {offset}: next {body['trials_next_offset']}")
        expect(body["trials_total"] == total and response.headers["X-Total-Count"] == str(total),
               f"page from {offset}: total {body['trials_total']}")
        expect(len(body["trial_states"]) == total, "trial_states counts every trial")
    return check


def _no_check(response: httpx.Response) -> None:
    expect(bool(response.content), "an empty answer")


def run(quick: bool) -> Outcome:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="muster-bench-describe-") as tmp, \
            ServerProcess(Path(tmp) / "server", slots=1) as server:
        token = Home(server.home).token_path.read_text().strip()
        store = Store(f"sqlite:///{server.home / 'muster.db'}")
        started = time.monotonic()
        try:
            search_id = seed_search(store, _admin_id(store), Home(server.home).runs_dir,
                                    _search_size(size))
            checkpoint_wal(store)
        finally:
            store.dispose()
        seeded_s = time.monotonic() - started
        sizes: dict[str, int] = {}
        total = size.trials
        base = f"/api/v1/experiments/{search_id}"
        with httpx.Client(base_url=server.url, timeout=120,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            paths = {
                "GET /api/v1/health (floor)": ("/api/v1/health", _no_check),
                f"first page, limit={SMALL_PAGE}": (
                    f"{base}?limit={SMALL_PAGE}", _page(total, 0, SMALL_PAGE)),
                f"last page, offset={total - SMALL_PAGE}&limit={SMALL_PAGE}": (
                    f"{base}?offset={total - SMALL_PAGE}&limit={SMALL_PAGE}",
                    _page(total, total - SMALL_PAGE, SMALL_PAGE)),
                "default page (1,000 trials)": (base, _page(total, 0, min(total, 1_000))),
                "the page's overview fragment (/ui/experiments/ID/live)": (
                    f"/ui/experiments/{search_id}/live", _no_check),
            }
            arms = {arm: _arm(http, path, check, sizes)
                    for arm, (path, check) in paths.items()}
            times = interleave(arms, size.repetitions)
    rows = [[arm, f"{ms(median(times[arm])):.1f}", f"{ms(min(times[arm])):.1f}",
             f"{sizes[paths[arm][0]]:,}"] for arm in arms]
    table = Table(f"(z2) an experiment's description at {total:,} trials (ms, "
                  f"{size.repetitions} interleaved requests; bytes of the body)",
                  ["request", "median", "min", "bytes"], rows)
    small = [arm for arm in arms if f"limit={SMALL_PAGE}" in arm]
    slowest = max(ms(median(times[arm])) for arm in small)
    largest = max(sizes[paths[arm][0]] for arm in small)
    targets = [
        Target(f"(z2) a page of {SMALL_PAGE} trials of a {total:,}-trial experiment ≤ "
               f"{PAGE_TARGET_MS:.0f} ms (the slower of first and last)",
               f"{slowest:.1f} ms", slowest <= PAGE_TARGET_MS),
        Target(f"(z2) a page of {SMALL_PAGE} trials ≤ 1 MB", f"{largest:,} bytes",
               largest <= PAGE_TARGET_BYTES),
    ]
    notes = [f"Seeded in {seeded_s:.0f} s: {total:,} trials, {size.points} validation reports "
             "each, one attempt of one replica each (`ui_budget.seed_search`), SQLite."]
    data = {"times_s": times, "bytes": {arm: sizes[paths[arm][0]] for arm in arms},
            "trials": total}
    return Outcome("describe_pages", [table], targets, notes, data)


def main() -> int:
    import run as benchmarks

    return benchmarks.main(["--only", "describe_pages", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
