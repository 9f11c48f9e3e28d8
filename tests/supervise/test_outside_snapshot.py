"""What muster records of an attempt from outside its process (issue 30, item 9): the
trial's own interpreter is asked, under `-I -S`, with real processes; nothing of the user's
is imported; its packages are read from the site directories' metadata; a program that
does not answer as an interpreter, or answers too much or too late, is recorded as unknown
and killed; under `run_as` the question runs as the job's account."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.diagnostics import read_outside_part
from muster.launch.accounts import Account
from muster.rundir import RunDir
from muster.supervise import outside_snapshot
from muster.supervise.outside_snapshot import Question, capture, record
from tests.server.test_run_as import SYSTEM_PYTHON, Accounts, accounts  # noqa: F401 (fixture)

OURS = ".".join(map(str, sys.version_info[:3]))


def dist(site: Path, folder: str, name: str, version: str | None,
         meta: str = "METADATA") -> None:
    """A distribution's metadata as an installer leaves it."""
    (site / folder).mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}"]
    if version is not None:
        lines.append(f"Version: {version}")
    (site / folder / meta).write_text("\n".join(lines) + "\n\nA description: Version: 9\n")


def venv(where: Path) -> tuple[Path, Path]:
    """A real venv of this interpreter, without pip: its python and its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    return where / "bin" / "python", next((where / "lib").glob("python*/site-packages"))


def fake_interpreter(where: Path, body: str) -> str:
    path = where / "python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_the_interpreter_answers_for_itself_and_imports_nothing_of_the_user_s(
        tmp_path: Path) -> None:
    python, site = venv(tmp_path / "layer")
    marker = tmp_path / "user-code-ran"
    # What a site directory may run at start-up: a .pth line and sitecustomize.
    (site / "evil.pth").write_text(f"import os; open({str(marker)!r}, 'w').close()\n")
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    dist(site, "tiny_alpha-1.0.dist-info", "Tiny.Alpha", "1.0")
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text("print('hi')\n")

    part = capture(Question(str(python), (str(site),), None, context), attempt=3)
    assert not marker.exists()
    assert part["source"] == "outside" and part["attempt"] == 3
    assert part["python"] == {"version": OURS, "implementation": "cpython"}
    assert part["packages"] == {"tiny-alpha": "1.0"}
    assert part["code"]["files"] == 1 and len(part["code"]["tree_sha256"]) == 64
    assert part["unknown"] == {}
    # Without -S the same interpreter would have run the user's code.
    subprocess.run([str(python), "-I", "-c", "pass"], check=True)
    assert marker.exists()


def test_packages_come_in_import_order_from_the_metadata_alone(tmp_path: Path) -> None:
    layer, lower = tmp_path / "layer", tmp_path / "lower"
    dist(layer, "numpy-2.0.2.dist-info", "numpy", "2.0.2")
    dist(lower, "numpy-1.26.4.dist-info", "numpy", "1.26.4")  # shadowed by the layer's
    dist(lower, "Old_Thing.egg-info", "Old_Thing", "0.3", meta="PKG-INFO")
    (lower / "flat-1.0.egg-info").write_text("Metadata-Version: 1.0\nName: flat\nVersion: 1.0\n")
    dist(lower, "noversion-1.dist-info", "noversion", None)
    (lower / "linked-1.0.dist-info").mkdir()
    (lower / "linked-1.0.dist-info" / "METADATA").symlink_to(
        lower / "Old_Thing.egg-info" / "PKG-INFO")  # a link is not read through
    (lower / "not-a-package.txt").write_text("Name: nope\nVersion: 1\n")

    part = capture(Question(sys.executable, (str(layer), str(lower), str(tmp_path / "gone")),
                            None, tmp_path), attempt=1)
    assert part["packages"] == {"numpy": "2.0.2", "old-thing": "0.3", "flat": "1.0"}


@pytest.mark.parametrize(("body", "said"), [
    ("echo '{\"version\": 3}'\n", "did not answer as a Python interpreter does"),
    ("exit 7\n", "exited 7 when asked what it is"),
    ("exec yes\n", "answered more than 4,194,304 bytes"),
])
def test_a_program_that_does_not_answer_as_an_interpreter_is_unknown(
        tmp_path: Path, body: str, said: str) -> None:
    part = capture(Question(fake_interpreter(tmp_path, body), (), None, tmp_path), attempt=1)
    assert part["python"] == {"version": None, "implementation": None}
    assert part["packages"] is None
    assert said in part["unknown"]["python"]


def test_an_interpreter_that_does_not_answer_in_time_is_killed_with_its_children(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outside_snapshot, "PROBE_TIMEOUT_S", 1.0)
    pids = tmp_path / "pids"
    python = fake_interpreter(tmp_path, f"sleep 600 & echo $$ $! > {pids}\nwait\n")
    part = capture(Question(python, (), None, tmp_path), attempt=1)
    assert part["unknown"]["python"].endswith("did not answer within 1 s")
    for pid in pids.read_text().split():
        assert _gone(int(pid)), f"process {pid} of the probe still runs"


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat_file:
                if stat_file.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True  # ended; its parent (init, once the shell died) reaps it
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_the_record_is_read_back_from_the_latest_attempt_that_has_one(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    question = Question(sys.executable, (), None, tmp_path)
    record(run, 1, question)
    record(run, 2, question)
    run.outside_snapshot(3).write_text("{not json")  # a record cut short: passed over
    found = read_outside_part(run, [1, 2, 3])
    assert found is not None and found["attempt"] == 2
    assert found["python"]["version"] == OURS
    assert stat.S_IMODE(run.outside_snapshot(2).stat().st_mode) == 0o600
    run.outside_snapshot(2).write_text(json.dumps({"source": "harness"}))  # not ours
    assert read_outside_part(run, [1, 2, 3])["attempt"] == 1  # type: ignore[index]
    assert read_outside_part(run, [4]) is None


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every account can reach (pytest's own is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="muster-outside-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def test_under_run_as_the_question_is_asked_as_the_job_s_account(
        accounts: Accounts, shared_dir: Path) -> None:  # noqa: F811 (the fixture)
    if not SYSTEM_PYTHON.is_file():
        pytest.skip(f"{SYSTEM_PYTHON} is not here")
    readable, private = shared_dir / "readable", shared_dir / "private"
    dist(readable, "seen-1.0.dist-info", "seen", "1.0")
    dist(private, "hidden-1.0.dist-info", "hidden", "1.0")
    private.chmod(0o700)  # root's: the job's account cannot list it
    alice = accounts.alice
    account = Account(alice.pw_name, alice.pw_uid, alice.pw_gid, (alice.pw_gid,),
                      alice.pw_dir)
    question = Question(str(SYSTEM_PYTHON), (str(private), str(readable)), account, shared_dir)
    assert capture(question, attempt=1)["packages"] == {"seen": "1.0"}
    as_root = Question(str(SYSTEM_PYTHON), (str(private), str(readable)), None, shared_dir)
    assert capture(as_root, attempt=1)["packages"] == {"hidden": "1.0", "seen": "1.0"}
    assert os.geteuid() == 0  # (the accounts fixture skips otherwise)
