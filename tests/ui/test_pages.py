"""The web UI's flows in Chromium against a real server: logging in, the list, an
experiment and a trial live, kill, review, what a viewer sees, and a long list."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from muster.store import Experiment
from tests.server.experiments import create, only_trial, wait_trial
from tests.ui.conftest import PASSWORD, Team

pytestmark = pytest.mark.lifecycle  # a real server, real trials, a real browser

SLOW_LINES = "import sys, time\nfor i in range(400):\n    print('line', i, flush=True)\n" \
             "    time.sleep(0.05)\n"


def test_the_root_shows_a_login_form_to_a_visitor(browser: Any, team: Team) -> None:
    """The contract: unauthenticated, `/` is a login form with a "Token" field and a
    "Log in" button; a token logs in as its user."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(team.server.url + "/")
    expect(page.get_by_label("Token")).to_be_visible()
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    page.get_by_label("Token").fill(team.tokens["alice"])
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".who .user")).to_contain_text("alice")
    expect(page.locator(".who .role")).to_have_text("user")
    cookie = next(c for c in context.cookies() if c["name"] == "muster_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_label("Token")).to_be_visible()
    context.close()


def test_a_wrong_password_is_refused_in_the_form(browser: Any, team: Team) -> None:
    page = browser.new_page()
    page.goto(team.server.url + "/cluster")  # a page behind the login: sent to the form
    page.get_by_label("User name").fill("vera")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_have_text("wrong user name or password")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(team.server.url + "/cluster")  # back where it was going
    expect(page.get_by_role("heading", name="Cluster")).to_be_visible()
    page.close()


def test_a_cross_site_login_form_is_refused(team: Team) -> None:
    """The login form's double-submit check: a post without the form's own cookie (a form on
    another site cannot have it) opens no session."""
    response = httpx.post(team.server.url + "/login", timeout=30, follow_redirects=False,
                          data={"name": "alice", "password": PASSWORD,
                                "login_check": "forged"})
    assert response.status_code == 403 and "muster_session" not in response.headers.get(
        "set-cookie", "")


def test_a_run_from_the_list_to_its_live_log(page_of: Any, team: Team, tmp_path: Path) -> None:
    page = page_of("alice")
    page.evaluate("window.stayed = true")
    with team.client("alice") as alice:
        context = tmp_path / "slow"
        context.mkdir()
        (context / "slow.py").write_text(SLOW_LINES)
        (context / "experiment.yaml").write_text("name: live-log\nentrypoint: python slow.py\n")
        exp = alice.create_experiment((context / "experiment.yaml").read_text(), context)
    row = page.locator(f"tr[data-experiment='{exp['id']}']")
    expect(row).to_contain_text("alice")  # appeared without a reload (the list polls)
    assert page.evaluate("window.stayed") is True
    row.get_by_role("link", name="live-log").click()
    expect(page.get_by_role("heading", name=re.compile("live-log"))).to_be_visible()
    trial_id = only_trial(exp)["id"]
    page.get_by_role("link", name=f"trial {trial_id}").click()
    expect(page.locator("#log")).to_contain_text("line 5")
    expect(page.locator("#log")).to_contain_text("line 60")  # still coming in, live
    page.get_by_label("Find").fill("line 42")
    expect(page.locator("#log mark")).to_have_count(1)


def test_a_running_trial_shows_its_progress_and_eta(page_of: Any, team: Team,
                                                    tmp_path: Path) -> None:
    """In the list (polled) and on the trial page (its progress line polls), until it ends:
    a trial that planned 10 steps (ctx.plan()) and reported 5."""
    gate = tmp_path / "gate"
    with team.client("alice") as alice:
        exp = create(alice, tmp_path, "planned_progress.py", "steps", "10", "5", str(gate),
                     name="half-way")
    trial_id = only_trial(exp)["id"]
    with_eta = re.compile(r"5 of 10 steps \(50%\), ETA \d")
    page = page_of("alice")
    listed = page.locator(f"tr[data-experiment='{exp['id']}'] .trial-progress")
    expect(listed).to_contain_text(with_eta, timeout=30_000)
    expect(listed.get_by_role("link", name="#0")).to_have_attribute("href",
                                                                    f"/trials/{trial_id}")
    page.goto(f"{team.server.url}/trials/{trial_id}")
    progress = page.locator("#progress")
    expect(progress).to_contain_text(with_eta)
    expect(progress).to_contain_text("planned by ctx.plan(), measured from harness")
    expect(progress.locator("progress")).to_have_attribute("value", "0.5")
    gate.touch()  # it exits 0 short of its plan: SUSPECT, and the line goes away
    expect(progress).to_have_text("", timeout=30_000)
    page.reload()
    expect(page.locator("#verdict")).to_contain_text("SUSPECT")
    expect(progress).to_have_text("")


def test_kill_changes_the_state_without_a_reload(page_of: Any, team: Team,
                                                 tmp_path: Path) -> None:
    with team.client("alice") as alice:
        exp = create(alice, tmp_path, "wait_for_file.py", str(tmp_path / "never"))
        wait_trial(alice, only_trial(exp)["id"], {"RUNNING"})
    page = page_of("alice")
    page.goto(f"{team.server.url}/experiments/{exp['id']}")
    page.evaluate("window.stayed = true")
    expect(page.locator("#live .facts .state")).to_have_text("ACTIVE")
    page.once("dialog", lambda dialog: dialog.accept())
    # The experiment's Kill (each running trial's row has its own, "kill trial N").
    kill = page.get_by_role("region", name="actions", exact=True).get_by_role("button",
                                                                      name="Kill")
    kill.click()
    expect(page.locator("#live .facts .state")).to_have_text("CANCELED", timeout=30_000)
    assert page.evaluate("window.stayed") is True  # the same page: updated in place
    expect(page.get_by_role("button", name="Kill")).to_have_count(0)  # nor a row's


def test_a_suspect_trial_is_read_and_rejected_with_a_note(page_of: Any, team: Team,
                                                          tmp_path: Path) -> None:
    with team.client("alice") as alice:
        trial_id = only_trial(create(alice, tmp_path, "report_metrics.py", "3"))["id"]
        wait_trial(alice, trial_id, {"SUSPECT"})
    page = page_of("alice")
    page.goto(f"{team.server.url}/trials/{trial_id}")
    expect(page.locator(".facts .state")).to_have_text("SUSPECT")
    failed = page.locator("table.checks tr.failed")
    expect(failed.first).to_be_visible()
    page.get_by_label("Note").fill("the checkpoint is missing: not a result")
    page.get_by_role("button", name="Reject").click()
    expect(page.locator(".facts .state")).to_have_text("FAILED")
    with team.client("admin") as admin:
        last = admin.get_trial(trial_id)["events"][-1]
    assert (last["actor"], last["message"]) == ("alice", "the checkpoint is missing: not a "
                                                         "result")


def test_a_viewer_sees_no_controls(page_of: Any, team: Team, tmp_path: Path) -> None:
    with team.client("alice") as alice:
        exp = create(alice, tmp_path, "wait_for_file.py", str(tmp_path / "release"))
        suspect = only_trial(create(alice, tmp_path, "report_metrics.py", "3"))["id"]
        wait_trial(alice, suspect, {"SUSPECT"})
    page = page_of("vera")
    expect(page.locator(".who .role")).to_have_text("viewer")
    page.goto(f"{team.server.url}/experiments/{exp['id']}")
    expect(page.locator("#live")).to_be_visible()
    for name in ("Pause", "Kill", "Set"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    page.goto(f"{team.server.url}/trials/{suspect}")
    expect(page.locator(".facts .state")).to_have_text("SUSPECT")
    expect(page.get_by_role("button", name="Reject")).to_have_count(0)
    (tmp_path / "release").touch()


def test_a_list_of_a_thousand_experiments_pages_on_the_server(page_of: Any,
                                                              team: Team) -> None:
    with team.server.store() as store, store.session_scope() as s:
        s.add_all(Experiment(name=f"seeded-{n:04d}", config={"name": "seeded"},
                             config_yaml="", context_dir="/tmp", state="COMPLETED",
                             labels=["seeded"], created_at=time.time() - n)
                  for n in range(1000))
    page = page_of("vera")
    page.goto(team.server.url + "/?label=seeded")
    expect(page.locator(".count")).to_contain_text("1000 experiments")
    expect(page.locator("table.list tbody tr")).to_have_count(50)
    page.get_by_role("link", name="next →").click()
    expect(page.locator("table.list tbody tr")).to_have_count(50)
    page.goto(team.server.url + "/?label=seeded&sort=name&order=asc")
    expect(page.locator("table.list tbody tr").first).to_contain_text("seeded-0000")
