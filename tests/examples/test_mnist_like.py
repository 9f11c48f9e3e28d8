"""examples/mnist-like, unmodified, under a real server: its environment (torch 2.14.1 and
torchvision 0.29.1 from PyPI) is built by uv, the trial runs in it, and the example's
verification (samples, checkpoint, metrics) passes. Needs the two wheels: on this project's
machines they lie in a local index, which the server is pointed at as uv reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import RunningServer, serving

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist-like"
LOCAL_INDEX = Path("/opt/pypi-more/simple")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    if not (LOCAL_INDEX / "torchvision").is_dir() and not os.environ.get("MUSTER_TEST_PYPI"):
        pytest.skip(f"torchvision's wheels are not on this machine ({LOCAL_INDEX}); with "
                    "MUSTER_TEST_PYPI=1 uv downloads them from PyPI (~3 GB)")
    patch = pytest.MonkeyPatch()
    if (LOCAL_INDEX / "torchvision").is_dir():
        patch.setenv("UV_EXTRA_INDEX_URL", f"file://{LOCAL_INDEX}")
    try:
        with serving(tmp_path_factory.mktemp("home")) as running:
            yield running
    finally:
        patch.undo()


def test_the_example_builds_its_environment_and_succeeds_verified(
    server: RunningServer, tmp_path: Path
) -> None:
    context = tmp_path / "mnist-like"
    shutil.copytree(EXAMPLE, context)
    environ = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
               "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", "muster", "experiment", "create",
                           str(context / "experiment.yaml"), str(context), "--wait", "--json"],
                          env=environ, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    experiment = json.loads(done.stdout)
    assert experiment["state"] == "COMPLETED"
    with server.client() as client:
        trial = client.get_trial(experiment["trials"][0]["id"])
        log = client.read_logs(trial["id"]).data.decode()
    assert trial["state"] == "SUCCEEDED" and trial["verification"]["verified"] is True
    checks = {c["name"]: c["passed"] for c in trial["verification"]["checks"]}
    assert checks.get("samples") is True, trial["verification"]
    frozen = trial["environment"]["freeze"]
    assert "torchvision==0.29.1" in frozen
    assert any(line.startswith("torch==2.14.1") for line in frozen)
    assert "Test set: Average loss" in log
    assert any(e["reason"] == "launching" for e in trial["events"])
