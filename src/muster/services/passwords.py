"""Passwords: argon2id hashes (argon2-cffi's RFC 9106 low-memory profile), checked a few at a
time.

An argon2 check costs about 0.2 s of CPU and 64 MiB here, on purpose; unbounded, a burst of
logins would take every core and a lot of memory. `PasswordChecker` lets `MAX_CONCURRENT`
checks run at once and refuses a caller who would wait behind more than `MAX_WAITING`.
"""

from __future__ import annotations

import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from muster.errors import InvalidRequest, TooManyRequests

__all__ = ["MAX_PASSWORD_CHARS", "MIN_PASSWORD_CHARS", "PasswordChecker", "check_strength",
           "hash_password"]

MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024  # argon2 takes any length; a bound keeps a request's cost known
MAX_CONCURRENT = 2
MAX_WAITING = 16

_HASHER = PasswordHasher()
# What a login for a user without a password (or with no such user) is checked against, so
# that the answer takes as long as for a real user: the time does not tell names apart.
_DECOY = _HASHER.hash("muster: no such password")


def check_strength(password: str) -> None:
    """Raise InvalidRequest for a password muster refuses to keep."""
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise InvalidRequest(f"a password must be {MIN_PASSWORD_CHARS} to "
                             f"{MAX_PASSWORD_CHARS} characters, got {len(password)}")
    if "\x00" in password:
        raise InvalidRequest("a password cannot hold a NUL character")


def hash_password(password: str) -> str:
    """The argon2id hash of `password` (after `check_strength`)."""
    check_strength(password)
    return _HASHER.hash(password)


class PasswordChecker:
    """Checks passwords against hashes, at most `MAX_CONCURRENT` at a time."""

    def __init__(self, concurrent: int = MAX_CONCURRENT, waiting: int = MAX_WAITING) -> None:
        self._slots = threading.BoundedSemaphore(concurrent)
        self._lock = threading.Lock()
        self._queued = 0
        self._waiting = waiting

    def matches(self, password: str, stored: str | None) -> bool:
        """True when `password` is the one `stored` was made from; a None `stored` (no such
        user, or one without a password) is checked against a decoy and is False.

        Raises:
            TooManyRequests: too many checks wait already.
        """
        with self._lock:
            if self._queued >= self._waiting:
                raise TooManyRequests("too many password checks are waiting; try again in a "
                                      "few seconds", retry_after=2)
            self._queued += 1
        try:
            with self._slots:
                return _verify(password[:MAX_PASSWORD_CHARS], stored)
        finally:
            with self._lock:
                self._queued -= 1


def _verify(password: str, stored: str | None) -> bool:
    try:
        return _HASHER.verify(stored or _DECOY, password) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
