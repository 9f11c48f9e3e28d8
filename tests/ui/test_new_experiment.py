"""Starting runs from the browser: a zip upload, a folder packed in the page, the server's
problems listed by key path, and "Run again" with the earlier snapshot."""

from __future__ import annotations

import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, real trials, a real browser

SCRIPT = ("import sys, time\nprint(open('message.txt').read().strip(), flush=True)\n"
          "for i in range(200):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\n")
CONFIG = "name: {name}\nentrypoint: python run.py\n"


def project(where: Path, message: str) -> Path:
    where.mkdir(parents=True)
    (where / "run.py").write_text(SCRIPT)
    (where / "message.txt").write_text(message + "\n")
    (where / "__pycache__").mkdir()
    (where / "__pycache__" / "junk.pyc").write_bytes(b"\x00" * 10)
    return where


def submit_page(page: Any, team: Team, config: str) -> None:
    page.goto(team.server.url + "/new")
    page.get_by_label("Config (YAML)").fill(config)


def test_a_zip_upload_starts_a_run_whose_log_comes_live(page_of: Any, team: Team,
                                                        tmp_path: Path) -> None:
    folder = project(tmp_path / "zipped", "hello from a zip")
    archive = tmp_path / "project.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for name in ("run.py", "message.txt"):
            zipped.write(folder / name, name)
    page = page_of("alice")
    submit_page(page, team, CONFIG.format(name="from-a-zip"))
    page.get_by_label("Context: a .tar.gz or .zip").set_input_files(archive)
    page.get_by_role("button", name="Submit").click()
    expect(page).to_have_url(re.compile(r"/experiments/\d+$"))
    expect(page.get_by_role("heading", name=re.compile("from-a-zip"))).to_be_visible()
    page.locator("table.trials tbody a").first.click()
    expect(page.locator("#log")).to_contain_text("hello from a zip")
    expect(page.locator("#log")).to_contain_text("tick 20")


def test_a_folder_is_packed_in_the_browser(page_of: Any, team: Team, tmp_path: Path) -> None:
    folder = project(tmp_path / "picked", "hello from a folder")
    page = page_of("alice")
    submit_page(page, team, CONFIG.format(name="from-a-folder"))
    page.get_by_label("or the folder itself").set_input_files(folder)
    page.get_by_role("button", name="Submit").click()
    expect(page).to_have_url(re.compile(r"/experiments/\d+$"))
    experiment_id = int(page.url.rsplit("/", 1)[1])
    page.locator("table.trials tbody a").first.click()
    expect(page.locator("#log")).to_contain_text("hello from a folder")
    with team.client("alice") as alice:
        exp = alice.get_experiment(experiment_id)
    snapshot = Path(team.server.home) / "experiments" / exp["uuid"] / "context"
    assert sorted(p.name for p in snapshot.iterdir()) == ["message.txt", "run.py"]


def test_the_server_s_problems_are_listed_by_key_path(page_of: Any, team: Team) -> None:
    page = page_of("alice")
    submit_page(page, team, "name: broken\nentrypoint: [1]\nresources: {replicas: 0}\n")
    page.get_by_role("button", name="Submit").click()
    problems = page.locator("#config-problems li")
    expect(problems.filter(has_text="entrypoint[0]: must be a string")).to_have_count(1)
    expect(problems.filter(has_text="resources.replicas:")).to_have_count(1)
    expect(page).to_have_url(team.server.url + "/new")


def test_run_again_edits_the_config_and_reuses_the_snapshot(page_of: Any, team: Team,
                                                            tmp_path: Path) -> None:
    folder = project(tmp_path / "first", "hello again")
    with team.client("alice") as alice:
        first = alice.create_experiment(CONFIG.format(name="first-run"), folder)
    page = page_of("alice")
    page.goto(f"{team.server.url}/experiments/{first['id']}")
    page.get_by_role("link", name="Run again").click()
    editor = page.get_by_label("Config (YAML)")
    expect(editor).to_have_value(CONFIG.format(name="first-run"))
    editor.fill(CONFIG.format(name="second-run"))
    page.get_by_role("button", name="Submit").click()
    expect(page.get_by_role("heading", name=re.compile("second-run"))).to_be_visible()
    page.locator("table.trials tbody a").first.click()
    expect(page.locator("#log")).to_contain_text("hello again")


def test_a_viewer_has_no_new_experiment(page_of: Any, team: Team) -> None:
    page = page_of("vera")
    expect(page.get_by_role("link", name="New experiment")).to_have_count(0)
    page.goto(team.server.url + "/new")
    expect(page.locator("main .banner.error")).to_contain_text(
        "viewer vera cannot submit experiments")


def test_a_submit_after_the_session_ended_says_so_and_keeps_the_config(
    page_of: Any, team: Team, tmp_path: Path
) -> None:
    """Not the API's "send Authorization: Bearer": the page says the session ended, links a
    login beside it, and keeps what was typed."""
    archive = tmp_path / "project.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        packed.add(project(tmp_path / "p", "never run"), arcname=".")
    page = page_of("alice")
    config = CONFIG.format(name="after-the-session")
    submit_page(page, team, config)
    page.get_by_label("Context: a .tar.gz or .zip").set_input_files(archive)
    with team.client("admin") as admin:
        before = len(admin.list_experiments())
        for session in admin.list_sessions(user="alice"):
            admin.end_session(session["id"])
    page.get_by_role("button", name="Submit").click()
    problems = page.locator("#config-problems")
    expect(problems).to_contain_text("Your session has ended, so nothing was submitted")
    link = problems.get_by_role("link", name="log in again in a new tab")
    expect(link).to_have_attribute("target", "_blank")
    expect(page.get_by_label("Config (YAML)")).to_have_value(config)
    expect(page.get_by_role("button", name="Submit")).to_be_enabled()
    with team.client("admin") as admin:
        assert len(admin.list_experiments()) == before
