"""Real muster servers for the tests: `python -m muster up` in a subprocess on a fresh home.

One module for every test that needs a server: `RunningServer` (start, kill, restart,
clients, the database), `serving()` (a server for a block), and `shared_server()`, the
module-scoped fixture of modules whose tests each make and inspect their own experiments
(it saves a server start per test).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import muster
from muster.client import Client
from muster.errors import ServerUnavailable
from muster.home import Home
from muster.store import Store
from tests.processes import kill_home_processes
from tests.waiting import wait_until

STOP_TIMEOUT = 15.0  # SIGTERM -> exit; a server's shutdown takes a second or two


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
    env: dict[str, str] = field(default_factory=dict)  # over the test's own environment

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        """The API token the server made in its home."""
        return Home(self.home).token_path.read_text().strip()

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
                                     start_new_session=True, env={**os.environ, **self.env})
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
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                # Every thread's stack into server.log (`muster up` dumps them on SIGQUIT),
                # then a warning that names it: a server that hangs in its shutdown is a bug.
                self.proc.send_signal(signal.SIGQUIT)
                time.sleep(1.0)
                self.proc.kill()
                self.proc.wait()
                log = self.home / "server.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-80:])
                warnings.warn(f"the server did not stop within {STOP_TIMEOUT:g} s of SIGTERM; "
                              f"the end of {log}, its threads' stacks last:\n{tail}",
                              stacklevel=2)


@contextmanager
def serving(home: Path, db_url: str | None = None,
            options: Sequence[str] = ("--min-free-disk", "0"),
            env: dict[str, str] | None = None) -> Iterator[RunningServer]:
    """A real server on `home` (SQLite in the home unless `db_url`), started with `muster up`
    `options` (4 slots unless they say otherwise) and `env` over the test's environment,
    stopped afterwards together with every trial process it started."""
    home.mkdir(parents=True, exist_ok=True)
    running = RunningServer(home=home, db_url=db_url or f"sqlite:///{home / 'muster.db'}",
                            env=env or {})
    running.start_with(list(options))
    try:
        yield running
    finally:
        running.stop()
        kill_home_processes(home)


def shared_server(env: dict[str, str] | None = None) -> Callable[..., Any]:
    """A module-scoped `server` fixture: `server = shared_server()` in a test module (`env`
    over the test's environment, as `serving` takes it)."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
        """One server for the module: each test makes and inspects its own experiments."""
        with serving(tmp_path_factory.mktemp("server") / "home", env=env) as running:
            yield running

    return server


@contextmanager
def serving_jobs_as_accounts(cluster_yaml: str, env: dict[str, str] | None = None,
                             prefix: str = "muster-run-as-") -> Iterator[RunningServer]:
    """A server (root) with `cluster_yaml` as its cluster config (`run_as: ...`), its home
    where other accounts can reach their runs (pytest's own temporary directory is root's
    alone), running the muster package from a copy every account can read, as an
    installation in /opt would be: the checkout the tests run from may lie where other
    accounts cannot look (root's home). `env` over the test's environment."""
    top = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    top.chmod(0o755)
    package = Path(muster.__file__).resolve().parent
    shutil.copytree(package, top / "src" / "muster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(top / "src")], check=True)
    home = top / "home"
    home.mkdir()
    cluster = top / "cluster.yaml"
    cluster.write_text(cluster_yaml)
    server = RunningServer(home=home, db_url=f"sqlite:///{home / 'muster.db'}",
                           env={"PYTHONPATH": str(top / "src"), **(env or {})})
    server.start_with(["--min-free-disk", "0", "--cluster-config", str(cluster)])
    try:
        yield server
    finally:
        server.stop()
        kill_home_processes(home)
        shutil.rmtree(top, ignore_errors=True)
