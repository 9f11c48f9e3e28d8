"""muster's Determined Core API (`src/muster/compat/determined`), as a trial imports it.

The pure parts are tested here in this process (as `muster.compat.determined`); the rest
through real processes with the variables muster gives a trial and the compat directory on
PYTHONPATH, as `compat: determined` arranges: tiny scripts in tests/compat/fixtures/, and the
stages of Determined's own Core API tutorial (tests/fixtures/determined_tutorial/, NOTICE)
run by the entrypoints of their configs. No muster server: where a new attempt resumes, the
test names its checkpoint in MUSTER_LATEST_CHECKPOINT as the supervisor does.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from muster import checkpoint_files, harness, metrics_lines
from muster.compat.determined.core import _distributed, _sharding
from muster.compat.determined.core._storage_ids import STORAGE_ID_KEY, StorageIds
from muster.compat.determined.errors import CheckpointNotFound, InvalidCheckpointException
from muster.compat.determined.launch.torch_distributed import UsageError, script_of
from muster.metrics_lines import MetricLine
from muster.rundir import RunDir
from muster.states import MetricKind
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
COMPAT = REPO / "src" / "muster" / "compat"
FIXTURES = Path(__file__).parent / "fixtures"
TUTORIAL = REPO / "tests" / "fixtures" / "determined_tutorial"
HPARAMS = {"global_batch_size": 16, "learning_rate": 0.5, "n_filters1": 4, "n_filters2": 4,
           "dropout1": 0.25, "dropout2": 0.5}
PROCESS_TIMEOUT = 60.0
_TORCHRUN = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE"}


# The pure parts, in this process.

@pytest.mark.parametrize(("environ", "expected"), [
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     (1, 2, 1, 2, 0, 1)),
    ({"RANK": "0", "WORLD_SIZE": "1"}, (0, 1, 0, 1, 0, 1)),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}, (3, 4, 1, 2, 1, 2)),
])
def test_topology_comes_from_torchruns_variables(environ: dict[str, str],
                                                 expected: tuple[int, ...]) -> None:
    topology = _distributed.topology_from_environ(environ)
    assert tuple(topology.values()) == expected


@pytest.mark.parametrize(("environ", "message"), [
    ({"WORLD_SIZE": "2"}, "RANK is not set"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK must be an integer"),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "GROUP_RANK": "1"}, "GROUP_WORLD_SIZE is not set"),
])
def test_topology_refuses_what_torchrun_would_not_give(environ: dict[str, str],
                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _distributed.topology_from_environ(environ)


@pytest.mark.parametrize(("numbers", "message"), [
    ({"rank": 2, "size": 2, "local_rank": 0, "local_size": 2, "cross_rank": 0,
      "cross_size": 1}, "rank must be in"),
    ({"rank": 0, "size": 4, "local_rank": 0, "local_size": 2, "cross_rank": 0,
      "cross_size": 1}, "local_size must equal size"),
    ({"rank": 0, "size": 2, "local_rank": 0, "local_size": 3, "cross_rank": 0,
      "cross_size": 1}, "local_size at most size"),
])
def test_a_distributed_context_refuses_impossible_numbers(numbers: dict[str, int],
                                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _distributed.DistributedContext(**numbers)


def test_node_ranks_group_the_ranks_by_node_in_local_order() -> None:
    assert _distributed.node_ranks([(0, 0), (1, 0), (0, 1), (1, 1)], 2) == {0: [0, 2],
                                                                           1: [1, 3]}
    with pytest.raises(ValueError, match="both local rank 0 of node 0"):
        _distributed.node_ranks([(0, 0), (0, 0)], 1)
    with pytest.raises(ValueError, match="cross_size is 2"):
        _distributed.node_ranks([(0, 0), (0, 1)], 2)


def test_sharded_metadata_merges_and_names_conflicts() -> None:
    merged = _sharding.merge_metadata([{"steps_completed": 5, "a": {"x": 1}},
                                       {"steps_completed": 5, "a": {"y": 2}}, {}])
    assert merged == {"steps_completed": 5, "a": {"x": 1, "y": 2}}
    with pytest.raises(RuntimeError, match=r"/a/x from ranks \[0, 1\]"):
        _sharding.merge_metadata([{"a": {"x": 1}}, {"a": {"x": 2}}])


def test_sharded_files_go_to_the_lowest_rank_that_holds_them() -> None:
    assert _sharding.file_owners([{"a": "1"}, {"a": "1", "b": "2"}]) == {"a": 0, "b": 1}
    with pytest.raises(RuntimeError, match=r"a from ranks \[0, 1\]"):
        _sharding.file_owners([{"a": "1"}, {"a": "2"}])


@pytest.mark.parametrize(("argv", "script"), [
    (["python3", "train.py", "--epochs", "2"], ["python3", "train.py", "--epochs", "2"]),
    (["--", "python3", "train.py"], ["python3", "train.py"]),
])
def test_the_launcher_runs_the_script_it_is_given(argv: list[str], script: list[str]) -> None:
    assert script_of(argv) == script


@pytest.mark.parametrize(("argv", "message"), [
    (["--nproc_per_node", "4", "--", "python3", "train.py"], "no meaning under muster"),
    (["--trial", "model_def:Trial"], "Trial classes are not supported"),
    ([], "no script to run"),
])
def test_the_launcher_refuses_what_muster_decides(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        script_of(argv)


def test_what_is_not_provided_fails_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import muster.compat.determined as det

    monkeypatch.delenv("MUSTER_RUN_DIR", raising=False)
    det.get_cluster_info.cache_clear()
    with pytest.raises(ImportError, match=r"PyTorchTrial and det\.pytorch\.Trainer"):
        import muster.compat.determined.pytorch  # noqa: F401
    with pytest.raises(AttributeError, match="TFKerasTrial"):
        det.keras  # noqa: B018
    assert det.get_cluster_info() is None  # off the platform, as off a Determined cluster


def test_the_cluster_info_names_the_trial_and_its_experiment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import muster.compat.determined as det
    from muster.compat.determined import _run

    for name in [n for n in os.environ if n.startswith("MUSTER_") or n in _TORCHRUN]:
        monkeypatch.delenv(name)
    hparams = tmp_path / "hparams.json"
    hparams.write_text(json.dumps(HPARAMS))
    for name, value in {"MUSTER_RUN_DIR": tmp_path / "run", "MUSTER_TRIAL_ID": 7,
                        "MUSTER_EXPERIMENT_ID": 3, "MUSTER_HPARAMS": hparams}.items():
        monkeypatch.setenv(name, str(value))
    for cached in (det.get_cluster_info, _run.this_run, _run.this_job):
        cached.cache_clear()
    try:
        info = det.get_cluster_info()
        assert info is not None
        assert (info.trial.trial_id, info.trial.experiment_id) == (7, 3)
        assert info.trial.hparams == HPARAMS
    finally:
        for cached in (det.get_cluster_info, _run.this_run, _run.this_job):
            cached.cache_clear()


def test_storage_ids_name_muster_checkpoints_by_directory_or_recorded_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("MUSTER_") or n in _TORCHRUN]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MUSTER_RUN_DIR", str(tmp_path))
    with harness.init() as ctx:
        with ctx.checkpoint.save(3) as path:  # saved by the harness: named by its directory
            (path / "model").write_text("weights")
        with ctx.checkpoint.save(5, {STORAGE_ID_KEY: "step-000000000005-" + "a" * 32}) as path:
            (path / "model").write_text("weights")
    ids = StorageIds(ctx.checkpoint.directory, None, None)
    plain, recorded = checkpoint_files.published(ctx.checkpoint.directory)

    assert ids.latest() == "step-000000000005-" + "a" * 32
    assert ids.find(plain.name).path == plain
    assert ids.find("step-000000000005-" + "a" * 32).path == recorded
    (plain / "model").write_text("changed")
    with pytest.raises(InvalidCheckpointException, match="model does not match its sha256"):
        StorageIds(ctx.checkpoint.directory, None, None).find(plain.name)
    with pytest.raises(CheckpointNotFound, match="retention may have deleted it"):
        ids.find("step-000000000004-" + "b" * 32)
    with pytest.raises(CheckpointNotFound, match="not a storage id of muster's"):
        ids.find("3f2a9c1e-uuid")


# Real processes, with the environment muster gives a trial.

class Trial(NamedTuple):
    """A trial's run directory and the environment of its attempt 1, rank 0."""

    run_dir: Path
    env: dict[str, str]
    work: Path  # the processes' working directory

    def attempt(self, number: int, **more: str) -> dict[str, str]:
        return {**self.env, "MUSTER_ATTEMPT": str(number), **more}

    def metrics(self, attempt: int = 1, rank: int = 0) -> list[MetricLine]:
        path = RunDir(self.run_dir).attempt(attempt).rank(rank).metrics
        lines = path.read_bytes().splitlines(keepends=True) if path.exists() else []
        return [line for raw in lines if (line := metrics_lines.parse(raw, rank))]

    def checkpoints(self) -> list[checkpoint_files.Inspection]:
        return checkpoint_files.inspect_all(RunDir(self.run_dir).checkpoints, trial_id=7)

    def latest_checkpoint(self) -> str:
        """MUSTER_LATEST_CHECKPOINT as the supervisor sets it for a new attempt."""
        found = checkpoint_files.latest_intact(RunDir(self.run_dir).checkpoints)
        assert found is not None
        return str(found.path)


