"""Environments on a real server: real uv, real venvs, wheels built in the test (no index).

Each test makes its own wheels and requirements (`--no-index --find-links`), so a build
needs no network and every hash is the test's own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from muster.environments.build import LOG_BYTES
from muster.environments.layout import EnvHome
from tests.environments.wheels import make_wheel
from tests.server.experiments import only_trial, wait_ended, write_context
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]

# uv asks an index that does not answer 3 more times, with backoff, by default: the test of
# that failure needs muster's retry, not uv's (a build of a real index is unchanged).
server = shared_server(env={"UV_HTTP_RETRIES": "0"})

REPORT = """\
import json, os, shutil, sys
found = {"prefix": sys.prefix, "python": shutil.which("python"), "pip": shutil.which("pip")}
for name in ("tinyalpha", "tinybeta", "yaml", "muster.harness"):
    try:
        module = __import__(name, fromlist=["_"])
        found[name] = getattr(module, "VERSION", "imported")
    except ImportError as exc:
        found[name] = f"missing: {exc}"
print("REPORT " + json.dumps(found), flush=True)
"""


def _context(tmp_path: Path, environment: dict[str, Any], lines: list[str] | None = None,
             script: str = REPORT, entrypoint: list[str] | None = None,
             failure_policy: dict[str, Any] | None = None) -> Path:
    files = {"job.py": script}
    if lines is not None:
        files["requirements.txt"] = "".join(f"{line}\n" for line in lines)
    context = write_context(tmp_path, entrypoint or ["python", "job.py"], files=files,
                            failure_policy=failure_policy)
    config = json.loads((context / "experiment.yaml").read_text())
    config["environment"] = environment
    (context / "experiment.yaml").write_text(json.dumps(config))
    return context


def _wheels(tmp_path: Path, *, alpha: str = "1.0") -> Path:
    where = tmp_path / "wheels"
    make_wheel(where, "tinyalpha", alpha)
    make_wheel(where, "tinybeta", "2.0", requires=["tinyalpha>=1"])
    return where


def _index(wheels: Path) -> list[str]:
    return ["--no-index", f"--find-links {wheels}"]


def _submit(server: RunningServer, context: Path) -> int:
    with server.client() as client:
        created = client.create_experiment((context / "experiment.yaml").read_text(), context)
    return int(created["id"])


def _trial(server: RunningServer, experiment_id: int) -> dict[str, Any]:
    with server.client() as client:
        trial: dict[str, Any] = client.get_trial(
            only_trial(client.get_experiment(experiment_id))["id"])
    return trial


def _ended_trial(server: RunningServer, experiment_id: int, timeout: float = 120
                 ) -> dict[str, Any]:
    with server.client() as client:
        wait_ended(client, experiment_id, timeout=timeout)
    return _trial(server, experiment_id)


def _report(server: RunningServer, trial: dict[str, Any]) -> dict[str, Any]:
    with server.client() as client:
        text = client.read_logs(trial["id"]).data.decode()
    line = next(x for x in text.splitlines() if x.startswith("REPORT "))
    found: dict[str, Any] = json.loads(line.removeprefix("REPORT "))
    return found


def _cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
               "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "muster", *args], env=environ,
                          capture_output=True, text=True, timeout=120)


def _envs(server: RunningServer) -> dict[str, dict[str, Any]]:
    done = _cli(server, "env", "list", "--json")
    assert done.returncode == 0, done.stderr
    return {env["hash"]: env for env in json.loads(done.stdout)}


def _builders(home: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "muster.environments.build" in cmdline and str(home / "envs") in cmdline:
            found.append(proc)
    return found


def _musters_venv_freeze() -> str:
    return subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"],
                          capture_output=True, text=True, check=True).stdout


def test_two_experiments_share_one_build_and_run_in_it(server: RunningServer,
                                                       tmp_path: Path) -> None:
    wheels = _wheels(tmp_path)
    lines = [*_index(wheels), "tinybeta==2.0"]
    first = _submit(server, _context(tmp_path, {"requirements": "requirements.txt"}, lines))
    second = _submit(server, _context(tmp_path, {"requirements": "requirements.txt"}, lines))
    trials = [_ended_trial(server, e) for e in (first, second)]
    assert [t["state"] for t in trials] == ["SUCCEEDED", "SUCCEEDED"]
    key = trials[0]["environment"]["hash"]
    assert trials[1]["environment"]["hash"] == key
    assert "tinybeta==2.0" in trials[0]["environment"]["freeze"]
    envs = _envs(server)
    assert envs[key]["state"] == "READY"
    assert envs[key]["packages"] == ["tinybeta==2.0"]
    assert sorted(envs[key]["trials"]) == sorted(t["id"] for t in trials)
    layout = EnvHome(server.home / "envs")
    assert len(list(layout.store.glob(f"{key}-*"))) == 1, "built once for both"
    for trial in trials:
        report = _report(server, trial)
        assert report["tinybeta"] == "2.0" and report["tinyalpha"] == "1.0"
        assert report["yaml"] == "imported", "inherit is the default: the base's packages too"
        assert report["muster.harness"] == "imported"
        # `python` and `pip` are the trial's own layer's, never muster's venv.
        assert report["prefix"].startswith(str(server.home / "runs"))
        assert report["python"] == f"{report['prefix']}/bin/python"
        assert report["pip"] == f"{report['prefix']}/bin/pip"
    assert trials[0]["environment"]["hash"] in _cli(server, "trial", "describe",
                                                    str(trials[0]["id"])).stdout


ON_THE_BASE = """\
import importlib, json, os, shutil, sys
found = {"prefix": sys.prefix, "pytest_program": shutil.which("pytest"),
         "torchrun": shutil.which("torchrun")}
