"""A real muster server in a subprocess (`python -m muster up`), on a fresh home."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from muster.client import Client
from muster.errors import ServerUnavailable
from muster.home import Home
from muster.store import Store
from tests.processes import kill_home_processes
from tests.waiting import wait_until


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    home: Path
    db_url: str
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @contextmanager
    def store(self) -> Iterator[Store]:
        """The server's database, opened from the test process (closed afterwards)."""
        opened = Store(self.db_url)
        try:
            yield opened
        finally:
            opened.dispose()

    def start(self) -> None:
        self.start_with(["--min-free-disk", "0"])

    def start_with(self, options: list[str]) -> None:
        """Start `muster up` with 4 slots and these extra options."""
        argv = [sys.executable, "-m", "muster", "up", "--home", str(self.home),
                "--port", str(self.port), "--db", self.db_url, "--slots", "4", *options]
        log = open(self.home / "server.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ})
        log.close()
        wait_until(self._healthy, timeout=60, what="the server to answer /health")

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited: {(self.home / 'server.log').read_text()}")
        try:
            with Client(url=self.url, home=Home(self.home)) as c:
                c.health()
            return True
        except ServerUnavailable:
            return False

    def client(self) -> Client:
        return Client(url=self.url, home=Home(self.home))

    def kill(self) -> None:
        """SIGKILL the server (not its trials: they live in their own sessions)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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
