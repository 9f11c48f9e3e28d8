"""Following from the terminal: exit codes that tell how it ended, Ctrl-C that says the run
goes on, a search followed trial by trial, and every attempt of a restarted trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import assert_clean_failure, create_json, on
from tests.server.experiments import only_trial, write_context
from tests.servers import RunningServer

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

# Killed by a signal on its first attempt (TRANSIENT: retried), fine on its second.
CRASH_ONCE = """\
import os, signal
attempt = os.environ["MUSTER_ATTEMPT"]
print(f"attempt {attempt} starts", flush=True)
if attempt == "1":
    os.kill(os.getpid(), signal.SIGSEGV)
print(f"attempt {attempt} done", flush=True)
"""


def search_context(tmp_path: Path, script: str) -> Path:
    context = write_context(tmp_path, ["python", "train.py"], files={"train.py": script})
    config = yaml.safe_load((context / "experiment.yaml").read_text())
    config.update(hyperparameters={"x": {"type": "categorical", "vals": [1, 2]}},
                  searcher={"name": "grid", "metric": "loss", "max_concurrent_trials": 2})
    (context / "experiment.yaml").write_text(yaml.safe_dump(config))
    return context


def test_a_search_is_followed_trial_by_trial(server: RunningServer, tmp_path: Path) -> None:
    script = ("import json, os, pathlib\n"
              "x = json.loads(pathlib.Path(os.environ['MUSTER_HPARAMS']).read_text())['x']\n"
              "print(f'x is {x}')\n")
    context = search_context(tmp_path, script)
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context),
              "--follow")
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert lines == ["[trial 0] x is 1", "[trial 1] x is 2"] or lines == [
        "[trial 0] x is 2", "[trial 1] x is 1"], done.stdout
    ended = [line for line in done.stderr.splitlines() if " ended SUCCEEDED" in line]
    assert len(ended) == 2 and {line.split()[1] for line in ended} == {"0]", "1]"}
    # Each trial's end says its verdict: a plain script's exit 0 is not verified, and why.
    assert all(": exit 0 — not verified: " in line for line in ended), ended


def test_follow_and_wait_exit_1_unless_everything_succeeded(
    server: RunningServer, tmp_path: Path
) -> None:
    context = search_context(tmp_path, "import json, os, pathlib, sys\n"
                             "x = json.loads(pathlib.Path(os.environ['MUSTER_HPARAMS'])"
                             ".read_text())['x']\nsys.exit(0 if x == 1 else 3)\n")
    for flag in ("--follow", "--wait"):
        done = on(server, "experiment", "create", str(context / "experiment.yaml"),
                  str(context), flag, "--json")
        assert done.returncode == 1, (flag, done.stderr)
        exp = json.loads(done.stdout)
        assert exp["state"] == "COMPLETED"  # one trial succeeded, the other did not
        assert sorted(t["state"] for t in exp["trials"]) == ["FAILED", "SUCCEEDED"]


def _ctrl_c_reaches_it() -> None:
    """A shell without job control starts background jobs with SIGINT ignored, and children
    inherit that (then Python installs no KeyboardInterrupt): undo it, as a terminal has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_says_the_experiment_keeps_running(server: RunningServer, tmp_path: Path) -> None:
    script = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"
    context = write_context(tmp_path, ["python", "sleep.py"], files={"sleep.py": script})
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "PYTHONUNBUFFERED": "1"}
    cli = subprocess.Popen([sys.executable, "-m", "muster", "experiment", "create",
                            str(context / "experiment.yaml"), str(context), "--follow"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_ctrl_c_reaches_it)
    assert cli.stdout is not None
    assert cli.stdout.readline() == "started\n"
    cli.send_signal(signal.SIGINT)
    _, err = cli.communicate(timeout=30)
    assert cli.returncode == 130, err
    with server.client() as client:
        exp = client.list_experiments()[-1]
        assert exp["state"] == "ACTIVE"  # it goes on
        assert (f"stopped following; experiment {exp['id']} keeps running (muster experiment "
                f"kill {exp['id']})") in err
        assert "Traceback" not in err
        client.kill_experiment(exp["id"])


def test_trial_logs_shows_every_attempt_with_why_it_restarted(
    server: RunningServer, tmp_path: Path
) -> None:
    context = write_context(tmp_path, ["python", "crash.py"], files={"crash.py": CRASH_ONCE})
    trial = only_trial(create_json(server, context, "--wait"))
    trial_id = str(trial["id"])
    assert trial["state"] == "SUCCEEDED"
    marker = "── attempt 2 (restart after rank 0 ended TRANSIENT: SIGSEGV) ──\n"
    both = "attempt 1 starts\nattempt 2 starts\nattempt 2 done\n"
    done = on(server, "trial", "logs", trial_id)
    # Not a terminal: the logs alone on stdout, the marker on stderr.
    assert (done.returncode, done.stdout, done.stderr) == (0, both, marker)
    done = on(server, "trial", "logs", trial_id, "--follow")
    assert (done.returncode, done.stdout, done.stderr) == (0, both, marker)
    done = on(server, "trial", "logs", trial_id, "--attempt", "2")
    assert (done.returncode, done.stdout, done.stderr) == (0, "attempt 2 starts\nattempt 2 "
                                                              "done\n", "")


def test_events_number_attempts_as_the_attempts_table_does(
    server: RunningServer, tmp_path: Path
) -> None:
    context = write_context(tmp_path, ["python", "crash.py"], files={"crash.py": CRASH_ONCE})
    trial = only_trial(create_json(server, context, "--wait"))
    described = json.loads(on(server, "trial", "describe", str(trial["id"]), "--json").stdout)
    numbers = {a["number"] for a in described["attempts"]}
    about_attempts = [e for e in described["events"] if e["entity"] == "attempt"]
    assert numbers == {1, 2} and {e["attempt"] for e in about_attempts} == numbers
    assert all(e["attempt"] is None for e in described["events"] if e["entity"] != "attempt")
    table = on(server, "trial", "describe", str(trial["id"])).stdout
    assert "attempt 1" in table and "attempt 2" in table


def test_trial_logs_follow_exits_1_for_a_trial_that_did_not_succeed(
    server: RunningServer, tmp_path: Path
) -> None:
    context = write_context(tmp_path, ["python", "-c", "import sys; print('x'); sys.exit(4)"])
    trial = only_trial(create_json(server, context, "--wait"))
    done = on(server, "trial", "logs", str(trial["id"]), "--follow")
    assert (done.returncode, done.stdout) == (1, "x\n")
    assert f"trial {trial['id']} is FAILED: failed: " in done.stderr


def test_trial_logs_follow_require_verified_exits_3_for_an_exit_0_not_verified(
    server: RunningServer, tmp_path: Path
) -> None:
    context = write_context(tmp_path, ["python", "-c", "print('x')"])
    trial = only_trial(create_json(server, context, "--wait"))
    done = on(server, "trial", "logs", str(trial["id"]), "--follow", "--require-verified")
    assert (done.returncode, done.stdout) == (3, "x\n"), done.stderr
    assert f"trial {trial['id']}: exit 0 — not verified: " in done.stderr
    assert "(--require-verified)" in done.stderr
    done = on(server, "trial", "logs", str(trial["id"]), "--follow")
    assert (done.returncode, done.stdout, done.stderr) == (0, "x\n", "")  # as before


def test_a_rank_the_trial_does_not_have_is_named(server: RunningServer, tmp_path: Path) -> None:
    context = write_context(tmp_path, ["python", "-c", "print(1)"])
    trial = only_trial(create_json(server, context, "--wait"))
    for args in ((), ("--follow",)):
        done = on(server, "trial", "logs", str(trial["id"]), "--rank", "5", *args)
        assert f"trial {trial['id']} has no rank 5; its ranks are 0" in assert_clean_failure(done)