for name in ("tinytorchuser", "torch", "muster.harness", "fastapi", "uvicorn", "pytest"):
    try:
        importlib.import_module(name)
        found[name] = "imported"
    except ImportError as exc:
        found[name] = f"missing: {exc}"
print("REPORT " + json.dumps(found), flush=True)
"""


def test_a_built_environment_stands_on_the_runtime_base_not_musters_venv(
    server: RunningServer, tmp_path: Path
) -> None:
    """`pip: [a local package that needs torch]` without environment.python: uv finds torch
    in the runtime base (offline: it is never fetched), and the trial imports the package
    and torch but none of muster's server, test or CLI packages, nor runs their programs."""
    wheel = make_wheel(tmp_path / "wheels", "tinytorchuser", "1.0", requires=["torch"],
                       code="import torch\nVERSION = '1.0'\n")
    context = _context(tmp_path, {"pip": [f"tinytorchuser @ file://{wheel}"]},
                       script=ON_THE_BASE)
    trial = _ended_trial(server, _submit(server, context))
    assert trial["state"] == "SUCCEEDED", trial["message"]
    report = _report(server, trial)
    assert (report["tinytorchuser"], report["torch"], report["muster.harness"]) == (
        "imported", "imported", "imported")
    for name in ("fastapi", "uvicorn", "pytest"):
        assert report[name] == f"missing: No module named '{name}'", name
    musters_bin = os.path.dirname(sys.executable)
    assert report["pytest_program"] is None or not report["pytest_program"].startswith(
        musters_bin), "muster's venv's programs are not on the trial's PATH"
    assert report["torchrun"] == f"{report['prefix']}/bin/torchrun", "the base's, rebased"
    built = EnvHome(server.home / "envs").built(trial["environment"]["hash"])
    assert built is not None
    site = next((built / "lib").glob("python*/site-packages"))
    assert not (site / "torch").exists(), "torch was not installed again"
    [stub] = site.glob("torch-*.dist-info")
    assert (stub / "INSTALLER").read_text() == "muster-inherited\n"
    record = json.loads((built / ".muster" / "env.json").read_text())
    assert record["python"] == str(server.home / "envs" / "runtime" / "current" / "bin"
                                   / "python")


def test_inherit_false_is_a_clean_environment_with_pip_and_the_harness(
    server: RunningServer, tmp_path: Path
) -> None:
    wheels = _wheels(tmp_path)
    context = _context(tmp_path, {"requirements": "requirements.txt", "inherit": False},
                       [*_index(wheels), "tinyalpha==1.0"])
    trial = _ended_trial(server, _submit(server, context))
    assert trial["state"] == "SUCCEEDED", trial["message"]
    report = _report(server, trial)
    assert report["tinyalpha"] == "1.0"
    assert report["yaml"].startswith("missing"), "a clean environment sees none of muster's"
    assert report["muster.harness"] == "imported"
    assert report["pip"] == f"{report['prefix']}/bin/pip"


