"""What can be checked at submission is checked there (issue 12, item 7), through the real
server and the real CLI: a clear `error:` naming the key path, exit 1, nothing stored.

Before, each of these was accepted: the trial then failed minutes later with the cause in
a log (a missing script, a missing data directory, `&&` handed to Python as an argument),
or waited in the queue forever (more replicas than the server has slots).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.test_cli import assert_clean_failure, on
from tests.server.experiments import write_context
from tests.servers import RunningServer, shared_server

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

server = shared_server()  # 4 slots, no GPUs


def _refused(server: RunningServer, tmp_path: Path, entrypoint: list[str],
             files: dict[str, str] | None = None, **extra: Any) -> str:
    """Submit through the CLI; the submission must be refused and store nothing."""
    context = write_context(tmp_path, entrypoint, files=files)
    config = json.loads((context / "experiment.yaml").read_text())
    (context / "experiment.yaml").write_text(json.dumps({**config, **extra}))
    with server.client() as client:  # (by id: an earlier test's experiments may still run)
        before = [e["id"] for e in client.list_experiments()]
    done = on(server, "experiment", "create", str(context / "experiment.yaml"), str(context))
    message = assert_clean_failure(done)
    with server.client() as client:
        assert [e["id"] for e in client.list_experiments()] == before
    return message


def test_a_script_missing_from_the_context(server: RunningServer, tmp_path: Path) -> None:
    message = _refused(server, tmp_path, ["python", "-u", "train.py", "--lr", "1"],
                       files={"model.py": "", "main.py": ""})
    assert ("entrypoint[2]: 'train.py' is not in the uploaded context directory (its Python "
            "files: main.py, model.py); upload the directory that holds it") in message


@pytest.mark.parametrize(("entrypoint", "index"), [
    (["torchrun", "--nproc-per-node", "2", "ddp.py", "--epochs", "1"], 3),
    (["bash", "run.sh"], 1),
    (["./scripts/train.sh"], 0),
])
def test_a_launcher_s_script_missing(server: RunningServer, tmp_path: Path,
                                     entrypoint: list[str], index: int) -> None:
    message = _refused(server, tmp_path, entrypoint, files={"other.py": ""})
    assert f"entrypoint[{index}]: {entrypoint[index]!r} is not in the uploaded context" in message


def test_shell_operators_as_words(server: RunningServer, tmp_path: Path) -> None:
    message = _refused(server, tmp_path, ["python", "a.py", "&&", "python", "b.py", ">", "out.log"],
                       files={"a.py": "", "b.py": ""})
    assert ("entrypoint[2]: '&&' is a shell operator, but the entrypoint runs without a "
            "shell, so it would reach the program as an argument; use a list or a script "
            "(e.g. `entrypoint: [bash, run.sh]`)") in message
    assert "entrypoint[5]: '>' is a shell operator" in message


def test_a_data_path_that_does_not_exist(server: RunningServer, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-data"
    message = _refused(server, tmp_path, ["python", "t.py"], files={"t.py": ""},
                       data={"path": str(missing)})
    assert (f"data.path: {str(missing)!r} does not exist on the server, which scans it before "
            "the first launch") in message
    file = tmp_path / "a-file"
    file.write_text("x")
    message = _refused(server, tmp_path, ["python", "t.py"], files={"t.py": ""},
                       data={"path": "t.py"})
    assert "data.path: 't.py' (in the context: " in message and "is not a directory" in message


def test_a_trial_bigger_than_the_cluster(server: RunningServer, tmp_path: Path) -> None:
    message = _refused(server, tmp_path, ["python", "t.py"], files={"t.py": ""},
                       resources={"replicas": 5})
    assert ("resources.replicas: a trial needs 5 slots at once, and this server has 4 slots in "
            "all, so it would wait forever") in message
    message = _refused(server, tmp_path, ["python", "t.py"], files={"t.py": ""},
                       resources={"gpus_per_replica": 1, "gpu_type": "h100"})
    assert ("resources.gpu_type: a trial needs 1 h100 GPU (1 replicas x 1), and this server "
            "has 0 h100 GPUs (its GPUs: none), so it would wait forever") in message


def test_a_nul_byte_anywhere(server: RunningServer, tmp_path: Path) -> None:
    message = _refused(server, tmp_path, ["python", "t\0.py"], files={"t.py": ""})
    assert "entrypoint[1]: holds a NUL byte" in message


def test_what_the_checks_cannot_judge_is_accepted(server: RunningServer, tmp_path: Path) -> None:
    """A module, a command, an absolute path and a program on PATH are not second-guessed."""
    for entrypoint in (["python", "-m", "json.tool", "--help"], ["python", "-c", "print(1)"],
                       ["python", str(tmp_path / "elsewhere.py")], ["true"],
                       ["python", "-W", "error", "t.py"]):
        context = write_context(tmp_path, entrypoint, files={"t.py": ""})
        done = on(server, "experiment", "create", str(context / "experiment.yaml"),
                  str(context), "--json")
        assert done.returncode == 0, (entrypoint, done.stderr)
        assert json.loads(done.stdout)["state"] == "ACTIVE"


def _posted(server: RunningServer, text: str) -> httpx.Response:
    """POST /api/v1/experiments with one config and no context, as a script would."""
    return httpx.post(f"{server.url}/api/v1/experiments", timeout=60,
                      headers={"Authorization": f"Bearer {server.token}"},
                      data={"config": text})


def test_a_data_path_with_no_file_to_count(server: RunningServer, tmp_path: Path) -> None:
    """Issue 30 item 4: a data folder the manifest would count 0 files in is refused, with
    the two fixes; `data.allow_empty: true` lets it through."""
    empty = tmp_path / "empty"
    empty.mkdir()
    message = _refused(server, tmp_path, ["python", "t.py"], files={"t.py": ""},
                       data={"path": str(empty)})
    assert (f"data.path: {str(empty)!r} holds no file matching * (every file counts: "
            "data.manifest.extensions is not set), so a run over it would train on nothing; "
            "add the data files there (or fix the path), or set data.allow_empty: true if the "
            "script brings its own data") in message
    other = tmp_path / "other"
    (other / "cat").mkdir(parents=True)
    (other / "cat" / "notes.txt").write_text("no image")
    body = {"path": str(other), "manifest": {"extensions": [".png", "jpg"]}}
    response = _posted(server, "name: x\nentrypoint: [python, -c, pass]\n"
                       f"data: {json.dumps(body)}\n")
    assert response.status_code == 422, response.text
    assert (f"data.path: {str(other)!r} holds no file matching *.png, *.jpg "
            "(data.manifest.extensions)") in response.json()["message"]
    for data in ({"path": str(empty), "allow_empty": True},
                 {**body, "manifest": {"extensions": [".txt"]}}):
        response = _posted(server, f"name: x\nentrypoint: [python, -c, pass]\n"
                           f"data: {json.dumps(data)}\n")
        assert response.status_code == 201, (data, response.text)


@pytest.mark.parametrize(("setting", "problem"), [
    ("verify: {samples_tolerance: 1e-3}",
     "verify.samples_tolerance: YAML reads 1e-3 as a string: write 1.0e-3"),
    ("failure_policy: {trial_retries: 1e1}",
     "failure_policy.trial_retries: YAML reads 1e1 as a string: write 10"),
    ("searcher: {name: random, metric: loss, max_trials: 2}\n"
     "hyperparameters: {lr: {type: log, minval: 1e-5, maxval: -2}}",
     "hyperparameters.lr.minval: YAML reads 1e-5 as a string: write 1.0e-5"),
    ("searcher: {name: random, metric: loss, max_trials: 2}\n"
     "hyperparameters: {lr: {type: log, minval: 1.0e-5, maxval: 1.0e-2}}",
     "these are exponents of base 10: write minval: -5, maxval: -2"),
])
def test_numbers_that_are_not_what_was_meant_answer_422(server: RunningServer, setting: str,
                                                        problem: str) -> None:
    """Issue 30 item 10, through the API: the key path and the spelling to write."""
    response = _posted(server, f"name: x\nentrypoint: [python, -c, pass]\n{setting}\n")
    assert response.status_code == 422, response.text
    assert problem in response.json()["message"], response.json()
