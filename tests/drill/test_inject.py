"""The drill's injectors (muster.drill.inject) against real replicas under real shims, real
memory cgroups, real data files and a real tmpfs."""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from muster.drill import inject
from muster.drill.inject import (
    BALLAST,
    Throttle,
    corrupt_files,
    fill,
    hang_rank,
    hide_files,
    kill_rank,
    mount_small_fs,
    rank_child,
    release_small_fs,
    resume_rank,
    squeeze_memory,
)
from muster.errors import InjectionError, LaunchError
from muster.launch.base import MemoryEnforcement, ReplicaSpec
from muster.launch.identity import group_members, is_alive, read_stat
from muster.launch.local import LocalLauncher
from muster.launch.memory import open_cgroup
from muster.launch.shim_launcher import ShimFiles
from muster.states import OomSource
from tests.launch.conftest import Replica, fixture_argv, kill_leftovers
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(120)]

MiB = 1 << 20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
StartFn = Callable[..., Replica]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[StartFn]:
    """Start a fixture script under a real shim, as a trial's rank 0; returns once the
    training process runs. At teardown each is stopped and its shim waited for (it removes
    the replica's memory cgroup last); what is left then is SIGKILLed."""
    launcher, attempts, started = LocalLauncher(), iter(range(1, 100)), []

    def run(name: str, *args: str, enforcement: MemoryEnforcement = "auto") -> Replica:
        attempt = next(attempts)
        spec = ReplicaSpec(trial_uuid="drill-under-test", attempt=attempt, rank=0,
                           argv=fixture_argv(name, *args), env=dict(os.environ), cwd=tmp_path,
                           attempt_dir=tmp_path / f"attempt-{attempt}", stop_grace=1.0,
                           memory_enforcement=enforcement)
        launcher.submit(spec)
        replica = Replica(launcher, spec)
        started.append(replica)
        replica.child()
        return replica

    yield run
    for replica in started:
        replica.cancel()
    shims = [ShimFiles(replica.spec.attempt_dir, 0).shim for replica in started]
    wait_until(lambda: not any(shim and is_alive(shim) for shim in shims), timeout=30,
               what="every shim's end")
    kill_leftovers(tmp_path)


def states(pgid: int) -> set[str]:
    return {member.state for member in group_members(pgid)}


def cpu_seconds(pid: int) -> float:
    stat = read_stat(pid)
    assert stat is not None
    return stat.cpu_ticks / CLOCK_TICKS


# -- processes -----------------------------------------------------------------------------------


@pytest.mark.lifecycle
def test_rank_child_is_the_live_training_process(start: StartFn, tmp_path: Path) -> None:
    with pytest.raises(InjectionError, match="rank 0 has no training process yet"):
        rank_child(tmp_path / "attempt-99", 0)
    replica = start("spin.py")
    assert rank_child(replica.spec.attempt_dir, 0) == replica.child()
    replica.cancel()
    replica.wait_exit()
    with pytest.raises(InjectionError, match=r"rank 0's training process \(pid \d+\) has ended"):
        rank_child(replica.spec.attempt_dir, 0)


@pytest.mark.lifecycle
def test_kill_rank_sigkills_the_training_process(start: StartFn) -> None:
    replica = start("spin.py")
    child = replica.child()
    said = kill_rank(replica.spec.attempt_dir, 0)
    assert said == f"SIGKILL to rank 0's training process (pid {child.pid})"
    record = replica.wait_exit()
    assert (record.returncode, record.signal) == (-9, "SIGKILL")
    with pytest.raises(InjectionError, match="has ended"):
        kill_rank(replica.spec.attempt_dir, 0)


