"""Trials are independent (invariant 8): each runs in its own copy of the context, which its
attempts share, so a script that resumes from its own files in its cwd (torchrun's snapshot
style) finds them after a restart and never finds another trial's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.client import pack_context
from muster.launch.accounts import Account
from muster.rundir import RunDir
from muster.services.experiments import create_experiment
from muster.states import ExperimentState
from muster.store import Experiment, Trial
from muster.supervise.ownership import grant_trial
from muster.supervise.workdir import prepare_workdir
from tests.supervise.conftest import Rig

pytestmark = pytest.mark.timeout(120)

# What the DDP tutorial does with its snapshot.pt, in miniature: a file in the cwd is "mine
# to resume from". The trial with x = 0 is killed by a signal on its first attempt (TRANSIENT:
# retried) after writing its file; its second attempt must find it.
SCRIPT = """\
import json, os, pathlib, signal
import muster.harness as mh
x = json.loads(pathlib.Path(os.environ["MUSTER_HPARAMS"]).read_text())["x"]
attempt = os.environ["MUSTER_ATTEMPT"]
mine = pathlib.Path("mine.txt")
found = mine.read_text() if mine.exists() else "nothing"
shipped = pathlib.Path("shipped.txt").read_text()
print(f"x={x} attempt={attempt} found={found} shipped={shipped} data={os.listdir('data')}")
pathlib.Path("shipped.txt").write_text(f"rewritten by x={x}")
if not mine.exists():
    mine.write_text(f"x={x}")
if x == 0 and attempt == "1":
    os.kill(os.getpid(), signal.SIGSEGV)
with mh.init() as ctx:
    ctx.samples.seen(1, epoch=0)  # the one file of the data path
"""


def submit_two_trials(rig: Rig, tmp_path: Path) -> int:
    context = tmp_path / "context"
    (context / "data").mkdir(parents=True)
    (context / "train.py").write_text(SCRIPT)
    (context / "shipped.txt").write_text("as shipped")
    (context / "data" / "sample.bin").write_bytes(b"\x00" * 1000)
    archive = tmp_path / "context.tar.gz"
    archive.write_bytes(pack_context(context))
    config = {"name": "independent", "entrypoint": ["python", "train.py"],
              "hyperparameters": {"x": {"type": "categorical", "vals": [0, 1]}},
              "searcher": {"name": "grid", "metric": "loss", "max_concurrent_trials": 1},
              "data": {"path": "data"}, "verify": {"require_checkpoint": False},
              "failure_policy": {"stop_grace": "1s"}}
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config), archive)


def test_trials_never_see_each_others_files(sqlite_rig: Rig, tmp_path: Path) -> None:
    experiment_id = submit_two_trials(sqlite_rig, tmp_path)
    sqlite_rig.tick_until(lambda: sqlite_rig.experiment_state(experiment_id).is_terminal(),
                          what="the experiment to end")
    assert sqlite_rig.experiment_state(experiment_id) is ExperimentState.COMPLETED
    with sqlite_rig.store.session_scope() as s:
        trials = [(t.uuid, t.hparams["x"], t.state, len(t.attempts)) for t in s.scalars(
            select(Trial).where(Trial.experiment_id == experiment_id))]
        trials.sort(key=lambda trial: trial[1])
        snapshot = Path(s.get_one(Experiment, experiment_id).context_dir)
    assert [(x, state, attempts) for _, x, state, attempts in trials] == [
        (0, "SUCCEEDED", 2), (1, "SUCCEEDED", 1)]
    logs = {(x, n): sqlite_rig.home.run_dir(uuid).attempt(n).rank(0).log.read_text()
            for uuid, x, _, attempts in trials for n in range(1, attempts + 1)}
    # Its own file survives its restart; the other trial started clean.
    assert "found=nothing shipped=as shipped" in logs[(0, 1)]
    assert "found=x=0 shipped=rewritten by x=0" in logs[(0, 2)]
    assert "found=nothing shipped=as shipped data=['sample.bin']" in logs[(1, 1)]
    # The snapshot itself is never run in, and the data is shared, not copied.
    assert (snapshot / "shipped.txt").read_text() == "as shipped"
    assert not (snapshot / "mine.txt").exists()
    assert (snapshot / "data" / "sample.bin").stat().st_nlink == 3
    for uuid, x, _, _ in trials:
        workdir = sqlite_rig.home.run_dir(uuid).workdir
        assert (workdir / "mine.txt").read_text() == f"x={x}"
        assert json.loads(sqlite_rig.home.run_dir(uuid).attempt(1).hparams.read_text())["x"] == x


def test_a_copy_left_half_made_is_made_again(tmp_path: Path) -> None:
    context = tmp_path / "context"
    (context / "sub").mkdir(parents=True)
    (context / "sub" / "a.py").write_text("print(1)")
    os.symlink("sub/a.py", context / "link.py")
    workdir = RunDir(tmp_path / "run").workdir
    half = workdir.with_name(f".{workdir.name}.tmp-{os.getpid()}")
    half.mkdir(parents=True)
    (half / "junk").write_text("from a server killed mid-copy")
    assert prepare_workdir(context, workdir) is True
    assert sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob("*")) == [
        "link.py", "sub", "sub/a.py"]
    assert os.readlink(workdir / "link.py") == "sub/a.py" and not half.exists()
    assert (workdir / "sub" / "a.py").stat().st_ino != (context / "sub" / "a.py").stat().st_ino
    (workdir / "sub" / "a.py").write_text("changed by the trial")
    assert prepare_workdir(context, workdir) is False  # made once: every attempt shares it
    assert (workdir / "sub" / "a.py").read_text() == "changed by the trial"
    assert (context / "sub" / "a.py").read_text() == "print(1)"


# Under run_as every file of a working directory is a hard link to the snapshot's: only the
# directories are new. The job's account owns them, not the files (root's, read-only), so a
# write through a link fails and a replacement breaks the link.
JOB_PYTHON = Path("/usr/bin/python3")  # one every account can run (the venv may be root's)
JOB_WRITES = """\
import os, pathlib
results = {"read": open("shipped.txt").read(), "runnable": os.access("run.sh", os.X_OK)}
for name, act in [
    ("write", lambda: open("shipped.txt", "w").write("written through")),
    ("append", lambda: open("data/sample.bin", "ab").write(b"!")),
    ("chmod", lambda: os.chmod("shipped.txt", 0o666)),
]:
    try:
        act()
        results[name] = "done"
    except OSError as exc:
        results[name] = type(exc).__name__
