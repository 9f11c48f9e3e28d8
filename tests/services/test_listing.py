"""The experiments list a page at a time (`muster.services.listing`), on SQLite and
PostgreSQL: filters, sorting, paging and each row's progress, badges and best trial."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from muster.errors import InvalidRequest, NotFound
from muster.services import listing
from muster.services.listing import ExperimentFilter
from muster.states import ExperimentState
from muster.store import Experiment, Store, Trial, User
from tests.store.rows import add_metric

SEARCH = {"name": "search", "searcher": {"name": "random", "metric": "val_loss",
                                          "max_trials": 4}}


def seed(store: Store) -> dict[str, Any]:
    """Three experiments: alice's search (a SUSPECT trial, an unverified and a verified
    SUCCEEDED one, a running one), bob's finished run (one trial without a verification,
    one approved on review), and an old one without an owner."""
    with store.session_scope() as s:
        alice, bob = User(name="alice", role="user"), User(name="bob", role="user")
        search = Experiment(name="Digits-Search", config=SEARCH, config_yaml="",
                            context_dir="/tmp", state="ACTIVE", owner=alice, max_trials=4,
                            labels=["digits", "nightly"], created_at=100.0)
        run = Experiment(name="single run", config={"name": "run"}, config_yaml="",
                         context_dir="/tmp", state="COMPLETED", owner=bob, labels=["digits"],
                         created_at=200.0)
        old = Experiment(name="from before users", config={"name": "old"}, config_yaml="",
                         context_dir="/tmp", state="ERROR", created_at=50.0)
        trials = [
            Trial(experiment=search, state="SUSPECT", number=0),
            Trial(experiment=search, state="SUCCEEDED", number=1,
                  verification={"passed": True, "verified": False, "checks": []}),
            Trial(experiment=search, state="SUCCEEDED", number=2, hparams={"lr": 0.1},
                  verification={"passed": True, "verified": True, "checks": []}),
            Trial(experiment=search, state="RUNNING", number=3),
            Trial(experiment=run, state="SUCCEEDED", number=0),
            # SUSPECT, then approved on review: SUCCEEDED, never verified.
            Trial(experiment=run, state="SUCCEEDED", number=1, reason="review approved",
                  message="fine", verification={"passed": False, "verified": False, "checks": [
                      {"name": "checkpoint", "passed": False, "detail": "none"}]}),
        ]
        s.add_all([alice, bob, search, run, old, *trials])
        s.flush()
        for trial, value in ((trials[1], 0.5), (trials[2], 0.25), (trials[2], 0.75),
                             (trials[3], 0.01)):
            add_metric(s, trial, {"val_loss": value})
        return {"search": search.id, "run": run.id, "old": old.id, "best": trials[2].id}


def names(page: listing.Page) -> list[str]:
    return [row["name"] for row in page.rows]


def test_filters_sorting_and_paging(store: Store) -> None:
    seed(store)
    everything = listing.list_page(store)
    assert names(everything) == ["Digits-Search", "single run", "from before users"]
    assert everything.total == 3
    by = listing.list_page
    assert names(by(store, ExperimentFilter(owner="bob"))) == ["single run"]
    assert names(by(store, ExperimentFilter(label="digits"))) == ["Digits-Search",
                                                                  "single run"]
    assert names(by(store, ExperimentFilter(label="nightly"))) == ["Digits-Search"]
    assert names(by(store, ExperimentFilter(label="digit"))) == []  # a whole label only
    assert names(by(store, ExperimentFilter(name="digits"))) == ["Digits-Search"]  # any case
    assert names(by(store, ExperimentFilter(state=ExperimentState.ERROR))) == [
        "from before users"]
    assert names(by(store, sort="created", descending=True)) == [
        "single run", "Digits-Search", "from before users"]
    assert names(by(store, sort="owner")) == ["Digits-Search", "single run",
                                              "from before users"]  # no owner: last
    second = by(store, sort="created", offset=1, limit=1)
    assert (names(second), second.total) == (["Digits-Search"], 3)
    with pytest.raises(NotFound, match="user 'carol' does not exist"):
        by(store, ExperimentFilter(owner="carol"))
    with pytest.raises(InvalidRequest, match="sort must be one of"):
        by(store, sort="loss")
    with pytest.raises(InvalidRequest, match="limit must be 1 to 500"):
        by(store, limit=10_000)


def test_each_row_says_its_progress_its_badges_and_its_best(store: Store) -> None:
    ids = seed(store)
    rows = {row["id"]: row for row in listing.list_page(store).rows}
    search = rows[ids["search"]]
    assert search["progress"] == {"ended": 3, "running": 1, "queued": 0, "total": 4}
    assert (search["awaiting_review"], search["unverified"]) == (1, 1)
    assert search["verdicts"] == {"verified": 1, "not_verified": 1, "suspect": 1}
    # No verification recorded, or approved on review: SUCCEEDED, not verified.
    assert rows[ids["run"]]["verdicts"] == {"verified": 0, "not_verified": 2, "suspect": 0}
    assert rows[ids["run"]]["unverified"] == 2
    assert search["trial_states"] == ["SUSPECT", "SUCCEEDED", "SUCCEEDED", "RUNNING"]
    best = search["best"]
    # The best SUCCEEDED trial by its best value: not the running one's lower value.
    assert (best["trial_id"], best["number"], best["metric"], best["value"]) == (
        ids["best"], 2, "val_loss", 0.25)
    assert best["hparams"] == {"lr": 0.1}
    assert rows[ids["run"]]["best"] is None  # no searcher metric
    assert rows[ids["old"]]["owner"] is None
    assert rows[ids["old"]]["progress"] == {"ended": 0, "running": 0, "queued": 0, "total": 1}


def searches(store: Store, count: int) -> dict[str, int]:
    """`count` searches of one metric, `score`: alternately the lower and the higher is
    better. Each has two SUCCEEDED trials whose reports span 0.2-0.9 and 0.3-0.6."""
    found = {}
    with store.session_scope() as s:
        for n in range(count):
            smaller = n % 2 == 0
            config = {"name": f"s{n}", "searcher": {"name": "random", "metric": "score",
                                                     "smaller_is_better": smaller,
                                                     "max_trials": 2}}
            exp = Experiment(name=f"s{n}", config=config, config_yaml="", context_dir="/tmp",
                             state="COMPLETED", max_trials=2)
            wide, narrow = (Trial(experiment=exp, state="SUCCEEDED", number=i)
                            for i in range(2))
            s.add_all([exp, wide, narrow])
            s.flush()
            for trial, values in ((wide, (0.2, 0.9)), (narrow, (0.3, 0.6))):
                for step, value in enumerate(values):
                    add_metric(s, trial, {"score": value}, step=step)
            found[exp.name] = exp.id
    return found


def test_each_search_on_a_page_has_its_best_by_its_own_goal(store: Store) -> None:
    ids = searches(store, 2)
    rows = {row["id"]: row for row in listing.list_page(store).rows}
    lower, higher = rows[ids["s0"]]["best"], rows[ids["s1"]]["best"]
    # One metric name, two directions: each searcher's own, over each trial's own reports.
    assert (lower["number"], lower["value"]) == (0, 0.2)
    assert (higher["number"], higher["value"]) == (0, 0.9)


def test_a_page_costs_the_same_few_queries_whatever_its_size(store: Store) -> None:
    searches(store, 8)
    statements = []
    event.listen(store.engine, "before_cursor_execute",
                 lambda *args: statements.append(args[2]))
    listing.list_page(store, limit=2)
    few = len(statements)
    statements.clear()
    page = listing.list_page(store, limit=8)
    assert len(page.rows) == 8 and all(row["best"] is not None for row in page.rows)
    assert len(statements) == few
