"""The orchestrator: the supervisor's passes on the server's event loop, one at a time.

A pass runs in a worker thread, at once when woken (an experiment created, killed, paused
or activated; a shim reporting a start or an end; a file or process of `wakeups`), and
otherwise every `TICK_SECONDS`, or every `wakeups.SAFETY_NET_SECONDS` where the wake-ups
report what changes (inotify and pidfds on this machine). A pass that fails is
retried with a growing pause (`backoff`), so a broken database or a bug does not spin the
loop and flood the log; `PassHealth` keeps the last failure and its time for
`GET /api/v1/health`, which stays 200 while the server serves (`degraded` says the last
pass failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from muster.errors import MusterError
from muster.server.wakeups import SAFETY_NET_SECONDS, Wakeups, Watched
from muster.supervise.reconcile import reconcile_attempts
from muster.supervise.supervisor import Supervisor

log = logging.getLogger(__name__)

TICK_SECONDS = 0.2
RETRY_SECONDS = 2.0
MAX_BACKOFF_SECONDS = 10.0


def backoff(failures: int) -> float:
    """Seconds to wait before the next pass after `failures` failed passes in a row."""
    if failures <= 0:
        return TICK_SECONDS
    return min(MAX_BACKOFF_SECONDS, TICK_SECONDS * 2.0 ** min(failures, 16))


@dataclass
class PassHealth:
    """How the supervisor's passes are going: the last failure stays after a recovery."""

    failures_in_a_row: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    last_pass_at: float | None = None  # the end of the last pass that succeeded
    passes: int = 0  # passes that succeeded since the server started

    @property
    def degraded(self) -> bool:
        return self.failures_in_a_row > 0

    def succeeded(self) -> None:
        if self.failures_in_a_row:
            log.info("supervisor passes work again after %d failed", self.failures_in_a_row)
        self.failures_in_a_row, self.last_pass_at = 0, time.time()
        self.passes += 1

    def failed(self, error: str) -> bool:
        """Note a failed pass; True when its error is new (worth a traceback in the log)."""
        new = error != self.last_error or not self.failures_in_a_row
        self.failures_in_a_row += 1
        self.last_error, self.last_error_at = error, time.time()
        return new


@dataclass
class Orchestrator:
    """Runs the supervisor's passes on the server's event loop (one at a time, in a thread)."""

    supervisor: Supervisor
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    health: PassHealth = field(default_factory=PassHealth)
    # Whether to learn of changes from the files and processes of this machine (False
    # where replicas run on a cluster's nodes: their files change elsewhere).
    use_wakeups: bool = True
    safety_net: float = SAFETY_NET_SECONDS  # the interval when wake-ups report changes
    wakeups: Wakeups | None = field(default=None, init=False)

    async def run(self) -> None:
        # Before the reconciliation, so that /health tells from the server's first answer
        # whether the passes are woken or polled.
        if self.use_wakeups:
            self.wakeups = Wakeups.start(asyncio.get_running_loop(), self.wake.set)
        try:
            await self._reconcile()
            await self._passes()
        finally:
            if self.wakeups is not None:
                self.wakeups.close()

    @property
    def interval(self) -> float:
        """Seconds between passes that nothing woke."""
        if (self.wakeups is not None and self.wakeups.complete
                and not self.supervisor.waits_on_the_clock()):
            return self.safety_net
        return TICK_SECONDS

    async def _passes(self) -> None:
        while True:
            # Cleared before the pass, not after: a wake-up that arrives during a pass (a
            # trial created after the pass looked at the queue) must start the next one now.
            self.wake.clear()
            self._tend_wakeups(before_pass=True)
            await self._pass()
            self._tend_wakeups(before_pass=False)
            if self.health.degraded:
                # Being woken does not cut a backoff short: requests must not spin a loop
                # whose every pass fails.
                await asyncio.sleep(backoff(self.health.failures_in_a_row))
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.interval)

    def _tend_wakeups(self, before_pass: bool) -> None:
        """Re-arm the wake-ups before a pass, point them at what it followed after it. A
        failure there never stops the passes: they poll every TICK_SECONDS from then on."""
        if self.wakeups is None:
            return
        try:
            if before_pass:
                self.wakeups.rearm()
            else:
                self.wakeups.update(Watched(self.supervisor.followed_dirs(),
                                            self.supervisor.child_pids()))
        except Exception:  # logged with its traceback; polling takes over
            log.exception("the wake-ups failed; the passes poll every %ss from now on",
                          TICK_SECONDS)
            wakeups, self.wakeups = self.wakeups, None
            with contextlib.suppress(OSError):
                wakeups.close()

    async def _pass(self) -> None:
        try:
            await asyncio.to_thread(self.supervisor.tick)
        except MusterError as exc:
            self._note_failure(str(exc), with_traceback=False)
        except Exception as exc:  # noqa: BLE001 - recorded, logged with its traceback, retried
            self._note_failure(f"{type(exc).__name__}: {exc}", with_traceback=True)
        else:
            self.health.succeeded()

    def _note_failure(self, error: str, with_traceback: bool) -> None:
        new = self.health.failed(error)
        wait = backoff(self.health.failures_in_a_row)
        count = self.health.failures_in_a_row
        message = "supervisor pass failed (%d in a row; next try in %.1fs): %s"
        if new and with_traceback:
            log.exception(message, count, wait, error)
        elif new or count in (2, 5) or count % 60 == 0:
            log.error(message, count, wait, error)

    async def _reconcile(self) -> None:
        """Reconcile every unfinished attempt before any new work starts; a failure (e.g. the
        database is down) is retried, never skipped, so no attempt is launched twice."""
        while True:
            try:
                await asyncio.to_thread(reconcile_attempts, self.supervisor)
                return
            except MusterError as exc:
                self.health.failed(f"reconciliation: {exc}")
                log.error("reconciliation failed, retrying in %ss: %s", RETRY_SECONDS, exc)
            except Exception as exc:
                self.health.failed(f"reconciliation: {type(exc).__name__}: {exc}")
                log.exception("reconciliation failed unexpectedly, retrying in %ss",
                              RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)
