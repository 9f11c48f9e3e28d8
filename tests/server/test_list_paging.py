"""Every list of the API is paged and bounded (issue 38): `GET /environments`, `/jobs`,
`/models`, `/models/{name}/versions`, `/trials/{id}/checkpoints`,
`/experiments/{id}/checkpoints` and `/experiments/{id}/trials`, through a real server on
SQLite and on PostgreSQL: the first page, a window across two, one past the end, the count
in `X-Total-Count` and a 422 naming a bad `offset` or `limit`; the SDK reads every page, the
CLI says which rows it showed and how to see the next, and the pages that list them are
bounded too.

The rows are stored in the server's database (and its environments' directory) from the
test, more than a page of each, in a PAUSED experiment with PAUSED trials, so the
supervisor has nothing to start or end for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, select

from muster.client import Client
from muster.home import Home
from muster.services.listing import MAX_NESTED
from muster.store import Checkpoint, ModelVersion, RegisteredModel, Trial
from tests.cli.test_cli import on
from tests.conftest import BACKENDS, _fresh_pg_database
from tests.server.test_search_views import add_experiment, search_config
from tests.servers import RunningServer, serving

pytestmark = pytest.mark.lifecycle  # starts real processes

PAGE = 1_000  # every list's default and largest page here but the trials' (10,000)
ROWS = PAGE + 3  # of each list: past one page
DASH = "\N{EN DASH}"  # as the pages write a range of rows


@dataclass(frozen=True)
class Stored:
    """What the test stored: each list's keys in the order the API lists them."""

    experiment_id: int
    jobs: list[int]  # the PAUSED trials, by id (and by number)
    first_trial: int  # it holds ROWS checkpoints; the second trial 2
    trial_checkpoints: list[int]  # the first trial's steps
    experiment_checkpoints: list[tuple[int, int]]  # (trial, step) of both trials'
    models: list[str]
    versions: list[int]  # of models[0]
    environments: list[str]


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    home = tmp_path_factory.mktemp("paging") / "home"
    with _database(request) as db_url, serving(home, db_url) as running:
        yield running


def _database(request: pytest.FixtureRequest) -> AbstractContextManager[str | None]:
    if request.param == "sqlite":
        return nullcontext(None)  # `serving`'s own, in the home
    return _fresh_pg_database(request.getfixturevalue("_postgres_server"))


@pytest.fixture(scope="module")
def stored(server: RunningServer) -> Stored:
    """More than a page of every list. Rows are inserted out of their listed order (steps,
    versions and names backwards), so that the order seen is the API's, not the ids'."""
    steps, models = list(range(1, ROWS + 1)), [f"m-{n:04d}" for n in range(ROWS)]
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=ROWS), state="PAUSED", max_trials=ROWS)
        trials = [Trial(experiment=exp, number=n, state="PAUSED", hparams={"lr": 0.1})
                  for n in range(ROWS)]
        s.add_all(trials)
        s.flush()
        experiment_id, jobs = exp.id, [t.id for t in trials]
        first, second = jobs[0], jobs[1]
        s.execute(insert(Checkpoint), [_checkpoint(first, step) for step in reversed(steps)]
                  + [_checkpoint(second, step) for step in (20, 10)])
        s.execute(insert(RegisteredModel), [{"name": name} for name in reversed(models)])
        model_id = s.scalar(select(RegisteredModel.id).where(RegisteredModel.name == models[0]))
        checkpoint_id = s.scalar(select(Checkpoint.id).where(Checkpoint.trial_id == first)
                                 .limit(1))
        s.execute(insert(ModelVersion), [
            {"model_id": model_id, "version": v, "trial_id": first,
             "experiment_id": experiment_id, "checkpoint_id": checkpoint_id,
             "checkpoint_uuid": "u", "verified": True, "registered_by": "admin"}
            for v in reversed(steps)])
    environments = [f"{n:016x}" for n in range(ROWS)]
    requests = Home(server.home).envs_dir / "requests"
    requests.mkdir(parents=True, exist_ok=True)
    for key in reversed(environments):
        (requests / f"{key}.json").write_text(json.dumps({"requirements": ["numpy"]}))
    return Stored(experiment_id, jobs, first, steps,
                  [(first, step) for step in steps] + [(second, 10), (second, 20)], models,
                  steps, environments)


