"""One trial's controls in the web UI (issue 36, deliverable 4), in Chromium against a real
server with real processes: alice kills a trial of her running search from the trials
table and the search goes on drawing; she restarts, pauses and activates another from its
page; a viewer sees no controls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import expect

from tests.ui.conftest import Team
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

WAIT_FOR = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n"
            "    time.sleep(0.1)\nprint('done')\n")


def _search(tmp_path: Path, go: Path) -> tuple[str, Path]:
    """A random search of 3 trials, 2 at once, each running until `go` exists."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "wait_for.py").write_text(WAIT_FOR)
    config = {"name": "ui-trial-controls", "entrypoint": ["python", "wait_for.py", str(go)],
              "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
              "searcher": {"name": "random", "metric": "loss", "max_trials": 3,
                           "max_concurrent_trials": 2},
              "failure_policy": {"stop_grace": 2.0}}
    return yaml.safe_dump(config), context


def _states(alice: Any, experiment_id: int) -> dict[int, str]:
    return {t["id"]: t["state"] for t in alice.list_trials(experiment_id)}


def test_a_trial_killed_from_the_table_while_its_search_goes_on(
        page_of: Any, team: Team, tmp_path: Path) -> None:
    go = tmp_path / "go"
    config, context = _search(tmp_path, go)
    with team.client("alice") as alice:
        exp = alice.create_experiment(config, context)
        def two_running() -> list[int] | None:
            found = sorted(i for i, s in _states(alice, exp["id"]).items() if s == "RUNNING")
            return found if len(found) == 2 else None

        killed, kept = wait_until(two_running, timeout=60, what="two running trials")

        page = page_of("alice")
        page.on("dialog", lambda dialog: dialog.accept())  # "Kill trial N? ..."
        page.goto(f"{team.server.url}/experiments/{exp['id']}")
        page.get_by_role("button", name=f"kill trial {killed}").click()
        wait_until(lambda: _states(alice, exp["id"]).get(killed) == "CANCELED", timeout=60,
                   what=f"trial {killed} to be CANCELED")
        # The search goes on: it draws its third trial, and the other still runs.
        wait_until(lambda: len(_states(alice, exp["id"])) == 3, timeout=60,
                   what="the third trial")
        assert _states(alice, exp["id"])[kept] == "RUNNING"
        row = page.locator("table.trials tr", has=page.get_by_role("link",
                                                                    name=f"trial {killed}"))
        expect(row.locator(".state")).to_have_text("CANCELED", timeout=15_000)
        expect(row.get_by_role("button")).to_have_count(0)  # at rest: nothing to do
        assert alice.get_experiment(exp["id"])["state"] == "ACTIVE"

        # Restart, pause and activate from the trial's own page.
        page.goto(f"{team.server.url}/trials/{kept}")
        actions = page.get_by_role("region", name="trial actions")
        actions.get_by_role("button", name="Restart").click()
        wait_until(lambda: len(alice.get_trial(kept)["attempts"]) == 2
                   and alice.get_trial(kept)["state"] == "RUNNING", timeout=60,
                   what="attempt 2 of the restarted trial")
        page.reload()
        actions.get_by_role("button", name="Pause").click()
        expect(page.locator("#trial-state .state")).to_have_text("PAUSED", timeout=30_000)
        expect(actions.get_by_role("button", name="Activate")).to_be_visible()
        actions.get_by_role("button", name="Activate").click()
        wait_until(lambda: alice.get_trial(kept)["state"] == "RUNNING", timeout=60,
                   what="the activated trial to run again")
        trial = alice.get_trial(kept)
        # Attempts 1 (restarted) and 2 (paused) were stopped as asked: no failure.
        assert [a["reason"] for a in trial["attempts"]][:2] == ["STOPPED", "STOPPED"]
        reasons = [e["reason"] for e in trial["events"]]
        assert {"restart requested", "pause requested", "activated"} <= set(reasons)
        assert all(e["actor"] == "alice" for e in trial["events"]
                   if e["reason"] in ("restart requested", "pause requested"))

        # A viewer reads the page but has no controls.
        vera = page_of("vera")
        vera.goto(f"{team.server.url}/trials/{kept}")
        expect(vera.locator("#trial-state .state")).to_have_text("RUNNING")
        expect(vera.get_by_role("region", name="trial actions")).to_have_count(0)

        go.touch()
        ended = wait_until(lambda: (e := alice.get_experiment(exp["id"]))["state"]
                           in ("COMPLETED", "ERROR", "CANCELED") and e, timeout=120,
                           what="the search to end")
        assert ended["state"] == "COMPLETED"
        assert sorted(_states(alice, exp["id"]).values()) == [
            "CANCELED", "SUCCEEDED", "SUCCEEDED"]
