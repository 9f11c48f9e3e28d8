"""`Idempotency-Key` on `POST /experiments`: a create sent twice (a retry, a double click)
creates once, against a real server on SQLite and on PostgreSQL (issue 33)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, update

from muster.client import Client, pack_context
from muster.home import Home
from muster.services.idempotency import KEEP_S
from muster.store import IdempotencyKey, User
from muster.store.models import now
from tests.conftest import BACKENDS, _fresh_pg_database
from tests.processes import kill_home_processes
from tests.server.experiments import config_text
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

RACERS = 6  # requests fired at once with one key


@dataclass
class Site:
    """A server, and the tokens of its admin and of two users."""

    server: RunningServer
    contexts: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def post(self, key: str | None, config: str, context: bytes | None = None,
             who: str = "ann", **extra: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}", **extra}
        if key is not None:
            headers["Idempotency-Key"] = key
        files = None if context is None else {
            "context": ("context.tar.gz", context, "application/gzip")}
        return httpx.post(f"{self.server.url}/api/v1/experiments", headers=headers,
                          data={"config": config}, files=files, timeout=60)

    def count(self) -> int:
        with self.server.client() as admin:
            return len(admin.list_experiments(archived=True))

    def snapshots(self) -> int:
        folder = Home(self.server.home).experiments_dir
        return len(list(folder.iterdir())) if folder.is_dir() else 0

    def context(self, text: str = "print('hi')\n") -> bytes:
        folder = self.contexts / f"c{len(list(self.contexts.iterdir()))}"
        folder.mkdir()
        (folder / "train.py").write_text(text)
        return pack_context(folder)


@pytest.fixture(scope="module", params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Site]:
    home = tmp_path_factory.mktemp("idem") / "home"
    home.mkdir()
    with _database(request, home) as db_url:
        server = RunningServer(home=home, db_url=db_url)
        server.start()
        try:
            made = Site(server, tmp_path_factory.mktemp("contexts"), {"admin": server.token})
            with server.client() as admin:
                for name in ("ann", "bob"):
                    made.tokens[name] = admin.create_user(name, "user")["token"]
            yield made
        finally:
            server.stop()
            kill_home_processes(home)


def _database(request: pytest.FixtureRequest, home: Path) -> AbstractContextManager[str]:
    if request.param == "sqlite":
        return nullcontext(f"sqlite:///{home / 'muster.db'}")
    return _fresh_pg_database(request.getfixturevalue("_postgres_server"))


def _config(name: str) -> str:
    return config_text(["python", "train.py"], name=name)


def test_the_same_key_and_request_answers_the_first_experiment(site: Site) -> None:
    context = site.context()
    first = site.post("same-1", _config("once"), context)
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    before, snapshots = site.count(), site.snapshots()
    again = site.post("same-1", _config("once"), context)
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["uuid"] == first.json()["uuid"]
    assert (site.count(), site.snapshots()) == (before, snapshots)


def test_the_same_key_with_another_request_is_refused(site: Site) -> None:
    context = site.context()
    assert site.post("other-1", _config("first"), context).status_code == 201
    before, snapshots = site.count(), site.snapshots()
    for config, sent in ((_config("second"), context),
                         (_config("first"), site.context("print('changed')\n"))):
        refused = site.post("other-1", config, sent)
        assert refused.status_code == 409, refused.text
        assert "was used for another submission" in refused.json()["message"]
    assert (site.count(), site.snapshots()) == (before, snapshots)


@pytest.mark.parametrize("key", ["", "has space", "a/b", "k" * 129])
def test_a_malformed_key_is_a_422_that_says_the_rule(site: Site, key: str) -> None:
    before = site.count()
    refused = site.post(key, _config("bad-key"))
    assert refused.status_code == 422, refused.text
    message = refused.json()["message"]
    assert "Idempotency-Key" in message and "A-Za-z0-9._:-" in message
    assert site.count() == before


def test_keys_are_per_user(site: Site) -> None:
    context = site.context()
    ann = site.post("shared-1", _config("mine"), context, who="ann")
    bob = site.post("shared-1", _config("mine"), context, who="bob")
    assert (ann.status_code, bob.status_code) == (201, 201)
    assert "Idempotent-Replayed" not in bob.headers
    assert ann.json()["id"] != bob.json()["id"]
    assert (ann.json()["owner"], bob.json()["owner"]) == ("ann", "bob")


def test_a_batch_is_answered_again_as_its_list(site: Site) -> None:
    headers = {"Authorization": f"Bearer {site.tokens['ann']}", "Idempotency-Key": "batch-1"}
    data = {"config": [config_text(["python", "-c", "pass"], name=f"b{n}") for n in range(2)]}
    url = f"{site.server.url}/api/v1/experiments"
    first = httpx.post(url, headers=headers, data=data, timeout=60)
    before = site.count()
    again = httpx.post(url, headers=headers, data=data, timeout=60)
    assert first.status_code == again.status_code == 201
    assert [e["id"] for e in again.json()] == [e["id"] for e in first.json()]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert site.count() == before


def test_requests_racing_with_one_key_create_one_experiment(site: Site) -> None:
    """The double-click race: every request is sent at once; one creates, the others are
    answered with its experiment (or told to retry), and nothing else is left behind."""
    context = site.context()
    before, snapshots = site.count(), site.snapshots()
    barrier = threading.Barrier(RACERS)

    def fire(_: int) -> httpx.Response:
        barrier.wait(timeout=30)
        return site.post("race-1", _config("raced"), context)

    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        answers = list(pool.map(fire, range(RACERS)))
    created = [a for a in answers if a.status_code == 201]
    assert all(a.status_code in (201, 409) for a in answers), [a.text for a in answers]
    assert created and len({a.json()["id"] for a in created}) == 1
    assert sum("Idempotent-Replayed" not in a.headers for a in created) == 1
    assert (site.count(), site.snapshots()) == (before + 1, snapshots + 1)


def test_an_expired_key_creates_anew_and_is_pruned(site: Site) -> None:
    context = site.context()
    first = site.post("old-1", _config("old"), context)
    with site.server.store() as store, store.session_scope() as s:
        ann = s.scalars(select(User.id).where(User.name == "ann")).one()
        s.execute(update(IdempotencyKey).where(IdempotencyKey.key == "old-1")
                  .values(created_at=now() - KEEP_S - 60))
    again = site.post("old-1", _config("old"), context)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again.headers
    assert again.json()["id"] != first.json()["id"]
    with site.server.store() as store, store.session_scope() as s:
        rows = s.scalars(select(IdempotencyKey).where(IdempotencyKey.user_id == ann)).all()
        assert all(row.created_at >= now() - KEEP_S for row in rows)
        assert [row.experiment_ids for row in rows if row.key == "old-1"] == [
            [again.json()["id"]]]


def test_the_client_sends_a_key_with_each_create(site: Site) -> None:
    folder = site.contexts / "client-context"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    with Client(url=site.server.url, token=site.tokens["bob"],
                home=Home(site.server.home)) as bob:
        made = bob.create_experiment(_config("from-client"), folder)
    with site.server.store() as store, store.session_scope() as s:
        keyed = s.scalars(select(IdempotencyKey.experiment_ids)).all()
    assert [made["id"]] in keyed
