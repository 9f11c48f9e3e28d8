"""Secrets and files (issue 12, item 15), on a real server with real jobs.

Before: `environment.variables` was the only way to hand a job a credential, and the API and
`describe --json` returned it; every rank's spec file held the server's whole environment;
jobs inherited MUSTER_HOME and MUSTER_DB (a database URL may carry a password); the home and
its files were as readable as the umask made them, and the token lay in the home's top
directory, an ancestor of every run directory.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.home import Home
from muster.rundir import RankFile
from tests.server.experiments import only_trial, wait_ended, write_context
from tests.servers import RunningServer, shared_server

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

server = shared_server()

SECRET = "hunter2-but-longer-0123"
PRINTS = """\
import os, sys
print("token is", os.environ["API_TOKEN"], flush=True)
print("server settings:", sorted(k for k in os.environ if k in ("MUSTER_HOME", "MUSTER_DB",
      "MUSTER_URL", "MUSTER_JOB_UMASK")), flush=True)
open("made-by-job.txt", "w").write("x")
"""


def _cli(server: RunningServer, *args: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
               "COLUMNS": "200", "NO_COLOR": "1"}
    environ.pop("API_TOKEN", None)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "muster", *args], env=environ,
                          capture_output=True, text=True, timeout=120)


def _context(tmp_path: Path, script: str, secrets: Any) -> Path:
    context = write_context(tmp_path, ["python", "job.py"], files={"job.py": script})
    config = json.loads((context / "experiment.yaml").read_text())
    config["environment"] = {"secrets": secrets}
    (context / "experiment.yaml").write_text(json.dumps(config))
    return context


def _submit(server: RunningServer, context: Path, *flags: str,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    done = _cli(server, "experiment", "create", str(context / "experiment.yaml"),
                str(context), "--json", *flags, env=env)
    assert done.returncode == 0, done.stderr
    with server.client() as client:
        return wait_ended(client, json.loads(done.stdout)["id"])


def test_a_submitted_secret_reaches_the_job_and_nothing_else(
    server: RunningServer, tmp_path: Path
) -> None:
    exp = _submit(server, _context(tmp_path, PRINTS, ["API_TOKEN"]),
                  env={"API_TOKEN": SECRET})
    trial = only_trial(exp)
    assert trial["state"] == "SUCCEEDED", trial
    home = Home(server.home)
    # The job had it; the logs muster serves show it masked, offsets intact.
    logs = _cli(server, "trial", "logs", str(trial["id"])).stdout
    assert f"token is {'*' * len(SECRET)}\n" in logs and SECRET not in logs
    run_dir = Path(trial["attempts"][0]["run_dir"])
    on_disk = (run_dir / "rank-0.log").read_text()
    assert len(on_disk) == len(logs) and SECRET in on_disk  # stored byte-exact, shown masked
    # A search of the log sees what a read sees: the secret masked, never found.
    with server.client() as client:
        assert client.search_logs(trial["id"], SECRET)["matches"] == []
        (shown,) = client.search_logs(trial["id"], "token is")["matches"]
        assert shown["after"] == " " + "*" * len(SECRET)
    # Not in the API, the CLI's JSON, or the database.
    described = _cli(server, "experiment", "describe", str(exp["id"]), "--json").stdout
    assert SECRET not in described and '"API_TOKEN": "submit"' in described
    with server.client() as client:
        assert SECRET not in json.dumps(client.list_experiments())
    database = server.home / "muster.db"
    assert all(SECRET.encode() not in p.read_bytes() for p in server.home.glob("muster.db*"))
    # Kept 0600 beside the token, never under a run directory.
    kept = home.secrets_file(exp["uuid"])
    assert json.loads(kept.read_text()) == {"API_TOKEN": SECRET}
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # The spec file carries the job's own variables only, 0600.
    spec_file = next(run_dir.glob(f"rank-0.{RankFile.SPEC.value}"))
    spec = json.loads(spec_file.read_text())
    assert stat.S_IMODE(spec_file.stat().st_mode) == 0o600
    assert spec["env"]["API_TOKEN"] == SECRET
    assert not {"PATH", "HOME", "MUSTER_HOME", "MUSTER_DB"} & spec["env"].keys()
    # The server's own settings never reach the job.
    assert "server settings: []" in on_disk
    # The server's files are private; the job's own file has the user's umask.
    for path in (server.home, home.secrets_dir, run_dir, run_dir.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in (database, run_dir / "rank-0.log", run_dir / "rank-0.exit.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    user_umask = os.umask(0)
    os.umask(user_umask)
    made = run_dir.parent / "workdir" / "made-by-job.txt"
    assert stat.S_IMODE(made.stat().st_mode) == 0o666 & ~user_umask


def test_a_secret_given_on_the_command_line_and_masked_in_the_message(
    server: RunningServer, tmp_path: Path
) -> None:
    script = "import os\nraise ValueError('bad key ' + os.environ['API_TOKEN'])\n"
    exp = _submit(server, _context(tmp_path, script, {"API_TOKEN": "submit"}),
                  "--secret", f"API_TOKEN={SECRET}")
    trial = only_trial(exp)
    assert trial["state"] == "FAILED"
    assert f"ValueError: bad key {'*' * len(SECRET)}" in trial["message"]
    assert SECRET not in json.dumps(exp)


def test_a_server_side_secret_is_read_at_launch(server: RunningServer, tmp_path: Path) -> None:
    """`env:HOME` is the server's own HOME: the job gets it, the logs mask it."""
    server_home = os.environ["HOME"]
    script = "import os\nprint('home', os.environ['FROM_SERVER'])\n"
    exp = _submit(server, _context(tmp_path, script, {"FROM_SERVER": "env:HOME"}))
    trial = only_trial(exp)
    assert trial["state"] == "SUCCEEDED"
    logs = _cli(server, "trial", "logs", str(trial["id"])).stdout
    assert logs == f"home {'*' * len(server_home)}\n"