@pytest.mark.lifecycle
def test_hang_stops_the_whole_group_and_resume_continues_it(start: StartFn) -> None:
    replica = start("spin.py", "2")
    replica.wait_log(b"spinning")
    leader = replica.child().pid
    said = hang_rank(replica.spec.attempt_dir, 0)
    assert said.startswith("SIGSTOP to rank 0's process group (3 processes: pid ")
    wait_until(lambda: states(leader) == {"T"}, timeout=10, what="every process stopped")
    stopped_at = cpu_seconds(leader)
    assert cpu_seconds(leader) == stopped_at
    resume_rank(replica.spec.attempt_dir, 0)
    resume_rank(replica.spec.attempt_dir, 0)  # idempotent
    wait_until(lambda: "T" not in states(leader), timeout=10, what="every process running")
    wait_until(lambda: cpu_seconds(leader) > stopped_at, timeout=10, what="CPU used again")
    replica.cancel()
    replica.wait_exit()
    resume_rank(replica.spec.attempt_dir, 0)  # the group is gone: nothing, quietly


@pytest.mark.lifecycle
def test_a_throttled_rank_runs_about_the_duty_cycle(start: StartFn) -> None:
    replica = start("spin.py")
    replica.wait_log(b"spinning")
    leader = replica.child().pid
    throttle = Throttle(replica.spec.attempt_dir, 0, duty=0.5, period=0.2)
    assert throttle.start() == "throttled rank 0 to 50% (SIGSTOP/SIGCONT every 0.2 s)"
    used, began = cpu_seconds(leader), time.monotonic()
    time.sleep(2.0)  # a share of CPU time is measured over a stretch of time
    share = (cpu_seconds(leader) - used) / (time.monotonic() - began)
    throttle.stop()
    throttle.stop()  # idempotent
    assert 0.2 <= share <= 0.8, share
    assert "T" not in states(leader)
    assert not any(t.name.startswith("drill-throttle") for t in threading.enumerate())


@pytest.mark.lifecycle
def test_a_throttle_ends_by_itself_once_the_group_is_gone(start: StartFn) -> None:
    replica = start("spin.py")
    throttle = Throttle(replica.spec.attempt_dir, 0)
    throttle.start()
    replica.cancel()
    replica.wait_exit()
    wait_until(lambda: not any(t.name.startswith("drill-throttle")
                               for t in threading.enumerate()), timeout=10,
               what="the throttle's thread to end")
    throttle.stop()


def test_a_throttle_refuses_a_duty_cycle_it_cannot_run(tmp_path: Path) -> None:
    for duty in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match=r"but got duty="):
            Throttle(tmp_path, 0, duty=duty)
    with pytest.raises(ValueError, match=r"but got period=0"):
        Throttle(tmp_path, 0, period=0)


# -- memory ----------------------------------------------------------------------------------------


def _cgroup_problem() -> str | None:
    """Why the shim can make no memory cgroup here, or why the drill cannot squeeze one."""
    if os.geteuid() != 0:
        return f"writing memory cgroups needs root (running as uid {os.geteuid()})"
    try:
        open_cgroup(None, f"muster-drill-probe-{os.getpid()}").close()
    except LaunchError as exc:
        return str(exc)
    return None


CGROUP_PROBLEM = _cgroup_problem()
needs_cgroup = pytest.mark.skipif(CGROUP_PROBLEM is not None,
                                  reason=f"no memory cgroup to squeeze here: {CGROUP_PROBLEM}")


@pytest.mark.lifecycle
@needs_cgroup
def test_a_squeezed_rank_is_oom_killed_even_when_it_allocates_no_more(start: StartFn) -> None:
    # It holds its 100 MiB and sleeps: only the drill's neighbour makes the kernel act.
    replica = start("memory_hog.py", "hog", "100")
    replica.wait_log(b"holding")
    child = replica.child()
    said = squeeze_memory(replica.spec.attempt_dir, 0)
    assert said.startswith("lowered rank 0's memory limit to ")
    # Its shim may remove the rank's cgroup, and its OOM count, before the count is read
    # again: the exit record then says it (below).
    assert re.search(rf"the kernel (OOM-killed|ended) its training process \(pid {child.pid}\)"
                     r"(; its cgroup was removed with it .*)?$", said), said
    record = replica.wait_exit()
    assert (record.returncode, record.signal) == (-9, "SIGKILL")
    assert record.oom is not None and record.oom.source is OomSource.CGROUP


