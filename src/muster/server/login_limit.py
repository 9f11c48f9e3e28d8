"""How often a password or token may be guessed: growing delays per (address, user name)
and per address, which a stranger cannot turn against another user.

Each login is counted as failed when it starts (so a burst of them at once counts in full)
and forgiven when it succeeds; a delay runs from the end of the last failure. Past
`FREE_PER_NAME` failures of one name from one address
(token logins count under one name), or `FREE_PER_ADDRESS` from one address in all, the next
login from there must wait `FIRST_DELAY_S`, doubling with each further failure up to
`MAX_DELAY_S`; an early one is refused with a 429 (Retry-After: the wait left) before its
password is checked, so a guesser also costs no argon2 time. A key's failures are forgotten
`WINDOW_S` after its last one.

Nothing is counted per name alone: failures from one address never slow a login from
another, so nobody can lock the admin out from elsewhere. And an address from which a user
logged in within `WINDOW_S` is never held back for that user: someone behind the same NAT
or proxy address cannot lock them out either. The price of both is that a guesser with many
addresses gets `FREE_PER_NAME` tries from each; argon2's cost and the password rules
(`muster.services.passwords`) are what stand against that.

At most `MAX_KEYS` keys are remembered (the least recently used are forgotten first), so
random names or addresses cannot grow the tables without bound.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from muster.errors import TooManyRequests

__all__ = ["FIRST_DELAY_S", "FREE_PER_ADDRESS", "FREE_PER_NAME", "MAX_DELAY_S", "WINDOW_S",
           "LoginAttempt", "LoginLimiter", "delay_after"]

FREE_PER_NAME = 5
FREE_PER_ADDRESS = 20
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 300.0
WINDOW_S = 900.0
MAX_KEYS = 10_000
MAX_KEY_CHARS = 64  # of a name or an address: longer names do not exist, and can only fail
TOKEN_LOGIN = "(token)"  # the name token logins are counted under

K = TypeVar("K")
V = TypeVar("V")


def delay_after(failures: int, free: int, first: float = FIRST_DELAY_S,
                most: float = MAX_DELAY_S) -> float:
    """Seconds the next login waits after `failures` in a row, `free` of them without one."""
    if failures < free:
        return 0.0
    return min(most, first * 2.0 ** min(failures - free, 64))


@dataclass(frozen=True)
class LoginAttempt:
    """A login `LoginLimiter.begin` admitted; exactly one of its methods tells the verdict."""

    limiter: LoginLimiter
    name: str | None
    address: str
    counted: bool  # as a failure, until it succeeds (not for a trusted address)

    def failed(self) -> None:
        """The credential was wrong: the next login from the address waits from now."""
        self.limiter._failed(self)

    def succeeded(self) -> None:
        """Its failure is forgiven, the address's tries of that name start afresh, and the
        address is trusted for that name for the window."""
        self.limiter._succeeded(self)

    def forgive(self) -> None:
        """It ended without a verdict (the server was busy, or broke): not counted."""
        self.limiter._forgive_attempt(self)


@dataclass
class _Tally:
    failures: int
    last: float  # when the last of them started, then when it failed


class LoginLimiter:
    """Counts failed logins; safe to use from any thread. `name` None is a token login."""

    def __init__(self, per_name: int = FREE_PER_NAME, per_address: int = FREE_PER_ADDRESS,
                 window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_KEYS, first_delay_s: float = FIRST_DELAY_S,
                 max_delay_s: float = MAX_DELAY_S) -> None:
        if min(per_name, per_address, max_keys) < 1 or not 0 < first_delay_s <= max_delay_s \
                or window_s < max_delay_s:
            raise ValueError(
                f"limits and max_keys must be at least 1, 0 < first_delay_s <= max_delay_s "
                f"<= window_s, but got {per_name=}, {per_address=}, {max_keys=}, "
                f"{first_delay_s=}, {max_delay_s=}, {window_s=}.")
        self._free = {"name": per_name, "address": per_address}
        self._delays = (first_delay_s, max_delay_s)
        self._window = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._tallies: OrderedDict[tuple[str, ...], _Tally] = OrderedDict()
        self._successes: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, name: str | None, address: str) -> LoginAttempt:
        """Admit a login of `name` from `address`, counted as failed until it succeeds
        (unless the address logged `name` in lately: then it is not counted at all).

        Raises:
            TooManyRequests: it comes too soon after failures from this address.
        """
        with self._lock:
            now = self._clock()
            if self._trusted(name, address, now):
                return LoginAttempt(self, name, address, counted=False)
            keys = self._keys(name, address)
            for key in keys:
                self._check(key, name, address, now)
            for key in keys:
                tally = self._tally(key, now)
                tally.failures, tally.last = tally.failures + 1, now
                self._remember(self._tallies, key, tally)
            return LoginAttempt(self, name, address, counted=True)

    def _failed(self, attempt: LoginAttempt) -> None:
        with self._lock:
            now = self._clock()
            for key in self._keys(attempt.name, attempt.address):
                tally = self._tallies.get(key)
                if tally is not None:
                    tally.last = max(tally.last, now)

    def _succeeded(self, attempt: LoginAttempt) -> None:
        with self._lock:
            now = self._clock()
            pair, whole = self._keys(attempt.name, attempt.address)
            self._tallies.pop(pair, None)
            if attempt.counted:
                self._forgive(whole)
            if attempt.name is not None:
                self._remember(self._successes, (attempt.address[:MAX_KEY_CHARS],
                                                 attempt.name[:MAX_KEY_CHARS]), now)

    def _forgive_attempt(self, attempt: LoginAttempt) -> None:
        if attempt.counted:
            with self._lock:
                for key in self._keys(attempt.name, attempt.address):
                    self._forgive(key)

    def _keys(self, name: str | None, address: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The (address, name) key and the address's own."""
        address = address[:MAX_KEY_CHARS]
        return (("name", address, (name or TOKEN_LOGIN)[:MAX_KEY_CHARS]),
                ("address", address))

    def _trusted(self, name: str | None, address: str, now: float) -> bool:
        if name is None:
            return False
        at = self._successes.get((address[:MAX_KEY_CHARS], name[:MAX_KEY_CHARS]))
        return at is not None and now - at < self._window

    def _check(self, key: tuple[str, ...], name: str | None, address: str, now: float
               ) -> None:
        tally = self._tally(key, now)
        wait = tally.last + delay_after(tally.failures, self._free[key[0]],
                                        *self._delays) - now
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            whose = (f"{'tokens' if name is None else name} from {address}"
                     if key[0] == "name" else f"address {address}")
            raise TooManyRequests(f"too many failed logins for {whose}; try again in "
                                  f"{seconds} s", retry_after=seconds)

    def _tally(self, key: tuple[str, ...], now: float) -> _Tally:
        tally = self._tallies.get(key)
        if tally is None or now - tally.last >= self._window:
            return _Tally(0, now)
        return tally

    def _forgive(self, key: tuple[str, ...]) -> None:
        tally = self._tallies.get(key)
        if tally is not None:
            tally.failures = max(0, tally.failures - 1)

    def _remember(self, table: OrderedDict[K, V], key: K, value: V) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self._max_keys:
            table.popitem(last=False)