def test_a_failing_requirement_fails_the_trial_with_the_resolvers_words(
    server: RunningServer, tmp_path: Path
) -> None:
    wheels = _wheels(tmp_path)
    context = _context(tmp_path, {"requirements": "requirements.txt"},
                       [*_index(wheels), "tinyalpha==9.9"])
    trial = _ended_trial(server, _submit(server, context))
    assert (trial["state"], trial["reason"]) == ("FAILED", "PERMANENT_ERROR")
    assert "No solution found when resolving dependencies" in trial["message"]
    assert "tinyalpha==9.9" in trial["message"]
    assert trial["attempts"] == [], "nothing was launched"
    key = trial["environment"]["hash"]
    assert _envs(server)[key]["state"] == "FAILED"
    logs = _cli(server, "env", "logs", key[:6])
    assert logs.returncode == 0 and "No solution found" in logs.stdout
    described = _cli(server, "trial", "describe", str(trial["id"])).stdout
    assert "its build log" in described and "No solution found" in described


def test_an_index_that_does_not_answer_is_infra_retried_then_failed(
    server: RunningServer, tmp_path: Path
) -> None:
    """A real network failure: the only index is a closed port on this machine."""
    context = _context(tmp_path, {"requirements": "requirements.txt"},
                       ["--index-url http://127.0.0.1:9/simple", "tinyalpha==1.0"],
                       failure_policy={"trial_retries": 1})
    trial = _ended_trial(server, _submit(server, context))
    assert (trial["state"], trial["reason"]) == ("FAILED", "INFRA"), trial["message"]
    assert "127.0.0.1:9" in trial["message"]
    retried = [e["message"] for e in trial["events"] if e["reason"] == "environment"]
    assert len(retried) == 1 and "retry 1 of 1" in retried[0]


def test_pip_install_in_a_trial_changes_its_layer_never_musters_venv_or_the_build(
    server: RunningServer, tmp_path: Path
) -> None:
    wheels = _wheels(tmp_path)
    before = _musters_venv_freeze()
    installs = (f"import subprocess, sys\nsubprocess.run(['pip', 'install', '--no-index', "
                f"'--find-links', {str(wheels)!r}, 'tinybeta==2.0'], check=True)\n" + REPORT)
    # Without an environment block: the default layer over muster's own interpreter.
    plain = _ended_trial(server, _submit(server, _context(tmp_path, {}, script=installs)))
    assert plain["state"] == "SUCCEEDED", plain["message"]
    assert _report(server, plain)["tinybeta"] == "2.0"
    assert plain["environment"]["hash"] is None
    # With a built environment: the trial's layer takes the install, not the build.
    lines = [*_index(wheels), "tinyalpha==1.0"]
    built = _ended_trial(server, _submit(server, _context(
        tmp_path, {"requirements": "requirements.txt"}, lines, script=installs)))
    assert built["state"] == "SUCCEEDED", built["message"]
    assert _report(server, built)["tinybeta"] == "2.0"
    after_install = _ended_trial(server, _submit(server, _context(
        tmp_path, {"requirements": "requirements.txt"}, lines)))
    assert after_install["environment"]["hash"] == built["environment"]["hash"]
    assert _report(server, after_install)["tinybeta"].startswith("missing"), \
        "another trial of the same build does not see what one trial installed"
    assert _musters_venv_freeze() == before
    with pytest.raises(ImportError):
        __import__("tinybeta")


HOLD = """\
import os, time
while os.path.exists({hold!r}):
    time.sleep(0.05)
"""


