"""A search survives its server being SIGKILLed mid-search: the restarted server carries the
search on from the store and it ends with exactly `max_trials` trials, none drawn twice."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from muster.store import Trial
from tests.processes import kill_home_processes
from tests.server.experiments import wait_ended
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "search_job.py"
MAX_TRIALS = 8


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[RunningServer]:
    home = tmp_path / "home"
    home.mkdir()
    running = RunningServer(home=home, db_url=db_url)
    running.start_with(["--min-free-disk", "0", "--slots", "2"])
    try:
        yield running
    finally:
        running.stop()
        kill_home_processes(home)


def trials(server: RunningServer, experiment_id: int) -> list[tuple[int, str, float]]:
    with server.store() as store, store.session_scope() as s:
        return [(t.number, t.state, t.hparams["x"]) for t in s.scalars(
            select(Trial).where(Trial.experiment_id == experiment_id).order_by(Trial.number))]


def test_a_search_goes_on_after_a_server_sigkill(server: RunningServer, tmp_path: Path) -> None:
    config = {
        "name": "search-restart", "entrypoint": [sys.executable, str(FIXTURE)],
        "harness": True, "environment": {"variables": {"PAUSE": "0.3"}},
        "hyperparameters": {"x": {"type": "double", "minval": 0, "maxval": 1}},
        "searcher": {"name": "random", "metric": "loss", "max_trials": MAX_TRIALS,
                     "max_concurrent_trials": 2, "max_length": 4},
        "reproducibility": {"experiment_seed": 42},
    }
    context = tmp_path / "context"
    context.mkdir()
    with server.client() as client:
        experiment_id = int(client.create_experiment(json.dumps(config), context)["id"])
        wait_until(lambda: sum(state == "SUCCEEDED" for _, state, _ in
                               trials(server, experiment_id)) >= 2,
                   timeout=90, what="two trials of the search to succeed")
    before = trials(server, experiment_id)
    server.kill()
    server.start_with(["--min-free-disk", "0", "--slots", "2"])
    with server.client() as client:
        ended = wait_ended(client, experiment_id, timeout=180)
    assert ended["state"] == "COMPLETED"
    after = trials(server, experiment_id)
    assert [number for number, _, _ in after] == list(range(MAX_TRIALS))
    assert {state for _, state, _ in after} == {"SUCCEEDED"}
    assert len({x for _, _, x in after}) == MAX_TRIALS  # no draw repeated
    # What was drawn before the kill is what ran.
    assert [(n, x) for n, _, x in before] == [(n, x) for n, _, x in after[:len(before)]]
