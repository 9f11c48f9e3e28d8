"""Pages that stay live (issue 33, deliverable 2), in Chromium against a real server: the
trial page follows its trial's events over one server-sent event stream (no reload), and
a banner says when the server stops answering or the session ended, with a login link
that comes back to the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.experiments import make_context, only_trial, wait_trial, write_context
from tests.ui.conftest import Team

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

WAIT_FOR = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n"
            "    time.sleep(0.1)\nprint('done')\n")


def _marked(page: Any) -> None:
    """Mark the page's window: a reload would lose the mark (`_not_reloaded`)."""
    page.evaluate("window.__notReloaded = true")


def _not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"


@pytest.fixture(scope="module")
def suspect(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """alice's SUSPECT trial (it exits 0 without the checkpoint its plan promised)."""
    context = make_context(tmp_path_factory.mktemp("live"), "harness_train.py",
                           "--no-checkpoint", name="live-suspect")
    with team.client("alice") as alice:
        exp = alice.create_experiment((context / "experiment.yaml").read_text(), context)
        return wait_trial(alice, only_trial(exp)["id"], {"SUSPECT", "FAILED", "SUCCEEDED"},
                          timeout=120)


def test_a_trial_at_rest_changes_on_its_page_when_it_is_reviewed(
    page_of: Any, team: Team, suspect: dict[str, Any]
) -> None:
    """A SUSPECT trial's page polls nothing (it is at rest): only its event stream can
    tell it that an admin approved it elsewhere."""
    assert suspect["state"] == "SUSPECT", suspect
    page = page_of("alice")
    page.goto(f"{team.server.url}/trials/{suspect['id']}")
    expect(page.locator("#trial-state .state")).to_have_text("SUSPECT")
    expect(page.get_by_role("heading", name="Review")).to_be_visible()
    _marked(page)
    with team.client("admin") as admin:
        admin.review_trial(suspect["id"], "approve", "checked the curves by hand")
    expect(page.locator("#trial-state .state")).to_have_text("SUCCEEDED")
    expect(page.get_by_role("heading", name="Review")).to_have_count(0)
    expect(page.locator("#verdict")).to_contain_text("approved")
    _not_reloaded(page)


def test_a_running_trial_turns_succeeded_with_its_verification_without_a_reload(
    page_of: Any, team: Team, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    context = write_context(tmp_path, ["python", "wait_for.py", str(go)],
                            files={"wait_for.py": WAIT_FOR}, name="live-running")
    with team.client("alice") as alice:
        exp = alice.create_experiment((context / "experiment.yaml").read_text(), context)
        trial = wait_trial(alice, only_trial(exp)["id"], {"RUNNING"}, timeout=60)
    page = page_of("alice")
    page.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(page.locator("#trial-state .state")).to_have_text("RUNNING")
    expect(page.get_by_role("heading", name="Verification")).to_have_count(0)
    _marked(page)
    go.touch()
    expect(page.locator("#trial-state .state")).to_have_text("SUCCEEDED", timeout=30_000)
    expect(page.get_by_role("heading", name="Verification")).to_be_visible()
    expect(page.locator("#trial-attempts .state").first).to_have_text("SUCCEEDED")
    _not_reloaded(page)


def test_a_banner_says_the_server_stopped_and_goes_once_it_is_back(
    page_of: Any, team: Team, suspect: dict[str, Any]
) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/experiments/{suspect['experiment_id']}")
    banner = page.locator("#connection")
    expect(banner).to_be_hidden()
    team.server.stop()
    try:
        expect(banner).to_contain_text("The server does not answer", timeout=30_000)
    finally:
        team.server.start()
    expect(banner).to_be_hidden(timeout=30_000)


def test_a_banner_says_the_session_ended_and_links_back_here(
    page_of: Any, team: Team, suspect: dict[str, Any]
) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{suspect['id']}")
    with team.client("admin") as admin:
        for session in admin.list_sessions(user="vera"):
            admin.end_session(session["id"])
    banner = page.locator("#connection")
    expect(banner).to_contain_text("Your session has ended", timeout=60_000)
    link = banner.get_by_role("link", name="Log in again")
    expect(link).to_have_attribute("href", f"/login?next=%2Ftrials%2F{suspect['id']}")
