"""The cluster page in Chromium: slots, the queue in order with each trial's position and
reason, live, and the disk and environments sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.experiments import FIXTURES
from tests.ui.conftest import Team
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server, real trials, a real browser

SEARCH = """\
name: queue-of-six
entrypoint: python wait_for_file.py {release}
hyperparameters:
  n: {{type: int, minval: 1, maxval: 1000}}
searcher: {{name: random, metric: val_loss, max_trials: 6, max_concurrent_trials: 6}}
"""


def test_the_queue_shows_in_order_with_positions_and_reasons(page_of: Any, team: Team,
                                                             tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "wait_for_file.py").write_text((FIXTURES / "wait_for_file.py").read_text())
    release = tmp_path / "release"
    with team.client("alice") as alice:
        exp = alice.create_experiment(SEARCH.format(release=release), context)
        wait_until(lambda: sum(t["state"] == "RUNNING" for t in alice.get_experiment(
            exp["id"])["trials"]) == 4, timeout=60, what="4 trials running on 4 slots")
    page = page_of("vera")
    page.goto(f"{team.server.url}/cluster")
    expect(page.locator("#cluster .facts")).to_contain_text("4 of 4 slots in use")
    queued = page.locator("#cluster tr", has_text="QUEUED")
    expect(queued).to_have_count(2)
    expect(queued.nth(0)).to_contain_text("#1")
    expect(queued.nth(1)).to_contain_text("#2")
    expect(queued.first).to_contain_text("slot")  # why it waits
    expect(page.get_by_role("heading", name="Environments")).to_be_visible()
    expect(page.get_by_role("heading", name="Disk")).to_be_visible()
    release.touch()
    expect(page.locator("#cluster tr", has_text="QUEUED")).to_have_count(0, timeout=60_000)
