"""`make screenshots`: the web UI's pages as PNGs in docs/ui/, from a real server and a real
search.

Starts `muster up --detach` on a fresh home in a temporary directory and runs, through the
API, a short adaptive ASHA search of the digits example (examples/digits/search.yaml cut to
12 trials of up to 8 epochs, 2 at a time), its silent-drop example (a trial that ends
SUSPECT) and a run with a mistyped data path (a trial that fails). It takes each page in
Debian's Chromium (/usr/bin/chromium, as tests/ui drives it) at 1280x800, signed in as the
home's admin by its token, the cluster while they run and the others once they have ended,
and writes docs/ui/{login,experiments,experiment,trial,cluster,new}.png, each also in the
dark colours (NAME-dark.png, the browser's scheme set dark), and README's picture,
docs/screenshot.png: the experiment page's first screen in 64 colours. About 2 minutes on
2 cores (more when they are busy); the server stops and the home is deleted at the end.
"""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from muster.client import Client
from muster.home import Home

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "examples" / "digits"
OUT = REPO / "docs" / "ui"
README_PICTURE = REPO / "docs" / "screenshot.png"
CHROMIUM = Path("/usr/bin/chromium")
# As tests/ui/conftest.py: Chromium as root, headless, quiet on a closed network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
VIEWPORT = {"width": 1280, "height": 800}
EXPERIMENT_HEIGHT = 1800  # the experiment's trials and charts, not all its events
WAIT_MS = 60_000  # a bound on any one wait, not a measure
# The search, small enough to end in a minute or two (12 trials: enough for the importance
# chart, which needs 10), rungs at epochs 2, 4 and 8.
SEARCH = {"max_trials": 12, "max_concurrent_trials": 2, "max_length": 8, "divisor": 2,
          "max_rungs": 3}
MISTYPED = """\
name: digits-mlp-typo
description: a data path that does not exist, as one types it by mistake
labels: [example, digits]
entrypoint: python train.py --data dta --epochs 3
harness: true
failure_policy: {trial_retries: 0, stop_grace: 10s}
"""


def main() -> int:
    if not CHROMIUM.exists():
        print(f"no {CHROMIUM}: `make install` installs Debian's chromium where apt runs as "
              "root", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="muster-screenshots-") as tmp:
        root = Path(tmp)
        context = _context(root / "digits")
        with _server(root / "home") as client, _chromium() as browser:
            token = Home(root / "home").token_path.read_text().strip()
            shots = _take(Camera(browser, client.url, token), client, context)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, png in shots.items():
        (OUT / f"{name}.png").write_bytes(png)
        print(f"docs/ui/{name}.png: {len(png) / 1024:.0f} KiB")
    small = first_screen(shots["experiment"])
    README_PICTURE.write_bytes(small)
    print(f"{README_PICTURE.relative_to(REPO)}: {len(small) / 1024:.0f} KiB")
    return 0


def first_screen(png: bytes) -> bytes:
    """A page's first viewport of a PNG, in a palette of 64 colours: README's picture stays
    small (the pages are flat colours and text, which a palette keeps sharp)."""
    from PIL import Image  # muster[examples]; only this picture needs it

    page = Image.open(io.BytesIO(png)).convert("RGB")
    screen = page.crop((0, 0, VIEWPORT["width"], min(page.height, VIEWPORT["height"])))
    out = io.BytesIO()
    screen.quantize(colors=64).save(out, format="PNG", optimize=True)
    return out.getvalue()


def _take(camera: Camera, client: Client, context: Path) -> dict[str, bytes]:
    """The runs, and each page as a PNG by name, light and dark (`NAME-dark`): the cluster
    while they run, the others once they have ended (the trial's: the search's best)."""
    shots: dict[str, bytes] = {}

    def both(name: str, path: str, ready: str, **options: Any) -> None:
        for scheme, suffix in (("light", ""), ("dark", "-dark")):
            shots[name + suffix] = camera.shot(path, ready, scheme=scheme, **options)

    both("login", "/login", "form", signed_in=False)
    search, others = _submit(client, context)
    _wait(lambda: sum(j["state"] == "RUNNING" for j in client.list_jobs()) >= 2)
    both("cluster", "/cluster", "a[href^='/trials/']")
    for exp in others:
        client.wait_experiment(exp["id"])
    search = client.wait_experiment(search["id"])
    best = (search["search"]["best"] or {}).get("trial_id") or search["trials"][0]["id"]
    both("experiments", "/", "table.list tbody tr")
    both("experiment", f"/experiments/{search['id']}", "table.trials",
         height=EXPERIMENT_HEIGHT)
    both("trial", f"/trials/{best}", "#log:not(:empty)", height=None)
    both("new", "/new", "main form")
    return shots


