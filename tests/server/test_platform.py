"""The platform: made once, by `create_app`'s one call of `open_platform`, and held by the
server's state; the services work against one a test makes, without the HTTP layer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.home import Home
from muster.server import app as server_app
from muster.server.app import create_app
from muster.server.platform import Platform, open_platform
from muster.server.settings import ServerSettings
from muster.services.cluster import cluster_status, submission_capacity
from muster.services.experiments import NewExperiments, create_experiments
from muster.services.jobs import list_jobs
from muster.store import Trial
from tests.accounts import first_admin

SETTINGS = ServerSettings(slots=3, min_free_disk=0)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    made = open_platform(Home(tmp_path / "home"), SETTINGS)
    made.store.upgrade()
    try:
        yield made
    finally:
        made.close()


def test_create_app_makes_one_platform_that_the_state_and_the_passes_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Platform] = []

    def counted(home: Home, settings: ServerSettings) -> Platform:
        made.append(open_platform(home, settings))
        return made[-1]

    monkeypatch.setattr(server_app, "open_platform", counted)
    state = create_app(Home(tmp_path / "home"), SETTINGS).state.muster
    try:
        assert made == [state.platform]
        platform = state.platform
        assert state.orchestrator.supervisor is platform.supervisor
        assert (state.store, state.home) == (platform.store, platform.home)
        assert platform.supervisor.envs is platform.envs
        assert platform.supervisor.placement is platform.placement
    finally:
        state.platform.close()


def test_a_submission_through_the_platform_is_admitted_and_the_cluster_view_counts_it(
    platform: Platform
) -> None:
    """No server, no passes: the create goes through the platform's `Submission` (its
    capacity, its admission at submission) and the cluster's status reads the platform."""
    admin = first_admin(platform.store, platform.home)
    config = yaml.safe_dump({"name": "plain", "entrypoint": ["true"]})
    before = cluster_status(platform)
    assert (before["slots"], before["slots_in_use"], before["queued"]) == (3, 0, 0)
    assert submission_capacity(platform).slots == 3

    (experiment_id,) = create_experiments(platform, admin, NewExperiments([config]))

    with platform.store.session_scope() as s:
        state = s.scalars(select(Trial.state).where(Trial.experiment_id == experiment_id)).one()
    assert state == "STARTING"  # a slot was free and nothing waited: admitted at once
    after = cluster_status(platform)
    assert (after["slots_in_use"], after["queued"]) == (1, 0)
    assert [job["experiment_id"] for job in list_jobs(platform.store).rows] == [experiment_id]
