"""The web UI in a real browser: Playwright driving Debian's Chromium (/usr/bin/chromium,
installed by `make install` where apt may run as root; never a browser Playwright
downloads). Without it the tests skip with the reason, unless MUSTER_REQUIRE_BROWSER=1
(CI), which turns the skip into a failure.

Every page a test opens through `browser` (or `page_of`) reports the Content-Security-Policy
violations it meets (`securitypolicyviolation` events), and a test whose pages met any fails
at its end: the UI must work under the server's policy (muster.server.security_headers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from muster.home import Home
from tests.server.experiments import ENDED
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

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


# Installed in every page before its own scripts: each violation is reported to the test.
CSP_PROBE = """
window.__musterCspSeen = 0;
document.addEventListener("securitypolicyviolation", (event) => {
  window.__musterCspSeen += 1;
  window.__musterCspViolation(event.violatedDirective + " blocked " + (event.blockedURI || "inline")
    + " at " + event.sourceFile + ":" + event.lineNumber + " on " + location.pathname);
});
"""


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
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


class WatchedBrowser:
    """The browser, for one test: each context it makes reports its CSP violations."""

    def __init__(self, browser: Any) -> None:
        self._browser = browser
        self.violations: list[str] = []

    def new_context(self, **options: Any) -> Any:
        context = self._browser.new_context(**options)
        self._watch(context)
        return context

    def new_page(self, **options: Any) -> Any:
        page = self._browser.new_page(**options)  # in a context of its own, still blank
        self._watch(page.context)
        return page

    def _watch(self, context: Any) -> None:
        context.expose_function("__musterCspViolation", self._report)
        context.add_init_script(CSP_PROBE)

    def _report(self, violation: str) -> None:
        self.violations.append(violation)


@pytest.fixture
def browser(chromium: Any) -> Iterator[WatchedBrowser]:
    """The browser; the test fails if a page it opened broke the Content-Security-Policy."""
    watched = WatchedBrowser(chromium)
    yield watched
    assert not watched.violations, f"CSP violations: {watched.violations}"


@dataclass
class Team:
    """A server with admin, alice (a user) and vera (a viewer), each with a password."""

    server: RunningServer
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, who: str) -> Client:
        return Client(url=self.server.url, token=self.tokens[who], home=Home(self.server.home))

    def run_to_the_end(self, config: str, context: Path) -> dict[str, Any]:
        """alice's experiment of `config` on `context`, once it has COMPLETED."""
        with self.client("alice") as alice:
            exp = alice.create_experiment(config, context)
            ended: dict[str, Any] = wait_until(
                lambda: (e := alice.get_experiment(exp["id"]))["state"] in ENDED and e,
                timeout=240, what="the experiment to end")
        assert ended["state"] == "COMPLETED", ended
        return ended


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    with serving(tmp_path_factory.mktemp("ui") / "home") as server:
        team = Team(server, {"admin": server.token})
        with team.client("admin") as admin:
            admin.edit_user("admin", password=PASSWORD)
            for name, role in (("alice", "user"), ("vera", "viewer")):
                team.tokens[name] = admin.create_user(name, role, password=PASSWORD)["token"]
        yield team


def log_in(page: Any, team: Team, name: str) -> None:
    """Logs `page` in as `name` through the login form (the user's password); it ends on
    the server's list page."""
    page.goto(team.server.url + "/login")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(team.server.url + "/")


@pytest.fixture
def page_of(browser: WatchedBrowser, team: Team) -> Iterator[Any]:
    """`page_of(name)`: a fresh browser context logged in as that user (through the login
    form, with the user's password), on the server's list page."""
    contexts: list[Any] = []

    def open_page(name: str) -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        log_in(page, team, name)
        return page

    yield open_page
    for context in contexts:
        context.close()
