"""resources.distributed_env: which trials get torchrun's variables (a table, no processes)."""

from __future__ import annotations

import pytest

from muster.jobenv import TORCHRUN_VARIABLES, job_environment
from muster.launch.torchrun import launches_torchrun, python_module, wants_distributed_env
from muster.states import DistributedEnv

AUTO, ALWAYS, NEVER = DistributedEnv.AUTO, DistributedEnv.ALWAYS, DistributedEnv.NEVER
SCRIPT = ["python", "train.py", "--epochs", "3"]
TORCHRUN = ["torchrun", "--nproc-per-node", "2", "train.py"]


@pytest.mark.parametrize(("setting", "replicas", "entrypoint", "wanted"), [
    (AUTO, 1, SCRIPT, False),  # nanoGPT on one replica: no RANK, no DDP path
    (AUTO, 2, SCRIPT, True),
    (AUTO, 1, TORCHRUN, True),
    (AUTO, 1, ["python", "-m", "torch.distributed.run", "train.py"], True),
    (ALWAYS, 1, SCRIPT, True),
    (ALWAYS, 4, SCRIPT, True),
    (NEVER, 1, TORCHRUN, False),
    (NEVER, 2, SCRIPT, False),
])
def test_auto_means_several_replicas_or_torchrun(setting: DistributedEnv, replicas: int,
                                                 entrypoint: list[str], wanted: bool) -> None:
    assert wants_distributed_env(setting, replicas, entrypoint) is wanted


@pytest.mark.parametrize(("entrypoint", "torchrun"), [
    (TORCHRUN, True),
    (["/opt/venv/bin/torchrun", "--standalone", "train.py"], True),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"], True),
    (["python3", "-m", "torch.distributed.launch", "t.py"], True),
    (["python3.11", "-mtorch.distributed.run", "t.py"], True),
    (["/usr/bin/python3", "-u", "-m", "torch.distributed.run", "t.py"], True),
    (["python", "-Bm", "torch.distributed.run", "t.py"], True),
    (["python", "-W", "ignore", "-X", "dev", "-m", "torch.distributed.run", "t.py"], True),
    (["python", "--check-hash-based-pycs", "never", "-m", "torch.distributed.run"], True),
    (SCRIPT, False),
    (["python", "-m", "train"], False),
    (["python", "-c", "import torch.distributed.run"], False),
    (["python", "-c", "-m torch.distributed.run"], False),
    (["python", "torchrun"], False),  # a script named torchrun in the context
    (["python", "--", "-m", "torch.distributed.run"], False),
    (["bash", "-m", "torch.distributed.run"], False),  # not a python
    (["accelerate", "launch", "train.py"], False),
    (["python", "-m"], False),
    ([], False),
])
def test_a_torchrun_entrypoint_is_recognised(entrypoint: list[str], torchrun: bool) -> None:
    assert launches_torchrun(entrypoint) is torchrun


@pytest.mark.parametrize(("args", "module"), [
    (["-m", "pkg.mod", "--flag"], "pkg.mod"),
    (["-mpkg"], "pkg"),
    (["-OO", "-m", "pkg"], "pkg"),
    (["-Wdefault", "-m", "pkg"], "pkg"),
    (["script.py", "-m", "pkg"], None),  # the script's own arguments
    (["-"], None),
    ([], None),
])
def test_the_module_python_runs(args: list[str], module: str | None) -> None:
    assert python_module(args) == module


def test_the_server_s_own_torchrun_variables_never_reach_a_job() -> None:
    """A server started where RANK or MASTER_PORT is set (inside another launcher) must not
    hand them to a trial that is not distributed; a job's own (muster's, or the config's
    by name) are kept."""
    inherited = {name: "9" for name in TORCHRUN_VARIABLES} | {"HOME": "/root"}
    env = job_environment(inherited, {"MUSTER_RANK": "0", "MASTER_PORT": "29511"})
    assert not (TORCHRUN_VARIABLES - {"MASTER_PORT"}) & env.keys()
    assert (env["MASTER_PORT"], env["MUSTER_RANK"], env["HOME"]) == ("29511", "0", "/root")
