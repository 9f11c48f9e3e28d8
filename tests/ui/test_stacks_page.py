"""The trial page's "Stacks": its owner dumps a stuck trial's stacks with a button, and every
reader sees where each rank's main thread waits, with the bundle to download."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.experiments import FIXTURES, attempt_dir, only_trial, wait_trial
from tests.ui.conftest import Team
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server, a real stuck trial, a real browser


def test_the_owner_dumps_the_stacks_and_a_viewer_reads_them(page_of: Any, team: Team,
                                                             tmp_path: Path) -> None:
    context = tmp_path / "stuck"
    context.mkdir()
    (context / "stuck.py").write_bytes((FIXTURES / "stuck.py").read_bytes())
    (context / "experiment.yaml").write_text("name: stuck\nentrypoint: python stuck.py lock\n")
    with team.client("alice") as alice:
        trial = only_trial(alice.create_experiment((context / "experiment.yaml").read_text(),
                                                   context))
        wait_trial(alice, trial["id"], {"RUNNING"})
    log = attempt_dir(team.server.home, trial, 1) / "rank-0.log"
    wait_until(lambda: log.exists() and b"stuck" in log.read_bytes(), timeout=60,
               what="the trial to get stuck")
    lines = (FIXTURES / "stuck.py").read_text().splitlines()
    lock_line = next(n for n, text in enumerate(lines, 1) if text.endswith("# LOCK_LINE"))
    shown = f"rank 0 waits in Lock.acquire at stuck.py:{lock_line}"

    page = page_of("alice")
    page.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(page.locator(".stacks td.empty")).to_have_text("No evidence bundle yet.")
    page.get_by_role("button", name="Dump stacks").click()
    expect(page.locator(".stacks td.stack")).to_have_text(shown, timeout=30_000)
    link = page.locator(".stacks a[download]")
    expect(link).to_have_attribute("href", f"/api/v1/trials/{trial['id']}/evidence?attempt=1")

    reader = page_of("vera")
    reader.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(reader.locator(".stacks td.stack")).to_have_text(shown)
    expect(reader.get_by_role("button", name="Dump stacks")).to_have_count(0)
    with team.client("alice") as alice:
        alice.kill_experiment(trial["experiment_id"])
