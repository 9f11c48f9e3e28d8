"""Trials without an environment block on a real server: they import the runtime base
(training packages, muster.harness) and never muster's server; the cluster config's
`base_environment` replaces the base; `muster cluster status` shows it."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from muster.environments.interpreters import own
from muster.errors import ConfigError
from muster.home import Home
from muster.server.app import create_app
from muster.server.settings import ServerSettings
from tests.server.experiments import only_trial, submit, wait_ended, write_context
from tests.servers import RunningServer, serving, shared_server

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

server = shared_server()

REPORT = """\
import importlib, json, sys
found = {"python": sys.version.split()[0]}
for name in ("torch", "numpy", "sklearn", "muster.harness", "fastapi", "pytest", "uvicorn",
             "rich"):
    try:
        importlib.import_module(name)
        found[name] = "imported"
    except ImportError as exc:
        found[name] = f"missing: {exc}"
print("REPORT " + json.dumps(found), flush=True)
"""
TRAINING = ("torch", "numpy", "sklearn", "muster.harness")
SERVERS = ("fastapi", "pytest", "uvicorn")


def run_report(server: RunningServer, tmp_path: Path) -> dict[str, Any]:
    """What a plain `python job.py` trial imports (it must succeed)."""
    context = write_context(tmp_path, ["python", "job.py"], files={"job.py": REPORT})
    with server.client() as client:
        experiment = submit(client, context)
        wait_ended(client, experiment["id"], timeout=180)
        trial = client.get_trial(only_trial(client.get_experiment(experiment["id"]))["id"])
        log = client.read_logs(trial["id"]).data.decode()
    assert trial["state"] == "SUCCEEDED", (trial["message"], log)
    assert trial["environment"]["hash"] is None and trial["environment"]["python"] is None
    line = next(x for x in log.splitlines() if x.startswith("REPORT "))
    found: dict[str, Any] = json.loads(line.removeprefix("REPORT "))
    return found


def cli(server: RunningServer, *args: str) -> str:
    environ = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
               "COLUMNS": "250", "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", "muster", *args], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_trial_without_an_environment_block_imports_torch_but_never_musters_server(
        server: RunningServer, tmp_path: Path) -> None:
    found = run_report(server, tmp_path)
    assert {name: found[name] for name in TRAINING} == dict.fromkeys(TRAINING, "imported")
    for name in SERVERS:
        assert found[name] == f"missing: No module named '{name}'"
    assert found["python"] == own().version, "the Python muster runs on"

    status = json.loads(cli(server, "cluster", "status", "--json"))["runtime_base"]
    assert (status["source"], status["python"], status["error"]) == (
        "computed", own().version, None)
    names = [p["name"] for p in status["packages"]]
    assert names[0] == "torch", "training packages are shown first"
    assert {"torch", "numpy", "scikit-learn"} <= set(names)
    assert not {"fastapi", "pytest", "uvicorn", "muster"} & set(names)
    torch = md.version("torch")
    shown = cli(server, "cluster", "status")
    assert f"runtime base: computed, {len(names)} packages (torch {torch}, " in shown
    assert f"numpy {md.version('numpy')}" in shown
    assert f"python {own().version} ({server.home / 'envs' / 'runtime' / 'current'})" in shown


def link_distributions(site: Path, names: tuple[str, ...]) -> None:
    """Link muster's venv's installed `names` (their top-level entries) into `site`."""
    for name in names:
        files = md.distribution(name).files or []
        for top in {f.parts[0] for f in files if f.parts[0] != ".."}:
            source = Path(str(md.distribution(name).locate_file(top)))
            if not (site / top).exists():
                (site / top).symlink_to(source)


def test_base_environment_names_a_venv_whose_packages_plain_trials_import(
        tmp_path: Path) -> None:
    venv = tmp_path / "train-venv"
    subprocess.run([own().executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    link_distributions(venv / "lib" / own().lib_dir / "site-packages",
                       ("rich", "markdown-it-py", "mdurl", "pygments"))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"base_environment: {venv}\n")
    options = ["--min-free-disk", "0", "--cluster-config", str(cluster)]
    with serving(tmp_path / "home", options=options) as running:
        found = run_report(running, tmp_path)
        assert (found["rich"], found["muster.harness"]) == ("imported", "imported")
        assert found["torch"].startswith("missing"), "only the venv's packages"
        shown = cli(running, "cluster", "status")
    assert "runtime base: configured, 4 packages (markdown-it-py " in shown
    assert f"({venv})" in shown


def test_a_base_environment_that_is_not_python_stops_the_server_at_its_start(
        tmp_path: Path) -> None:
    not_python = tmp_path / "not-python"
    not_python.write_text("#!/bin/sh\nexit 3\n")
    not_python.chmod(0o755)
    cluster = tmp_path / "cluster.yaml"
    for named, said in ((not_python, "is not a Python interpreter muster can use"),
                        (tmp_path / "missing", "does not exist"),
                        (tmp_path, "a directory without bin/python")):
        cluster.write_text(f"base_environment: {named}\n")
        with pytest.raises(ConfigError, match=f"base_environment in the cluster config "
                                              f"cannot be used: .*{said}"):
            create_app(Home(tmp_path / "home"), ServerSettings(cluster_config=str(cluster)))
