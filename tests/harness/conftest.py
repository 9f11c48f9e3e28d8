"""Fixtures for the harness tests: a platform environment, scripts as real processes, a
tiny disk to fill."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
MUSTER_VARS = ("MUSTER_RUN_DIR", "MUSTER_TRIAL_ID", "MUSTER_ATTEMPT", "MUSTER_HPARAMS",
               "MUSTER_LATEST_CHECKPOINT", "MUSTER_SOURCE_CHECKPOINT",
               "MUSTER_HEARTBEAT_TIMEOUT", "RANK", "WORLD_SIZE",
               "MUSTER_RANK", "MUSTER_WORLD_SIZE")
HPARAMS = {"lr": 0.01, "hidden": 64}


class Platform(NamedTuple):
    """A run directory and the environment muster would give rank 1 of attempt 2 in it."""

    run_dir: Path
    env: dict[str, str]

    @property
    def attempt_dir(self) -> Path:
        return self.run_dir / "attempt-2"

    def rank_file(self, suffix: str) -> Path:
        return self.attempt_dir / f"rank-1{suffix}"


@pytest.fixture(autouse=True)
def _no_muster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts off the platform, whatever the environment running pytest holds."""
    for name in MUSTER_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def platform(tmp_path: Path) -> Platform:
    run_dir = tmp_path / "run"
    attempt_dir = run_dir / "attempt-2"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "hparams.json").write_text(json.dumps(HPARAMS))
    env = {
        "MUSTER_RUN_DIR": str(run_dir),
        "MUSTER_TRIAL_ID": "7",
        "MUSTER_ATTEMPT": "2",
        "MUSTER_HPARAMS": str(attempt_dir / "hparams.json"),
        "RANK": "1",
        "WORLD_SIZE": "2",
    }
    return Platform(run_dir, env)


@pytest.fixture
def on_platform(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> Platform:
    """`platform`, with its variables set in this process's environment."""
    for name, value in platform.env.items():
        monkeypatch.setenv(name, value)
    return platform


def start_script(name: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """Start tests/harness/fixtures/`name` with this interpreter and `env` added."""
    return subprocess.Popen(
        [sys.executable, str(FIXTURES / name), *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 1 MiB tmpfs: a real file system that a test can fill until ENOSPC."""
    mount_point = tmp_path / "tiny-disk"
    mount_point.mkdir()
    yield from _mounted_tmpfs(mount_point)


def _mounted_tmpfs(mount_point: Path) -> Iterator[Path]:
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        pytest.skip(f"no mount command to make a small disk to fill: {exc}")
    if done.returncode != 0:
        pytest.skip("cannot mount a 1 MiB tmpfs to fill (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def fill(path: Path) -> None:
    """Write `path` until its file system is full (ENOSPC)."""
    chunk = b"\0" * 4096
    with path.open("ab", buffering=0) as file:
        try:
            while True:
                file.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
