"""The log search through a real server: the route, the SDK's `search_logs`, and `muster
trial logs ID --grep` with grep's exit statuses. Logs are written into the trials' run
directories in the shim's format (`tests/server/rank_logs.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from muster.client import Client
from muster.errors import ConfigError, NotFound
from muster.store import Store
from tests.server.rank_logs import RankFiles, add_trial_with_ranks
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts a real server

server = shared_server()

LOG = b"step 1 loss 0.5\nstep 2 loss nan\nstep 3 Loss NaN again\n\xffodd loss nan\n"


@pytest.fixture
def server_store(server: RunningServer) -> Iterator[Store]:
    with server.store() as store:
        yield store


def one_rank_trial(store: Store, run_dir: Path, data: bytes = LOG) -> int:
    trial_id = add_trial_with_ranks(store, [run_dir], 1)
    RankFiles(run_dir, 0).append((1.0, data))
    return trial_id


def get(server: RunningServer, path: str, token: str | None, **params: object
        ) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}/api/v1{path}", params=params, headers=headers, timeout=30)


def cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "muster", *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(60)
def test_the_sdk_pages_forward_and_backward(
    client: Client, server_store: Store, tmp_path: Path
) -> None:
    trial_id = one_rank_trial(server_store, tmp_path / "attempt-1")
    nan_at = [LOG.index(b"loss nan"), LOG.rindex(b"loss nan")]
    found = client.search_logs(trial_id, "loss nan")
    assert [m["offset"] for m in found["matches"]] == nan_at
    assert (found["complete"], found["stopped"], found["size"]) == (True, "end", len(LOG))
    assert found["matches"][1]["before"] == "\ufffdodd "
    nocase = client.search_logs(trial_id, "LOSS NAN", ignore_case=True)
    assert len(nocase["matches"]) == 3
    first = client.search_logs(trial_id, "loss", limit=1)
    assert (first["complete"], first["stopped"]) == (False, "limit")
    then = client.search_logs(trial_id, "loss", start=first["next_from"], limit=1)
    assert then["matches"][0]["offset"] == LOG.index(b"loss nan")
    back = client.search_logs(trial_id, r"^step \d", regex=True, backward=True, limit=2)
    assert [m["text"] for m in back["matches"]] == ["step 3", "step 2"]
    assert back["next_from"] == LOG.index(b"step 2")
    # The offsets are those the log route reads.
    piece = client.read_logs(trial_id, rank=0, offset=nan_at[0], limit=8)
    assert piece.data == b"loss nan"


@pytest.mark.timeout(60)
def test_bad_input_is_a_4xx_that_says_what_to_fix(
    client: Client, server_store: Store, server: RunningServer, tmp_path: Path
) -> None:
    trial_id = one_rank_trial(server_store, tmp_path / "attempt-1")
    with pytest.raises(ConfigError, match="missing \\) at position 5"):
        client.search_logs(trial_id, "loss (nan", regex=True)
    token = server.token
    bad = get(server, f"/trials/{trial_id}/logs/search", token, pattern="a(?=b)", regex="true")
    assert bad.status_code == 422 and bad.json()["error"] == "InvalidPattern"
    assert "invalid perl operator at position 1" in bad.json()["message"]
    for params in ({"pattern": "x" * 1001}, {"pattern": ""}, {"pattern": "x", "limit": 1001},
                   {"pattern": "x", "direction": "sideways"}, {"pattern": "x", "from": -1},
                   {"pattern": "x", "max_bytes": 0}, {}):
        answer = get(server, f"/trials/{trial_id}/logs/search", token, **params)
        assert answer.status_code == 422, (params, answer.text)
        assert answer.json()["message"]
    with pytest.raises(NotFound, match="no rank 3"):
        client.search_logs(trial_id, "x", rank=3)
    with pytest.raises(NotFound, match="no attempt 2"):
        client.search_logs(trial_id, "x", attempt=2)


@pytest.mark.timeout(60)
def test_every_reader_may_search_and_no_one_else(
    client: Client, server_store: Store, server: RunningServer, tmp_path: Path
) -> None:
    """As the log routes: any role reads any trial's log (a viewer too); no token is a 401;
    a trial that does not exist is a 404."""
    trial_id = one_rank_trial(server_store, tmp_path / "attempt-1")
    viewer = client.create_user(f"viewer{trial_id}", "viewer")["token"]
    path = f"/trials/{trial_id}/logs/search"
    assert get(server, path, viewer, pattern="nan").json()["matches"]
    assert get(server, path, None, pattern="nan").status_code == 401
    assert get(server, path, "mst_not_a_token", pattern="nan").status_code == 401
    assert get(server, "/trials/987654/logs/search", viewer, pattern="nan").status_code == 404


@pytest.mark.timeout(120)
def test_grep_prints_matching_lines_and_exits_as_grep(
    server_store: Store, server: RunningServer, tmp_path: Path
) -> None:
    trial_id = one_rank_trial(server_store, tmp_path / "attempt-1")
    found = cli(server, "trial", "logs", str(trial_id), "--grep", "loss nan")
    assert (found.returncode, found.stdout) == (0, "step 2 loss nan\n\ufffdodd loss nan\n")
    offsets = cli(server, "trial", "logs", str(trial_id), "--grep", "nan", "-i", "-b", "-m", "2")
    assert offsets.stdout == "16:step 2 loss nan\n32:step 3 Loss NaN again\n"
    regex = cli(server, "trial", "logs", str(trial_id), "--grep", r"^step [13]\b", "--regex")
    assert regex.stdout == "step 1 loss 0.5\nstep 3 Loss NaN again\n"
    none = cli(server, "trial", "logs", str(trial_id), "--grep", "inf")
    assert (none.returncode, none.stdout) == (1, "")
    bad = cli(server, "trial", "logs", str(trial_id), "--grep", "(", "--regex")
    assert bad.returncode == 2 and "missing )" in bad.stderr
    live = cli(server, "trial", "logs", str(trial_id), "--grep", "nan", "--follow")
    assert live.returncode == 2 and "leave out --follow" in live.stderr
    missing = cli(server, "trial", "logs", "987654", "--grep", "nan")
    assert missing.returncode == 2 and "987654" in missing.stderr, missing.stderr


@pytest.mark.timeout(120)
def test_grep_searches_every_attempt_and_rank(
    server_store: Store, server: RunningServer, tmp_path: Path
) -> None:
    trial_id = add_trial_with_ranks(server_store, [tmp_path / "a1", tmp_path / "a2"], 2)
    RankFiles(tmp_path / "a1", 0).append((1.0, b"a1 r0 nan\n"))
    RankFiles(tmp_path / "a1", 1).append((1.0, b"a1 r1 fine\n"))
    RankFiles(tmp_path / "a2", 1).append((2.0, b"a2 r1 nan nan\n"))
    done = cli(server, "trial", "logs", str(trial_id), "--grep", "nan")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "attempt 1 rank 0:a1 r0 nan\nattempt 2 rank 1:a2 r1 nan nan\n"
    one = cli(server, "trial", "logs", str(trial_id), "--grep", "nan", "--attempt", "2",
              "--rank", "1")
    assert one.stdout == "a2 r1 nan nan\n"
