"""The web UI in a real browser: Playwright driving Debian's Chromium (/usr/bin/chromium,
installed by `make install` where apt may run as root; never a browser Playwright
downloads). Without it the tests skip with the reason, unless MUSTER_REQUIRE_BROWSER=1
(CI), which turns the skip into a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from muster.home import Home
from tests.servers import RunningServer, serving

CHROMIUM = Path("/usr/bin/chromium")
# Chromium as root, headless, and quiet on a machine whose network is closed.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
PASSWORD = "a long enough password"


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"no {CHROMIUM}: `make install` installs Debian's chromium where apt runs as root"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (`make install` installs it)"
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    reason = _missing()
    if reason is not None:
        if os.environ.get("MUSTER_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason} (and MUSTER_REQUIRE_BROWSER=1 requires the browser tests)")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                              args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class Team:
    """A server with admin, alice (a user) and vera (a viewer), each with a password."""

    server: RunningServer
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, who: str) -> Client:
        return Client(url=self.server.url, token=self.tokens[who], home=Home(self.server.home))


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    with serving(tmp_path_factory.mktemp("ui") / "home") as server:
        team = Team(server, {"admin": server.token})
        with team.client("admin") as admin:
            admin.edit_user("admin", password=PASSWORD)
            for name, role in (("alice", "user"), ("vera", "viewer")):
                team.tokens[name] = admin.create_user(name, role, password=PASSWORD)["token"]
        yield team


@pytest.fixture
def page_of(browser: Any, team: Team) -> Iterator[Any]:
    """`page_of(name)`: a fresh browser context logged in as that user (through the login
    form, with the user's password), on the server's list page."""
    contexts: list[Any] = []

    def open_page(name: str) -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(team.server.url + "/")
        page.get_by_label("User name").fill(name)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(team.server.url + "/")
        return page

    yield open_page
    for context in contexts:
        context.close()
