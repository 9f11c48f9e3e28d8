"""The account page in Chromium against a real server: your web sessions and API tokens,
each with a button that ends it (a form with the session's CSRF token, no script)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.ui.conftest import PASSWORD, Team

pytestmark = pytest.mark.lifecycle  # a real server, a real browser


def log_in(browser: Any, team: Team, name: str) -> Any:
    page = browser.new_page()
    page.goto(team.server.url + "/login")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".who .user")).to_contain_text(name)
    return page


def test_the_account_page_ends_another_session_and_revokes_a_token(
    browser: Any, team: Team
) -> None:
    elsewhere = log_in(browser, team, "alice")
    page = log_in(browser, team, "alice")
    with team.client("alice") as alice:
        made = alice.create_token("for the page")
    page.locator(".who .user").click()
    expect(page.get_by_role("heading", name="Web sessions")).to_be_visible()
    mine = page.locator("tr", has_text="(this one)")
    expect(mine).to_have_count(1)
    other = page.locator("tbody tr", has=page.get_by_role("button", name="End", exact=True))
    other.first.get_by_role("button", name="End", exact=True).click()
    expect(page).to_have_url(team.server.url + "/account")
    elsewhere.reload()
    expect(elsewhere.get_by_label("Token")).to_be_visible()  # logged out: the login form
    row = page.locator("tr", has_text=made["id"])
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator("tr", has_text=made["id"])).to_have_count(0)
    expect(page.locator(".who .user")).to_contain_text("alice")  # still logged in
    elsewhere.close()
    page.close()
