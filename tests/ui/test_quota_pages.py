"""Quotas in Chromium (issue 36, deliverable 2): a user's quota and what is in use on their
account page and on the cluster page, and the queue reason that names the quota on the
cluster page and the waiting trial's page. A real server, real trials, a real browser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.experiments import FIXTURES
from tests.ui.conftest import Team
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle

CONFIG = "name: quota-{n}\nentrypoint: python wait_for_file.py {release}\n"
REASON = "alice's quota: 1 of 1 running trial in use"


def test_the_quota_shows_on_the_account_cluster_and_trial_pages(
        page_of: Any, team: Team, tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "wait_for_file.py").write_text((FIXTURES / "wait_for_file.py").read_text())
    release = tmp_path / "release"
    with team.client("admin") as admin:
        admin.set_quota("user", "alice", {"max_running_trials": 1})
    try:
        with team.client("alice") as alice:
            first, second = (alice.create_experiment(
                CONFIG.format(n=n, release=release), context)["trials"][0]["id"]
                for n in (1, 2))
            wait_until(lambda: alice.get_trial(first)["state"] == "RUNNING"
                       and alice.get_trial(second)["queue_reason"], timeout=60,
                       what="one trial running, one waiting for the quota")
            assert REASON in str(alice.get_trial(second)["queue_reason"])

        mine = page_of("alice")
        mine.goto(f"{team.server.url}/account")
        expect(mine.locator("#quotas")).to_contain_text("your own")
        expect(mine.locator("#quotas")).to_contain_text("1 of 1 running trial")

        viewer = page_of("vera")
        viewer.goto(f"{team.server.url}/cluster")
        quotas = viewer.locator("#quotas")
        expect(quotas.locator("tr", has_text="alice")).to_contain_text("1 of 1 running trial")
        expect(quotas).to_contain_text("set by an admin")
        expect(viewer.locator("#cluster tr", has_text="QUEUED")).to_contain_text(REASON)
        viewer.goto(f"{team.server.url}/trials/{second}")
        expect(viewer.locator(".banner.info", has_text="Waiting")).to_contain_text(REASON)
    finally:
        release.touch()
        with team.client("admin") as admin:
            admin.clear_quota("user", "alice")
