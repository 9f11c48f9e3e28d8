"""How often a password may be guessed: failed logins per user name and per client address.

Past `MAX_PER_NAME` failures for one name, or `MAX_PER_ADDRESS` from one address, within
`WINDOW_S`, a login is refused with a 429 (Retry-After: until the oldest failure ages out)
before its password is checked, so a guesser also costs no argon2 time. A success clears its
name's failures. At most `MAX_KEYS` names and addresses are remembered (the least recently
failed are forgotten first), so random names cannot grow the table without bound.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from muster.errors import TooManyRequests

__all__ = ["MAX_PER_ADDRESS", "MAX_PER_NAME", "WINDOW_S", "LoginLimiter"]

WINDOW_S = 300.0
MAX_PER_NAME = 5
MAX_PER_ADDRESS = 20
MAX_KEYS = 10_000


class LoginLimiter:
    """Counts failed logins; safe to use from any thread."""

    def __init__(self, per_name: int = MAX_PER_NAME, per_address: int = MAX_PER_ADDRESS,
                 window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_KEYS) -> None:
        if min(per_name, per_address) < 1 or window_s <= 0:
            raise ValueError(f"limits must be at least 1 and the window positive, but got "
                             f"{per_name=}, {per_address=}, {window_s=}.")
        self._limits = {"name": per_name, "address": per_address}
        self._window = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, name: str, address: str) -> None:
        """Raise TooManyRequests when `name` or `address` failed too often lately."""
        with self._lock:
            now = self._clock()
            for key in (("name", name), ("address", address)):
                failures = self._recent(key, now)
                if len(failures) >= self._limits[key[0]]:
                    wait = max(1, math.ceil(failures[0] + self._window - now))
                    whose = f"user {name}" if key[0] == "name" else f"address {address}"
                    raise TooManyRequests(
                        f"too many failed logins for {whose}; try again in {wait} s",
                        retry_after=wait)

    def failed(self, name: str, address: str) -> None:
        with self._lock:
            now = self._clock()
            for key in (("name", name), ("address", address)):
                failures = self._recent(key, now)
                failures.append(now)
                self._failures[key] = failures
                self._failures.move_to_end(key)
            while len(self._failures) > self._max_keys:
                self._failures.popitem(last=False)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(("name", name), None)

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        failures = self._failures.get(key, deque())
        while failures and failures[0] <= now - self._window:
            failures.popleft()
        return failures