@pytest.mark.parametrize(("secrets", "flags", "env", "says"), [
    (["API_TOKEN"], (), {}, "secret API_TOKEN: set it in your environment (export "
                            "API_TOKEN=...) or pass --secret API_TOKEN=VALUE"),
    (["API_TOKEN"], ("--secret", "OTHER=1"), {"API_TOKEN": "x"},
     "--secret OTHER: the config declares no such `submit` secret"),
    ({"K": "env:NO_SUCH_VARIABLE_HERE"}, (), {},
     "environment.secrets.K: the server's environment has no NO_SUCH_VARIABLE_HERE"),
    ({"K": "file:/no/such/file"}, (), {}, "environment.secrets.K: the server cannot read "
                                          "/no/such/file"),
])
def test_a_secret_that_cannot_be_had_is_refused_at_submission(
    server: RunningServer, tmp_path: Path, secrets: Any, flags: tuple[str, ...],
    env: dict[str, str], says: str
) -> None:
    context = _context(tmp_path, "print(1)\n", secrets)
    done = _cli(server, "experiment", "create", str(context / "experiment.yaml"), str(context),
                *flags, env=env)
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_api_refuses_secrets_the_config_does_not_declare(server: RunningServer) -> None:
    response = httpx.post(f"{server.url}/api/v1/experiments",
                          data={"config": "name: x\nentrypoint: [\"true\"]\n",
                                "secrets": json.dumps({"SNEAKY": "v"})},
                          headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 422
    assert "'SNEAKY' was sent but the config declares no such secret" in (
        response.json()["message"])
    response = httpx.post(f"{server.url}/api/v1/experiments",
                          data={"config": "name: x\nentrypoint: [\"true\"]\n", "secrets": "[1]"},
                          headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 400 and "JSON object" in response.json()["message"]
    # Nested past the JSON parser's depth: still the client's mistake, not a 500.
    response = httpx.post(f"{server.url}/api/v1/experiments",
                          data={"config": "name: x\nentrypoint: [\"true\"]\n",
                                "secrets": "[" * 100_000 + "]" * 100_000},
                          headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 400, response.text
    assert "the `secrets` field is not JSON text" in response.json()["message"]


def test_a_json_body_is_capped_before_anything_reads_it(server: RunningServer) -> None:
    """A priority or review body is read before the token check: its size is capped."""
    big = b'{"priority": 1, "pad": "' + b"x" * 200_000 + b'"}'
    for headers in ({}, {"Authorization": f"Bearer {server.token}"}):
        response = httpx.post(f"{server.url}/api/v1/trials/1/priority", content=big,
                              headers={**headers, "Content-Type": "application/json"})
        assert response.status_code == 413, response.text
        assert response.json()["error"] == "PayloadTooLarge"

    def chunks() -> Any:
        yield b'{"priority": 1, "pad": "'
        for _ in range(100):
            yield b"x" * 10_000

    response = httpx.post(f"{server.url}/api/v1/trials/1/priority", content=chunks(),
                          headers={"Authorization": f"Bearer {server.token}",
                                   "Content-Type": "application/json"})
    assert response.status_code == 413, response.text


def test_a_review_with_a_nul_byte_is_a_422(server: RunningServer) -> None:
    response = httpx.post(f"{server.url}/api/v1/trials/1/review",
                          json={"decision": "approve", "note": "ok\x00", "reviewer": "bob"},
                          headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 422 and "note" in response.json()["message"]
