"""The server tests' fixtures: a fresh server per test (`server`) and its client; the
shared ones are in `tests/servers.py`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.client import Client
from tests.processes import kill_home_processes
from tests.servers import RunningServer


@pytest.fixture
def server_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


@pytest.fixture
def server(server_home: Path) -> Iterator[RunningServer]:
    running = RunningServer(home=server_home, db_url=f"sqlite:///{server_home / 'muster.db'}")
    running.start()
    try:
        yield running
    finally:
        running.stop()
        kill_home_processes(server_home)


@pytest.fixture
def client(server: RunningServer) -> Iterator[Client]:
    with server.client() as c:
        yield c
