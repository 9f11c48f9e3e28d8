"""`muster checkpoint download` against a real server.

A checkpoint saved by the harness (`tests/fixtures/harness_train.py`) comes back file for
file into a new directory, each file checked against its sha256 in metadata.json. A target
in the way and a checkpoint changed after registration are refused and leave nothing
behind. (Archives made to escape the target: `tests/test_checkpoint_archive.py`.)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.server.experiments import create, only_trial, wait_ended
from tests.servers import RunningServer


def muster(server: RunningServer, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m muster ARGS` in `cwd`, against `server`, as a person would type it."""
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "muster", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The registered checkpoint of a harness_train.py trial, with `trial_id`."""
    with server.client() as client:
        exp = create(client, tmp_path_factory.mktemp("trained"), "harness_train.py",
                     "--epochs", "1", "--samples", "20", "--batch", "10")
        trial = only_trial(wait_ended(client, exp["id"]))
        assert trial["state"] == "SUCCEEDED", trial
        (checkpoint,) = client.list_checkpoints(trial["id"])
    assert checkpoint["intact"], checkpoint
    return {**checkpoint, "trial_id": trial["id"]}


# -- through the CLI ------------------------------------------------------------------------


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_a_checkpoint_comes_back_file_for_file_with_verified_hashes(
    server: RunningServer, trained: dict[str, Any], tmp_path: Path
) -> None:
    done = muster(server, "checkpoint", "download", str(trained["trial_id"]), trained["name"],
                  "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    original = Path(trained["path"])
    assert files_under(tmp_path / "out") == files_under(original)
    listed = json.loads((tmp_path / "out" / "metadata.json").read_text())["files"]
    assert set(listed) == {"state.json"}
    assert listed["state.json"] == hashlib.sha256(
        (tmp_path / "out" / "state.json").read_bytes()).hexdigest()
    assert "  state.json  " in done.stdout and "  metadata.json  " in done.stdout
    assert (f"checkpoint {trained['name']} (step {trained['step']}) of trial "
            f"{trained['trial_id']} is in out: 2 files") in done.stdout
    assert "each matching its sha256 in metadata.json" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_the_default_target_is_the_checkpoints_name_and_an_empty_one_is_used(
    server: RunningServer, trained: dict[str, Any], tmp_path: Path
) -> None:
    trial, name = str(trained["trial_id"]), trained["name"]
    assert muster(server, "checkpoint", "download", trial, name, cwd=tmp_path).returncode == 0
    assert files_under(tmp_path / name) == files_under(Path(trained["path"]))
    (tmp_path / "empty").mkdir()
    done = muster(server, "checkpoint", "download", trial, name, "-o", "empty", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert files_under(tmp_path / "empty") == files_under(Path(trained["path"]))


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_a_target_in_the_way_is_refused_and_left_as_it_was(
    server: RunningServer, trained: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep me")
    (tmp_path / "a-file").write_text("keep me too")
    for target, words in (("full", "is a directory with files in it"),
                          ("a-file", "exists and is not a directory")):
        done = muster(server, "checkpoint", "download", str(trained["trial_id"]),
                      trained["name"], "-o", target, cwd=tmp_path)
        assert done.returncode == 1
        assert done.stderr.startswith("error: ") and words in done.stderr, done.stderr
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep me"
    assert (tmp_path / "a-file").read_text() == "keep me too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "full"]


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_a_checkpoint_changed_after_registration_is_not_kept(
    server: RunningServer, trained: dict[str, Any], tmp_path: Path
) -> None:
    state = Path(trained["path"]) / "state.json"
    before = state.read_bytes()
    state.write_bytes(before.replace(b"1", b"2"))  # same size, another sha256
    try:
        done = muster(server, "checkpoint", "download", str(trained["trial_id"]),
                      trained["name"], "-o", "out", cwd=tmp_path)
    finally:
        state.write_bytes(before)
    assert done.returncode == 1
    assert "broke off" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.lifecycle
def test_an_unknown_checkpoint_is_an_error_naming_the_list_command(
    server: RunningServer, trained: dict[str, Any], tmp_path: Path
) -> None:
    done = muster(server, "checkpoint", "download", str(trained["trial_id"]), "step-5",
                  cwd=tmp_path)
    assert done.returncode == 1
    assert f"`muster checkpoint list {trained['trial_id']}`" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []
