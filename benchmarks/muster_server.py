"""A real muster server (`python -m muster up`) in a subprocess, on a fresh home."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from muster.atomic import read_json
from muster.client import Client
from muster.errors import ServerUnavailable
from muster.home import Home
from muster.launch.base import ProcessIdentity
from muster.launch.identity import group_members, send_signal
from muster.rundir import RankFile, every_rank_file

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class ServerProcess:
    """Starts the server on `root/home` with its own SQLite store; stops it on exit, and
    kills any trial it left running (a benchmark that failed half-way)."""

    def __init__(self, root: Path, slots: int | None = None, db: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.home = root / "home"  # made here, or one a benchmark has prepared
        self.env = env or {}  # over this process's environment
        self.port = _free_port()
        self.slots = slots
        self.db = db or f"sqlite:///{self.home / 'muster.db'}"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the server has not been started")
        return self._proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Client:
        return Client(url=self.url, home=Home(self.home))

    def __enter__(self) -> ServerProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "muster", "up", "--home", str(self.home),
                "--port", str(self.port), "--db", self.db,
                "--min-free-disk", "0",
                *(["--slots", str(self.slots)] if self.slots is not None else [])]
        with (self.home / "server.log").open("ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True,
                                          env={**os.environ, **self.env})
        self._wait_healthy(self._proc)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        kill_trials(self.home)

    def _wait_healthy(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.client() as client:
            while True:
                if proc.poll() is not None:
                    log = (self.home / "server.log").read_text(errors="replace")
                    raise RuntimeError(f"the muster server exited at start:\n{log[-3000:]}")
                try:
                    client.health()
                    return
                except ServerUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_trials(home: Path) -> None:
    """SIGKILL every shim and training process group still alive under `home`/runs."""
    for status_file in every_rank_file(home / "runs", RankFile.STATUS):
        status = read_json(status_file)
        if not isinstance(status, dict):
            continue
        pgid = status.get("pgid")
        if isinstance(pgid, int) and pgid > 1 and group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        send_signal(ProcessIdentity(status["shim_pid"], status["shim_start_ticks"]),
                    signal.SIGKILL)