def memory_cgroup_v1(pid: int) -> Path | None:
    """The v1 memory cgroup directory of `pid`, where it has one."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    return None


@pytest.mark.lifecycle
@needs_cgroup
def test_a_squeeze_the_kernel_does_not_act_on_is_undone(
        start: StartFn, monkeypatch: pytest.MonkeyPatch) -> None:
    replica = start("memory_hog.py", "hog", "60")
    replica.wait_log(b"holding")
    child = replica.child()
    cgroup = memory_cgroup_v1(child.pid)
    if cgroup is None:
        pytest.skip("the OOM killer is switched off per cgroup in cgroup v1 alone")
    (cgroup / "memory.oom_control").write_text("1")  # the kernel pauses, never kills
    limit = (cgroup / "memory.limit_in_bytes").read_text()
    monkeypatch.setattr(inject, "SQUEEZE_TIMEOUT_S", 1.0)
    with pytest.raises(InjectionError, match=r"outlived its memory limit of .* for 1 s"):
        squeeze_memory(replica.spec.attempt_dir, 0)
    assert (cgroup / "memory.limit_in_bytes").read_text() == limit
    assert Path(f"/proc/{child.pid}/oom_score_adj").read_text() == "0\n"
    assert is_alive(child)


@pytest.mark.lifecycle
@needs_cgroup
def test_a_rank_without_a_cgroup_of_its_own_is_not_squeezed(start: StartFn) -> None:
    replica = start("memory_hog.py", "hog", "20", enforcement="watchdog")
    with pytest.raises(InjectionError, match=r"has no memory cgroup of its own .* its shim"):
        squeeze_memory(replica.spec.attempt_dir, 0)


# -- data files ----------------------------------------------------------------------------------


def make_data(root: Path, count: int = 20) -> dict[str, bytes]:
    """`count` files of different sizes in two directories, an empty file and a link."""
    files = {f"{'train' if i % 2 else 'val'}/part-{i:03d}.bin": os.urandom(1 + 997 * i)
             for i in range(count)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        (root / rel).chmod(0o640)
        os.utime(root / rel, (1_000_000_000, 1_000_000_000))
    (root / "empty.txt").touch()
    (root / "link.bin").symlink_to("train/part-001.bin")
    return files


def linked_copy(source: Path, target: Path) -> None:
    """`target`: every file of `source` as a hard link, as a trial's copy of the data is."""
    shutil.copytree(source, target, symlinks=True, copy_function=os.link)


def contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def test_corrupt_files_replaces_a_seeded_tenth(tmp_path: Path) -> None:
    clean = make_data(tmp_path / "snapshot")
    linked_copy(tmp_path / "snapshot", tmp_path / "trial")
    changed = corrupt_files(tmp_path / "trial", fraction=0.1, seed=7)
    assert len(changed) == math.ceil(0.1 * len(clean)) == 2  # the empty file is never chosen
    assert changed == sorted(changed)
    after = contents(tmp_path / "trial")
    truncated = [rel for rel in changed if after[rel] == clean[rel][:len(clean[rel]) // 2]]
    garbled = [rel for rel in changed if len(after[rel]) == len(clean[rel])
               and after[rel] != clean[rel]]
    assert len(truncated) == 1 and len(garbled) == 1
    assert {rel: data for rel, data in after.items() if rel not in changed} == {
        **{rel: data for rel, data in clean.items() if rel not in changed}, "empty.txt": b""}
    assert contents(tmp_path / "snapshot") == {**clean, "empty.txt": b""}  # the other link
    for rel in changed:
        replaced = (tmp_path / "trial" / rel).stat()
        assert replaced.st_ino != (tmp_path / "snapshot" / rel).stat().st_ino
        assert (oct(replaced.st_mode & 0o777), replaced.st_mtime) == ("0o640", 1_000_000_000)
    assert list((tmp_path / "trial").rglob(".*drill*")) == []  # no temp file left


def test_corruption_is_the_same_for_the_same_seed(tmp_path: Path) -> None:
    make_data(tmp_path / "snapshot", count=40)
    for trial in ("a", "b", "c"):
        linked_copy(tmp_path / "snapshot", tmp_path / trial)
    assert corrupt_files(tmp_path / "a", 0.25, seed=1) == corrupt_files(tmp_path / "b", 0.25,
                                                                        seed=1)
    assert contents(tmp_path / "a") == contents(tmp_path / "b")
    assert corrupt_files(tmp_path / "c", 0.25, seed=2) != corrupt_files(tmp_path / "a", 0.25,
                                                                        seed=1)


def test_a_one_byte_file_is_still_corrupted(tmp_path: Path) -> None:
    # Truncated: one byte cut. Garbled: a random byte, never the one it had.
    for seed in range(50):
        data = tmp_path / f"data-{seed}"
        data.mkdir()
        (data / "a").write_bytes(b"a")
        (data / "b").write_bytes(b"b")
        assert corrupt_files(data, fraction=1.0, seed=seed) == ["a", "b"]
        after = {name: (data / name).read_bytes() for name in ("a", "b")}
        assert sorted(len(content) for content in after.values()) == [0, 1]
        assert after["a"] != b"a" and after["b"] != b"b"


def test_hide_files_moves_a_seeded_choice_aside(tmp_path: Path) -> None:
    clean = make_data(tmp_path / "snapshot")
    linked_copy(tmp_path / "snapshot", tmp_path / "trial")
    hidden = hide_files(tmp_path / "trial", tmp_path / "held", fraction=0.1, seed=3)
    assert len(hidden) == math.ceil(0.1 * (len(clean) + 1)) == 3  # the empty file counts
    assert all(not (tmp_path / "trial" / rel).exists() for rel in hidden)
    assert contents(tmp_path / "held") == {rel: {**clean, "empty.txt": b""}[rel]
                                           for rel in hidden}
    linked_copy(tmp_path / "snapshot", tmp_path / "again")
    assert hide_files(tmp_path / "again", tmp_path / "held-again", 0.1, seed=3) == hidden


def test_hide_files_refuses_a_place_inside_the_data(tmp_path: Path) -> None:
    make_data(tmp_path / "data")
    with pytest.raises(InjectionError, match="must be outside the data directory"):
        hide_files(tmp_path / "data", tmp_path / "data" / "held")
    with pytest.raises(ValueError, match=r"but got fraction=0"):
        hide_files(tmp_path / "data", tmp_path / "held", fraction=0)
    (tmp_path / "none").mkdir()
    with pytest.raises(InjectionError, match="holds no file a drill could change"):
        corrupt_files(tmp_path / "none")


# -- a small file system -------------------------------------------------------------------------


needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason=f"mounting a tmpfs needs root (running as uid "
                                       f"{os.geteuid()})")


def mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == str(path) for line in mountinfo)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """Where the drill's tmpfs goes; unmounted afterwards if a test left it mounted."""
    path = tmp_path / "run" / "workdir"
    yield path
    while mounted(path):
        subprocess.run(["umount", "-l", str(path)], check=True)


