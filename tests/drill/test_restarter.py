"""The drill's server restart (muster.drill.restarter): its helper, run against a real
`muster up`, kills it by identity and starts the same command again on the same port."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from muster.atomic import read_json
from muster.client import Client
from muster.drill.restarter import restart_request
from muster.errors import ServerUnavailable
from muster.home import Home
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive, read_identity, send_signal
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def as_the_server_sees_itself(pid: int) -> tuple[list[str], str, dict[str, str]]:
    """Its argv, working directory and environment, as `restart_server` hands them over."""
    proc = Path(f"/proc/{pid}")
    argv = [part.decode() for part in (proc / "cmdline").read_bytes().split(b"\0")[:-1]]
    env = dict(entry.decode().split("=", 1)
               for entry in (proc / "environ").read_bytes().split(b"\0") if entry)
    return argv, str((proc / "cwd").readlink()), env


def started_again(server: RunningServer, old: ProcessIdentity) -> ProcessIdentity | None:
    """The server its home's server.json names, once that is not `old` and it answers."""
    record = read_json(Home(server.home).server_file)
    if not isinstance(record, dict):
        return None
    new = ProcessIdentity(record["pid"], record["start_ticks"])
    try:
        with Client(url=server.url, home=Home(server.home)) as client:
            client.health()
    except ServerUnavailable:
        return None
    return new if new != old else None


def test_the_helper_kills_the_server_and_starts_it_again(tmp_path: Path) -> None:
    with serving(tmp_path / "home") as server:
        assert server.proc is not None
        old = read_identity(server.proc.pid)
        assert old is not None
        log = server.home / "server.log"
        request = restart_request(old, *as_the_server_sees_itself(old.pid), log)
        assert request.stat().st_mode & 0o777 == 0o600
        with open(log, "ab") as out:
            helper = subprocess.run([sys.executable, "-m", "muster.drill.restarter",
                                     str(request)], stdout=out, stderr=subprocess.STDOUT,
                                    timeout=60, check=False)
        assert helper.returncode == 0, log.read_text()
        assert not request.exists()  # it held the server's environment
        assert server.proc.wait(timeout=10) == -signal.SIGKILL
        new = wait_until(lambda: started_again(server, old), timeout=60,
                         what="the server started again")
        try:
            assert new.pid != old.pid
            text = log.read_text()
            assert f"SIGKILL to the server (pid {old.pid}); it is gone" in text
            assert f"started the server again: pid {new.pid}" in text
        finally:
            send_signal(new, signal.SIGTERM)
            wait_until(lambda: not is_alive(new), timeout=30, what="the new server to stop")


def test_a_helper_that_cannot_restart_says_why_in_one_line(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text("{not json")
    helper = subprocess.run([sys.executable, "-m", "muster.drill.restarter", str(request)],
                            capture_output=True, timeout=60, check=False)
    assert helper.returncode == 1
    [line] = helper.stdout.decode().splitlines()
    assert "could not restart the server: JSONDecodeError: " in line
    assert not request.exists()
