"""Trial logs through the API and the CLI: byte-exact, by cursor, by tail, followed live."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from muster.client import Client
from muster.errors import NotFound
from tests.server.experiments import (
    FIXTURES,
    create,
    only_trial,
    read_whole_log,
    run_to_end,
    submit,
    wait_ended,
    write_context,
)
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

server = shared_server()


def fixture_module(name: str) -> ModuleType:
    """A fixture script imported as a module, for its constants and helpers."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), FIXTURES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def printing(text: str) -> list[str]:
    """An entrypoint that writes `text` to stdout, byte for byte."""
    return ["python", "-c", f"import sys; sys.stdout.write({text!r})"]


def run_printing(client: Client, tmp_path: Path, text: str) -> int:
    """The id of an ended, succeeded trial that printed `text`."""
    exp = wait_ended(client, submit(client, write_context(tmp_path, printing(text)))["id"])
    trial = only_trial(exp)
    assert trial["state"] == "SUCCEEDED", trial
    trial_id: int = trial["id"]
    return trial_id


@pytest.mark.timeout(180)
def test_a_50_mb_flood_reads_back_byte_identical(client: Client, tmp_path: Path) -> None:
    size = 50_000_000
    exp = run_to_end(client, tmp_path, "flood.py", str(size), timeout=150)
    trial = only_trial(exp)
    assert trial["state"] == "SUCCEEDED"
    expected = sha256(fixture_module("flood.py").pattern_bytes(size))
    (replica,) = trial["attempts"][0]["replicas"]
    assert sha256(Path(replica["log_path"]).read_bytes()) == expected
    assert sha256(read_whole_log(client, trial["id"])) == expected
    # An odd limit, so chunk edges fall inside the pattern rather than on its period.
    assert sha256(read_whole_log(client, trial["id"], attempt=1, limit=999_983)) == expected


def cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "muster", *args], env=env,
                          capture_output=True, timeout=60)


@pytest.mark.timeout(60)
def test_odd_bytes_are_kept_and_shown_with_replacement(
    client: Client, tmp_path: Path, server: RunningServer
) -> None:
    odd = fixture_module("odd_bytes.py")
    expected: bytes = odd.ODD_STDOUT + odd.ODD_STDERR
    trial = only_trial(run_to_end(client, tmp_path, "odd_bytes.py"))
    assert trial["state"] == "SUCCEEDED"
    assert read_whole_log(client, trial["id"]) == expected
    assert client.read_logs(trial["id"]).data == expected

    done = cli(server, "trial", "logs", str(trial["id"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode("utf-8") == expected.decode("utf-8", errors="replace")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["\n", ""], ids=["trailing-newline", "no-trailing-newline"])
def test_tail_returns_exactly_the_last_lines(client: Client, tmp_path: Path, ending: str) -> None:
    lines = [f"line {i}" for i in range(10)]
    text = "\n".join(lines) + ending
    trial_id = run_printing(client, tmp_path, text)
    for n in (1, 2, 9):
        assert client.read_logs(trial_id, tail=n).data == (
            "\n".join(lines[-n:]) + ending).encode()
    assert client.read_logs(trial_id, tail=10).data == text.encode()
    assert client.read_logs(trial_id, tail=50).data == text.encode()
    assert client.read_logs(trial_id, tail=0).data == b""


@pytest.mark.timeout(60)
def test_tail_keeps_empty_lines(client: Client, tmp_path: Path) -> None:
    trial_id = run_printing(client, tmp_path, "a\n\n\nb\n")
    assert client.read_logs(trial_id, tail=2).data == b"\nb\n"
    assert client.read_logs(trial_id, tail=3).data == b"\n\nb\n"


TICKER = """\
import time

for i in range(40):
    print(f"tick {i}", flush=True)
    time.sleep(0.05)
"""


@pytest.mark.timeout(60)
def test_follow_streams_the_whole_log_and_ends_with_the_trial(
    client: Client, tmp_path: Path
) -> None:
    context = write_context(tmp_path, ["python", "ticker.py"], files={"ticker.py": TICKER})
    exp = submit(client, context)
    trial_id = only_trial(exp)["id"]
    followed = b"".join(client.follow_logs(trial_id))
    assert followed == b"".join(b"tick %d\n" % i for i in range(40))
    # The stream ended because the trial did, not before.
    assert client.get_trial(trial_id)["state"] == "SUCCEEDED"


@pytest.mark.timeout(90)
def test_follow_moves_on_to_the_next_attempt(client: Client, tmp_path: Path) -> None:
    exp = create(client, tmp_path, "kill_self.py", "SIGSEGV", failure_policy={"trial_retries": 1})
    trial_id = only_trial(exp)["id"]
    followed = b"".join(client.follow_logs(trial_id))
    trial = client.get_trial(trial_id)
    assert (trial["state"], trial["restarts"]) == ("FAILED", 1)
    per_attempt = [client.read_logs(trial_id, attempt=n).data for n in (1, 2)]
    assert per_attempt == [b"about to raise SIGSEGV\n"] * 2
    assert followed == b"".join(per_attempt)


@pytest.mark.timeout(60)
def test_follow_of_an_ended_trial_returns_its_log(client: Client, tmp_path: Path) -> None:
    trial_id = run_printing(client, tmp_path, "one\ntwo\nthree\n")
    assert b"".join(client.follow_logs(trial_id)) == b"one\ntwo\nthree\n"
    assert b"".join(client.follow_logs(trial_id, tail=1)) == b"three\n"


@pytest.mark.timeout(60)
def test_a_missing_attempt_is_a_404(
    client: Client, tmp_path: Path, server: RunningServer
) -> None:
    trial_id = run_printing(client, tmp_path, "x\n")
    with pytest.raises(NotFound, match=f"trial {trial_id} has no attempt 99"):
        client.read_logs(trial_id, attempt=99)
    with pytest.raises(NotFound, match=f"trial {trial_id} has no attempt 99"):
        b"".join(client.follow_logs(trial_id, attempt=99))
    token = server.token
    response = httpx.get(f"{server.url}/api/v1/trials/{trial_id}/logs",
                         params={"attempt": 99, "follow": "true"},
                         headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 404
    assert response.json()["error"] == "NotFound"


@pytest.mark.timeout(60)
def test_a_cursor_past_the_end_reads_nothing(client: Client, tmp_path: Path) -> None:
    trial_id = run_printing(client, tmp_path, "abc\n")
    piece = client.read_logs(trial_id, offset=2)
    assert (piece.data, piece.next_offset) == (b"c\n", 4)
    piece = client.read_logs(trial_id, offset=1000)
    assert (piece.data, piece.next_offset) == (b"", 1000)
