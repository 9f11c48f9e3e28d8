"""Kernel OOM kills named without a memory limit, and every replica's peak memory (issue 31).

Every replica runs in a memory cgroup of its own where one can be made, limit or not; its
OOM-kill counter turns the kernel's SIGKILL into OOM. Without a cgroup the shim reads the
kernel log for an OOM kill of one of the group's processes. The real OOM killer is made to
strike by running the shims in a cgroup the test makes with a 200 MiB limit (no muster
memory_limit anywhere): see `tests/cgroups.py`.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from muster.launch.base import ExitRecord, MemoryEnforcement, OomKill, ReplicaSpec
from muster.launch.exits import ExitObservation, classify_exit
from muster.launch.kernel_log import KMSG, KernelKill, KernelLog, parse_record
from muster.launch.local import LocalLauncher
from muster.launch.logs import FileLog, tail_text
from muster.launch.memory import GroupSample, RssWatchdog, machine_memory, sample_group
from muster.sizes import format_size
from muster.states import OomSource, Reason
from tests.cgroups import LauncherInCgroup, ShimCgroup, memory_cgroup, needs_cgroup
from tests.launch.conftest import Replica, fixture_argv, kill_leftovers
from tests.processes import live_group
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

MiB = 1 << 20
CGROUP_LIMIT = 200 * MiB
KMSG_PROBLEM = KernelLog.open().problem
needs_kmsg = pytest.mark.skipif(KMSG_PROBLEM is not None,
                                reason=f"no kernel log to read here: {KMSG_PROBLEM}")

RunFn = Callable[..., Replica]


@pytest.fixture
def cgroup() -> Iterator[ShimCgroup]:
    with memory_cgroup(CGROUP_LIMIT, "oom-kill") as made:
        yield made


def _starter(launcher: LocalLauncher, tmp_path: Path) -> RunFn:
    attempts = iter(range(1, 100))

    def start(*args: str, enforcement: MemoryEnforcement = "auto") -> Replica:
        attempt = next(attempts)
        spec = ReplicaSpec(
            trial_uuid=f"oom-{tmp_path.name}", attempt=attempt, rank=0,
            argv=fixture_argv("memory_hog.py", *args), env={}, cwd=tmp_path,
            attempt_dir=tmp_path / f"attempt-{attempt}", stop_grace=1.0,
            memory_limit=None, memory_enforcement=enforcement,
        )
        launcher.submit(spec)
        return Replica(launcher, spec)

    return start


@pytest.fixture
def run_in_cgroup(cgroup: ShimCgroup, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[RunFn]:
    """Start `memory_hog.py` without a memory limit, its shim inside the test's cgroup."""
    monkeypatch.setenv("MUSTER_SHIM_FORKSERVER", "0")
    yield _starter(LauncherInCgroup(cgroup), tmp_path)
    kill_leftovers(tmp_path)


@pytest.fixture
def run(launcher: LocalLauncher, tmp_path: Path) -> Iterator[RunFn]:
    """Start `memory_hog.py` without a memory limit, as muster does."""
    yield _starter(launcher, tmp_path)
    kill_leftovers(tmp_path)


def verdict_of(replica: Replica, record: ExitRecord) -> tuple[Reason, str]:
    verdict = classify_exit(ExitObservation(
        rank=0, exit=record, log_tail=tail_text(FileLog(0, replica.files.log), 20)))
    return verdict.reason, verdict.message


_KERNEL_OOM = re.compile(
    r"The replica worker-0 \(rank 0\) ran out of memory and exited with a non-zero status "
    r"of 137: killed by the kernel's OOM killer at (?P<peak>[\d.]+ MiB) \(machine "
    r"(?P<machine>[\d.]+ GiB), no memory_limit set\): set resources\.memory_limit or use "
    r"less memory"
)


# -- the replica's own cgroup, without a limit ------------------------------------------------


@needs_cgroup
def test_a_kernel_oom_kill_without_a_limit_is_oom_with_the_peak(run_in_cgroup: RunFn) -> None:
    replica = run_in_cgroup("hog", "600")
    record = replica.wait_exit()
    assert (record.returncode, record.signal) == (-9, "SIGKILL")
    assert record.oom == OomKill(OomSource.CGROUP, None, machine_memory())
    # No limit: the limit's fields stay empty; the peak is the replica cgroup's.
    assert (record.memory_limit_bytes, record.peak_memory_bytes, record.memory_enforcement) == (
        None, None, None)
    assert record.peak_rss_bytes is not None
    assert 100 * MiB <= record.peak_rss_bytes <= CGROUP_LIMIT
    assert b"holding" not in replica.log()  # it never got to 600 MiB
    reason, message = verdict_of(replica, record)
    assert reason is Reason.OOM
    match = _KERNEL_OOM.fullmatch(message)
    assert match, message
    assert match["peak"] == format_size(record.peak_rss_bytes)
    assert machine_memory() is not None
    assert match["machine"] == format_size(machine_memory() or 0)


