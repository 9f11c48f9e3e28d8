"""Who an event says acted: a muster user's name, or a part of muster itself (`system:...`).

A user's name never holds a colon (`muster.services.users.NAME_PATTERN`), so no user can be
mistaken for muster, and `muster events --user NAME` finds exactly what that person did.
"""

from __future__ import annotations

__all__ = ["SEARCHER", "SERVER", "SERVER_START", "STORAGE", "SUPERVISOR", "SYSTEM_PREFIX",
           "is_system"]

SYSTEM_PREFIX = "system:"
SUPERVISOR = "system:supervisor"  # attempts, restarts, verification, the queue, GPUs
SEARCHER = "system:searcher"  # draws and early stops
SERVER_START = "system:server-start"  # what a starting server finds and finalises
SERVER = "system:server"  # the first admin, made when a server first meets its database
STORAGE = "system:storage"  # checkpoint uploads, garbage collection, experiment deletion


def is_system(actor: str) -> bool:
    """True when `actor` is a part of muster rather than a person."""
    return actor.startswith(SYSTEM_PREFIX)
