"""A user's string is never code in another user's page (attack X1: a metric named
`<img src=x onerror=...>`, written into an admin's page with innerHTML, which then ran a
second stage read from the user's own trial log).

Three walls, each tested: the browser code never writes markup and the templates hold no
inline script, style or handler (read from the files); the server's Content-Security-Policy
stops inline script even where markup did get in (Chromium); the config refuses such a name
(the API's 422). And the old data that got in before the rule shows as text, running nothing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from muster import ui
from muster.metrics_lines import NAME_RULE
from muster.store import Experiment
from tests.ui.conftest import Team, WatchedBrowser

SCRIPTS = sorted(ui.STATIC.glob("*.js"))  # ours; vendor/ is htmx's and uPlot's
TEMPLATES = sorted(ui.TEMPLATES.glob("*.html"))
# Every way a script turns a string into markup or code.
MARKUP_WRITES = re.compile(r"\b(innerHTML|outerHTML|insertAdjacentHTML|document\.write|srcdoc"
                           r"|createContextualFragment|parseFromString|eval|Function)\b"
                           r"|\.setAttribute\(\s*[\"'](on|style|href|src)")
# What a CSP without 'unsafe-inline' refuses in a page, and htmx's eval'd attributes.
INLINE = {
    "an inline <script>": re.compile(r"<script(?![^>]*\ssrc=)[^>]*>|<script[^>]*>[^<\s]",
                                     re.IGNORECASE),
    "a <style> element": re.compile(r"<style\b", re.IGNORECASE),
    "a style attribute": re.compile(r"\sstyle\s*=", re.IGNORECASE),
    "an on...= handler": re.compile(r"\son[a-z]+\s*=", re.IGNORECASE),
    "an hx-on handler": re.compile(r"\s(data-)?hx-on", re.IGNORECASE),
    "a javascript: or js: value": re.compile(r"(javascript|\bjs):", re.IGNORECASE),
    "an htmx [condition] (eval)": re.compile(r"hx-trigger=\"[^\"]*\[", re.IGNORECASE),
}
JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)  # never sent to the browser

HOSTILE = "<img src=x onerror=\"window.__pwned=1;fetch('{receiver}/pwned')\">"
TRAIN = """\
import muster.harness as mh

print("window.__pwned = 1;", flush=True)  # what X1's second stage read from its own log
with mh.init() as ctx:
    for epoch in range(1, 4):
        ctx.report_validation(epoch, {"val_loss": ctx.hparams["lr"] / epoch})
"""
SEARCH = """\
name: x1
entrypoint: python train.py
harness: true
verify: {require_checkpoint: false}
hyperparameters:
  lr: {type: double, minval: 0.1, maxval: 0.9}