@needs_cgroup
def test_an_oom_kill_below_the_leader_ends_the_whole_group(run_in_cgroup: RunFn) -> None:
    # The kernel kills the hogging child alone; its parent would wait for ever if the shim
    # did not end the group once the replica cgroup's OOM counter rose (limit or not).
    replica = run_in_cgroup("child-hog", "600")
    record = replica.wait_exit()
    assert record.oom is not None and record.oom.source is OomSource.CGROUP
    assert record.pid is not None and not live_group(record.pid)
    assert verdict_of(replica, record)[0] is Reason.OOM


# -- no cgroup: the kernel log -----------------------------------------------------------------


@needs_cgroup
@needs_kmsg
def test_without_a_cgroup_the_kernel_log_names_the_oom_kill(run_in_cgroup: RunFn) -> None:
    # "watchdog" makes no replica cgroup: the shim samples the group and reads /dev/kmsg.
    replica = run_in_cgroup("hog", "600", enforcement="watchdog")
    record = replica.wait_exit()
    assert (record.returncode, record.signal) == (-9, "SIGKILL")
    assert record.oom == OomKill(OomSource.KMSG, None, machine_memory())
    assert record.memory_enforcement is None  # no limit was enforced
    assert record.peak_rss_bytes is not None and record.peak_rss_bytes > 0  # sampled
    assert verdict_of(replica, record)[0] is Reason.OOM
    shim_log = replica.files.shim_log.read_text()
    assert f"the kernel log names an OOM kill of pid {record.pid} " in shim_log


@pytest.mark.parametrize("enforcement", ["auto", "watchdog"])
def test_a_sigkill_that_is_no_oom_kill_stays_infra(
    launcher: LocalLauncher, tmp_path: Path, enforcement: MemoryEnforcement
) -> None:
    spec = ReplicaSpec(trial_uuid="sigkill", attempt=1, rank=0,
                       argv=fixture_argv("kill_self.py", "SIGKILL"), env={}, cwd=tmp_path,
                       attempt_dir=tmp_path / "attempt-1", memory_enforcement=enforcement)
    launcher.submit(spec)
    replica = Replica(launcher, spec)
    try:
        record = replica.wait_exit()
    finally:
        kill_leftovers(tmp_path)
    assert (record.returncode, record.oom) == (-9, None)
    assert verdict_of(replica, record)[0] is Reason.INFRA


# -- every replica's peak ------------------------------------------------------------------


@pytest.mark.parametrize("enforcement", ["auto", "watchdog"])
def test_every_replica_gets_its_peak_recorded(run: RunFn,
                                              enforcement: MemoryEnforcement) -> None:
    replica = run("within", "40", enforcement=enforcement)
    record = replica.wait_exit()
    assert (record.returncode, record.oom) == (0, None)
    # The cgroup's peak holds every byte the replica touched. The watchdog samples every
    # 0.5 s, so a 40 MiB burst between two samples (or a replica that ended before the
    # first) escapes it; the child's own peak, which the kernel kept, is its floor.
    assert record.peak_rss_bytes is not None and record.peak_rss_bytes >= 40 * MiB


@pytest.mark.parametrize("enforcement", ["auto", "watchdog"])
def test_a_replica_that_ends_at_once_still_has_a_peak(
        launcher: LocalLauncher, tmp_path: Path, enforcement: MemoryEnforcement) -> None:
    spec = ReplicaSpec(
        trial_uuid=f"oom-{tmp_path.name}", attempt=1, rank=0, argv=fixture_argv("exit0.sh"),
        env={}, cwd=tmp_path, attempt_dir=tmp_path / "attempt-1",
        memory_enforcement=enforcement)
    launcher.submit(spec)
    record = Replica(launcher, spec).wait_exit()
    assert record.returncode == 0
    assert record.peak_rss_bytes is not None and record.peak_rss_bytes > 0


# -- the kernel log: parsing, and matching a kill to the group -------------------------------


