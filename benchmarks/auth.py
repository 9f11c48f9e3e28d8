"""(g) What users cost a request: the token lookup, and a password login.

Before users, a request's token was one `hmac.compare_digest` against the token the server
read at start. Now each request looks its token up by SHA-256 in the store, with its user
(so a revoked token or a deactivated user is refused by the very next request). Measured
side by side, interleaved:

- in process: the old comparison vs `tokens.authenticate` on SQLite (and on PostgreSQL when
  127.0.0.1:5432 answers);
- over HTTP, on one real server: `GET /api/v1/health` (no credential, no database) vs
  `GET /api/v1/jobs` with a bearer token (the lookup plus a small query);
- a password login (`POST /api/v1/login`: argon2id, by design about 0.2 s of CPU).
"""

from __future__ import annotations

import hmac
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
from measure import expect, interleave, median
from muster_server import ServerProcess
from report import Outcome, Table, Target

from muster.home import Home
from muster.services import tokens, users
from muster.states import TokenKind
from muster.store import Store

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
TARGET_US = 2000.0  # a token lookup on SQLite, per request


def _timed(call: Callable[[], object], times: int) -> Callable[[], float]:
    def arm() -> float:
        started = time.perf_counter()
        for _ in range(times):
            call()
        return (time.perf_counter() - started) / times
    return arm


@contextmanager
def _stores(root: Path) -> Iterator[dict[str, Store]]:
    """A migrated SQLite store, and a PostgreSQL one where a server answers."""
    found = {"sqlite": Store(f"sqlite:///{root / 'auth.db'}")}
    name = f"muster_bench_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        found["postgresql"] = Store(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
    except psycopg.OperationalError:
        name = ""
    try:
        for store in found.values():
            store.upgrade()
        yield found
    finally:
        for store in found.values():
            store.dispose()
        if name:
            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _in_process(root: Path, repetitions: int) -> dict[str, list[float]]:
    with _stores(root) as stores:
        arms: dict[str, Callable[[], float]] = {}
        old = secrets.token_urlsafe(32)
        arms["compare_digest (before users)"] = _timed(
            lambda: hmac.compare_digest(old.encode(), old.encode()), 1000)
        for backend, store in stores.items():
            home = Home(root / backend).ensure()
            users.bootstrap(store, home.token_path)
            token = home.token_path.read_text().strip()
            expect(tokens.authenticate(store, token, TokenKind.API).name == "admin",
                   "the home token does not authenticate")
            arms[f"authenticate, {backend}"] = _timed(
                lambda s=store, t=token: tokens.authenticate(s, t, TokenKind.API), 50)
        return interleave(arms, repetitions)


def _over_http(root: Path, repetitions: int) -> dict[str, list[float]]:
    with ServerProcess(root) as server, httpx.Client(base_url=server.url + "/api/v1",
                                                     timeout=30) as http:
        token = Home(server.home).token_path.read_text().strip()
        with server.client() as admin:
            admin.create_user("bench", "user", password="a benchmark password")
        bearer = {"Authorization": f"Bearer {token}"}

        def get(path: str, headers: dict[str, str]) -> Callable[[], object]:
            def call() -> object:
                response = http.get(path, headers=headers)
                expect(response.status_code == 200, f"{path}: {response.status_code}")
                return response
            return call

        def login() -> object:
            response = http.post("/login", json={"name": "bench",
                                                 "password": "a benchmark password"})
            expect(response.status_code == 200, f"login: {response.status_code}")
            return response

        arms = {"GET /health (no credential)": _timed(get("/health", {}), 20),
                "GET /jobs (bearer token)": _timed(get("/jobs", bearer), 20),
                "POST /login (argon2id)": _timed(login, 1)}
        return interleave(arms, repetitions)


def run(quick: bool) -> Outcome:
    repetitions = 5 if quick else 15
    with tempfile.TemporaryDirectory(prefix="muster-bench-auth-") as tmp:
        local = _in_process(Path(tmp), repetitions)
        remote = _over_http(Path(tmp) / "server", repetitions)
    us = {name: median(values) * 1e6 for name, values in local.items()}
    http_ms = {name: median(values) * 1e3 for name, values in remote.items()}
    tables = [
        Table("(g) checking a request's token, in process (median µs per check)",
              ["check", "µs"], [[name, f"{value:.1f}"] for name, value in us.items()]),
        Table("(g) over HTTP, one server (median ms per request)",
              ["request", "ms"], [[name, f"{value:.2f}"] for name, value in http_ms.items()]),
    ]
    lookup = us["authenticate, sqlite"]
    targets = [Target(f"(g) a token lookup on SQLite ≤ {TARGET_US:.0f} µs",
                      f"{lookup:.0f} µs", lookup <= TARGET_US)]
    notes = [f"{repetitions} interleaved repetitions of each arm (in process: 50 lookups, "
             "1,000 comparisons per sample; over HTTP: 20 requests, 1 login).",
             "`last_used_at` is written at most once a minute per token, so a lookup in "
             "steady state is one indexed read of `tokens` joined with its user."]
    return Outcome("auth", tables, targets, notes,
                   data={"in_process_s": local, "http_s": remote})