@pytest.fixture
def trial(tmp_path: Path) -> Trial:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    work.mkdir()
    hparams = tmp_path / "hparams.json"
    hparams.write_text(json.dumps(HPARAMS))
    inherited = {name: value for name, value in os.environ.items()
                 if not name.startswith("MUSTER_") and name not in _TORCHRUN}
    env = {**inherited, "MUSTER_RUN_DIR": str(run_dir), "MUSTER_TRIAL_ID": "7",
           "MUSTER_ATTEMPT": "1", "MUSTER_HPARAMS": str(hparams), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(COMPAT), str(REPO / "src")]),
           # `python3` in an entrypoint is this interpreter, as a trial's is its own.
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    return Trial(run_dir, env, work)


def start(argv: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen[str], code: int = 0) -> str:
    """Its output, once it exited with `code`."""
    output, _ = process.communicate(timeout=PROCESS_TIMEOUT)
    assert process.returncode == code, output
    return output


def run(argv: list[str], env: Mapping[str, str], cwd: Path) -> str:
    return finish(start(argv, env, cwd))


def script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(FIXTURES / name), *args]


def torchrun_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What muster gives rank `rank` of a distributed trial on one node."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "MUSTER_RANK": str(rank),
            "MUSTER_WORLD_SIZE": str(world_size)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def reports(lines: list[MetricLine], kind: MetricKind) -> dict[int, dict[str, float]]:
    """`kind`'s metrics by step (the reports of one step merged)."""
    by_step: dict[int, dict[str, float]] = {}
    for line in lines:
        if line.kind is kind:
            by_step.setdefault(line.step, {}).update(line.metrics)
    return by_step