def _context(context: Path) -> Path:
    """train.py and the digits PNGs, with the damaged copy the silent-drop example reads."""
    context.mkdir(parents=True)
    shutil.copy(DIGITS / "train.py", context)
    subprocess.run([sys.executable, str(DIGITS / "prepare_data.py"), "--out",
                    str(context / "data"), "--corrupt", "0.12"], check=True,
                   capture_output=True)
    return context


@contextmanager
def _server(home: Path) -> Iterator[Client]:
    """`muster up --detach` on `home`; on the way out every run still going is killed and the
    server stopped (`muster down` leaves trials running, for a restart)."""
    port = _free_port()
    muster = [sys.executable, "-m", "muster"]
    subprocess.run([*muster, "up", "--detach", "--home", str(home), "--port", str(port),
                    "--slots", "2", "--min-free-disk", "1GiB"], check=True)
    try:
        with Client(url=f"http://127.0.0.1:{port}", home=Home(home)) as client:
            try:
                yield client
            finally:
                for exp in client.list_experiments():
                    if exp["state"] in ("ACTIVE", "PAUSED"):
                        client.kill_experiment(exp["id"])
    finally:
        subprocess.run([*muster, "down", "--home", str(home)], check=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _submit(client: Client, context: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The search, then the SUSPECT run and the failing one (they queue behind it)."""
    config = yaml.safe_load((DIGITS / "search.yaml").read_text())
    config["searcher"].update(SEARCH)
    search = client.create_experiment(yaml.safe_dump(config, sort_keys=False), context)
    others = [client.create_experiment(text, context) for text in (
        (DIGITS / "experiment-corrupt.yaml").read_text(), MISTYPED)]
    print(f"running experiments {search['id']}, {others[0]['id']} and {others[1]['id']}...",
          file=sys.stderr, flush=True)
    return search, others


def _wait(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing ran within {WAIT_MS / 1000:.0f} s")
        time.sleep(0.2)


@contextmanager
def _chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass(frozen=True)
class Camera:
    """Takes the server's pages at 1280x800, signed in as the admin by token."""

    browser: Any
    url: str
    token: str

    def shot(self, path: str, ready: str, *, height: int | None = 0,
             signed_in: bool = True, scheme: str = "light") -> bytes:
        """The page at `path` in the `scheme` colours ("light" or "dark") once `ready` (a CSS
        selector) is on it and each of its charts has drawn: the viewport (`height` 0), the
        whole page (None), or its first `height` pixels. Not "network idle": a live page
        holds its event stream open for as long as it is shown."""
        headers = {"Authorization": f"Bearer {self.token}"} if signed_in else {}
        context = self.browser.new_context(viewport=VIEWPORT, extra_http_headers=headers,
                                           color_scheme=scheme)
        try:
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(self.url + path, wait_until="load")
            page.locator(ready).first.wait_for()
            # The sections under the curves draw once scrolled near: brought near in turn,
            # then the page back at its top.
            for chart in ("#curves", "#hp-charts", "#metric-charts"):
                if page.locator(chart).count():
                    page.locator(chart).scroll_into_view_if_needed()
                    page.locator(f"{chart}[data-drawn]").wait_for()
            if page.locator("#importance").count():
                page.locator("#importance").scroll_into_view_if_needed()
                page.locator("#importance .bar, #importance .chart-note").first.wait_for()
            if page.locator("#parallel").count():
                page.locator("#parallel").scroll_into_view_if_needed()
                page.locator("#parallel[data-axes]").wait_for()
            page.evaluate("window.scrollTo(0, 0)")
            if not height:
                png: bytes = page.screenshot(full_page=height is None, animations="disabled")
                return png
            whole = page.evaluate("document.documentElement.scrollHeight")
            png = page.screenshot(full_page=True, animations="disabled", clip={
                "x": 0, "y": 0, "width": VIEWPORT["width"], "height": min(height, whole)})
            return png
        finally:
            context.close()


if __name__ == "__main__":
    sys.exit(main())
