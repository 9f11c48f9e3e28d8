"""Passwords: argon2id hashes (argon2-cffi's RFC 9106 low-memory profile), made and checked
a few at a time.

An argon2 hash or check costs about 0.2 s of CPU and 64 MiB here, on purpose; unbounded, a
burst of logins (or of password changes) would take every core and a lot of memory. Every
hash and check of this process takes one of `MAX_CONCURRENT` places, and a caller who would
wait behind `MAX_WAITING` others is refused (429) instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from muster.errors import InvalidRequest, TooManyRequests

__all__ = ["MAX_PASSWORD_CHARS", "MIN_PASSWORD_CHARS", "check_strength", "hash_password",
           "matches"]

MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024  # argon2 takes any length; a bound keeps a request's cost known
MAX_CONCURRENT = 2
MAX_WAITING = 16

_HASHER = PasswordHasher()
# What a login for a user without a password (or with no such user) is checked against, so
# that the answer takes as long as for a real user: the time does not tell names apart.
_DECOY = _HASHER.hash("muster: no such password")

T = TypeVar("T")


class _Places:
    """At most `concurrent` callers at once, `waiting` more in line; the rest are refused."""

    def __init__(self, concurrent: int, waiting: int) -> None:
        self._slots = threading.BoundedSemaphore(concurrent)
        self._lock = threading.Lock()
        self._queued = 0
        self._waiting = waiting

    def run(self, work: Callable[[], T]) -> T:
        with self._lock:
            if self._queued >= self._waiting:
                raise TooManyRequests("too many password checks are waiting; try again in a "
                                      "few seconds", retry_after=2)
            self._queued += 1
        try:
            with self._slots:
                return work()
        finally:
            with self._lock:
                self._queued -= 1


_PLACES = _Places(MAX_CONCURRENT, MAX_WAITING)


def check_strength(password: str) -> None:
    """Raise InvalidRequest for a password muster refuses to keep."""
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise InvalidRequest(f"a password must be {MIN_PASSWORD_CHARS} to "
                             f"{MAX_PASSWORD_CHARS} characters, got {len(password)}")
    if "\x00" in password:
        raise InvalidRequest("a password cannot hold a NUL character")


def hash_password(password: str) -> str:
    """The argon2id hash of `password`.

    Raises:
        InvalidRequest: `check_strength` refuses it.
        TooManyRequests: too many hashes and checks wait already.
    """
    check_strength(password)
    return _PLACES.run(lambda: _HASHER.hash(password))


def matches(password: str, stored: str | None) -> bool:
    """True when `password` is the one `stored` was made from; a None `stored` (no such
    user, or one without a password) is checked against a decoy and is False.

    Raises:
        TooManyRequests: too many hashes and checks wait already.
    """
    return _PLACES.run(lambda: _verify(password[:MAX_PASSWORD_CHARS], stored))


def _verify(password: str, stored: str | None) -> bool:
    try:
        return _HASHER.verify(stored or _DECOY, password) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
