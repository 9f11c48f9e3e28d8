"""The account and users pages in Chromium against a real server: your password, web
sessions and API tokens, and an admin's users, each changed with a plain form (the
session's CSRF token, no script)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from muster.client import Client
from muster.home import Home
from tests.ui.conftest import PASSWORD, Team

pytestmark = pytest.mark.lifecycle  # a real server, a real browser


def test_the_account_page_ends_another_session_and_revokes_a_token(
    page_of: Any, team: Team
) -> None:
    elsewhere = page_of("alice")  # each in a context of its own: a session of its own
    page = page_of("alice")
    with team.client("alice") as alice:
        made = alice.create_token("for the page")
    page.locator(".who .user").click()
    expect(page.get_by_role("heading", name="Web sessions")).to_be_visible()
    mine = page.locator("tr", has_text="(this one)")
    expect(mine).to_have_count(1)
    other = page.locator("tbody tr", has=page.get_by_role("button", name="End", exact=True))
    other.first.get_by_role("button", name="End", exact=True).click()
    expect(page).to_have_url(team.server.url + "/account?done=session")
    expect(page.get_by_role("status")).to_have_text("The session ended.")
    # The ended session's own page may be sending itself to /login already (its live stream
    # got a 401), so a reload of it races that navigation: a fresh page with its cookies asks.
    again = elsewhere.context.new_page()
    again.goto(team.server.url + "/account")
    expect(again.get_by_label("Token")).to_be_visible()  # logged out: the login form
    row = page.locator("tr", has_text=made["id"])
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator("tr", has_text=made["id"])).to_have_count(0)
    expect(page.locator(".who .user")).to_contain_text("alice")  # still logged in


def _account(page_of: Any, name: str) -> Any:
    page = page_of(name)
    page.locator(".who .user").click()
    expect(page.get_by_role("heading", name="Password")).to_be_visible()
    return page


def test_a_password_changes_on_the_account_page_and_only_with_the_current_one(
    page_of: Any, team: Team
) -> None:
    """A wrong current password changes nothing (403, said on the page); the right one
    changes it: the old password stops logging in, the new one works, this session goes
    on."""
    with team.client("admin") as admin:
        admin.create_user("paula", "user", password=PASSWORD)
    page = _account(page_of, "paula")
    form = page.locator("#password-form")
    form.get_by_label("Current password").fill("not the password at all")
    form.get_by_label("New password", exact=True).fill("a brand new password")
    form.get_by_label("Repeat the new password").fill("a brand new password")
    form.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("alert")).to_contain_text("current password")
    assert _logs_in(team, "paula", PASSWORD)

    form.get_by_label("Current password").fill(PASSWORD)
    form.get_by_label("New password", exact=True).fill("a brand new password")
    form.get_by_label("Repeat the new password").fill("a different new password")
    form.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("alert")).to_contain_text("differ")
    assert _logs_in(team, "paula", PASSWORD)

    form.get_by_label("Current password").fill(PASSWORD)
    form.get_by_label("New password", exact=True).fill("a brand new password")
    form.get_by_label("Repeat the new password").fill("a brand new password")
    form.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("status")).to_contain_text("Your password changed")
    assert not _logs_in(team, "paula", PASSWORD)
    assert _logs_in(team, "paula", "a brand new password")
    page.reload()
    expect(page.locator(".who .user")).to_contain_text("paula")  # this session goes on


def _logs_in(team: Team, name: str, password: str) -> bool:
    response = httpx.post(f"{team.server.url}/api/v1/login",
                          json={"name": name, "password": password}, timeout=30)
    assert response.status_code in (200, 401), response.text
    return response.status_code == 200


def test_a_token_made_on_the_account_page_is_shown_once_and_works(
    page_of: Any, team: Team
) -> None:
    page = _account(page_of, "alice")
    form = page.locator("#token-form")
    form.get_by_label("Name").fill("from the page")
    form.get_by_label("Expires after").fill("soon")
    form.get_by_role("button", name="Create token").click()
    expect(page.get_by_role("alert")).to_contain_text("expires")
    expect(form.get_by_label("Name")).to_have_value("from the page")  # kept for the retry

    form.get_by_label("Expires after").fill("30d")
    with page.expect_response(lambda r: r.url.endswith("/account/tokens")) as answered:
        form.get_by_role("button", name="Create token").click()
    assert answered.value.status == 201
    assert answered.value.headers["cache-control"] == "no-store"
    secret = page.locator("#new-token").text_content()
    assert secret
    with Client(url=team.server.url, token=secret.strip(), home=Home(team.server.home)) as made:
        assert made.whoami()["name"] == "alice"
    page.goto(team.server.url + "/account")
    expect(page.locator("#new-token")).to_have_count(0)  # shown that once
    row = page.locator("tr", has_text="from the page")
    expect(row).to_have_count(1)
    row.get_by_role("button", name="Revoke").click()
    expect(page.get_by_role("status")).to_contain_text("revoked")
    response = httpx.get(f"{team.server.url}/api/v1/whoami", timeout=30,
                         headers={"Authorization": f"Bearer {secret.strip()}"})
    assert response.status_code == 401


def test_an_admin_makes_a_user_sets_its_role_and_deactivates_it(
    page_of: Any, team: Team
) -> None:
    page = page_of("admin")
    page.get_by_role("link", name="Users").click()
    expect(page.get_by_role("heading", name="Users", exact=True)).to_be_visible()
    form = page.locator("#new-user")
    form.get_by_label("User name").fill("ursula")
    form.get_by_label("Role").select_option("viewer")
    form.get_by_role("button", name="Create user").click()
    secret = (page.locator("#new-token").text_content() or "").strip()
    assert secret
    with Client(url=team.server.url, token=secret, home=Home(team.server.home)) as ursula:
        assert ursula.whoami()["role"] == "viewer"

    form.get_by_label("User name").fill("ursula")
    form.get_by_role("button", name="Create user").click()
    expect(page.get_by_role("alert")).to_contain_text("ursula")  # taken: said, not a 500

    row = page.locator("tr[data-user=ursula]")
    row.get_by_label("role of ursula").select_option("user")
    row.get_by_role("button", name="Set role").click()
    expect(page.get_by_role("status")).to_contain_text("role changed")
    with team.client("admin") as admin:
        assert admin.get_user("ursula")["role"] == "user"
    page.locator("tr[data-user=ursula]").get_by_role("button", name="Deactivate").click()
    expect(page.get_by_role("status")).to_contain_text("deactivated")
    response = httpx.get(f"{team.server.url}/api/v1/whoami", timeout=30,
                         headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 401
    page.locator("tr[data-user=ursula]").get_by_role("button", name="Activate").click()
    expect(page.get_by_role("status")).to_contain_text("log in again")


def test_a_user_reads_the_users_but_cannot_change_them(page_of: Any, team: Team) -> None:
    page = page_of("alice")
    expect(page.get_by_role("link", name="Users")).to_have_count(0)
    page.goto(team.server.url + "/users")
    expect(page.locator("tr[data-user=vera]")).to_have_count(1)
    expect(page.get_by_role("button", name="Deactivate")).to_have_count(0)
    expect(page.locator("#new-user")).to_have_count(0)
    # The form posted anyway (a crafted request with the session's CSRF token): refused.
    csrf = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")
    answer = page.request.post(team.server.url + "/users/vera/deactivate",
                               form={"csrf_token": csrf}, max_redirects=0)
    assert answer.status == 403
    with team.client("admin") as admin:
        assert admin.get_user("vera")["active"] is True


def test_notifications_are_added_shown_redacted_and_removed_on_the_account_page(
    page_of: Any, team: Team
) -> None:
    """A private host is refused with the fix (400, said on the page, the form kept); a
    webhook's signing key is shown once; Slack's URL shows as its scheme alone; Remove
    takes one away."""
    with team.client("admin") as admin:
        admin.create_user("nora", "user", password=PASSWORD)
    page = _account(page_of, "nora")
    form = page.locator("#notify-form")
    form.get_by_label("URL").fill("https://10.0.0.7/hook")
    form.get_by_label("trial-failed").check()
    form.get_by_role("button", name="Add notification").click()
    expect(page.get_by_role("alert")).to_contain_text("10.0.0.7 is not a public address")
    expect(page.locator("#notify-form").get_by_label("URL")).to_have_value(
        "https://10.0.0.7/hook")
    expect(page.locator("#notify-form").get_by_label("trial-failed")).to_be_checked()

    form = page.locator("#notify-form")
    form.get_by_label("URL").fill("https://93.184.215.14/muster/T0/secret-path")
    form.get_by_role("button", name="Add notification").click()
    expect(page.locator("#new-signing-key")).to_have_text(re.compile(r"^[0-9a-f]{64}$"))
    page.locator("#notify-form").get_by_label("URL").fill("slack://TokenA/TokenB/TokenC/#ml")
    page.locator("#notify-form").get_by_label("experiment-ended").check()
    page.locator("#notify-form").get_by_role("button", name="Add notification").click()
    expect(page.locator("#new-signing-key")).to_have_count(0)  # Apprise: no key of muster's
    rows = page.locator("#subscriptions tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("https://93.184.215.14/…")
    expect(rows.nth(1)).to_contain_text("slack://…")
    expect(rows.nth(1)).to_contain_text("experiment-ended")
    expect(page.locator("#subscriptions")).not_to_contain_text("secret-path")
    expect(page.locator("#subscriptions")).not_to_contain_text("TokenA")
    with team.client("admin") as admin:
        listed = [n for n in admin.list_notifications(everyone=True) if n["user"] == "nora"]
    assert [n["url"] for n in listed] == ["https://93.184.215.14/…", "slack://…"]

    page.get_by_role("button", name=f"remove notification {listed[0]['id']}").click()
    expect(page).to_have_url(team.server.url + "/account?done=unsubscribed")
    expect(page.locator("#subscriptions tbody tr")).to_have_count(1)
    expect(page.locator("#subscriptions")).to_contain_text("slack://…")
