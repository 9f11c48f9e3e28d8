"""Experiments created at the same moment: distinct ids, distinct runs, all of them finish.

The same tests run against the embedded SQLite store and against PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.processes import kill_home_processes
from tests.server.experiments import make_context, only_trial, submit, wait_ended
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

THREADS = 8


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_server(request: pytest.FixtureRequest, server_home: Path) -> Iterator[RunningServer]:
    """A real server on each backend in turn."""
    if request.param == "sqlite":
        yield request.getfixturevalue("server")
        return
    running = RunningServer(home=server_home, db_url=request.getfixturevalue("pg_url"))
    running.start()
    try:
        yield running
    finally:
        running.stop()
        kill_home_processes(server_home)


def assert_distinct_and_succeeded(
    client: Client, server: RunningServer, created: list[dict[str, Any]]
) -> None:
    ids = [exp["id"] for exp in created]
    assert len(set(ids)) == len(ids), ids
    ended = [wait_ended(client, exp_id, timeout=120) for exp_id in ids]
    trials = [only_trial(exp) for exp in ended]
    assert [exp["state"] for exp in ended] == ["COMPLETED"] * len(ids)
    assert [t["state"] for t in trials] == ["SUCCEEDED"] * len(ids)
    assert len({t["id"] for t in trials}) == len(ids)
    assert len({t["uuid"] for t in trials}) == len(ids)
    assert len({exp["uuid"] for exp in ended}) == len(ids)
    run_dirs = {t["attempts"][0]["run_dir"] for t in trials}
    assert len(run_dirs) == len(ids)
    for trial in trials:
        log = Path(trial["attempts"][0]["replicas"][0]["log_path"])
        assert log.read_bytes() == b"hello from exit0\n"
    assert len(list((server.home / "runs").iterdir())) == len(ids)
    assert len(list((server.home / "experiments").iterdir())) == len(ids)


@pytest.mark.timeout(120)
def test_two_experiments_created_back_to_back_are_distinct(
    any_server: RunningServer, tmp_path: Path
) -> None:
    contexts = [make_context(tmp_path, "exit0.sh") for _ in range(2)]
    with any_server.client() as client:
        created = [submit(client, context) for context in contexts]
        assert_distinct_and_succeeded(client, any_server, created)


@pytest.mark.timeout(180)
def test_eight_threads_creating_at_once_all_succeed(
    any_server: RunningServer, tmp_path: Path
) -> None:
    contexts = [make_context(tmp_path, "exit0.sh", name=f"parallel-{n}")
                for n in range(THREADS)]
    barrier = threading.Barrier(THREADS)

    def create_one(context: Path) -> dict[str, Any]:
        with any_server.client() as client:  # each thread its own client and connection
            barrier.wait(timeout=30)
            return submit(client, context)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        created = list(pool.map(create_one, contexts))  # re-raises any thread's error
    assert sorted(exp["name"] for exp in created) == sorted(
        f"parallel-{n}" for n in range(THREADS))
    with any_server.client() as client:
        assert_distinct_and_succeeded(client, any_server, created)