def _checkpoint(trial_id: int, step: int) -> dict[str, Any]:
    """A checkpoint row, deleted (so that the storage worker leaves it alone)."""
    return {"trial_id": trial_id, "name": f"step-{step}", "path": f"/nonexistent/{step}",
            "step": step, "size_bytes": 1, "file_count": 1, "intact": True,
            "state": "deleted", "deleted_at": 1.0}


def raw(server: RunningServer, path: str, **params: Any) -> httpx.Response:
    """A GET without the SDK, with the server's token."""
    return httpx.get(f"{server.url}{path}", params=params, timeout=60,
                     headers={"Authorization": f"Bearer {server.token}"})


def assert_paged(server: RunningServer, path: str, expected: list[Any],
                 key: Callable[[dict[str, Any]], Any], most: int = PAGE) -> None:
    """`/api/v1{path}` lists `expected` (each row's `key`, in order) a page at a time: the
    default page is the first `most` with the count of all, a window crosses two pages, the
    last page holds the last row, one past the end is empty, and a bad `limit` or `offset`
    is a 422 that names it."""
    path = "/api/v1" + path
    first = raw(server, path)
    assert first.status_code == 200, first.text
    assert first.headers["X-Total-Count"] == str(len(expected))
    assert [key(row) for row in first.json()] == expected[:most]
    across = raw(server, path, offset=PAGE - 2, limit=4)
    assert [key(row) for row in across.json()] == expected[PAGE - 2:PAGE + 2]
    last = raw(server, path, offset=len(expected) - 1)
    assert [key(row) for row in last.json()] == expected[-1:]
    past = raw(server, path, offset=len(expected) + 5, limit=3)
    assert (past.status_code, past.json()) == (200, [])
    assert past.headers["X-Total-Count"] == str(len(expected))
    for bad, name in (({"limit": most + 1}, "limit"), ({"limit": 0}, "limit"),
                      ({"offset": -1}, "offset"), ({"offset": "x"}, "offset")):
        refused = raw(server, path, **bad)
        assert refused.status_code == 422, (bad, refused.text)
        assert f"query.{name}" in refused.json()["message"], refused.text


def test_jobs_are_paged_in_queue_order(server: RunningServer, stored: Stored) -> None:
    assert_paged(server, "/jobs", stored.jobs, lambda job: job["trial_id"])


def test_checkpoints_are_paged_by_step(server: RunningServer, stored: Stored) -> None:
    assert_paged(server, f"/trials/{stored.first_trial}/checkpoints", stored.trial_checkpoints,
                 lambda c: c["step"])
    assert_paged(server, f"/experiments/{stored.experiment_id}/checkpoints",
                 stored.experiment_checkpoints, lambda c: (c["trial_id"], c["step"]))


def test_models_and_versions_are_paged(server: RunningServer, stored: Stored) -> None:
    assert_paged(server, "/models", stored.models, lambda m: m["name"])
    assert_paged(server, f"/models/{stored.models[0]}/versions", stored.versions,
                 lambda v: v["version"])
    # Each model of the list holds its newest versions alone, and counts all.
    first = raw(server, "/api/v1/models", limit=1).json()[0]
    assert first["versions_total"] == ROWS
    assert [v["version"] for v in first["versions"]] == stored.versions[-MAX_NESTED:]


def test_environments_are_paged_by_hash(server: RunningServer, stored: Stored) -> None:
    assert_paged(server, "/environments", stored.environments, lambda e: e["hash"])


def test_an_experiments_trials_are_paged_in_any_order(server: RunningServer,
                                                       stored: Stored) -> None:
    """By number (in the database) every trial of a search is one page by default (10,000
    at most); by number backwards, and by a computed order, the same count and window."""
    path = f"/experiments/{stored.experiment_id}/trials"
    assert_paged(server, path, stored.jobs, lambda t: t["id"], most=10_000)
    for order, ids in (({"order": "desc"}, stored.jobs[::-1]),
                       ({"order_by": "state"}, stored.jobs)):
        page = raw(server, "/api/v1" + path, offset=ROWS - 2, limit=5, **order)
        assert page.headers["X-Total-Count"] == str(ROWS)
        assert [t["id"] for t in page.json()] == ids[ROWS - 2:]