@pytest.mark.lifecycle
def test_reports_land_in_the_ranks_metrics_file(trial: Trial) -> None:
    run(script("save_and_resume.py", "save", str(trial.work)), trial.env, trial.work)

    lines = trial.metrics()
    assert reports(lines, MetricKind.TRAINING) == {1: {"loss": 1.0}, 2: {"loss": 0.5},
                                                   3: {"loss": 1 / 3, "inference/latency": 2.5}}
    assert reports(lines, MetricKind.VALIDATION) == {3: {"val_loss": 0.5}}


@pytest.mark.lifecycle
def test_checkpoints_are_published_and_restored_across_processes(trial: Trial) -> None:
    run(script("save_and_resume.py", "save", str(trial.work)), trial.env, trial.work)
    saved = json.loads((trial.work / "save.json").read_text())
    stored, uploaded = trial.checkpoints()
    assert saved["stored"].startswith("step-000000000003-")
    assert stored.intact and stored.user_metadata == {
        "steps_completed": 3, "note": "first", STORAGE_ID_KEY: saved["stored"]}
    assert sorted(stored.file_sizes) == ["metadata.json", "model.txt"]  # muster's metadata.json
    assert sorted(uploaded.file_sizes) == ["metadata.json", "sub/model.txt"]

    env = trial.attempt(2, MUSTER_LATEST_CHECKPOINT=trial.latest_checkpoint())
    run(script("save_and_resume.py", "resume", str(trial.work)), env, trial.work)

    resumed = json.loads((trial.work / "resume.json").read_text())
    assert resumed == {
        "latest": saved["uploaded"], "latest_files": ["metadata.json", "sub/model.txt"],
        "latest_model": "weights at 4", "downloaded": "weights at 3",
        "metadata": {"steps_completed": 3, "note": "first"}, "trial_id": 7,
        "hparams": HPARAMS, "task_type": "TRIAL", "container_rank": 0}


