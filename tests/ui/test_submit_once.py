"""Submitting once from the browser (issue 33): a double click on Submit makes one
experiment, the upload shows its progress in MiB, and Cancel aborts it with nothing made."""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, a real browser

CONFIG = "name: {name}\nentrypoint: python run.py\n"
UPLOAD_BYTES_PER_S = 1024 * 1024  # the throttled upload: seconds for a few MiB


def named(team: Team, name: str) -> int:
    with team.client("alice") as alice:
        return sum(exp["name"] == name for exp in alice.list_experiments(archived=True))


def big_archive(tmp_path: Path, mib: int) -> Path:
    """A .tar.gz of `mib` MiB of random bytes (gzip cannot make it smaller) and run.py."""
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "run.py").write_text("print('big')\n")
    (folder / "noise.bin").write_bytes(os.urandom(mib * 1024 * 1024))
    archive = tmp_path / "big.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as packed:
        for path in folder.iterdir():
            packed.add(path, path.name)
    return archive


def throttle_uploads(page: Any) -> None:
    session = page.context.new_cdp_session(page)
    session.send("Network.enable")
    session.send("Network.emulateNetworkConditions", {
        "offline": False, "latency": 0, "downloadThroughput": -1,
        "uploadThroughput": UPLOAD_BYTES_PER_S})


def new_page(page_of: Any, team: Team, name: str) -> Any:
    page = page_of("alice")
    page.goto(team.server.url + "/new")
    page.get_by_label("Config (YAML)").fill(CONFIG.format(name=name))
    return page


def test_a_double_click_on_submit_makes_one_experiment(page_of: Any, team: Team,
                                                       tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "run.py").write_text("print('once')\n")
    page = new_page(page_of, team, "double-clicked")
    page.get_by_label("or the folder itself").set_input_files(folder)
    page.get_by_role("button", name="Submit").dblclick()
    expect(page).to_have_url(re.compile(r"/experiments/\d+$"))
    expect(page.get_by_role("heading", name=re.compile("double-clicked"))).to_be_visible()
    assert named(team, "double-clicked") == 1


def test_the_upload_shows_its_progress_and_the_button_waits(page_of: Any, team: Team,
                                                            tmp_path: Path) -> None:
    archive = big_archive(tmp_path, 4)
    page = new_page(page_of, team, "with-progress")
    page.get_by_label("Context: a .tar.gz or .zip").set_input_files(archive)
    throttle_uploads(page)
    submit = page.get_by_role("button", name="Submit")
    submit.click()
    expect(page.locator("#submit-status")).to_have_text(
        re.compile(r"uploading \d+\.\d+ of 4\.\d+ MiB"))
    expect(submit).to_be_disabled()
    expect(page).to_have_url(re.compile(r"/experiments/\d+$"), timeout=60_000)
    assert named(team, "with-progress") == 1


def test_cancel_aborts_the_upload_and_nothing_is_made(page_of: Any, team: Team,
                                                      tmp_path: Path) -> None:
    archive = big_archive(tmp_path, 8)
    page = new_page(page_of, team, "canceled")
    page.get_by_label("Context: a .tar.gz or .zip").set_input_files(archive)
    throttle_uploads(page)
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#submit-status")).to_contain_text("uploading")
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("#config-problems li")).to_have_text(
        "the upload was canceled; nothing was created")
    expect(page.get_by_role("button", name="Submit")).to_be_enabled()
    expect(page.get_by_role("button", name="Cancel")).to_be_hidden()
    assert named(team, "canceled") == 0
