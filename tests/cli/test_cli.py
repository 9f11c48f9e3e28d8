"""The `muster` command line, run as a real subprocess against a real server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from muster.client import Client
from muster.home import Home
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive
from tests.server.experiments import make_context, only_trial, wait_ended, write_context
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

DETERMINED_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "determined_configs"

CONTRACT_EXPERIMENT = {"id", "name", "state", "trials"}
CONTRACT_TRIAL = {"id", "state", "restarts", "attempts"}
CONTRACT_ATTEMPT = {"number", "state", "replicas"}
CONTRACT_REPLICA = {"rank", "exit_code", "signal", "reason", "message", "log_path", "node"}


def muster(
    home: Path, url: str | None, *args: str, cwd: Path | None = None,
    token: str | None = None, stdin: str | None = None, env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m muster ARGS` with MUSTER_HOME (and MUSTER_URL, MUSTER_TOKEN, `env`)
    set; never a shell."""
    variables = {**os.environ, "MUSTER_HOME": str(home), "PYTHONIOENCODING": "utf-8",
                 "COLUMNS": "200", "NO_COLOR": "1"}
    variables.pop("MUSTER_URL", None)
    variables.pop("MUSTER_TOKEN", None)
    if url is not None:
        variables["MUSTER_URL"] = url
    if token is not None:
        variables["MUSTER_TOKEN"] = token
    variables.update(env or {})
    return subprocess.run([sys.executable, "-m", "muster", *args], env=variables, cwd=cwd,
                          capture_output=True, text=True, timeout=120, input=stdin)