@pytest.mark.lifecycle
def test_a_trial_killed_mid_save_resumes_from_its_latest_checkpoint(trial: Trial) -> None:
    checkpoints = RunDir(trial.run_dir).checkpoints
    first = start(script("save_every_step.py", "6", "--hang-in-save-after", "3"), trial.env,
                  trial.work)
    wait_until(lambda: any(p.name.startswith(".tmp-step-000000000004")
                           for p in checkpoints.iterdir()) if checkpoints.exists() else False,
               timeout=PROCESS_TIMEOUT, what="the save of step 4 to begin")
    first.send_signal(signal.SIGKILL)
    assert "started at 1" in finish(first, -signal.SIGKILL)
    assert [c.step for c in trial.checkpoints()] == [1, 2, 3]

    env = trial.attempt(2, MUSTER_LATEST_CHECKPOINT=trial.latest_checkpoint())
    output = run(script("save_every_step.py", "6"), env, trial.work)

    assert "started at 4" in output and "finished at 6" in output
    assert [c.step for c in trial.checkpoints()] == [1, 2, 3, 4, 5, 6]
    assert sorted(reports(trial.metrics(2), MetricKind.TRAINING)) == [4, 5, 6]


@pytest.mark.lifecycle
def test_should_preempt_turns_true_on_sigterm(trial: Trial) -> None:
    process = start(script("wait_for_preempt.py"), trial.env, trial.work)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)

    assert "preempted at" in finish(process)
    assert [c.step for c in trial.checkpoints()] == [max(reports(trial.metrics(),
                                                                 MetricKind.TRAINING))]
    assert RunDir(trial.run_dir).attempt(1).rank(0).stop_ack.exists()


@pytest.mark.lifecycle
@pytest.mark.parametrize(("platform", "max_length", "expected"), [
    (True, "7", "length 7"),
    (True, None, "ValueError: this trial has no searcher context"),
    (False, None, "length 1"),  # Determined's off-cluster searcher
])
def test_the_searcher_operation_is_the_trials_max_length(
        trial: Trial, platform: bool, max_length: str | None, expected: str) -> None:
    env = dict(trial.env)
    if max_length is not None:
        env["MUSTER_MAX_LENGTH"] = max_length
    if not platform:
        env = {k: v for k, v in env.items() if not k.startswith("MUSTER_")}
    assert expected in run(script("searcher_length.py"), env, trial.work)


# Where each rank is, by rank: (local rank, node). On two nodes the second node's chief is
# rank 3: a node's ranks count in local-rank order, not by their global rank.
ONE_NODE = [(0, 0), (1, 0)]
TWO_NODES = [(0, 0), (1, 1), (1, 0), (0, 1)]


