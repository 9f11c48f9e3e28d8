"""A server whose database goes away keeps serving and says so: `/health` stays 200 with
`degraded` and the last supervisor error, the passes back off instead of flooding the log,
and everything recovers when the database is back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from muster.server.orchestrator import MAX_BACKOFF_SECONDS, TICK_SECONDS, PassHealth, backoff
from tests.conftest import PG_ADMIN
from tests.processes import kill_home_processes
from tests.servers import RunningServer
from tests.waiting import wait_until

API = "/api/v1"


@pytest.mark.parametrize(("failures", "seconds"), [
    (0, TICK_SECONDS), (1, 2 * TICK_SECONDS), (2, 4 * TICK_SECONDS), (3, 8 * TICK_SECONDS),
    (6, MAX_BACKOFF_SECONDS), (10_000, MAX_BACKOFF_SECONDS),
])
def test_failed_passes_back_off(failures: int, seconds: float) -> None:
    assert backoff(failures) == pytest.approx(seconds)


def test_pass_health_keeps_the_last_failure_after_a_recovery() -> None:
    health = PassHealth()
    assert not health.degraded
    assert health.failed("db down") is True  # a new error: worth its traceback
    assert health.failed("db down") is False
    assert health.failed("another") is True
    assert (health.degraded, health.failures_in_a_row, health.last_error) == (True, 3, "another")
    failed_at = health.last_error_at
    health.succeeded()
    assert (health.degraded, health.failures_in_a_row) == (False, 0)
    assert (health.last_error, health.last_error_at) == ("another", failed_at)
    assert health.last_pass_at is not None and failed_at is not None
    assert health.last_pass_at >= failed_at
    assert health.failed("another") is True  # the first failure after a recovery is news


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(sql)


@pytest.fixture
def pg_server(tmp_path: Path, pg_url: str) -> Iterator[tuple[RunningServer, str]]:
    home = tmp_path / "home"
    home.mkdir()
    running = RunningServer(home=home, db_url=pg_url)
    running.start()
    name = pg_url.rsplit("/", 1)[1]
    try:
        yield running, name
    finally:
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        running.stop()
        kill_home_processes(home)


def _health(server: RunningServer, token: bool = True) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {server.token}"} if token else {}
    response = httpx.get(f"{server.url}{API}/health", timeout=10, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.lifecycle
@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_a_lost_database_degrades_health_and_recovers(
    pg_server: tuple[RunningServer, str]
) -> None:
    server, name = pg_server
    assert _health(server)["degraded"] is False
    _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    _admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")

    down = wait_until(lambda: (h := _health(server))["degraded"] and h, timeout=30,
                      what="health to say degraded")
    assert name in down["last_supervisor_error"]
    assert down["last_supervisor_error_at"] is not None
    anyone = _health(server, token=False)  # the error's text names hosts and databases
    assert anyone["degraded"] and name not in str(anyone)
    assert anyone["last_supervisor_error"] == "(sign in to see the error)"
    token = server.token
    listed = httpx.get(f"{server.url}{API}/experiments", timeout=10,
                       headers={"Authorization": f"Bearer {token}"})
    assert listed.status_code == 503 and listed.json()["error"] == "StoreError"
    wait_until(lambda: _health(server)["supervisor"]["failures_in_a_row"] >= 3, timeout=30,
               what="three failed passes in a row")

    _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    up = wait_until(lambda: (h := _health(server))["degraded"] is False and h, timeout=30,
                    what="health to recover")
    # Kept for people after the recovery: the streak's last error (the first pass may fail
    # on its terminated connection, the next ones on the refused database: two texts).
    assert name in up["last_supervisor_error"]
    assert up["last_supervisor_error_at"] >= down["last_supervisor_error_at"]
    assert up["supervisor"]["last_pass_at"] > up["last_supervisor_error_at"]
    log = (server.home / "server.log").read_text()
    # Backed off, and logged sparingly (the 1st, 2nd and 5th failure of one error, then one
    # line a minute): not a line, or a traceback, every 0.2 s.
    assert 1 <= log.count("supervisor pass failed") <= 3, log[-3000:]
    assert "Traceback" not in log
