"""A list inside a row is bounded (issue 38): a model's `versions` and an environment's
`trials` hold their newest `MAX_NESTED` (100), in their usual order, beside `versions_total`
and `trials_total`, the count of all, through a real server on SQLite and on PostgreSQL;
the CLI and the web UI say how many more there are and name what lists them all, and
`muster model versions` still finds every version; a page's nested lists are read in a
handful of queries however long they are.

The rows are stored in the server's database from the test, in a PAUSED experiment with
PAUSED trials, so the supervisor has nothing to start or end for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert

from muster.client import Client
from muster.environments.registry import Environments
from muster.errors import Conflict, NotFound
from muster.home import Home
from muster.services import environments, registry
from muster.services.access import Principal
from muster.services.listing import MAX_NESTED
from muster.states import Role
from muster.store import Checkpoint, ModelVersion, RegisteredModel, Store, Trial
from tests.cli.test_cli import on
from tests.conftest import BACKENDS
from tests.server.test_list_paging import _database, raw
from tests.server.test_search_views import add_experiment, search_config
from tests.servers import RunningServer, serving

pytestmark = pytest.mark.lifecycle  # starts real processes

MANY = MAX_NESTED + 50  # versions of `big`, and trials that use `crowded`
CROWDED, FEW, UNUSED = "00000000000000c1", "00000000000000c2", "00000000000000c3"
ADMIN = Principal(user_id=1, name="admin", role=Role.ADMIN)


@dataclass(frozen=True)
class Stored:
    uses: list[int]  # the ids of the trials that use CROWDED, ascending
    few: list[int]  # of those that use FEW


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    home = tmp_path_factory.mktemp("nested") / "home"
    with _database(request) as db_url, serving(home, db_url) as running:
        yield running


@pytest.fixture(scope="module")
def stored(server: RunningServer) -> Stored:
    """Model `big` with versions 1 to MANY (inserted backwards), `small` with 3, `empty`
    with none; environment CROWDED used by MANY trials, two ways: by the experiment that
    needs it (some of whose trials also ran in it: one use each) and by trials of another
    experiment that ran in it; FEW by 5 trials that ran there (and need CROWDED); UNUSED by none."""
    with server.store() as store, store.session_scope() as s:
        needs = add_experiment(s, search_config(max_trials=MANY), state="PAUSED",
                               max_trials=MANY)
        needs.environment_key = CROWDED
        other = add_experiment(s, search_config(max_trials=MANY), state="PAUSED",
                               max_trials=MANY)
        trials = [Trial(experiment=needs if n % 3 else other, number=n, state="PAUSED",
                        hparams={"lr": 0.1}) for n in range(MANY)]
        s.add_all(trials)
        s.flush()
        for n, trial in enumerate(trials):
            if trial.experiment is other or n % 10 == 1:
                trial.environment_key = CROWDED
            elif n in (4, 5, 7, 8, 10):
                trial.environment_key = FEW
        checkpoint = Checkpoint(trial_id=trials[0].id, name="step-1", path="/nonexistent/1",
                                step=1, size_bytes=1, file_count=1, intact=True,
                                state="deleted", deleted_at=1.0)
        s.add(checkpoint)
        models = {name: RegisteredModel(name=name) for name in ("big", "empty", "small")}
        s.add_all(models.values())
        s.flush()
        s.execute(insert(ModelVersion), [
            {"model_id": models[name].id, "version": v, "trial_id": trials[0].id,
             "experiment_id": needs.id, "checkpoint_id": checkpoint.id,
             "checkpoint_uuid": "u", "verified": True, "registered_by": "admin"}
            for name, last in (("big", MANY), ("small", 3)) for v in range(last, 0, -1)])
        uses = sorted(t.id for t in trials)
        few = sorted(t.id for t in trials if t.environment_key == FEW)
    requests = Home(server.home).envs_dir / "requests"
    requests.mkdir(parents=True, exist_ok=True)
    for key in (CROWDED, FEW, UNUSED):
        (requests / f"{key}.json").write_text(json.dumps({"requirements": ["numpy"]}))
    return Stored(uses, few)


def numbers(model: dict[str, Any]) -> list[int]:
    return [v["version"] for v in model["versions"]]


def test_a_models_versions_are_its_newest_and_counted(server: RunningServer,
                                                       stored: Stored) -> None:
    listed = raw(server, "/api/v1/models")
    assert listed.status_code == 200, listed.text
    shown = {m["name"]: (numbers(m), m["versions_total"]) for m in listed.json()}
    newest = list(range(MANY - MAX_NESTED + 1, MANY + 1))
    assert shown == {"big": (newest, MANY), "empty": ([], 0), "small": ([1, 2, 3], 3)}
    big = raw(server, "/api/v1/models/big").json()
    assert (numbers(big), big["versions_total"]) == (newest, MANY)
    every = raw(server, "/api/v1/models/big/versions")
    assert [v["version"] for v in every.json()] == list(range(1, MANY + 1))
    assert every.headers["X-Total-Count"] == str(MANY)


def test_an_environments_trials_are_its_newest_and_counted(server: RunningServer,
                                                            stored: Stored) -> None:
    listed = raw(server, "/api/v1/environments")
    assert listed.status_code == 200, listed.text
    shown = {e["hash"]: (e["trials"], e["trials_total"]) for e in listed.json()}
    assert shown == {CROWDED: (stored.uses[-MAX_NESTED:], MANY), FEW: (stored.few, 5),
                     UNUSED: ([], 0)}


def test_the_cli_names_what_lists_every_version(server: RunningServer,
                                                 stored: Stored) -> None:
    described = on(server, "model", "describe", "big")
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == [
        f"v{n}" for n in range(MANY - MAX_NESTED + 1, MANY + 1)]
    assert lines[-1] == (f"showing the newest {MAX_NESTED} of {MANY} versions; every one: "
                         "muster model versions big (1,000 a page: --offset)")
    as_json = on(server, "model", "describe", "big", "--json")
    assert json.loads(as_json.stdout)["versions_total"] == MANY
    assert f"showing the newest {MAX_NESTED} of {MANY} versions" in as_json.stderr
    small = on(server, "model", "describe", "small")
    assert "showing" not in small.stdout + small.stderr
    every = on(server, "model", "versions", "big")
    assert every.returncode == 0, every.stderr
    assert [line.split()[0] for line in every.stdout.splitlines()] == [
        f"v{n}" for n in range(1, MANY + 1)]
    assert f"big: {MANY} versions, latest v{MANY} " in on(server, "model", "list").stdout
    envs = on(server, "env", "list")
    assert envs.returncode == 0, envs.stderr
    first = ", ".join(map(str, stored.uses[-MAX_NESTED:][:6]))
    assert f"{first}, +{MANY - 6}" in envs.stdout


def test_the_sdk_reads_every_version(client: Client, stored: Stored) -> None:
    assert client.get_model("big")["versions_total"] == MANY
    assert [v["version"] for v in client.list_model_versions("big")] == list(
        range(1, MANY + 1))


def test_the_pages_say_how_many_more(server: RunningServer, stored: Stored) -> None:
    models = raw(server, "/models").text
    assert f'<td class="num">{MANY}</td>' in models
    big = raw(server, "/models/big").text
    assert f"{MANY} versions" in big
    assert (f"Showing the newest {MAX_NESTED}; {MANY - MAX_NESTED} more: see <code>muster "
            "model versions big</code>") in big
    assert f'id="v{MANY - MAX_NESTED + 1}"' in big
    assert f'id="v{MANY - MAX_NESTED}"' not in big
    assert "Showing the newest" not in raw(server, "/models/small").text
    assert f"<td>{MANY}</td></tr>" in raw(server, "/cluster").text


def test_a_pages_nested_lists_take_a_few_queries(server: RunningServer, stored: Stored,
                                                 tmp_path: Path) -> None:
    """However many versions or trials: two queries for a page's versions (a grouped COUNT
    and the newest of each), two for its environments' trials (the same)."""
    envs = Environments(tmp_path / "envs")
    for key in (CROWDED, FEW, UNUSED):
        (envs.layout.requests / f"{key}.json").write_text("{}")
    with server.store() as store:
        registry.list_models(store)  # connected: the dialect's first questions are asked
        # The page (a COUNT, its rows), then its versions.
        assert _statements(store, lambda: registry.list_models(store)) == 4
        assert _statements(store, lambda: registry.describe_model(store, "big")) == 3
        # An admin reads every build's failure: no query of whose environments they are.
        page = environments.list_environments(store, envs, ADMIN)
        assert {e["hash"]: e["trials_total"] for e in page.rows} == {
            CROWDED: MANY, FEW: 5, UNUSED: 0}
        assert _statements(store, lambda: environments.list_environments(
            store, envs, ADMIN)) == 2


