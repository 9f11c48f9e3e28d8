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
        log = home / "server.log"

        def dumped() -> str | bool:
            assert running.proc is not None
            # Waited for by the event loop's frame, not by "Current thread": the kernel may
            # hand the signal to a thread Python does not know (a library's pool), and then
            # every thread's stack is headed "Thread 0x…". faulthandler writes at most 100
            # frames a thread, so a signal that lands while the loop's thread is deep in a
            # request cuts its stack above `run_forever`: signal again until one lands while
            # it waits (an idle server mostly does).
            text = log.read_text()
            if "in run_forever" in text:
                return text
            running.proc.send_signal(signal.SIGQUIT)
            return False

        try:
            dump = wait_until(dumped, what="the stacks in server.log", interval=1.0)
        except AssertionError as exc:
            status = Path(f"/proc/{running.proc.pid}/status").read_text()
            masks = [line for line in status.splitlines() if line.startswith("Sig")]
            raise AssertionError(f"{exc}; the server's {masks}; its log ends: "
                                 f"{log.read_text()[-2000:]!r}") from None
        # The event loop's thread, waiting in its selector, and the other threads.
        assert "in run_forever" in dump
        assert dump.count("Thread 0x") >= 1
        with running.client() as client:
            assert client.health()["status"] == "ok"
        assert running.proc.poll() is None