searcher: {name: random, metric: val_loss, max_trials: 2}
"""


def test_ui_scripts_never_write_markup() -> None:
    assert {path.name for path in SCRIPTS} >= {"charts.js", "log.js", "muster.js", "new.js"}
    found = [f"{path.name}:{number}: {line.strip()}" for path in SCRIPTS
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if MARKUP_WRITES.search(line)]
    assert not found, "build the DOM with textContent/createElement/replaceChildren:\n" + \
        "\n".join(found)


def test_templates_hold_no_inline_script_style_or_handler() -> None:
    assert len(TEMPLATES) >= 10
    found = [f"{path.name}: {what}: {match.group(0)!r}" for path in TEMPLATES
             for what, pattern in INLINE.items()
             for match in pattern.finditer(JINJA_COMMENT.sub("", path.read_text()))]
    assert not found, "move it into static/*.js or muster.css:\n" + "\n".join(found)


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server of the test's own: (its URL, the paths asked of it)."""
    asked: list[str] = []

    class Record(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads `asked`, not stderr

    server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.lifecycle  # a real server, a real browser
def test_the_policy_stops_inline_script_that_got_into_a_page(
        browser: WatchedBrowser, team: Team, receiver: tuple[str, list[str]]) -> None:
    """Were markup ever written from data again, its handler would not run: the CSP alone
    stops it, and the test's watch reports the violation."""
    url, asked = receiver
    page = browser.new_page()
    page.goto(team.server.url + "/login")
    page.evaluate("(html) => document.body.insertAdjacentHTML('beforeend', html)",
                  HOSTILE.format(receiver=url))
    page.wait_for_function("window.__pwned === undefined && window.__musterCspSeen > 0")
    assert page.evaluate("window.__pwned") is None and asked == []
    assert any("script-src" in v for v in browser.violations), browser.violations
    browser.violations.clear()  # seen: this test's violation was the point
    page.close()


@pytest.mark.lifecycle  # a real server
def test_a_hostile_metric_name_is_refused_with_the_rule(team: Team) -> None:
    config = SEARCH.replace("metric: val_loss", "metric: '<img src=x onerror=alert(1)>'")
    answer = httpx.post(f"{team.server.url}/api/v1/experiments",
                        files={"config": (None, config)},
                        headers={"Authorization": f"Bearer {team.tokens['alice']}"}, timeout=30)
    assert answer.status_code == 422, answer.text
    message = answer.json()["message"]
    assert "searcher.metric: a metric name must be " + NAME_RULE in message
    assert "got '<img src=x onerror=alert(1)>'" in message


@pytest.fixture(scope="module")
def finished(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    context = tmp_path_factory.mktemp("x1")
    (context / "train.py").write_text(TRAIN)
    return team.run_to_the_end(SEARCH, context)


def _plant(team: Team, experiment_id: int, metric: str) -> None:
    """The searcher's metric written straight into the stored config, as an experiment made
    before the name rule would hold it."""
    with team.server.store() as store, store.session_scope() as s:
        exp = s.get(Experiment, experiment_id)
        assert exp is not None
        exp.config = {**exp.config, "searcher": {**exp.config["searcher"], "metric": metric}}


@pytest.mark.lifecycle  # a real server, real trials, a real browser
def test_an_old_hostile_metric_name_shows_as_text_and_runs_nothing(
        page_of: Any, team: Team, finished: dict[str, Any],
        receiver: tuple[str, list[str]]) -> None:
    url, asked = receiver
    page = page_of("admin")
    page.goto(f"{team.server.url}/experiments/{finished['id']}")
    # a legitimate name charts: both trials' curves, and val_loss against lr
    expect(page.locator("#curves[data-drawn]")).to_have_attribute("data-curves", "2")
    page.locator("#hp-charts").scroll_into_view_if_needed()  # drawn once near the screen
    expect(page.locator("#hp-charts[data-drawn] .hp-chart canvas")).to_have_count(1)

    hostile = HOSTILE.format(receiver=url)
    _plant(team, finished["id"], hostile)
    page.reload()
    page.locator("#hp-charts").scroll_into_view_if_needed()
    expect(page.locator("#hp-charts[data-drawn]")).to_have_text(
        f"No SUCCEEDED trial has a value of {hostile} yet.")
    expect(page.locator("#curves-note")).to_have_text(f"No trial has reported {hostile} yet.")
    expect(page.locator("h2").first).to_have_text(f"Learning curves: {hostile} against steps")
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None and asked == []


@pytest.mark.lifecycle  # a real server, real trials, a real browser
def test_a_trial_page_of_the_old_experiment_still_charts(
        page_of: Any, team: Team, finished: dict[str, Any]) -> None:
    page = page_of("admin")
    page.goto(f"{team.server.url}/trials/{finished['trials'][0]['id']}")
    charts = page.locator("#metric-charts[data-drawn]")
    expect(charts).to_have_attribute("data-curves", "1")
    expect(charts).to_contain_text("validation val_loss (3 reports")


@pytest.mark.lifecycle  # a real server, real trials, a real browser
def test_a_trial_log_never_runs_as_a_script(page_of: Any, team: Team,
                                            finished: dict[str, Any]) -> None:
    """The log is shown as text, and served as text/plain or a download with nosniff: a
    `<script src>` of it (allowed by script-src 'self') is refused."""
    trial = finished["trials"][0]["id"]
    page = page_of("admin")
    page.goto(f"{team.server.url}/trials/{trial}")
    expect(page.locator("#log")).to_contain_text("window.__pwned = 1;")
    for path in (f"/api/v1/trials/{trial}/logs?tail=10",
                 f"/api/v1/trials/{trial}/logs/download?rank=0"):
        outcome = page.evaluate("""(src) => new Promise((done) => {
            const script = document.createElement("script");
            script.onload = () => done("ran");
            script.onerror = () => done("refused");
            script.src = src;
            document.head.appendChild(script);
        })""", path)
        assert outcome == "refused", path
    assert page.evaluate("window.__pwned") is None
