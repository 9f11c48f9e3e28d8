"""Drills in the web UI (issue 37), in Chromium against a real server with real processes:
"Run a drill" on an experiment's page starts one and opens its page, which follows the
drill to its end without a reload and shows its report; the runs and the drill link each
other; the owner cancels a running drill from its page; a viewer has no "Run a drill" and
no Cancel; a drill that is not there is a 404 page.

The drilled script is a tiny plain one, and the faults are kill-rank (the run may end
before the fault is due, which the report says; either way the row is the API's) and
network (skipped at once on a server without Ray): a drill of seconds, not minutes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.ui.conftest import Team
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

HELLO = "print('hello from a drill', flush=True)\n"
WAIT = "import time\nwhile True:\n    time.sleep(1)\n"
FAULTS = ("kill-rank", "network")  # the faults the form keeps checked
DRILL_S = 150_000  # ms: the clean run and one fault's run of a tiny script, with room
CAUGHT = {True: "yes", False: "NO", None: "—"}


def _context(tmp_path: Path, name: str, script: str) -> Path:
    context = tmp_path / name
    context.mkdir()
    (context / "job.py").write_text(script)
    return context


@pytest.fixture(scope="module")
def hello(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """alice's experiment of a script that prints a line and exits 0, ended."""
    context = _context(tmp_path_factory.mktemp("drill"), "hello", HELLO)
    return team.run_to_the_end("name: drill-ui\nentrypoint: python job.py\n", context)


