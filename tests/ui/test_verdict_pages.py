"""Each trial's verdict in the web UI, in Chromium against a real server: the trial page
shows the verdict line and every check with its status (never "Verification passed" above a
result that was not verified), and the experiment page and the experiments list count the
trials by verdict. Three real runs: verified, a plain exit 0 (not verified), SUSPECT."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from playwright.sync_api import expect
from sqlalchemy import select

from muster.sizes import format_size
from muster.store import Attempt, Replica, Store
from tests.server.experiments import make_context, only_trial, wait_trial, write_context
from tests.ui.conftest import Team

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def trials(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """alice's three trials once ended, as `GET /trials/{id}` shows them."""
    tmp = tmp_path_factory.mktemp("verdicts")
    verified = make_context(tmp, "harness_train.py", name="verdict-verified")
    config = yaml.safe_load((verified / "experiment.yaml").read_text())
    config["verify"] = {"expected_length": {"epochs": 2}}  # harness_train.py's default
    (verified / "experiment.yaml").write_text(yaml.safe_dump(config))
    plain = write_context(tmp, ["python", "train.py"], files={"train.py": "print('done')\n"},
                          name="verdict-plain")
    suspect = make_context(tmp, "harness_train.py", "--no-checkpoint", name="verdict-suspect")
    ended = {"verified": "SUCCEEDED", "plain": "SUCCEEDED", "suspect": "SUSPECT"}
    found = {}
    with team.client("alice") as alice:
        for name, context in (("verified", verified), ("plain", plain), ("suspect", suspect)):
            exp = alice.create_experiment((context / "experiment.yaml").read_text(), context)
            found[name] = wait_trial(alice, only_trial(exp)["id"],
                                     {ended[name], "FAILED", "CANCELED"}, timeout=120)
    assert {name: t["state"] for name, t in found.items()} == ended, found
    return found


def test_the_trial_page_says_the_verdict_above_each_check(
    page_of: Any, team: Team, trials: dict[str, dict[str, Any]]
) -> None:
    page = page_of("vera")
    for trial in trials.values():
        page.goto(f"{team.server.url}/trials/{trial['id']}")
        expect(page.locator("#verdict")).to_have_text(f"Verdict: {trial['verdict']}")
        expect(page.get_by_text("Verification passed")).to_have_count(0)
        rows = page.locator("table.checks tbody tr")
        expect(rows).to_have_count(len(trial["verification"]["checks"]))
        for index, check in enumerate(trial["verification"]["checks"]):
            status = check.get("status") or ("passed" if check["passed"] else "failed")
            row = rows.nth(index)
            expect(row.locator("td").first).to_have_text(check["name"])
            expect(row.locator("td.status")).to_have_text(status.replace("_", " "))
            expect(row).to_have_class(status)
    page.goto(f"{team.server.url}/trials/{trials['plain']['id']}")
    expect(page.locator("#verdict")).to_contain_text("exit 0 — not verified: ")
    expect(page.locator("#verdict")).to_have_class("verdict verdict-not-verified")
    page.goto(f"{team.server.url}/trials/{trials['suspect']['id']}")
    expect(page.locator("#verdict")).to_contain_text("SUSPECT: ")
    expect(page.locator("table.checks tr.failed").first).to_contain_text("checkpoint")
    page.goto(f"{team.server.url}/trials/{trials['verified']['id']}")
    expect(page.locator("#verdict")).to_have_text("Verdict: verified")


def test_the_experiment_page_and_the_list_count_verdicts(
    page_of: Any, team: Team, trials: dict[str, dict[str, Any]]
) -> None:
    page = page_of("vera")
    badges = {"verified": "1 verified", "plain": "1 not verified",
              "suspect": "1 SUSPECT, awaiting review"}
    for name, trial in trials.items():
        row = page.locator(f"tr[data-experiment='{trial['experiment_id']}']")
        expect(row.locator(".verdict-counts")).to_have_text(badges[name])
    for name, trial in trials.items():
        page.goto(f"{team.server.url}/experiments/{trial['experiment_id']}")
        expect(page.locator("#live .facts .verdict-counts")).to_have_text(badges[name])
        cell = page.locator("table.trials tbody tr td.verdict")
        expect(cell).to_have_text(trial["verdict"])


def test_the_trial_page_shows_each_replica_s_peak_memory(
    page_of: Any, team: Team, trials: dict[str, dict[str, Any]]
) -> None:
    """Every attempt records its process group's peak memory (issue 31), limit or not."""
    page = page_of("vera")
    trial = trials["plain"]
    [replica] = trial["attempts"][-1]["replicas"]
    assert replica["peak_rss_bytes"] is not None and replica["oom"] is None
    page.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(page.locator("table.attempts tbody td.peak")).to_have_text(
        format_size(replica["peak_rss_bytes"]))


def test_the_trial_page_says_when_a_replica_s_log_lost_output(
    page_of: Any, team: Team, trials: dict[str, dict[str, Any]]
) -> None:
    """Output the shim could not write (a full disk; tests/supervise/test_log_complete.py
    makes one) is named beside the replica's message; a complete log says nothing."""
    page = page_of("vera")
    trial = trials["verified"]
    page.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(page.locator("table.attempts .log-lost")).to_have_count(0)
    store = Store(team.server.db_url)
    try:
        with store.session_scope() as s:
            [replica] = s.scalars(select(Replica).join(Attempt).where(
                Attempt.trial_id == trial["id"]))
            replica.log_lost_bytes = 3 * 2**20
    finally:
        store.dispose()
    page.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(page.locator("table.attempts .log-lost")).to_have_text(
        "(3 MiB of output lost: the log is incomplete)")
