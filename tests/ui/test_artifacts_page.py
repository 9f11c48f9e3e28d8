"""A trial's artifacts on its page, in Chromium against a real server: the files listed
once the server copied them (without a reload: the section comes with the trial's live
parts), each downloaded byte-exact from its link, and the files left named with why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from muster.home import Home
from tests.server.experiments import only_trial
from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, a real browser

SCRIPT = """\
import os, struct, sys, time, zlib
from pathlib import Path


def png(width, height):
    raw = b"".join(b"\\x00" + bytes([200, 30, 30] * width) for _ in range(height))
    def chunk(kind, data):
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


while not Path(sys.argv[1]).exists():  # the test opens the page first
    time.sleep(0.05)
Path("plots").mkdir()
Path("plots/loss.csv").write_text("step,loss\\n1,0.9\\n2,0.4\\n")
Path("model.pt").write_bytes(bytes(range(256)) * 64)
Path("plots/curve.png").write_bytes(png(40, 20))
Path("plots/notes.json").write_text('{"note": "<script>window.pwned = 1</script>"}')
os.symlink("/etc/hostname", "plots/host.csv")
"""


def test_the_trial_page_lists_its_artifacts_and_each_downloads_byte_exact(
        page_of: Any, team: Team, tmp_path: Path) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(SCRIPT)
    gate = tmp_path / "gate"
    config = json.dumps({"name": "with-artifacts", "artifacts": ["model.pt", "plots/"],
                         "entrypoint": ["python", "train.py", str(gate)]})
    with team.client("alice") as alice:
        trial = only_trial(alice.create_experiment(config, context))
    page = page_of("alice")
    page.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(page.locator("#trial-artifacts section")).to_have_count(0)  # none while it runs
    gate.touch()

    section = page.locator("#trial-artifacts")
    expect(section.locator(".artifacts-state")).to_contain_text("collected, 4 files",
                                                                timeout=30_000)
    rows = section.locator("tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.nth(0)).to_contain_text("model.pt")
    expect(rows.nth(2)).to_contain_text("plots/loss.csv")
    workdir = Home(team.server.home).run_dir(trial["uuid"]).workdir
    for name, relative in (("model.pt", "model.pt"), ("loss.csv", "plots/loss.csv")):
        with page.expect_download() as info:
            section.get_by_role("link", name=name).click()
        download = info.value
        assert download.suggested_filename == name
        assert Path(download.path()).read_bytes() == (workdir / relative).read_bytes()
    section.locator("summary").click()
    expect(section.locator(".artifacts-left")).to_contain_text(
        "plots/host.csv: a link, not followed")
    expect(rows.nth(0).locator("a.view")).to_have_count(0)  # a .pt is downloaded, not shown

    rows.nth(2).get_by_role("link", name="view").click()  # the CSV, as a table
    expect(page.locator("table.artifact-table tr")).to_have_count(3)
    expect(page.locator("table.artifact-table tr").nth(2)).to_contain_text("0.4")
    page.go_back()
    rows.nth(3).get_by_role("link", name="view").click()  # the JSON, as text: never markup
    expect(page.locator("pre.artifact-text")).to_contain_text("<script>window.pwned = 1")
    assert page.evaluate("window.pwned") is None
    page.go_back()
    rows.nth(1).get_by_role("link", name="view").click()  # the PNG, drawn
    image = page.locator("img.artifact-image")
    expect(image).to_be_visible()
    page.wait_for_function("document.querySelector('img.artifact-image').complete")
    assert image.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [40, 20]
