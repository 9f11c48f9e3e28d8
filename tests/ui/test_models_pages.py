"""The model registry in the web UI, in Chromium against a real server with real runs: a
verified trial registered from its page (the form, and a checkpoint row's button), then
listed on /models and shown on /models/{name} with its verified badge, its lineage and links
that lead to its trial, experiment and snapshot diff; a trial that was not verified offered
only to an admin, whose version carries the "unverified: reason, by whom" mark (and the
server's refusal without a reason is shown in the page); nothing to register for a viewer;
the New model form; and a version's download, a tar.gz of its checkpoint's files."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server.experiments import FIXTURES, only_trial, wait_trial
from tests.ui.conftest import Team

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def trials(team: Team, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """alice's trials of search_job.py once at rest: `verified` (its planned 3 steps) and
    `suspect` (expected to reach 10, it stops at 3), as `GET /trials/{id}` shows them."""
    tmp = tmp_path_factory.mktemp("models")
    started = {}
    with team.client("alice") as alice:
        for name, verify in (("verified", {}), ("suspect", {"expected_length": {"steps": 10}})):
            context = tmp / name
            context.mkdir()
            shutil.copy2(FIXTURES / "search_job.py", context / "search_job.py")
            config = {"name": f"models-{name}", "entrypoint": ["python", "search_job.py"],
                      "harness": True, "hyperparameters": {"x": 0.5}, "verify": verify,
                      "searcher": {"name": "single", "metric": "loss", "max_length": 3}}
            started[name] = only_trial(alice.create_experiment(json.dumps(config), context))
        found = {name: wait_trial(alice, trial["id"], {"SUCCEEDED", "SUSPECT", "FAILED"},
                                  timeout=120) for name, trial in started.items()}
    assert {name: t["state"] for name, t in found.items()} == {
        "verified": "SUCCEEDED", "suspect": "SUSPECT"}, found
    assert found["verified"]["verified"] is True, found["verified"]
    return found


def test_a_verified_trial_registered_from_its_page_is_listed_with_its_lineage(
        page_of: Any, team: Team, trials: dict[str, dict[str, Any]]) -> None:
    trial = trials["verified"]
    page = page_of("alice")
    page.goto(f"{team.server.url}/trials/{trial['id']}")
    section = page.locator("#register")
    form = section.locator("form")
    result = section.locator(".register-result")
    form.locator("select[name=model]").select_option(value="")  # a new model
    form.get_by_label("New model's name").fill("digits-mlp")
    form.get_by_role("button", name="Register").click()
    expect(result).to_have_text(f"Registered digits-mlp v1 (verified), checkpoint "
                                f"{_checkpoint(team, trial)['uuid']}.")
    expect(result).to_have_class("register-result banner info")

    row_button = page.locator("#trial-checkpoints button[data-register-checkpoint]")
    expect(row_button).to_have_count(1)
    row_button.click()  # picks its checkpoint in the form; the model made is picked too
    expect(form.locator("select[name=checkpoint]")).to_have_value(_checkpoint(team, trial)["uuid"])
    expect(form.locator("select[name=model]")).to_have_value("digits-mlp")
    form.get_by_role("button", name="Register").click()
    expect(result).to_contain_text("Registered digits-mlp v2 (verified)")
    result.get_by_role("link", name="digits-mlp v2").click()
    page.wait_for_url(f"{team.server.url}/models/digits-mlp#v2")

    page.locator("header nav").get_by_role("link", name="Models").click()
    listed = page.locator("tr[data-model=digits-mlp]")
    expect(listed.locator("td.num")).to_have_text("2")
    expect(listed.locator("td.latest")).to_have_text("v2 none verified")
    listed.get_by_role("link", name="digits-mlp").click()

    model = _model(team, "digits-mlp")
    rows = page.locator("table.versions tbody tr")
    expect(rows).to_have_count(2)
    for row, version in zip((rows.nth(0), rows.nth(1)), model["versions"], strict=True):
        expect(row.locator("td.verification .badge.verified")).to_have_text("verified")
        expect(row).to_contain_text("by alice")
        expect(row).to_contain_text(f"loss={version['metrics']['loss']:.4g}")
    expect(rows.nth(0).locator("a.diff-link")).to_have_count(0)  # v1 has none before it
    lineage = page.locator("#lineage-v2")  # the newest, open
    snapshot = model["versions"][1]["snapshot"]
    expect(lineage.locator("td.checkpoint")).to_contain_text(model["versions"][1]["checkpoint_uuid"])
    expect(lineage.locator("td.checkpoint")).to_contain_text("step 3")
    expect(lineage.locator("td.snapshot-code")).to_have_text(snapshot["code"])
    expect(lineage).to_contain_text(snapshot["config_sha256"])
    expect(lineage.locator("table.checks tbody tr")).to_have_count(
        len(trial["verification"]["checks"]))

    rows.nth(0).locator("a.trial-link").click()
    page.wait_for_url(f"{team.server.url}/trials/{trial['id']}")
    expect(page.locator("h1")).to_contain_text(f"Trial {trial['id']}")
    page.go_back()
    rows.nth(0).locator("a.experiment-link").click()
    page.wait_for_url(f"{team.server.url}/experiments/{trial['experiment_id']}")
    expect(page.locator("h1")).to_contain_text("models-verified")
    page.go_back()
    rows.nth(1).locator("a.diff-link").click()
    page.wait_for_url(f"{team.server.url}/trials/{trial['id']}/diff?other={trial['id']}")
    expect(page.locator("h1")).to_have_text(f"Trial {trial['id']} vs trial {trial['id']}")


def test_an_unverified_trial_is_offered_to_an_admin_only_and_its_version_is_marked(
        page_of: Any, team: Team, trials: dict[str, dict[str, Any]]) -> None:
    trial = trials["suspect"]
    owner = page_of("alice")
    owner.goto(f"{team.server.url}/trials/{trial['id']}")
    expect(owner.locator("#verdict")).to_contain_text("SUSPECT")
    expect(owner.locator("#register")).to_have_count(0)
    expect(owner.locator("button[data-register-checkpoint]")).to_have_count(0)

    admin = page_of("admin")
    admin.goto(f"{team.server.url}/trials/{trial['id']}")
    section = admin.locator("#register")
    expect(section.locator(".banner.warn")).to_contain_text("This trial is not verified")
    form = section.locator("form")
    form.locator("select[name=model]").select_option(value="")
    form.get_by_label("New model's name").fill("short-run")
    form.get_by_role("button", name="Register").click()  # no reason: the server says why not
    result = section.locator(".register-result")
    expect(result).to_contain_text(f"trial {trial['id']} is not verified")
    expect(result).to_contain_text("--accept-unverified")
    expect(result).to_have_class("register-result banner error")
    form.get_by_label("Accept unverified: why").fill("a baseline to beat")
    expect(form.locator("select[name=model]")).to_have_value("short-run")  # made by the first try
    form.get_by_role("button", name="Register").click()
    expect(result).to_contain_text(
        "Registered short-run v1 (unverified: a baseline to beat, by admin)")

    viewer = page_of("vera")
    viewer.goto(f"{team.server.url}/models")
    mark = "unverified: a baseline to beat, by admin"
    expect(viewer.locator("tr[data-model=short-run] .badge.unverified-mark")).to_have_text(mark)
    viewer.goto(f"{team.server.url}/models/short-run")
    shown = viewer.locator("table.versions tbody tr").first.locator("td.verification .badge")
    expect(shown).to_have_text(mark)
    expect(shown).to_have_class("badge unverified-mark")
    expect(viewer.locator("#lineage-v1 summary .badge.unverified-mark")).to_have_text(mark)
    colours = shown.evaluate("b => [getComputedStyle(b).color, getComputedStyle(b).fontWeight]")
    assert colours[1] == "600" and colours[0] != "rgb(0, 0, 0)", colours  # a warning, in bold


def test_a_viewer_is_offered_no_register_and_a_user_makes_a_model(
        page_of: Any, team: Team, trials: dict[str, dict[str, Any]]) -> None:
    viewer = page_of("vera")
    viewer.goto(f"{team.server.url}/trials/{trials['verified']['id']}")
    expect(viewer.locator("#verdict")).to_contain_text("verified")
    expect(viewer.locator("#register")).to_have_count(0)
    expect(viewer.locator("button[data-register-checkpoint]")).to_have_count(0)
    viewer.goto(f"{team.server.url}/models")
    expect(viewer.locator("form[data-act]")).to_have_count(0)

    user = page_of("alice")
    user.locator("header nav").get_by_role("link", name="Models").click()
    expect(user.locator("header nav a[aria-current]")).to_have_text("Models")
    form = user.locator("section.new-model form")
    form.get_by_label("Name").fill("made-here")
    form.get_by_label("Description").fill("made from the <b>form</b>")
    form.get_by_role("button", name="Create").click()
    made = user.locator("tr[data-model=made-here]")
    expect(made).to_contain_text("made from the <b>form</b>")  # as text
    expect(made.locator("td.latest")).to_have_text("none yet")
    form.get_by_label("Name").fill("made-here")
    form.get_by_role("button", name="Create").click()
    expect(user.locator("#problem")).to_contain_text("a model named 'made-here' exists")


def test_a_version_downloads_as_a_tar_gz_of_its_checkpoint(
        page_of: Any, team: Team, trials: dict[str, dict[str, Any]]) -> None:
    trial = trials["verified"]
    with team.client("alice") as alice:
        alice.create_model("downloaded")
        alice.register_model_version("downloaded", trial["id"])
    page = page_of("vera")
    page.goto(f"{team.server.url}/models/downloaded")
    link = page.locator("table.versions a.download")
    expect(link).to_have_attribute("href", "/api/v1/models/downloaded/versions/1/download")
    with page.expect_download() as info:
        link.click()
    assert info.value.suggested_filename == "downloaded-v1.tar.gz"
    data = Path(info.value.path()).read_bytes()
    assert data[:2] == b"\x1f\x8b"  # gzip

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        files = {member.name: archive.extractfile(member).read()  # type: ignore[union-attr]
                 for member in archive.getmembers() if member.isfile()}
    checkpoint = Path(_checkpoint(team, trial)["path"])
    on_disk = {f"downloaded-v1/{p.relative_to(checkpoint)}": p.read_bytes()
               for p in checkpoint.rglob("*") if p.is_file()}
    assert files == on_disk
    listed = json.loads(files["downloaded-v1/metadata.json"])["files"]
    assert {f"downloaded-v1/{path}": sha for path, sha in listed.items()} == {
        name: hashlib.sha256(data).hexdigest() for name, data in files.items()
        if name != "downloaded-v1/metadata.json"}


def test_a_model_page_fits_a_narrow_screen(
        page_of: Any, team: Team, trials: dict[str, dict[str, Any]]) -> None:
    with team.client("admin") as admin:
        admin.create_model("narrow", "a model page at 400 px")
        admin.register_model_version("narrow", trials["suspect"]["id"],
                                     accept_unverified="a long reason " * 8)
    page = page_of("vera")
    page.set_viewport_size({"width": 400, "height": 800})
    for path in ("/models", "/models/narrow"):
        page.goto(team.server.url + path)
        expect(page.locator("main h1")).to_be_visible()
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 400, f"{path} is {wide} px wide at 400 px"


def _checkpoint(team: Team, trial: dict[str, Any]) -> dict[str, Any]:
    with team.client("admin") as admin:
        [checkpoint] = admin.list_checkpoints(trial["id"])
    return dict(checkpoint)


def _model(team: Team, name: str) -> dict[str, Any]:
    with team.client("admin") as admin:
        return dict(admin.get_model(name))
