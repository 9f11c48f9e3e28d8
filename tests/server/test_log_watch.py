"""`LogWatch`: a follower waiting on a log file wakes when the file is written (real
inotify on real files, on an event loop; no server)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from muster.inotify import Inotify
from muster.server.log_watch import LogWatch

LONG = 60.0  # a wait that ends by its timeout would take this long
T = TypeVar("T")


def _run(main: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(main())` on a thread of its own: a module of the same worker (the UI's
    Playwright) may hold a running loop in this one."""
    found: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            found.append(asyncio.run(main()))  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - raised again below
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return found[0]


@pytest.fixture
def inotify_here() -> None:
    notify = Inotify.open()
    if notify is None:
        pytest.skip("no inotify on this system: the follows poll")
    notify.close()


def _append_later(path: Path, data: bytes, delay: float) -> threading.Thread:
    def write() -> None:
        time.sleep(delay)
        with path.open("ab") as f:
            f.write(data)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("inotify_here")
def test_a_waiting_follower_wakes_when_its_log_is_written(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"seen\n")

    async def main() -> tuple[float, float]:
        watch = LogWatch()
        try:
            writer = _append_later(log, b"new\n", 0.2)
            start = time.monotonic()
            await watch.wait_growth(log, 5, LONG)  # one follower, then two on one file
            first = time.monotonic() - start
            writer.join()
            writers = _append_later(log, b"more\n", 0.2)
            start = time.monotonic()
            await asyncio.gather(watch.wait_growth(log, 9, LONG),
                                 watch.wait_growth(log, 9, LONG))
            both = time.monotonic() - start
            writers.join()
            assert watch._waiting == {}, "no watch is left behind"
            return first, both
        finally:
            watch.close()

    first, both = _run(main)
    assert first < LONG / 2 and both < LONG / 2, "woken by the write, not by the timeout"


@pytest.mark.usefixtures("inotify_here")
def test_bytes_already_there_end_the_wait_at_once_and_a_quiet_file_waits_the_timeout(
    tmp_path: Path
) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"0123456789")

    async def main() -> tuple[float, float]:
        watch = LogWatch()
        try:
            start = time.monotonic()
            await watch.wait_growth(log, 4, LONG)  # 6 bytes the follower has not read
            unread = time.monotonic() - start
            start = time.monotonic()
            await watch.wait_growth(log, 10, 0.3)  # nothing new: the poll's timeout
            quiet = time.monotonic() - start
            return unread, quiet
        finally:
            watch.close()

    unread, quiet = _run(main)
    assert unread < LONG / 2
    assert quiet >= 0.3


def test_a_log_not_there_yet_is_polled(tmp_path: Path) -> None:
    async def main() -> float:
        watch = LogWatch()
        try:
            start = time.monotonic()
            await watch.wait_growth(tmp_path / "missing.log", 0, 0.2)
            return time.monotonic() - start
        finally:
            watch.close()

    assert _run(main) >= 0.2
