"""The experiment page a person can scan (issue 33, deliverable 5), in Chromium against a
real server: its events collapsed, paged newest first, filtered by kind and actor, live
while it runs, their state in the address; its config as submitted, with the defaults a
click away."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.ui.conftest import Team
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server, a real trial, a real browser

CONFIG = """\
name: many-events
entrypoint: python wait.py   # runs until it is killed
"""
WAIT = "import time\nwhile True:\n    time.sleep(1)\n"
PRIORITIES = 30  # alice's priority changes: each one event of hers


@pytest.fixture(scope="module")
def busy(team: Team, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """alice's running experiment with more events than a page shows: its creation, the
    supervisor's launch, and PRIORITIES priority changes of hers."""
    context: Path = tmp_path_factory.mktemp("busy")
    (context / "wait.py").write_text(WAIT)
    with team.client("alice") as alice:
        exp = alice.create_experiment(CONFIG, context)
        for n in range(PRIORITIES):
            alice.set_experiment_priority(exp["id"], 10 + n)
        # Its launch's events written ("started" with RUNNING) before a test counts them.
        wait_until(lambda: alice.get_trial(exp["trials"][0]["id"])["state"] == "RUNNING",
                   what="the trial to run")
        yield exp
        alice.kill_experiment(exp["id"])


def _rows(page: Any) -> Any:
    return page.locator("#events-body tbody tr[data-event]")


def _shows(page: Any, ids: list[int]) -> None:
    """Wait until the events table shows exactly `ids`, in that order."""
    expect(_rows(page).first).to_have_attribute("data-event", str(ids[0]))
    expect(_rows(page)).to_have_count(len(ids))
    assert _ids(page) == ids


def _ids(page: Any) -> list[int]:
    return [int(i) for i in _rows(page).evaluate_all("rows => rows.map(r => r.dataset.event)")]


def test_events_are_collapsed_paged_newest_first_and_filtered_with_the_address(
    page_of: Any, team: Team, busy: dict[str, Any]
) -> None:
    with team.client("alice") as alice:
        every = alice.list_events(experiment_id=busy["id"], limit=1000)
    newest_first = [e["id"] for e in every][::-1]
    page = page_of("alice")
    page.goto(f"{team.server.url}/experiments/{busy['id']}")
    section = page.locator("#events")
    expect(section.locator("summary")).to_contain_text(f"{len(every)} in all")
    expect(_rows(page).first).to_be_hidden()  # collapsed: the trials and charts come first
    section.locator("summary").click()
    _shows(page, newest_first[:25])

    page.get_by_role("link", name="Older").click()
    _shows(page, newest_first[25:50])
    expect(page).to_have_url(re.compile(rf"ev_before={newest_first[24]}"))
    page.get_by_role("link", name="Newest").click()
    _shows(page, newest_first[:25])

    page.get_by_label("Actor").select_option("alice")
    expect(page).to_have_url(re.compile(r"ev_actor=alice"))
    mine = [e["id"] for e in every if e["actor"] == "alice"][::-1]
    _shows(page, mine[:25])
    page.reload()  # the address keeps the filter: the section opens on the same rows
    _shows(page, mine[:25])
    expect(page.get_by_label("Actor")).to_have_value("alice")

    page.get_by_label("Actor").select_option("")
    page.get_by_label("Kind").select_option("created")
    created = [e["id"] for e in every if e["kind"] == "created"][::-1]
    _shows(page, created)
    expect(page).to_have_url(re.compile(r"ev_kind=created"))


def test_a_new_event_shows_without_a_reload_while_the_experiment_runs(
    page_of: Any, team: Team, busy: dict[str, Any]
) -> None:
    page = page_of("alice")
    page.goto(f"{team.server.url}/experiments/{busy['id']}")
    page.locator("#events summary").click()
    first = _ids(page)[0]
    with team.client("alice") as alice:
        alice.set_experiment_priority(busy["id"], 77)
        (made,) = alice.list_events(experiment_id=busy["id"], tail=1)
    assert made["id"] > first
    expect(_rows(page).first).to_have_attribute("data-event", str(made["id"]), timeout=20_000)


def test_the_config_shows_as_submitted_and_with_its_defaults(
    page_of: Any, team: Team, busy: dict[str, Any]
) -> None:
    page = page_of("alice")
    page.goto(f"{team.server.url}/experiments/{busy['id']}")
    submitted = page.locator("#config-submitted")
    expect(submitted).to_have_text(CONFIG)  # the comment too: verbatim
    defaults = page.locator("#config-defaults")
    expect(defaults).to_be_hidden()
    page.get_by_text("With every default filled in").click()
    expect(defaults).to_be_visible()
    expect(defaults).to_contain_text("failure_policy:")
    expect(defaults).to_contain_text("silence_timeout:")