def _start_drill(page: Any, team: Team, experiment_id: int, faults: tuple[str, ...]) -> int:
    """"Run a drill" on the experiment's page with only `faults` checked, at scale 1; the
    id of the drill whose page it opens."""
    page.goto(f"{team.server.url}/experiments/{experiment_id}")
    form = page.get_by_role("form", name="run a drill")
    page.locator("#run-a-drill summary").click()
    boxes = form.get_by_role("checkbox")
    expect(boxes).to_have_count(10)
    for box in boxes.all():
        assert box.is_checked()  # every fault, by default
        if box.get_attribute("value") not in faults:
            box.uncheck()
    assert form.get_by_label("Scale").input_value() == "0.1"
    form.get_by_label("Scale").fill("1")
    form.get_by_role("button", name="Start the drill").click()
    page.wait_for_url(re.compile(rf"{re.escape(team.server.url)}/drills/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def _row(page: Any, fault: str) -> Any:
    return page.locator(f"#drill-report tr[data-fault='{fault}']")


def test_a_drill_run_from_an_experiments_page_to_its_report(
        page_of: Any, team: Team, hello: dict[str, Any]) -> None:
    page = page_of("alice")
    drill_id = _start_drill(page, team, hello["id"], FAULTS)
    page.evaluate("window.stayed = true")
    expect(page.locator("h1")).to_contain_text(f"drill {drill_id}")
    expect(page.locator("#drill-state")).to_have_text("DONE", timeout=DRILL_S)
    assert page.evaluate("window.stayed") is True  # it followed the drill without a reload
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)  # ended: nothing to do

    with team.client("alice") as alice:
        view = alice.get_drill(drill_id)
    assert view["state"] == "DONE" and view["source_experiment"] == hello["id"]
    assert [row["name"] for row in view["faults"]] == list(FAULTS)
    expect(page.locator("#drill-report tbody tr")).to_have_count(len(FAULTS))
    clean = view["clean"]
    expect(page.locator("#drill-clean")).to_contain_text(clean["verdict"])
    for row in view["faults"]:
        shown = _row(page, row["name"])
        expect(shown.locator("td.caught")).to_have_text(CAUGHT[row["caught"]])
        if row["skipped"]:
            expect(shown.locator("td.skipped")).to_have_text(row["skipped"])
        else:
            expect(shown.locator("td.said")).to_contain_text(row["message"])
            expect(shown.get_by_role("link")).to_have_text(f"experiment {row['experiment_id']}")
    expect(_row(page, "network").locator("td.skipped")).to_contain_text("Ray")
    assert view["summary"]
    expect(page.locator("#drill-summary")).to_have_text(view["summary"])

    # The clean run's experiment says whose run it is, and links back.
    page.locator("#drill-clean").get_by_role(
        "link", name=f"experiment {clean['experiment_id']}").click()
    page.wait_for_url(f"{team.server.url}/experiments/{clean['experiment_id']}")
    expect(page.locator("#drill-of")).to_contain_text(f"The clean run of drill {drill_id}")
    page.locator("#drill-of").get_by_role("link", name=f"drill {drill_id}").click()
    page.wait_for_url(f"{team.server.url}/drills/{drill_id}")
    # The drilled experiment lists its drill; the list of drills has it too.
    page.locator("#live .facts").get_by_role(
        "link", name=f"experiment {hello['id']}", exact=True).click()
    page.wait_for_url(f"{team.server.url}/experiments/{hello['id']}")
    listed = page.locator(f"#drills li[data-drill-id='{drill_id}']")
    expect(listed).to_contain_text(view["summary"])
    page.locator("header nav").get_by_role("link", name="Drills").click()
    page.wait_for_url(f"{team.server.url}/drills")
    expect(page.locator(f"table.drills tr[data-drill-id='{drill_id}']")).to_contain_text(
        "DONE")

    # On a phone, neither the report nor the open form scrolls the page sideways.
    page.set_viewport_size({"width": 400, "height": 800})
    page.goto(f"{team.server.url}/drills/{drill_id}")
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    page.goto(f"{team.server.url}/experiments/{hello['id']}")
    page.locator("#run-a-drill summary").click()
    assert page.evaluate("document.documentElement.scrollWidth") <= 400


def test_a_drill_with_no_fault_checked_is_not_sent(page_of: Any, team: Team,
                                                   hello: dict[str, Any]) -> None:
    page = page_of("alice")
    page.goto(f"{team.server.url}/experiments/{hello['id']}")
    page.locator("#run-a-drill summary").click()
    for box in page.get_by_role("form", name="run a drill").get_by_role("checkbox").all():
        box.uncheck()
    page.get_by_role("button", name="Start the drill").click()
    expect(page.locator("#problem")).to_have_text("Check at least one fault to drill.")
    assert page.url == f"{team.server.url}/experiments/{hello['id']}"


@pytest.fixture
def waiting(team: Team, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """alice's experiment of a script that runs until it is killed."""
    context = _context(tmp_path, "wait", WAIT)
    with team.client("alice") as alice:
        exp = alice.create_experiment("name: drill-cancel\nentrypoint: python job.py\n",
                                      context)
        try:
            yield exp
        finally:
            alice.kill_experiment(exp["id"])


def test_the_owner_cancels_a_running_drill_and_a_viewer_cannot(
        page_of: Any, team: Team, waiting: dict[str, Any]) -> None:
    page = page_of("alice")
    page.on("dialog", lambda dialog: dialog.accept())  # "Cancel drill N? ..."
    drill_id = _start_drill(page, team, waiting["id"], ("kill-rank",))
    expect(page.locator("#drill-state")).to_have_text("RUNNING")

    viewer = page_of("vera")
    viewer.goto(f"{team.server.url}/experiments/{waiting['id']}")
    expect(viewer.locator("#drills li[data-drill-id]")).to_have_count(1)
    expect(viewer.locator("#run-a-drill")).to_have_count(0)
    expect(viewer.get_by_role("button", name="Start the drill")).to_have_count(0)
    viewer.locator("#drills").get_by_role("link", name=f"drill {drill_id}").click()
    viewer.wait_for_url(f"{team.server.url}/drills/{drill_id}")
    expect(viewer.locator("#drill-state")).to_have_text("RUNNING")
    expect(viewer.get_by_role("button", name="Cancel")).to_have_count(0)
    viewer.evaluate("window.stayed = true")

    page.get_by_role("region", name="drill actions").get_by_role(
        "button", name="Cancel").click()
    expect(page.locator("#drill-state")).to_have_text("CANCELED", timeout=30_000)
    # The viewer's page follows by itself (its 2 s poll), without a reload.
    expect(viewer.locator("#drill-state")).to_have_text("CANCELED", timeout=15_000)
    assert viewer.evaluate("window.stayed") is True
    expect(_row(page, "kill-rank").locator("td.skipped")).to_have_text("canceled by alice")
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    with team.client("alice") as alice:  # its clean run was killed with it
        clean = alice.get_drill(drill_id)["clean"]["experiment_id"]
        wait_until(lambda: alice.get_experiment(clean)["state"] == "CANCELED", timeout=60,
                   what=f"the clean run, experiment {clean}, to be CANCELED")


def test_a_missing_drill_is_a_404_page(page_of: Any, team: Team) -> None:
    page = page_of("vera")
    for missing, said in (("999999", "no drill 999999"), ("0", "drill_id"),
                          ("not-a-number", "drill_id")):
        answer = page.goto(f"{team.server.url}/drills/{missing}")
        assert answer is not None and answer.status == 404, missing
        expect(page.get_by_role("heading", name="Not found")).to_be_visible()
        expect(page.locator("main .banner.error")).to_contain_text(said)


def test_the_drill_routes_without_a_browser(team: Team) -> None:
    """A visitor is sent to log in; a fragment without a session is a 401; a missing drill
    is a 404 page under the same policy as every page."""
    url = team.server.url
    bearer = {"Authorization": f"Bearer {team.tokens['vera']}"}
    with httpx.Client(timeout=30, follow_redirects=False) as http:
        listed = http.get(f"{url}/drills", headers=bearer)
        assert listed.status_code == 200 and "<h1>Drills</h1>" in listed.text
        assert "content-security-policy" in listed.headers
        gone = http.get(f"{url}/drills/999999", headers=bearer)
        assert gone.status_code == 404 and "no drill 999999" in gone.text
        assert http.get(f"{url}/ui/drills/999999", headers=bearer).status_code == 404
        assert http.get(f"{url}/ui/drills/1").status_code == 401
        away = http.get(f"{url}/drills/1")
        assert away.status_code == 303 and away.headers["location"].startswith("/login?next=")