pathlib.Path("shipped.txt.new").write_text("replaced by the job")
os.replace("shipped.txt.new", "shipped.txt")
pathlib.Path("mine.txt").write_text("the job's own")
print(results)
"""
NOBODY = Account(name="nobody", uid=65534, gid=65534, groups=(65534,), home="/")


def linked_workdirs(top: Path) -> tuple[Path, list[RunDir]]:
    context = top / "context"
    (context / "data").mkdir(parents=True)
    (context / "shipped.txt").write_text("as shipped")
    (context / "shipped.txt").chmod(0o600)  # a snapshot's files are the server's alone
    (context / "run.sh").write_text("echo hi\n")
    (context / "run.sh").chmod(0o700)
    (context / "data" / "sample.bin").write_bytes(b"\x00" * 1000)
    runs = [RunDir(top / "runs" / name) for name in ("one", "two")]
    for run in runs:
        assert prepare_workdir(context, run.workdir, context / "data", link_all=True)
        grant_trial(run, NOBODY)
    return context, runs


@pytest.mark.skipif(os.geteuid() != 0 or not JOB_PYTHON.exists(),
                    reason="running a job as another account needs root and /usr/bin/python3")
def test_a_linked_working_directory_is_changed_only_by_replacing_its_files() -> None:
    top = Path(tempfile.mkdtemp(prefix="muster-workdirs-", dir="/tmp"))
    try:
        top.chmod(0o755)  # the job's account must reach its own working directory
        context, (one, two) = linked_workdirs(top)
        for name in ("shipped.txt", "run.sh", "data/sample.bin"):
            assert (one.workdir / name).stat().st_ino == (context / name).stat().st_ino
        job = subprocess.run([str(JOB_PYTHON), "-c", JOB_WRITES], cwd=one.workdir,
                             user=NOBODY.uid, group=NOBODY.gid, extra_groups=[],
                             capture_output=True, text=True, timeout=60, check=True)
        assert job.stdout.strip() == str({"read": "as shipped", "runnable": True,
                                          "write": "PermissionError",
                                          "append": "PermissionError",
                                          "chmod": "PermissionError"}), job.stderr
        assert (one.workdir / "shipped.txt").read_text() == "replaced by the job"
        assert (one.workdir / "mine.txt").read_text() == "the job's own"
        for untouched in (context, two.workdir):
            assert (untouched / "shipped.txt").read_text() == "as shipped"
            assert (untouched / "data" / "sample.bin").read_bytes() == b"\x00" * 1000
            assert not (untouched / "mine.txt").exists()
    finally:
        shutil.rmtree(top)
