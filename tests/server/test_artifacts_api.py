"""A trial's artifacts through a real server: its final attempt's files that the config names
are copied when the trial ends, listed with their sha256 (`GET /trials/{id}/artifacts`,
`muster trial artifacts`) and downloaded byte-exact; a stale file attempt 1 left before it
was SIGKILLed, and a link to the server's token, are named and left."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from muster.cli import app
from muster.client import Client
from muster.errors import NotFound
from muster.home import Home
from tests.server.experiments import only_trial, wait_ended
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server and real trials

server = shared_server()

SCRIPT = """\
import os, signal, sys
from pathlib import Path

attempt = os.environ["MUSTER_ATTEMPT"]
Path("eval").mkdir(exist_ok=True)
Path("model.pt").write_bytes(b"weights of attempt " + attempt.encode() * 40000)
if attempt == "1":
    Path("eval/stale.json").write_text('{"from": "attempt 1"}')
    os.kill(os.getpid(), signal.SIGKILL)
Path("eval/report.json").write_text('{"a": 1}')
os.symlink(sys.argv[1], "eval/token.json")
Path("notes.txt").write_text("not an artifact")
"""


def _submit(client: Client, tmp_path: Path, token: str, **config: Any) -> dict[str, Any]:
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(SCRIPT)
    text = json.dumps({"name": "artifacts", "entrypoint": ["python", "train.py", token],
                       "failure_policy": {"stop_grace": "2s", "trial_retries": 1}, **config})
    return client.create_experiment(text, context)


def _settled(client: Client, trial_id: int) -> dict[str, Any]:
    return dict(wait_until(lambda: (found := client.get_artifacts(trial_id))["state"]
                           != "pending" and found, timeout=60, what="the artifacts copied"))


def test_the_final_attempts_artifacts_are_listed_and_downloaded_byte_exact(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    token = str(Home(server.home).token_path)
    exp = wait_ended(client, _submit(client, tmp_path, token,
                                     artifacts=["model.pt", "eval/*.json"])["id"], timeout=90)
    trial = only_trial(exp)
    assert trial["attempts"][0]["reason"] != "OK"  # attempt 1 was SIGKILLed

    found = _settled(client, trial["id"])

    workdir = Home(server.home).run_dir(trial["uuid"]).workdir
    assert (found["state"], found["attempt"]) == ("collected", 2)
    assert [f["path"] for f in found["files"]] == ["eval/report.json", "model.pt"]
    for item in found["files"]:
        data = (workdir / item["path"]).read_bytes()
        assert (item["size"], item["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert found["size"] == sum(f["size"] for f in found["files"])
    assert sorted(found["skipped"]) == [
        "eval/stale.json: not written by the final attempt (older than its start): a stale "
        "file", "eval/token.json: a link, not followed"]

    client.download_artifacts(trial["id"], tmp_path / "got")
    assert sorted(str(p.relative_to(tmp_path / "got")) for p in (tmp_path / "got").rglob("*")
                  if p.is_file()) == ["eval/report.json", "model.pt"]
    assert (tmp_path / "got" / "model.pt").read_bytes() == (workdir / "model.pt").read_bytes()

    one = httpx.get(f"{server.url}/api/v1/trials/{trial['id']}/artifacts/eval/report.json",
                    headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
    assert (one.status_code, one.content) == (200, b'{"a": 1}')
    assert 'filename="report.json"' in one.headers["content-disposition"]
    for missing in ("notes.txt", "eval/token.json", "../workdir/notes.txt"):
        answer = httpx.get(f"{server.url}/api/v1/trials/{trial['id']}/artifacts/{missing}",
                           headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
        assert answer.status_code == 404, (missing, answer.text)

    # The page shows a text; it refuses what it does not preview, saying why.
    bearer = {"Authorization": f"Bearer {server.token}"}
    view = httpx.get(f"{server.url}/trials/{trial['id']}/artifacts/view",
                     params={"path": "eval/report.json"}, headers=bearer, timeout=30)
    assert view.status_code == 200 and '{&#34;a&#34;: 1}' in view.text
    for page, path, why in (("view", "model.pt", "not a file the page previews"),
                            ("image", "eval/report.json", "is not a .png")):
        refused = httpx.get(f"{server.url}/trials/{trial['id']}/artifacts/{page}",
                            params={"path": path}, headers=bearer, timeout=30)
        assert refused.status_code == 400 and why in refused.text, refused.text

    shown = CliRunner().invoke(app, ["trial", "artifacts", str(trial["id"]), "--url",
                                     server.url, "--home", str(server.home)])
    assert shown.exit_code == 0, shown.output
    assert f"artifacts of trial {trial['id']} (attempt 2): collected, 2 files" in shown.output
    assert "left: eval/token.json: a link, not followed" in shown.output


def test_a_trial_whose_config_names_no_artifacts_says_how_to_name_them(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    exp = wait_ended(client, _submit(client, tmp_path, "/nonexistent")["id"], timeout=90)
    with pytest.raises(NotFound, match=r"has no artifacts: its config names none"):
        client.get_artifacts(only_trial(exp)["id"])


def test_over_the_limit_nothing_is_kept_and_the_sizes_are_named(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    exp = wait_ended(client, _submit(client, tmp_path, "/nonexistent", artifacts=["model.pt"],
                                     artifacts_limit="10KiB")["id"], timeout=90)
    trial_id = only_trial(exp)["id"]

    found = _settled(client, trial_id)

    assert (found["state"], found["files"]) == ("refused", [])
    assert found["message"].startswith("the artifacts hold 1 file of 39.1 KiB, more than "
                                       "artifacts_limit (10 KiB)")
    events = [e["message"] for e in client.list_events(trial_id=trial_id)]
    assert any("the artifacts of attempt 2 were not kept" in (m or "") for m in events), events