def placed_env(layout: list[tuple[int, int]], rank: int, port: int) -> dict[str, str]:
    """What muster gives `rank` of a trial whose ranks are placed as `layout` says (the Ray
    launcher's GROUP_RANK where they span nodes, with torchrun's GROUP_WORLD_SIZE)."""
    local_rank, node = layout[rank]
    nodes = len({n for _, n in layout})
    env = {**torchrun_env(rank, len(layout), port), "LOCAL_RANK": str(local_rank),
           "LOCAL_WORLD_SIZE": str(sum(n == node for _, n in layout))}
    if nodes > 1:
        env.update({"GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes)})
    return env


@pytest.mark.lifecycle
@pytest.mark.parametrize("layout", [ONE_NODE, TWO_NODES], ids=["one-node", "two-nodes"])
def test_collectives_checkpoints_and_preemption_across_ranks(
        trial: Trial, layout: list[tuple[int, int]]) -> None:
    port, size = free_port(), len(layout)
    ranks = [start(script("distributed_ranks.py", str(trial.work)),
                   {**trial.env, **placed_env(layout, rank, port), "MUSTER_MAX_LENGTH": "3"},
                   trial.work) for rank in range(size)]
    wait_until(lambda: (trial.work / "ready").exists() or any(r.poll() for r in ranks),
               timeout=PROCESS_TIMEOUT, what="every rank to poll should_preempt()")
    ranks[0].send_signal(signal.SIGTERM)  # muster's stop, seen by the chief alone here
    for rank in ranks:
        finish(rank)

    seen = [json.loads((trial.work / f"rank-{r}.json").read_text()) for r in range(size)]
    for rank, mine in enumerate(seen):
        local_rank, node = layout[rank]
        node_ranks = sorted((lr, r) for r, (lr, n) in enumerate(layout) if n == node)
        local = [r for _, r in node_ranks]  # the node's ranks in local-rank order
        assert mine["topology"] == [rank, size, local_rank, len(local), node,
                                    len({n for _, n in layout})]
        assert mine["allgather"] == [{"rank": r} for r in range(size)]
        assert mine["broadcast"] == "from rank 0"
        assert mine["gather"] == ([10 * r for r in range(size)] if rank == 0 else None)
        assert mine["allgather_local"] == local
        assert mine["broadcast_local"] == f"local from {local[0]}"
        assert mine["gather_local"] == (local if local_rank == 0 else None)
        assert mine["lengths"] == [3]
        assert mine["preempted"] is True
    assert [mine["own_sigterm"] for mine in seen] == [True] + [False] * (size - 1)
    assert len({mine["storage_id"] for mine in seen}) == len({mine["uploaded"] for mine in
                                                              seen}) == 1
    parts = ["metadata.json", *(f"part-{r}" for r in range(size))]
    assert [mine["restored"] for mine in seen] == [parts] * size
    shared, uploaded = trial.checkpoints()
    assert sorted(shared.file_sizes) == parts
    assert shared.user_metadata == {"steps_completed": 5, **{f"rank{r}": r for r in range(size)},
                                    STORAGE_ID_KEY: seen[0]["storage_id"]}
    own = sorted(f"own-{r}" for r in range(size))
    assert sorted(uploaded.file_sizes) == ["common", "metadata.json", *own]
    assert sorted(p.name for p in (trial.work / "downloaded").iterdir()) == [
        "common", "metadata.json", *own]


# Determined's Core API tutorial, each stage run by its config's entrypoint.

def entrypoint(config: str, *more: str) -> list[str]:
    stage: dict[str, Any] = yaml.safe_load((TUTORIAL / config).read_text())
    return [*shlex.split(stage["entrypoint"]), *more]


@pytest.fixture
def tutorial(trial: Trial) -> Trial:
    """The trial, with the tutorial as its working directory (muster's copy of the context)."""
    shutil.copytree(TUTORIAL, trial.work, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return trial


SMALL = ("--batch-size", "32", "--log-interval", "2")  # 4 steps of the stand-in's 128 images


@pytest.mark.lifecycle
def test_tutorial_stage_metrics(tutorial: Trial) -> None:
    run(entrypoint("metrics.yaml", "--epochs", "2", *SMALL), tutorial.env, tutorial.work)

    lines = tutorial.metrics()
    assert sorted(reports(lines, MetricKind.TRAINING)) == [2, 4, 6, 8]
    assert sorted(reports(lines, MetricKind.VALIDATION)) == [4, 8]
    assert tutorial.checkpoints() == []


@pytest.mark.lifecycle
def test_tutorial_stage_checkpoints_resumes_and_pauses(tutorial: Trial) -> None:
    run(entrypoint("checkpoints.yaml", "--epochs", "1", *SMALL), tutorial.env, tutorial.work)
    assert [c.step for c in tutorial.checkpoints()] == [4]

    env = tutorial.attempt(2, MUSTER_LATEST_CHECKPOINT=tutorial.latest_checkpoint())
    second = start(entrypoint("checkpoints.yaml", "--epochs", "50", *SMALL), env,
                   tutorial.work)
    wait_until(lambda: len(tutorial.checkpoints()) > 1 or second.poll() is not None,
               timeout=PROCESS_TIMEOUT, what="a checkpoint of the second attempt")
    second.send_signal(signal.SIGTERM)  # a pause: the script leaves at its epoch's end
    finish(second)

    validated = sorted(reports(tutorial.metrics(2), MetricKind.VALIDATION))
    assert validated[0] == 8 and len(validated) < 50  # resumed after epoch 1, left early
    assert [c.step for c in tutorial.checkpoints()] == [4, *validated]


@pytest.mark.lifecycle
def test_tutorial_stage_adaptive_search(tutorial: Trial) -> None:
    run(entrypoint("adaptive.yaml", "--epochs", "2", *SMALL), tutorial.env, tutorial.work)

    validation = reports(tutorial.metrics(), MetricKind.VALIDATION)
    assert [validation[step]["epochs"] for step in sorted(validation)] == [1, 2]
    assert [c.step for c in tutorial.checkpoints()] == [4, 8]


@pytest.mark.lifecycle
def test_tutorial_stage_distributed_on_two_ranks(tutorial: Trial) -> None:
    port = free_port()
    argv = entrypoint("distributed.yaml", "--epochs", "2", "--batch-size", "16",
                      "--log-interval", "2")
    ranks = [start(argv, {**tutorial.env, **torchrun_env(rank, 2, port)}, tutorial.work)
             for rank in (0, 1)]
    for rank in ranks:
        finish(rank)

    assert sorted(reports(tutorial.metrics(rank=0), MetricKind.VALIDATION)) == [4, 8]
    assert tutorial.metrics(rank=1) == []  # only the chief reports, as the script says
    assert [c.step for c in tutorial.checkpoints()] == [4, 8]
