"""Sharded checkpoints (torch.distributed.checkpoint): every rank writes its shard into one
directory, which rank 0 publishes once every rank said its part is written, in the
foreground or the background; restored like any other checkpoint; never published
incomplete, and tidied away only once nobody can be writing into it.

Two real ranks on gloo run the DCP story; the rules around it run with ranks as threads
(two `Checkpoints` of one attempt, as two processes would hold them) on real files."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import muster.harness as mh
from muster import checkpoint_files
from muster.checkpoint_files import (
    PartDocument,
    SaveInProgress,
    abandoned,
    in_progress_name,
    inspect,
    inspect_all,
    published,
    sharded_name,
)
from muster.harness import context
from muster.harness.checkpoints import Checkpoints, SaveFailures, Saver
from muster.harness.heartbeat import Heartbeat
from tests.harness.conftest import FIXTURES, MUSTER_VARS, Platform

RANKS_TIMEOUT = 120
TRIAL = 3
DCP_FILES = {".metadata", "__0_0.distcp", "__1_0.distcp"}


# -- two real ranks --------------------------------------------------------------------------


def run_ranks(where: Path, phase: str, attempt: int) -> list[int]:
    """Run tests/harness/fixtures/dcp_ranks.py as 2 ranks of `attempt`; their exit codes."""
    (where / "out").mkdir(exist_ok=True)
    (where / "run" / f"attempt-{attempt}").mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in MUSTER_VARS}
    base = {**inherited, "MUSTER_RUN_DIR": str(where / "run"), "MUSTER_ATTEMPT": str(attempt),
            "MUSTER_TRIAL_ID": str(TRIAL), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
            "RENDEZVOUS": str(where / f"rendezvous-{phase}")}
    ranks = [subprocess.Popen([sys.executable, str(FIXTURES / "dcp_ranks.py"), phase,
                               str(where / "out")], env={**base, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank in (0, 1)]
    try:
        outputs = [process.communicate(timeout=RANKS_TIMEOUT)[0] for process in ranks]
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    print(*(f"rank {r} of {phase}:\n{o.decode()}" for r, o in enumerate(outputs)), sep="\n")
    return [process.returncode for process in ranks]


def reports(where: Path, phase: str) -> list[dict[str, Any]]:
    return [json.loads((where / "out" / f"{phase}-rank{rank}.json").read_text())
            for rank in (0, 1)]


def failed_steps(run_dir: Path, attempt: int, rank: int) -> list[int]:
    document = json.loads(run_dir.joinpath(f"attempt-{attempt}", f"rank-{rank}.save-failures"
                                           ".json").read_text())
    return [failure["step"] for failure in document["failures"]]


@pytest.mark.lifecycle  # starts real processes
@pytest.mark.timeout(2 * RANKS_TIMEOUT + 30)
def test_two_ranks_save_with_dcp_restore_and_outlive_a_rank_killed_mid_save(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch.distributed.checkpoint", reason="needs PyTorch")
    run_dir, folder = tmp_path / "run", tmp_path / "run" / "checkpoints"
    assert run_ranks(tmp_path, "first", attempt=1) == [0, 0]
    first = reports(tmp_path, "first")
    saved = {found.step: found for found in inspect_all(folder, TRIAL)}
    assert sorted(saved) == [1, 2]  # step 3's future failed on rank 1: nothing published
    for step, kind in ((1, "sync"), (2, "async")):
        found = saved[step]
        assert found.intact, found.problem
        assert set(found.file_sizes) == {*DCP_FILES, "metadata.json"}  # no part file
        files = found.document["files"]
        assert isinstance(files, dict) and files.keys() == DCP_FILES  # every shard hashed
        assert (found.document["world_size"], found.document["rank"]) == (2, 0)
        assert found.user_metadata == {"kind": kind}
    assert [seen["async"] for seen in first] == [saved[2].name, None]
    assert "not published: rank 1 failed: OSError: the disk went away" in first[0][
        "failed_future"]
    assert "failed on rank 1 (OSError: the disk went away)" in first[1]["failed_future"]
    assert [failed_steps(run_dir, 1, rank) for rank in (0, 1)] == [[3], [3]]

    assert run_ranks(tmp_path, "resume", attempt=2) == [0, -signal.SIGKILL]
    resumed = reports(tmp_path, "resume")
    for rank in (0, 1):  # every rank loads the same checkpoint, its own shard from it
        assert resumed[rank]["restored"] == [saved[2].name, 2]
        assert resumed[rank]["loaded"] == {f"weights.rank{rank}": [20.0 + rank] * 64,
                                           "shared": [0, 2, 4, 6]}
    assert "rank 1 did not say within 1 s that its part is written" in resumed[0][
        "killed_step"]
    assert resumed[0]["latest_after_kill"] == 2  # the previous checkpoint
    assert [found.step for found in inspect_all(folder)] == [1, 2]
    assert failed_steps(run_dir, 2, 0) == [4]
    failed = folder / sharded_name(3, attempt=1, number=3)
    killed = folder / sharded_name(4, attempt=2, number=1)
    assert failed.is_dir() and killed.is_dir()

    flip_a_byte(saved[2].path / "__1_0.distcp")  # a shard is judged like any file
    with pytest.warns(RuntimeWarning, match=f"corrupt checkpoint {saved[2].path}: "
                      "__1_0.distcp does not match its sha256 in metadata.json"):
        restored = saver(folder, attempt=3).restore()
    assert restored is not None and restored.path == saved[1].path

    # While attempt 2 may still run, rank 1 may still be writing into its save: a save in
    # attempt 2 leaves it, and removes what every rank of attempt 1 finished with.
    publish(saver(folder, attempt=2), 5)
    assert not failed.exists() and killed.is_dir()
    publish(saver(folder, attempt=3), 6)  # attempt 2 has ended: the next one tidies
    assert not killed.exists()


# -- ranks as threads ------------------------------------------------------------------------


def saver(folder: Path, *, attempt: int = 1, rank: int = 0, world_size: int = 1,
          failures: SaveFailures | None = None) -> Checkpoints:
    """What `ctx.checkpoint` is in rank `rank` of `attempt` (its own process, normally)."""
    return Checkpoints(folder, Saver(TRIAL, attempt, rank, {}, world_size),
                       Heartbeat(folder.parent / f"heartbeat-{rank}.json", 10.0),
                       preferred=None, failures=failures)


def publish(checkpoints: Checkpoints, step: int) -> Path:
    with checkpoints.save(step) as path:
        (path / "state.bin").write_bytes(b"state")
    assert checkpoints.last_saved is not None
    return checkpoints.last_saved


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def on_thread(work: Callable[[], object]) -> Callable[[], object]:
    """Run `work` on a thread of its own (a rank); a function that joins it and returns what
    it returned, or raises what it raised."""
    outcome: list[object] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the joining test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> object:
        thread.join(30)
        assert not thread.is_alive(), "the rank's thread did not end"
        if errors:
            raise errors[0]
        return outcome[0]
    return join


def sharded_save(checkpoints: Checkpoints, step: int, files: dict[str, bytes],
                 timeout: float = 30.0) -> Path | None:
    with checkpoints.save_sharded(step, {"by": "test"}, timeout=timeout) as path:
        for name, data in files.items():
            (path / name).write_bytes(data)
    return checkpoints.last_saved


def test_every_rank_writes_its_shard_and_rank_0_publishes_it_hashed_once(
    tmp_path: Path,
) -> None:
    """Safetensors shards, written by each rank, are hashed like any other file."""
    numpy = pytest.importorskip("numpy")
    safetensors = pytest.importorskip("safetensors.numpy")
    folder = tmp_path / "checkpoints"
    shards = {rank: tmp_path / f"model-{rank + 1:05d}-of-00002.safetensors" for rank in (0, 1)}
    for rank, shard in shards.items():
        safetensors.save_file({f"layer{rank}": numpy.full((8,), rank, "float32")}, str(shard))
    ranks = [saver(folder, rank=rank, world_size=2) for rank in (0, 1)]
    rank_1 = on_thread(lambda: sharded_save(ranks[1], 7, {shards[1].name: shards[1].read_bytes()}))
    path = sharded_save(ranks[0], 7, {shards[0].name: shards[0].read_bytes()})
    assert rank_1() is None  # a rank other than 0 publishes nothing
    assert path is not None and published(folder) == [path]
    found = inspect(path, TRIAL)
    assert found.intact and (found.step, found.user_metadata) == (7, {"by": "test"})
    assert found.document["files"] == {
        shard.name: hashlib.sha256(shard.read_bytes()).hexdigest() for shard in shards.values()}
    assert checkpoint_files.in_progress(folder) == []
    flip_a_byte(path / shards[1].name)
    assert inspect(path, TRIAL).problem == (f"{shards[1].name} does not match its sha256 in "
                                           "metadata.json")


def test_a_rank_that_does_not_finish_in_time_keeps_rank_0_from_publishing(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "checkpoints"
    ranks = [saver(folder, rank=rank, world_size=2) for rank in (0, 1)]
    release = threading.Event()

    def slow_rank_1() -> Path | None:
        with ranks[1].save_sharded(2) as path:
            (path / "shard-1").write_bytes(b"1")
            release.wait(30)
        return None

    rank_1 = on_thread(slow_rank_1)
    with pytest.warns(RuntimeWarning, match="save for step 2 failed"), \
            pytest.raises(mh.CheckpointError, match=r"rank 1 did not say within 0\.2 s"):
        sharded_save(ranks[0], 2, {"shard-0": b"0"}, timeout=0.2)
    assert published(folder) == []
    (leftover,) = checkpoint_files.in_progress(folder)
    publish(saver(folder, rank=0, world_size=2), 1)  # rank 1 may still be writing into it
    assert leftover.path.is_dir()
    release.set()
    rank_1()
    publish(saver(folder, rank=0, world_size=2), 2)  # every rank is done with it now
    assert not leftover.path.exists() and checkpoint_files.in_progress(folder) == []


def test_a_rank_that_fails_stops_rank_0_at_once_and_both_record_it(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    ranks = [saver(folder, rank=rank, world_size=2,
                   failures=SaveFailures(tmp_path / f"rank-{rank}.save-failures.json"))
             for rank in (0, 1)]

    def failing_rank_1() -> None:
        with ranks[1].save_sharded(3):
            raise ValueError("out of memory, say")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank_1 = on_thread(failing_rank_1)
        with pytest.raises(mh.CheckpointError, match="rank 1 failed: ValueError: out of mem"):
            sharded_save(ranks[0], 3, {"shard-0": b"0"})  # waits up to 30 s otherwise
        with pytest.raises(mh.CheckpointError, match=r"failed on rank 1 \(ValueError"):
            rank_1()
    assert sum("save for step 3 failed" in str(w.message) for w in caught) == 2
    assert published(folder) == []
    for rank in (0, 1):
        document = json.loads((tmp_path / f"rank-{rank}.save-failures.json").read_text())
        assert [f["step"] for f in document["failures"]] == [3]


def test_shards_of_dcp_without_its_metadata_are_never_published(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    with pytest.warns(RuntimeWarning), pytest.raises(
            mh.CheckpointError, match=r"\.metadata is missing beside its shards"):
        sharded_save(saver(folder), 4, {"__0_0.distcp": b"shard"})
    assert published(folder) == []


def test_a_later_save_never_removes_a_save_that_may_still_be_written(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    ended = [folder / in_progress_name(1, attempt=1), folder / sharded_name(1, 1, number=1)]
    still_written = [folder / in_progress_name(2, attempt=2),  # another rank's, this attempt
                     folder / ".tmp-step-000000000009-ffffffff"]  # whose, nobody knows
    for path in ended + still_written:
        path.mkdir(parents=True)
    with ExitStack() as live:  # rank 1 of attempt 2 is in its sharded save's block
        entered = live.enter_context(saver(folder, attempt=2, rank=1, world_size=2)
                                     .save_sharded(3))
        publish(saver(folder, attempt=2, world_size=2), 4)
        assert sorted(s.path for s in checkpoint_files.in_progress(folder)) == sorted(
            [*still_written, entered])


@pytest.mark.parametrize(("attempt", "sharded", "latest", "live", "parts", "expected"), [
    (1, False, 2, {2}, {}, True),  # its attempt ended
    (2, False, 2, {2}, {}, False),  # its attempt runs: it may be written now
    (2, True, 2, {2}, {1: 2}, False),  # rank 0 has not finished with it
    (2, True, 2, {2}, {0: 2, 1: 2}, True),  # every rank finished with it
    (2, True, 2, {2}, {0: 3, 1: 3}, False),  # rank 2 of 3 has not
    (2, True, 2, set(), {}, True),  # the trial ended
    (3, False, 2, {2}, {}, False),  # an attempt not known yet
    (None, False, 2, {2}, {}, False),  # whose, nobody knows, while an attempt runs
    (None, False, 2, set(), {}, True),
])
def test_a_save_in_progress_is_abandoned_only_when_nobody_can_write_into_it(
    attempt: int | None, sharded: bool, latest: int, live: set[int], parts: dict[int, int],
    expected: bool,
) -> None:
    save = SaveInProgress(Path("/checkpoints/.tmp-x"), attempt, sharded)
    documents: dict[int, PartDocument | None] = {
        rank: PartDocument(rank=rank, world_size=size, ok=True, error=None, time=0.0)
        for rank, size in parts.items()}
    assert abandoned(save, latest, live, documents) is expected


def test_a_background_save_publishes_when_its_future_resolves(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    checkpoints = saver(folder)
    future: Future[None] = Future()
    pending = checkpoints.save_sharded_async(5, lambda path: future)
    assert not pending.done() and published(folder) == []  # the loop goes on meanwhile
    (pending.path / "shard-0").write_bytes(b"written in the background")
    future.set_result(None)
    path = pending.result(timeout=30)
    assert path is not None and published(folder) == [path] and inspect(path, TRIAL).intact
    assert (path / "shard-0").read_bytes() == b"written in the background"


def test_a_background_save_still_running_when_init_ends_is_dropped_and_recorded(
    on_platform: Platform, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(context, "PENDING_SAVES_TIMEOUT_S", 0.2)
    future: Future[None] = Future()  # a write that never ends
    with pytest.warns(RuntimeWarning, match="step 6 was still being written when "
                      r"muster.harness.init\(\) ended .after waiting 0.2 s.; it was dropped"), \
            mh.init() as ctx:
        pending = ctx.checkpoint.save_sharded_async(6, lambda path: future)
    future.set_result(None)  # too late: nothing is published, nothing recorded twice
    with pytest.raises(mh.CheckpointError, match="ended before the part was written"):
        pending.result(timeout=30)
    failures = json.loads(on_platform.rank_file(".save-failures.json").read_text())
    assert [f["step"] for f in failures["failures"]] == [6]
    assert published(on_platform.run_dir / "checkpoints") == []
    parts = checkpoint_files.read_parts(pending.path)
    assert parts.keys() == {1} and parts[1] is not None and not parts[1]["ok"]


@pytest.mark.parametrize(("arguments", "error"), [
    ({"step": -1}, ValueError), ({"step": 1.5}, TypeError), ({"step": 1, "timeout": 0},
                                                               ValueError),
])
def test_a_sharded_save_refuses_bad_arguments_before_anything_is_made(
    tmp_path: Path, arguments: dict[str, Any], error: type[Exception],
) -> None:
    checkpoints = saver(tmp_path / "checkpoints")
    with pytest.raises(error), checkpoints.save_sharded(**arguments):
        pass
    assert not (tmp_path / "checkpoints").exists()
