"""`kill -QUIT` on a real `muster up`: every thread's stack goes into the server log and the
server goes on serving (how an operator finds where a stuck server waits)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.servers import serving
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle


def test_sigquit_dumps_every_thread_and_the_server_goes_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serving(home) as running:
        assert running.proc is not None
        running.proc.send_signal(signal.SIGQUIT)
        log = home / "server.log"
        # Waited for by the event loop's frame, not by "Current thread": the kernel may hand
        # the signal to a thread Python does not know (a library's pool), and then every
        # thread's stack is headed "Thread 0x…".
        dump = wait_until(lambda: "in run_forever" in (text := log.read_text()) and text,
                          what="the stacks in server.log")
        # The event loop's thread, waiting in its selector, and the other threads.
        assert "in run_forever" in dump
        assert dump.count("Thread 0x") >= 1
        with running.client() as client:
            assert client.health()["status"] == "ok"
        assert running.proc.poll() is None