def _held_build(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A context whose build waits in its setup command while `hold` exists."""
    hold = tmp_path / f"hold-{name}"
    hold.touch()
    context = _context(tmp_path, {"pip": [f"tinyalpha @ file://{_wheels(tmp_path / name)}"
                                          "/tinyalpha-1.0-py3-none-any.whl"],
                                  "setup": [["python", "-c", HOLD.format(hold=str(hold)),
                                             name]]})
    return context, hold


def _wait_building(server: RunningServer, experiment_id: int) -> dict[str, Any]:
    def building() -> dict[str, Any] | None:
        trial = _trial(server, experiment_id)
        reason = trial.get("queue_reason") or ""
        return trial if "running setup command 1 of 1" in reason else None
    found = wait_until(building, timeout=60, what="the build to reach its setup command")
    assert isinstance(found, dict)
    return found


def test_a_build_killed_midway_is_retried_and_never_used_half_made(
    server: RunningServer, tmp_path: Path
) -> None:
    context, hold = _held_build(tmp_path, "killed")
    experiment_id = _submit(server, context)
    trial = _wait_building(server, experiment_id)
    assert trial["state"] == "QUEUED" and trial["queue_reason"].startswith(
        "building environment ")
    key = trial["environment"]["hash"]
    layout = EnvHome(server.home / "envs")
    [builder] = _builders(server.home)
    os.killpg(builder.pid, signal.SIGKILL)
    # Killed: nothing looks built, and the trial is charged one INFRA retry.
    wait_until(lambda: not _builders(server.home) or None, timeout=30, what="the kill")
    assert layout.built(key) is None
    hold.unlink()
    ended = _ended_trial(server, experiment_id)
    assert ended["state"] == "SUCCEEDED", ended["message"]
    events = ended["events"]
    retried = [e["message"] for e in events if e["reason"] == "environment"]
    assert len(retried) == 1 and "killed (SIGKILL)" in retried[0]
    assert "retry 1 of" in retried[0]
    assert layout.built(key) is not None
    assert len(list(layout.store.glob(f"{key}-*"))) == 1, "the half-made one is gone"


def test_a_server_sigkilled_mid_build_builds_again_after_the_restart(
    server: RunningServer, tmp_path: Path
) -> None:
    context, hold = _held_build(tmp_path, "server")
    experiment_id = _submit(server, context)
    key = _wait_building(server, experiment_id)["environment"]["hash"]
    layout = EnvHome(server.home / "envs")
    server.kill()
    # The build leaves with its server; what it made is not published.
    wait_until(lambda: not _builders(server.home) or None, timeout=30,
               what="the build to leave with the server")
    assert layout.built(key) is None
    assert len(list(layout.store.glob(f"{key}-*"))) == 1, "the half-made venv is there"
    hold.unlink()
    server.start()
    ended = _ended_trial(server, experiment_id)
    assert ended["state"] == "SUCCEEDED", ended["message"]
    built = layout.built(key)
    assert built is not None
    assert [p.resolve() for p in layout.store.glob(f"{key}-*")] == [built]


def test_prune_never_removes_an_environment_a_trial_still_needs(
    server: RunningServer, tmp_path: Path
) -> None:
    wheels = _wheels(tmp_path)
    done = _ended_trial(server, _submit(server, _context(
        tmp_path, {"requirements": "requirements.txt"}, [*_index(wheels), "tinyalpha==1.0"])))
    unused = done["environment"]["hash"]
    go = tmp_path / "go"
    waits = f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
    running = _submit(server, _context(tmp_path, {"requirements": "requirements.txt"},
                                       [*_index(wheels), "tinybeta==2.0"],
                                       script=waits + REPORT))

    def started() -> str | None:
        trial = _trial(server, running)
        return trial["environment"]["hash"] if trial["state"] == "RUNNING" else None
    in_use = wait_until(started, timeout=60, what="the second trial to run")
    pruned = _cli(server, "env", "prune", "--older-than", "0s", "--json")
    assert pruned.returncode == 0, pruned.stderr
    result = json.loads(pruned.stdout)
    assert unused in result["removed"] and in_use in result["kept_in_use"], (result, unused)
    envs = _envs(server)
    assert unused not in envs and envs[in_use]["state"] == "READY"
    go.touch()
    trial = _ended_trial(server, running)
    assert trial["state"] == "SUCCEEDED", trial["message"]
    assert _report(server, trial)["tinybeta"] == "2.0"


def test_a_missing_interpreter_or_requirements_file_is_refused_at_submission(
    server: RunningServer, tmp_path: Path
) -> None:
    from muster.errors import ConfigError

    for environment, problem in [
        ({"python": "/nowhere/bin/python"}, "environment.python: /nowhere/bin/python does "
                                            "not exist on the server"),
        ({"requirements": "missing.txt"}, "environment.requirements: 'missing.txt' is not in "
                                          "the uploaded context directory"),
    ]:
        context = _context(tmp_path, environment)
        with server.client() as client, pytest.raises(ConfigError, match=re.escape(problem)):
            client.create_experiment((context / "experiment.yaml").read_text(), context)


def test_a_queued_build_shows_what_it_does_and_holds_no_slot(
    server: RunningServer, tmp_path: Path
) -> None:
    context, hold = _held_build(tmp_path, "queued")
    experiment_id = _submit(server, context)
    trial = _wait_building(server, experiment_id)
    assert trial["queue_reason"].startswith(
        f"building environment {trial['environment']['hash'][:8]}…: running setup command")
    with server.client() as client:
        assert client.cluster_status()["slots_in_use"] == 0
    hold.unlink()
    started = time.monotonic()
    ended = _ended_trial(server, experiment_id)
    assert ended["state"] == "SUCCEEDED", (ended["message"], time.monotonic() - started)


def test_two_trials_that_differ_in_one_package_version_diff_to_it(server: RunningServer,
                                                                    tmp_path: Path) -> None:
    """Issue 17: the environments' `pip freeze` is in each trial's snapshot, so two trials
    whose environments differ in one version show that version, and no other package (then
    the environments' keys, a hash of them all)."""
    wheels = tmp_path / "wheels"
    for version in ("1.0", "1.1"):
        make_wheel(wheels, "tinyalpha", version)
    experiments = [
        _submit(server, _context(tmp_path / version, {"requirements": "requirements.txt"},
                                 [*_index(wheels), f"tinyalpha=={version}"]))
        for version in ("1.0", "1.1")]
    first, second = (_ended_trial(server, e) for e in experiments)
    assert (first["state"], second["state"]) == ("SUCCEEDED", "SUCCEEDED")
    done = _cli(server, "trial", "diff", str(first["id"]), str(second["id"]), "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["differences"]
    packages = [d for d in found if d["group"] == "packages"]
    assert packages[0] == {"group": "packages", "field": "environment.packages.tinyalpha",
                           "a": "1.0", "b": "1.1", "rank": None}
    assert [d["field"] for d in packages[1:]] == ["environment.key"]


def test_a_setup_command_that_prints_without_end_fills_no_disk_and_no_memory(
    server: RunningServer, tmp_path: Path
) -> None:
    """80 MB in one line without a newline: the build reads it in pieces, keeps its tail,
    and its log stops at LOG_BYTES with a line that says so."""
    flood = ["sh", "-c", "head -c 80000000 /dev/zero | tr '\\0' x; echo; echo flood-done"]
    trial = _ended_trial(server, _submit(server, _context(tmp_path, {"setup": [flood]})))
    assert trial["state"] == "SUCCEEDED", trial["message"]
    log = EnvHome(server.home / "envs").log(trial["environment"]["hash"])
    assert LOG_BYTES - (1 << 20) < log.stat().st_size < LOG_BYTES + 4096
    with log.open("rb") as f:
        f.seek(-2048, os.SEEK_END)
        tail = f.read()
    assert b"(the log stops here: it holds 64 MiB; the build goes on)" in tail


def test_a_failed_setup_command_s_output_stays_in_the_build_log(
    server: RunningServer, tmp_path: Path
) -> None:
    """Every reader sees a trial's message, only owners and admins the build log: what a
    setup command printed before it failed goes to the log, never into the message."""
    failing = ["sh", "-c", "echo private-build-output-$((40 + 2)); exit 3"]
    trial = _ended_trial(server, _submit(server, _context(tmp_path, {"setup": [failing]})))
    assert trial["state"] == "FAILED", trial
    assert "environment.setup[0]" in trial["message"], trial["message"]
    assert "failed (exit 3); what it printed is in the build log" in trial["message"]
    assert "private-build-output-42" not in trial["message"]
    log = EnvHome(server.home / "envs").log(trial["environment"]["hash"])
    assert b"private-build-output-42" in log.read_bytes()
