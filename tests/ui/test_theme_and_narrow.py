"""The web UI in the dark and on a phone (issue 33, deliverable 6), in Chromium against a
real server: the system's dark scheme darkens every page, the header's toggle overrides it
and is kept in the browser; at 400 px no page scrolls sideways and "Log out" is on screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.experiments import only_trial, wait_trial, write_context
from tests.ui.conftest import Team, WatchedBrowser, log_in

pytestmark = pytest.mark.lifecycle  # a real server, a real trial, a real browser

DARK_BG = "rgb(13, 17, 23)"
LIGHT_BG = "rgb(255, 255, 255)"


def _logged_in(browser: WatchedBrowser, team: Team, name: str, **options: Any) -> Any:
    context = browser.new_context(**options)
    page = context.new_page()
    log_in(page, team, name)
    return page


def _background(page: Any) -> str:
    return str(page.evaluate("getComputedStyle(document.body).backgroundColor"))


@pytest.fixture(scope="module")
def ended(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """alice's trial of a long-named experiment, ended."""
    tmp: Path = tmp_path_factory.mktemp("narrow")
    context = write_context(tmp, ["python", "train.py"],
                            files={"train.py": "print('step 1 loss 0.5 ' * 20)\n"},
                            name="a-rather-long-experiment-name-that-a-phone-must-wrap")
    with team.client("alice") as alice:
        exp = alice.create_experiment((context / "experiment.yaml").read_text(), context)
        return wait_trial(alice, only_trial(exp)["id"], {"SUCCEEDED"}, timeout=120)


def test_the_system_dark_scheme_darkens_the_page_and_the_toggle_overrides_it(
    browser: WatchedBrowser, team: Team
) -> None:
    page = _logged_in(browser, team, "alice", color_scheme="dark")
    assert _background(page) == DARK_BG
    toggle = page.locator("#theme-toggle")
    expect(toggle).to_have_text("Theme: auto")
    toggle.click()
    expect(toggle).to_have_text("Theme: dark")
    assert _background(page) == DARK_BG
    toggle.click()
    expect(toggle).to_have_text("Theme: light")
    assert _background(page) == LIGHT_BG  # light, though the system is dark
    page.goto(team.server.url + "/cluster")  # kept in the browser, applied before paint
    expect(page.locator("#theme-toggle")).to_have_text("Theme: light")
    assert _background(page) == LIGHT_BG
    page.locator("#theme-toggle").click()
    expect(page.locator("#theme-toggle")).to_have_text("Theme: auto")
    assert _background(page) == DARK_BG
    page.context.close()


def test_a_light_system_stays_light_until_dark_is_chosen(browser: WatchedBrowser,
                                                        team: Team) -> None:
    page = _logged_in(browser, team, "vera", color_scheme="light")
    assert _background(page) == LIGHT_BG
    page.locator("#theme-toggle").click()
    expect(page.locator("#theme-toggle")).to_have_text("Theme: dark")
    assert _background(page) == DARK_BG
    text = page.evaluate("getComputedStyle(document.body).color")
    assert text == "rgb(230, 237, 243)", text
    page.context.close()


@pytest.mark.parametrize("path", ["/", "/experiments/{experiment}", "/trials/{trial}",
                                  "/cluster", "/account", "/new", "/users", "/models",
                                  "/drills"])
def test_no_page_scrolls_sideways_at_400_px(browser: WatchedBrowser, team: Team,
                                            ended: dict[str, Any], path: str) -> None:
    page = _logged_in(browser, team, "admin", viewport={"width": 400, "height": 800})
    page.goto(team.server.url + path.format(experiment=ended["experiment_id"],
                                            trial=ended["id"]))
    expect(page.locator("main h1").first).to_be_visible()
    wide = page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 400, f"{path} is {wide} px wide at 400 px"
    box = page.get_by_role("button", name="Log out", exact=True).bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 400, box
    page.context.close()