@pytest.mark.parametrize(
    ("record", "kill"),
    [
        (b"3,423,518073396,-;Memory cgroup out of memory: Killed process 12655 (python3) "
         b"total-vm:60768kB, anon-rss:50816kB, file-rss:6608kB, shmem-rss:0kB, UID:0 "
         b"pgtables:156kB oom_score_adj:0\n", KernelKill(12655, 518.073396)),
        (b"3,9,7000000,-;Out of memory: Killed process 1234 (python) total-vm:1kB\n",
         KernelKill(1234, 7.0)),
        (b"6,422,518073381,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
         b"mems_allowed=0,oom_memcg=/a,task_memcg=/a/b,task=python3,pid=12655,uid=0\n",
         KernelKill(12655, 518.073381)),
        (b"6,12,5000000,-;oom-kill:constraint=CONSTRAINT_NONE,task=x,pid=77,uid=1000\n"
         b" SUBSYSTEM=memory\n", KernelKill(77, 5.0)),
        (b"6,421,518073376,-;[  12655]     0 12655    15192    14356 python3\n", None),
        (b"4,10,1,-;oom_reaper: reaped process 12655 (python3), now anon-rss:0kB\n", None),
        (b"12,425,521347398,-;Killed process 5 (printed by a user)\n", KernelKill(5, 521.347398)),
        (b"no header at all", None),
        (b"6,1,notanumber,-;Out of memory: Killed process 1 (init)\n", None),
    ],
)
def test_kernel_log_records(record: bytes, kill: KernelKill | None) -> None:
    assert parse_record(record) == kill


def test_an_unreadable_kernel_log_names_no_oom_kill(tmp_path: Path) -> None:
    kernel_log = KernelLog.open(tmp_path / "no-kmsg")
    assert kernel_log.problem is not None and "No such file or directory" in kernel_log.problem
    assert kernel_log.oom_kills() == []
    watchdog = RssWatchdog(None, kernel_log=kernel_log)
    assert not watchdog.killed_by_kernel()


@needs_kmsg
def test_the_kernel_log_is_read_from_where_it_was_opened() -> None:
    """Records logged before `open` are not read: an OOM kill from an hour ago (of a process
    that had the same pid) is not this replica's."""
    kernel_log = KernelLog.open(KMSG)
    try:
        assert kernel_log.problem is None
        assert kernel_log.oom_kills() == []  # nothing since it was opened (no OOM here now)
    finally:
        kernel_log.close()


class _LoggedKills(KernelLog):
    """The kernel log's interface over a list: the kills a real log would hold for a pid
    of our choosing (an OOM kill cannot be put in the real one without killing)."""

    def __init__(self, kills: list[KernelKill]) -> None:
        super().__init__(None, None)
        self.kills = kills

    def oom_kills(self) -> list[KernelKill]:
        return self.kills


def _since_boot() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def test_a_kill_matches_a_process_that_was_in_the_group_at_that_time() -> None:
    samples: list[int] = []

    def counted(pgid: int) -> GroupSample:
        samples.append(pgid)
        return sample_group(pgid)

    proc = subprocess.Popen(["sleep", "60"], process_group=0)
    kills = _LoggedKills([])
    watchdog = RssWatchdog(None, interval_s=0.01, sample=counted, kernel_log=kills)
    started = _since_boot()
    try:
        watchdog.watch(proc.pid)
        wait_until(lambda: len(samples) >= 2, timeout=10, what="two samples")
        kills.kills = [KernelKill(proc.pid + 1, _since_boot())]  # not a member
        assert not watchdog.killed_by_kernel()
        kills.kills = [KernelKill(proc.pid, started - 30)]  # before it started: another's
        assert not watchdog.killed_by_kernel()
        kills.kills = [KernelKill(proc.pid, _since_boot())]  # it, alive in the group
        assert watchdog.killed_by_kernel()
        proc.kill()
        proc.wait()
        seen = len(samples)
        wait_until(lambda: len(samples) >= seen + 2, timeout=10, what="samples without it")
        gone = _since_boot()
        kills.kills = [KernelKill(proc.pid, gone + 30)]  # after it was gone: a reused pid
        assert not watchdog.killed_by_kernel()
        kills.kills = [KernelKill(proc.pid, started + 0.01)]  # while it was ours
        assert watchdog.killed_by_kernel()
    finally:
        watchdog.finish()
        watchdog.close()
        proc.kill()
        proc.wait()
