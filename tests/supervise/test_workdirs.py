"""Trials are independent (invariant 8): each runs in its own copy of the context, which its
attempts share, so a script that resumes from its own files in its cwd (torchrun's snapshot
style) finds them after a restart and never finds another trial's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from muster.client import pack_context
from muster.rundir import RunDir
from muster.services.experiments import create_experiment
from muster.states import ExperimentState
from muster.store import Experiment, Trial
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