def _statements(store: Store, call: Any) -> int:
    """How many SQL queries `call()` sends (SQLite's `BEGIN IMMEDIATE` aside)."""
    sent: list[str] = []

    def count(*args: Any) -> None:
        if not args[2].startswith("BEGIN"):
            sent.append(args[2])

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        call()
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    return len(sent)


def test_a_version_is_found_and_a_refused_delete_names_ten_in_a_query_or_two(
        server: RunningServer, stored: Stored) -> None:
    """A version is looked up by its number, stage or newest in the database, not among every
    version read; a model delete refused for the versions left names ten and counts the rest."""
    with server.store() as store:
        registry.describe_version(store, registry.VersionRef.parse("big@7"))  # connected
        # The model, the version, and its view's model (however many versions there are).
        assert _statements(store, lambda: registry.describe_version(
            store, registry.VersionRef.parse("big@7"))) == 3
        assert registry.describe_version(store, registry.VersionRef.parse("big"))[
            "version"] == MANY
        with store.session_scope() as s:
            assert registry.resolve_version(s, registry.VersionRef.parse("big@7")).version == 7
            with pytest.raises(NotFound, match=r"model big has no version big@production; "
                                               r"`muster model versions big` lists them"):
                registry.resolve_version(s, registry.VersionRef.parse("big@production"))
            with pytest.raises(NotFound, match=r"model empty has no version yet; `muster "
                                               r"model register empty --trial ID` makes v1"):
                registry.resolve_version(s, registry.VersionRef.parse("empty@3"))
        with pytest.raises(Conflict) as refused:
            registry.delete_model(store, ADMIN, "big")
        ten = ", ".join(f"big@{n}" for n in range(1, 11))
        assert str(refused.value) == (
            f"model big still has {MANY} versions ({ten} and {MANY - 10} more); delete each "
            "first (`muster model delete big@N`), then the model")
        with pytest.raises(Conflict, match=r"model small still has 3 versions \(small@1, "
                                           r"small@2, small@3\); delete each first"):
            registry.delete_model(store, ADMIN, "small")