def on(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    return muster(server.home, server.url, *args)


def assert_clean_failure(done: subprocess.CompletedProcess[str]) -> str:
    """Exit status 1, an `error: ...` first line on stderr, no traceback; returns stderr."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_json(server: RunningServer, context: Path, *flags: str) -> dict[str, object]:
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context),
              "--json", *flags)
    exp: dict[str, object] = json.loads(done.stdout)
    return exp


@pytest.mark.timeout(60)
def test_create_json_prints_an_object_with_its_id(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    context = make_context(tmp_path, "exit0.sh")
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context),
              "--json")
    assert done.returncode == 0, done.stderr
    exp = json.loads(done.stdout)
    assert isinstance(exp, dict) and isinstance(exp["id"], int)
    assert wait_ended(client, exp["id"])["state"] == "COMPLETED"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("fixture", "status", "state"),
                         [("exit0.sh", 0, "SUCCEEDED"), ("exit2.sh", 1, "FAILED")])
def test_create_wait_exits_with_how_the_trial_ended(
    server: RunningServer, tmp_path: Path, fixture: str, status: int, state: str
) -> None:
    context = make_context(tmp_path, fixture)
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context),
              "--wait", "--json")
    assert done.returncode == status, done.stderr
    exp = json.loads(done.stdout)
    assert only_trial(exp)["state"] == state


@pytest.mark.timeout(60)
def test_create_takes_the_configs_folder_by_default(
    server: RunningServer, tmp_path: Path
) -> None:
    context = make_context(tmp_path, "exit0.sh")
    done = muster(server.home, server.url, "experiment", "create", "experiment.yaml", "--wait",
                  cwd=context)
    assert done.returncode == 0, done.stderr
    assert "ended COMPLETED" in done.stderr
    assert done.stdout == ""


@pytest.mark.timeout(60)
def test_describe_json_follows_the_contract(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    exp_id = create_json(server, make_context(tmp_path, "fail_traceback.py"), "--wait")["id"]
    done = on(server, "experiment", "describe", str(exp_id), "--json")
    assert done.returncode == 0, done.stderr
    exp = json.loads(done.stdout)
    assert set(exp) >= CONTRACT_EXPERIMENT
    trial = only_trial(exp)
    assert set(trial) >= CONTRACT_TRIAL
    (attempt,) = trial["attempts"]
    assert set(attempt) >= CONTRACT_ATTEMPT
    (replica,) = attempt["replicas"]
    assert set(replica) >= CONTRACT_REPLICA
    assert (replica["exit_code"], replica["signal"], replica["reason"]) == (1, None, "USER_ERROR")
    assert replica["node"] == socket.gethostname()  # the local launcher's node: this machine
    assert exp == client.get_experiment(int(exp["id"]))


@pytest.mark.timeout(60)
def test_describe_and_list_print_tables(server: RunningServer, tmp_path: Path) -> None:
    exp_id = create_json(server, make_context(tmp_path, "exit2.sh", name="table-me"),
                         "--wait")["id"]
    listed = on(server, "experiment", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "table-me" in line)
    assert str(exp_id) in row and "ERROR" in row and "FAILED" in row
    for header in ("ID", "Name", "State", "Trials"):
        assert header in listed.stdout
    described = on(server, "experiment", "describe", str(exp_id))
    assert described.returncode == 0, described.stderr
    assert "PERMANENT_ERROR" in described.stdout
    assert "non-zero status of 2" in described.stdout


@pytest.mark.timeout(60)
def test_trial_logs_writes_only_the_log(server: RunningServer, tmp_path: Path) -> None:
    lines = "".join(f"line {i}\n" for i in range(5))
    context = write_context(tmp_path, ["python", "-c", f"print({lines!r}, end='')"])
    exp = create_json(server, context, "--wait")
    trial_id = str(only_trial(exp)["id"])
    done = on(server, "trial", "logs", trial_id)
    assert (done.returncode, done.stdout, done.stderr) == (0, lines, "")
    done = on(server, "trial", "logs", trial_id, "--tail", "2")
    assert (done.returncode, done.stdout) == (0, "line 3\nline 4\n")
    done = on(server, "trial", "logs", trial_id, "--follow")
    assert (done.returncode, done.stdout) == (0, lines)


@pytest.mark.timeout(60)
def test_tail_longer_than_one_read_is_whole(server: RunningServer, tmp_path: Path) -> None:
    # Three lines of 700 kB: the last two are more than one API read (1 MiB) holds.
    script = "import sys\nfor c in 'abc':\n    sys.stdout.write(c * 700_000 + '\\n')\n"
    context = write_context(tmp_path, ["python", "lines.py"], files={"lines.py": script})
    trial_id = str(only_trial(create_json(server, context, "--wait"))["id"])
    done = on(server, "trial", "logs", trial_id, "--tail", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "b" * 700_000 + "\n" + "c" * 700_000 + "\n"


@pytest.mark.timeout(60)
def test_create_follow_streams_the_log(server: RunningServer, tmp_path: Path) -> None:
    context = make_context(tmp_path, "fail_traceback.py")
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context),
              "--follow")
    assert done.returncode == 1, done.stderr  # it ended ERROR: only COMPLETED exits 0
    assert done.stdout.startswith("training step 1\nTraceback (most recent call last):\n")
    assert done.stdout.endswith("ValueError: bad shape\n")
    assert "ended ERROR" in done.stderr
    assert "Termination reason: ValueError: bad shape" in done.stderr


@pytest.mark.timeout(60)
def test_a_missing_record_is_one_clear_line(server: RunningServer, tmp_path: Path) -> None:
    exp = create_json(server, make_context(tmp_path, "exit0.sh"), "--wait")
    trial_id = str(only_trial(exp)["id"])
    for args, words in [
        (("e", "describe", "999"), "experiment 999 does not exist"),
        (("e", "kill", "999"), "experiment 999 does not exist"),
        (("e", "kill", str(exp["id"])), f"experiment {exp['id']} is already COMPLETED"),
        (("t", "logs", "999"), "trial 999 does not exist"),
        (("t", "logs", trial_id, "--attempt", "99"), f"trial {trial_id} has no attempt 99"),
        (("t", "logs", trial_id, "--attempt", "99", "-f"), f"trial {trial_id} has no attempt 99"),
    ]:
        done = on(server, *args)
        assert words in assert_clean_failure(done), args
        assert done.stdout == "", args


@pytest.mark.timeout(60)
def test_a_home_without_a_token_says_so(server: RunningServer, tmp_path: Path) -> None:
    done = muster(tmp_path / "other-home", server.url, "experiment", "list")
    stderr = assert_clean_failure(done)
    assert "no API token to send" in stderr and "MUSTER_TOKEN" in stderr
    assert "muster login" in stderr and "other-home" in stderr


@pytest.mark.timeout(60)
def test_the_short_aliases_work(server: RunningServer, tmp_path: Path) -> None:
    exp = create_json(server, make_context(tmp_path, "exit0.sh"), "--wait")
    described = on(server, "e", "describe", str(exp["id"]), "--json")
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["id"] == exp["id"]
    logs = on(server, "t", "logs", str(only_trial(exp)["id"]))
    assert (logs.returncode, logs.stdout) == (0, "hello from exit0\n")
    listed = on(server, "e", "list", "--json")
    assert exp["id"] in [e["id"] for e in json.loads(listed.stdout)]


@pytest.mark.timeout(60)
def test_a_determined_config_is_created_with_what_each_key_became(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    """Determined's tutorial config as it is, plus a mount muster does without: the CLI
    says what each key became, the experiment keeps the text as submitted and muster's
    config, and its page shows each line (an ignored key as a warning too)."""
    context = tmp_path / "determined"
    context.mkdir()
    (context / "model_def.py").write_text("print('trained')\n")
    text = ((DETERMINED_CONFIGS / "core_api_mnist_const.yaml").read_text()
            + "bind_mounts: [{host_path: /datasets, container_path: /data}]\n")
    (context / "const.yaml").write_text(text)
    done = on(server, "experiment", "create", str(context / "const.yaml"), str(context),
              "--json")
    assert done.returncode == 0, done.stderr
    assert "const.yaml: a Determined experiment config, read as muster's:" in done.stderr
    mapped = "max_restarts: 0 → failure_policy.trial_retries: 0, replica_restarts: 0"
    assert f"\n  {mapped}" in done.stderr
    stored = client.get_experiment(json.loads(done.stdout)["id"])
    assert stored["config_yaml"] == text
    assert stored["config"]["compat"] == "determined"
    assert stored["config"]["entrypoint"] == ["python3", "model_def.py"]
    ignored = "bind_mounts: ignored: muster runs trials on the host"
    assert [w for w in stored["warnings"] if w.startswith(f"Determined's {ignored}")]
    kinds = [e["kind"] for e in client.list_events(experiment_id=stored["id"])
             if e["entity"] == "experiment"]
    assert kinds.count("determined key mapped") == 6  # a line a key (no GPUs: no slot line)
    assert kinds.count("determined key ignored") == 1
    page = httpx.get(f"{server.url}/experiments/{stored['id']}", timeout=30,
                     headers={"Authorization": f"Bearer {server.token}"})
    assert page.status_code == 200
    assert mapped in page.text and "determined key mapped" in page.text
    assert f'<p class="banner warn">Determined&#39;s {ignored}' in page.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("policy", "key"),
    [({"trial_retries": -1}, "failure_policy.trial_retries"),
     ({"trial_retires": 1}, "did you mean 'trial_retries'")],
)
def test_a_bad_config_is_refused_before_upload(
    server: RunningServer, client: Client, tmp_path: Path, policy: dict[str, int], key: str
) -> None:
    context = make_context(tmp_path, "exit0.sh", failure_policy=policy)
    before = client.list_experiments()
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context))
    stderr = assert_clean_failure(done)
    assert key in stderr
    assert done.stdout == ""
    assert client.list_experiments() == before
    # Refused before any request: with no server at all the same message comes.
    unreachable = f"http://127.0.0.1:{free_port()}"
    again = muster(server.home, unreachable, "experiment", "create",
                   str(context / "experiment.yaml"), str(context))
    assert again.stderr == stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [("experiment", "list"), ("e", "describe", "1"),
                                  ("t", "logs", "1"), ("t", "logs", "1", "--follow")])
def test_no_server_is_one_clear_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    home = tmp_path / "fresh-home"  # no token either: the server never ran here
    url = f"http://127.0.0.1:{free_port()}"
    done = muster(home, url, *args)
    stderr = assert_clean_failure(done)
    assert f"cannot reach the muster server at {url}" in stderr
    assert "start it with `muster up" in stderr
    assert len(stderr.strip().splitlines()) == 1


def server_identity(home: Path) -> ProcessIdentity:
    record = json.loads(Home(home).server_file.read_text())
    return ProcessIdentity(int(record["pid"]), int(record["start_ticks"]))


@pytest.mark.timeout(120)
def test_up_detach_then_down(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    up = muster(home, None, "up", "--detach", "--home", str(home), "--port", str(port))
    assert up.returncode == 0, up.stderr
    identity = server_identity(home)
    try:
        assert f"muster server running at http://127.0.0.1:{port}" in up.stdout
        with Client(home=Home(home)) as c:  # found through server.json, with the token
            assert c.health()["status"] == "ok"
            assert c.list_experiments() == []

        second = muster(home, None, "up", "--detach", "--home", str(home), "--port",
                        str(free_port()))
        stderr = assert_clean_failure(second)
        assert f"already running for {home}" in stderr
        assert "muster down" in stderr
        assert server_identity(home) == identity

        taken = muster(tmp_path / "other-home", None, "up", "--detach", "--port", str(port))
        stderr = assert_clean_failure(taken)
        # Said before a server starts, naming the one that holds the port.
        assert f"port {port} on 127.0.0.1 is taken (by pid {identity.pid}: " in stderr
        assert "choose another port with --port" in stderr
        assert not (tmp_path / "other-home" / "server.json").exists()

        down = muster(home, None, "down", "--home", str(home))
        assert down.returncode == 0, down.stderr
        assert f"(pid {identity.pid}) stopped" in down.stdout
        assert not is_alive(identity)
        assert not Home(home).server_file.exists()
        down_again = muster(home, None, "down", "--home", str(home))
        assert down_again.returncode == 0
        assert "no muster server is running" in down_again.stdout
    finally:
        if is_alive(identity):
            os.kill(identity.pid, 9)