def test_the_sdk_reads_every_page_unless_given_one(server: RunningServer, stored: Stored,
                                                    client: Client) -> None:
    whole = client.list_jobs()
    assert [job["trial_id"] for job in whole] == stored.jobs
    assert (whole.offset, whole.total, whole.next_offset) == (0, ROWS, None)
    steps = [c["step"] for c in client.list_checkpoints(stored.first_trial)]
    assert steps == stored.trial_checkpoints
    both = client.list_experiment_checkpoints(stored.experiment_id)
    assert [(c["trial_id"], c["step"]) for c in both] == stored.experiment_checkpoints
    assert [m["name"] for m in client.list_models()] == stored.models
    versions = client.list_model_versions(stored.models[0])
    assert [v["version"] for v in versions] == stored.versions
    assert [e["hash"] for e in client.list_environments()] == stored.environments
    assert [t["id"] for t in client.list_trials(stored.experiment_id)] == stored.jobs
    page = client.list_models(offset=PAGE - 1, limit=2)
    assert [m["name"] for m in page] == stored.models[PAGE - 1:PAGE + 1]
    assert (page.offset, page.total, page.next_offset) == (PAGE - 1, ROWS, PAGE + 1)


def test_the_cli_shows_a_page_and_names_the_next(server: RunningServer,
                                                  stored: Stored) -> None:
    done = on(server, "job", "list", "--limit", "2")
    assert done.returncode == 0, done.stderr
    assert (f"jobs 1 to 2 of {ROWS:,} shown; the next: muster job list --limit 2 --offset 2"
            in done.stdout)
    ended = on(server, "checkpoint", "list", "--experiment", str(stored.experiment_id),
               "--offset", str(PAGE), "--json")
    assert ended.returncode == 0, ended.stderr
    shown = [(c["trial_id"], c["step"]) for c in json.loads(ended.stdout)]
    assert shown == stored.experiment_checkpoints[PAGE:]
    assert f"checkpoints 1,001 to 1,005 of {ROWS + 2:,} shown" in ended.stderr
    assert "the next" not in ended.stderr
    for argv, what in ((["env", "list"], "environments"), (["model", "list"], "models"),
                       (["model", "versions", stored.models[0]], "versions")):
        first = on(server, *argv)
        assert first.returncode == 0, first.stderr
        assert (f"{what} 1 to 1,000 of {ROWS:,} shown; the next: muster {' '.join(argv)} "
                f"--offset 1000") in first.stdout
        past = on(server, *argv, "--offset", "5000")
        assert f"no {what} from 5,000: there are {ROWS:,}" in past.stdout
    bad = on(server, "job", "list", "--limit", "1001")
    assert bad.returncode == 2 and "--limit" in bad.stderr


def test_the_pages_that_list_them_are_bounded(server: RunningServer, stored: Stored) -> None:
    cluster = raw(server, "/cluster").text
    assert f"{ROWS} jobs · showing 1{DASH}100" in cluster
    assert 'href="/cluster?jobs_offset=100" rel="next"' in cluster
    assert f"{ROWS} environments · showing 1{DASH}100" in cluster
    later = raw(server, "/cluster", jobs_offset=1000, envs_offset=100).text
    assert f"{ROWS} jobs · showing 1001{DASH}{ROWS}" in later
    assert 'hx-get="/ui/cluster?jobs_offset=1000&amp;envs_offset=100"' in later
    assert 'href="/cluster?jobs_offset=900&amp;envs_offset=100" rel="prev"' in later
    models = raw(server, "/models", offset=1000).text
    assert f"showing 1001{DASH}1003" in models
    assert 'href="/models?offset=900" rel="prev"' in models
    trial = raw(server, f"/trials/{stored.first_trial}").text
    assert (f"checkpoints 1 to 1000 of {ROWS} shown; the next: <code>muster checkpoint list "
            f"{stored.first_trial} --offset 1000</code>") in trial
