"""The fair queue that creates with a context (an upload to unpack, a snapshot to copy) wait
in: a few worker threads, one FIFO per user, and turns between users.

An unpack may take up to `uploads.EXTRACT_TIMEOUT_S`, so a plain pool lets one user's six
decompression bombs hold every worker while another user's upload waits behind all six
(the audit saw 110 s). Here a free worker takes the first job of the waiting user with the
fewest jobs running, and among those the one served longest ago (`next_user`): one user's
jobs hold at most one worker while someone else waits, so another user's upload waits for
at most one unpack per worker before it starts.

Each user holds at most `per_user` creates in the server at once, and everyone together at
most `total` (`holding`: from before the body is read, so whether a context comes is not
known yet, to the answer); one more is refused with a 429 and Retry-After before its body
is read, so waiting uploads bound the disk they spool to as well as the queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from muster.errors import TooManyRequests

__all__ = ["FairQueue", "next_user"]

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_AFTER_S = 10  # what a refused create is told to wait: a few unpacks' time


def next_user(waiting: Iterable[str], running: Mapping[str, int],
              served: Mapping[str, int]) -> str:
    """Whose job a free worker takes: of the users with jobs `waiting`, the one with the
    fewest jobs `running`, and of those the one `served` longest ago (a user absent from
    `served` first; ties in the order of `waiting`)."""
    return min(waiting, key=lambda user: (running.get(user, 0), served.get(user, -1)))


@dataclass
class _Job(Generic[T]):
    run: Callable[[], T]
    future: Future[T] = field(default_factory=Future)


class FairQueue:
    """Runs blocking jobs on `workers` threads, fairly between users (`next_user`).

    `holding(user)` counts a create from its start (refusing one past the bounds); `run`
    queues its job and waits for it without blocking the event loop. Thread-safe.
    """

    def __init__(self, workers: int, per_user: int, total: int, name: str) -> None:
        if workers < 1 or per_user < 1 or total < per_user:
            raise ValueError(f"a fair queue needs workers >= 1 and 1 <= per_user <= total, "
                             f"but got {workers=}, {per_user=}, {total=}")
        self.workers, self.per_user, self.total = workers, per_user, total
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[_Job[Any]]] = {}
        self._running: Counter[str] = Counter()
        self._served: dict[str, int] = {}  # when each busy user's last job started (a tick)
        self._ticks = 0
        self._held: Counter[str] = Counter()

    @contextmanager
    def holding(self, user: str) -> Iterator[None]:
        """Count one create of `user` while the block runs.

        Raises:
            TooManyRequests: `user` already holds `per_user`, or everyone `total`.
        """
        with self._lock:
            self._check_room(user)
            self._held[user] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[user] -= 1
                if not self._held[user]:
                    del self._held[user]

    async def run(self, user: str, job: Callable[[], T]) -> T:
        """`job()` on a worker, in `user`'s turn; its result, or what it raised."""
        return await asyncio.wrap_future(self.submit(user, job))

    def submit(self, user: str, job: Callable[[], T]) -> Future[T]:
        """Queue `job` for `user`; a future of its result. Cancelling the future before a
        worker takes the job drops it."""
        queued: _Job[T] = _Job(job)
        with self._lock:
            self._waiting.setdefault(user, deque()).append(queued)
            self._dispatch()
            theirs = len(self._waiting.get(user, ()))
            waiting = sum(len(jobs) for jobs in self._waiting.values())
        log.info("context job of %s queued: %d of theirs waiting, %d in all", user, theirs,
                 waiting)
        return queued.future

    def _check_room(self, user: str) -> None:
        if self._held[user] >= self.per_user:
            raise TooManyRequests(
                f"{user} already has {self.per_user} experiment creates in progress, the most "
                f"one user may; wait for one to answer (retry after {RETRY_AFTER_S} s)",
                retry_after=RETRY_AFTER_S)
        if sum(self._held.values()) >= self.total:
            raise TooManyRequests(
                f"the server already has {self.total} experiment creates in progress; retry "
                f"after {RETRY_AFTER_S} s", retry_after=RETRY_AFTER_S)

    def _dispatch(self) -> None:
        """Give free workers the next jobs (called with the lock held)."""
        while self._waiting and sum(self._running.values()) < self.workers:
            user = next_user(self._waiting, self._running, self._served)
            job = self._waiting[user].popleft()
            if not self._waiting[user]:
                del self._waiting[user]
            if job.future.set_running_or_notify_cancel():
                self._ticks += 1
                self._served[user] = self._ticks
                self._running[user] += 1
                self._pool.submit(self._work, user, job)
            self._forget_if_idle(user)

    def _work(self, user: str, job: _Job[Any]) -> None:
        try:
            job.future.set_result(job.run())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
            job.future.set_exception(exc)
        finally:
            with self._lock:
                self._running[user] -= 1
                self._forget_if_idle(user)
                self._dispatch()

    def _forget_if_idle(self, user: str) -> None:
        """Drop what is kept of a user with nothing waiting or running (lock held): the
        queue's memory is bounded by its jobs, not by every user it has seen."""
        if user not in self._waiting and not self._running[user]:
            self._running.pop(user, None)
            self._served.pop(user, None)
