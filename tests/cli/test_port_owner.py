"""`muster up` on a port another process listens on: it says so, and names that process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.cli.port_owner import holder, listening_inodes, refusal


@pytest.fixture
def taken() -> Iterator[int]:
    """A port this test process listens on, for the test's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_free_port_is_no_refusal() -> None:
    assert refusal("127.0.0.1", free_port()) is None


def test_a_taken_port_names_its_holder(taken: int) -> None:
    assert len(listening_inodes(taken)) == 1
    assert holder(taken).startswith(f"(by pid {os.getpid()}: {sys.executable}")
    why = refusal("127.0.0.1", taken)
    assert why is not None
    assert why.startswith(f"port {taken} on 127.0.0.1 is taken (by pid {os.getpid()}: ")
    assert why.endswith("; stop it or choose another port with --port")


def test_another_address_than_the_holders_is_taken_too(taken: int) -> None:
    assert refusal("0.0.0.0", taken) is not None


@pytest.mark.lifecycle  # a real `muster up`
@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detached"])
def test_up_on_a_taken_port_says_so(tmp_path: Path, taken: int, detach: bool) -> None:
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-m", "muster", "up", "--home", str(home), "--port", str(taken),
         *(["--detach"] if detach else [])],
        capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [f"error: {refusal('127.0.0.1', taken)}"]
    assert f"port {taken} on 127.0.0.1 is taken (by pid {os.getpid()}: " in done.stderr
    assert not (home / "server.json").exists()