def write_outputs(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """What a run writes: files in a directory, with modes and times; and a link."""
    (root / "logs").mkdir()
    outputs = {"model.pt": os.urandom(3000), "logs/train.log": b"step 1\nstep 2\n"}
    for mode, (rel, data) in zip((0o600, 0o644), outputs.items(), strict=True):
        (root / rel).write_bytes(data)
        (root / rel).chmod(mode)
        os.utime(root / rel, (1_500_000_000, 1_500_000_000 + len(data)))
    (root / "latest").symlink_to("model.pt")
    return kept(root, outputs)


def kept(root: Path, names: Iterable[str]) -> dict[str, tuple[bytes, int, int]]:
    """Each file's bytes, mode and modification time."""
    found = {}
    for rel in names:
        stat = (root / rel).stat()
        found[rel] = ((root / rel).read_bytes(), stat.st_mode & 0o777, int(stat.st_mtime))
    return found


@needs_root
def test_a_filled_small_fs_refuses_writes_and_its_release_keeps_every_file(
        small_fs: Path) -> None:
    small_fs.mkdir(parents=True)
    os.chown(small_fs, 1234, 1234)
    assert mount_small_fs(small_fs, 1 * MiB) == f"mounted a 1 MiB tmpfs at {small_fs}"
    assert mounted(small_fs)
    assert (small_fs.stat().st_uid, oct(small_fs.stat().st_mode & 0o777)) == (1234, "0o700")
    outputs = write_outputs(small_fs)
    written = fill(small_fs)
    assert 0.9 * MiB < written < MiB
    with pytest.raises(OSError) as full:
        (small_fs / "checkpoint.pt").write_bytes(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC
    release_small_fs(small_fs)
    assert not mounted(small_fs)
    assert kept(small_fs, outputs) == outputs
    assert os.readlink(small_fs / "latest") == "model.pt"
    assert not (small_fs / BALLAST).exists()
    assert (small_fs.stat().st_uid, oct(small_fs.stat().st_mode & 0o777)) == (1234, "0o700")
    release_small_fs(small_fs)  # idempotent
    assert sorted(p.name for p in small_fs.parent.iterdir()) == ["workdir"]


@needs_root
def test_a_release_killed_midway_is_finished_by_the_next(small_fs: Path) -> None:
    mount_small_fs(small_fs, 1 * MiB)
    outputs = write_outputs(small_fs)
    # Killed while copying: a half copy is left, the tmpfs still mounted.
    partial = small_fs.with_name(".workdir.drill-copy.partial")
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half")
    release_small_fs(small_fs)
    assert {rel: (small_fs / rel).read_bytes() for rel in outputs} == {
        rel: data for rel, (data, _, _) in outputs.items()}
    # Killed after the unmount: the whole copy waits beside the empty mount point.
    mount_small_fs(small_fs.with_name("second"), 1 * MiB)
    second = small_fs.with_name("second")
    (second / "result.txt").write_text("done")
    subprocess.run(["cp", "-a", f"{second}/.", str(second.with_name(".second.drill-copy"))],
                   check=True)
    subprocess.run(["umount", str(second)], check=True)
    release_small_fs(second)
    assert (second / "result.txt").read_text() == "done"
    assert sorted(p.name for p in small_fs.parent.iterdir()) == ["second", "workdir"]


@needs_root
def test_the_small_fs_needs_an_empty_directory_and_fill_a_tmpfs(small_fs: Path) -> None:
    small_fs.mkdir(parents=True)
    (small_fs / "already.txt").write_text("here")
    with pytest.raises(InjectionError, match="is not an empty directory"):
        mount_small_fs(small_fs, MiB)
    with pytest.raises(InjectionError, match="never fills a real file system"):
        fill(small_fs)
    release_small_fs(small_fs)  # nothing mounted: nothing to do
    assert (small_fs / "already.txt").read_text() == "here"


def test_a_data_directory_that_links_out_of_the_context_is_never_damaged(
        tmp_path: Path) -> None:
    """A context whose `data` is a link to a directory elsewhere (the shared data, or
    anything): the data faults refuse it rather than replace or hide files out there."""
    from muster.drill.inject import data_dir_in

    outside = tmp_path / "shared"
    outside.mkdir()
    (outside / "a.png").write_bytes(b"keep me")
    context = tmp_path / "context"
    (context / "real").mkdir(parents=True)
    (context / "data").symlink_to(outside)
    with pytest.raises(InjectionError, match="leads outside"):
        data_dir_in(context, "data")
    with pytest.raises(InjectionError, match="not a directory"):
        data_dir_in(context, "missing")
    assert data_dir_in(context, "real") == (context / "real").resolve()
    assert (outside / "a.png").read_bytes() == b"keep me"
