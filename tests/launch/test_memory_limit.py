"""resources.memory_limit, enforced by the shim over the replica's whole process group: with a
cgroup where this machine lets us make one, and with the RSS watchdog everywhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from muster.errors import LaunchError
from muster.launch.base import ExitRecord, MemoryEnforcement, OomKill, ReplicaSpec
from muster.launch.exits import ExitObservation, classify_exit
from muster.launch.local import LocalLauncher
from muster.launch.logs import FileLog, tail_text
from muster.launch.memory import (
    WATCHDOG_FAILURES,
    GroupSample,
    RssWatchdog,
    machine_memory,
    open_cgroup,
)
from muster.launch.records import (
    exit_record_from_json,
    exit_record_to_json,
    spec_from_json,
    spec_to_json,
)
from muster.sizes import format_size
from muster.states import OomSource, Reason
from tests.launch.conftest import Replica, fixture_argv, kill_leftovers
from tests.processes import live_group
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

MiB = 1 << 20
LIMIT = 150 * MiB


def _cgroup_problem() -> str | None:
    """Why no memory cgroup can be made here, or None (the probe is made and removed). Each
    pytest worker imports this module at collection, at the same moment: each probes under
    a name of its own (one name made the other's mkdir fail, EEXIST, as if no cgroup could
    be made here, while its replicas then made theirs)."""
    try:
        open_cgroup(LIMIT, f"muster-test-probe-{os.getpid()}").close()
    except LaunchError as exc:
        return str(exc)
    return None


CGROUP_PROBLEM = _cgroup_problem()
MECHANISMS = [
    pytest.param(
        "cgroup",
        marks=pytest.mark.skipif(
            CGROUP_PROBLEM is not None,
            reason=f"no writable cgroup memory controller here: {CGROUP_PROBLEM}",
        ),
    ),
    "watchdog",
]


@pytest.fixture(params=MECHANISMS)
def mechanism(request: pytest.FixtureRequest) -> MemoryEnforcement:
    value: MemoryEnforcement = request.param
    return value


RunFn = Callable[..., Replica]


@pytest.fixture
def run(launcher: LocalLauncher, tmp_path: Path) -> Iterator[RunFn]:
    """Start `memory_hog.py` under a shim with a memory limit."""
    attempts = iter(range(1, 100))

    def start(
        *args: str, limit: int | None = LIMIT, enforcement: MemoryEnforcement = "auto"
    ) -> Replica:
        attempt = next(attempts)
        spec = ReplicaSpec(
            trial_uuid=f"memory-{tmp_path.name}", attempt=attempt, rank=0,
            argv=fixture_argv("memory_hog.py", *args), env={}, cwd=tmp_path,
            attempt_dir=tmp_path / f"attempt-{attempt}", stop_grace=1.0,
            memory_limit=limit, memory_enforcement=enforcement,
        )
        launcher.submit(spec)
        return Replica(launcher, spec)

    yield start
    kill_leftovers(tmp_path)


def classified(replica: Replica, record: ExitRecord) -> ExitObservation:
    return ExitObservation(rank=replica.spec.rank, exit=record,
                           log_tail=tail_text(FileLog(0, replica.files.log), 20))


_OVER_LIMIT = re.compile(
    r"The replica worker-0 \(rank 0\) ran out of memory and exited with a non-zero status "
    r"of 137: killed by (?:the kernel's OOM killer|muster's memory watchdog) at its "
    r"memory_limit of 150 MiB \(peak (?P<peak>[\d.]+) (?P<unit>MiB|GiB)\): raise "
    r"resources\.memory_limit or use less memory"
)


def assert_over_the_limit(replica: Replica, mechanism: str) -> ExitRecord:
    record = replica.wait_exit()
    source = OomSource.WATCHDOG if mechanism == "watchdog" else OomSource.CGROUP
    assert (record.returncode, record.signal) == (-9, "SIGKILL")
    assert record.oom == OomKill(source, LIMIT, machine_memory())
    assert record.memory_limit_bytes == LIMIT
    assert record.peak_rss_bytes == record.peak_memory_bytes
    assert record.memory_enforcement is not None
    assert record.memory_enforcement.startswith(mechanism)
    assert record.peak_memory_bytes is not None and record.peak_memory_bytes >= LIMIT
    verdict = classify_exit(classified(replica, record))
    assert verdict.reason is Reason.OOM
    match = _OVER_LIMIT.fullmatch(verdict.message)
    assert match, verdict.message
    scale = MiB if match["unit"] == "MiB" else 1024 * MiB
    assert float(match["peak"]) * scale >= LIMIT
    return record


def test_a_hog_is_killed_at_the_limit(run: RunFn, mechanism: MemoryEnforcement) -> None:
    replica = run("hog", "600", enforcement=mechanism)
    assert_over_the_limit(replica, mechanism)
    assert b"hog: 20 MiB" in replica.log()
    assert b"holding" not in replica.log()  # it never got to 600 MiB


def test_the_whole_process_group_counts(run: RunFn, mechanism: MemoryEnforcement) -> None:
    # Parent and child touch 90 MiB each: either alone is under 150 MiB, together over it.
    # Under a cgroup the kernel kills one of them; the shim then kills the other.
    replica = run("group", "90", enforcement=mechanism)
    record = assert_over_the_limit(replica, mechanism)
    assert record.pid is not None and not live_group(record.pid)


def test_a_hog_below_the_group_leader_ends_the_whole_group(
    run: RunFn, mechanism: MemoryEnforcement
) -> None:
    # Under a cgroup the kernel kills the hogging child alone; the parent would wait forever
    # if the shim did not kill the rest of the group when the cgroup's OOM counter rose.
    replica = run("child-hog", "600", enforcement=mechanism)
    record = assert_over_the_limit(replica, mechanism)
    assert record.pid is not None and not live_group(record.pid)


def test_a_replica_under_its_limit_is_unaffected(
    run: RunFn, mechanism: MemoryEnforcement
) -> None:
    replica = run("within", "40", enforcement=mechanism)
    record = replica.wait_exit()
    assert (record.returncode, record.oom, record.memory_limit_bytes) == (0, None, LIMIT)
    assert record.peak_memory_bytes is not None and record.peak_memory_bytes < LIMIT
    if mechanism == "cgroup":  # the kernel's peak; the watchdog's samples may miss a moment
        assert record.peak_memory_bytes >= 40 * MiB
    assert b"done" in replica.log()
    assert classify_exit(classified(replica, record)).reason is Reason.OK


@pytest.mark.skipif(CGROUP_PROBLEM is not None, reason=f"no memory cgroup: {CGROUP_PROBLEM}")
def test_the_cgroup_is_removed_when_the_replica_ends(run: RunFn, tmp_path: Path) -> None:
    probe = open_cgroup(LIMIT, f"muster-test-probe-{os.getpid()}")
    parent = probe.path.parent
    probe.close()
    for args in (("within", "10"), ("hog", "600")):
        run(*args, enforcement="cgroup").wait_exit()
    assert not list(parent.glob(f"muster-memory-{tmp_path.name}-*"))


def test_auto_takes_a_cgroup_where_one_can_be_made(run: RunFn) -> None:
    record = run("within", "10").wait_exit()
    expected = "watchdog" if CGROUP_PROBLEM is not None else "cgroup-"
    assert record.memory_enforcement is not None
    assert record.memory_enforcement.startswith(expected)


def test_without_a_limit_the_record_says_nothing_about_a_limit(run: RunFn) -> None:
    """The limit's fields stay empty, as before; the group's peak is recorded all the same."""
    record = run("within", "10", limit=None).wait_exit()
    assert (record.returncode, record.oom) == (0, None)
    assert (record.memory_limit_bytes, record.peak_memory_bytes, record.memory_enforcement) == (
        None, None, None)
    assert record.peak_rss_bytes is not None and record.peak_rss_bytes > 0


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("memory-error", "MemoryError"),
        ("cuda-oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                     "GPU 0 has a total capacity of 79.10 GiB of which 1.02 GiB is free."),
    ],
)
def test_an_out_of_memory_exception_is_oom(run: RunFn, mode: str, reason: str) -> None:
    replica = run(mode, limit=None)
    record = replica.wait_exit()
    assert (record.returncode, record.oom) == (1, None)
    verdict = classify_exit(classified(replica, record))
    assert verdict.reason is Reason.OOM
    assert verdict.termination_reason == reason
    assert re.fullmatch(
        r"The replica worker-0 \(rank 0\) ran out of memory and exited with a non-zero status "
        rf"of 1\. Termination reason: {re.escape(reason)} \(see the last \d+ log lines\)",
        verdict.message,
    ), verdict.message


@pytest.mark.skipif(CGROUP_PROBLEM is None, reason="a memory cgroup can be made here")
def test_a_cgroup_that_cannot_be_made_is_a_spawn_error_when_demanded(run: RunFn) -> None:
    record = run("within", "10", enforcement="cgroup").wait_exit()
    assert record.spawn_error is not None
    assert record.spawn_error.startswith("Cannot make a memory cgroup")
    assert classify_exit(ExitObservation(0, record)).reason is Reason.INTERNAL


# -- files: new fields round-trip, old files still load ----------------------------------


def test_a_spec_with_a_memory_limit_survives_a_json_round_trip(tmp_path: Path) -> None:
    spec = ReplicaSpec(
        trial_uuid="t", attempt=1, rank=0, argv=["python"], env={}, cwd=tmp_path,
        attempt_dir=tmp_path, memory_limit=4 << 30, memory_enforcement="watchdog",
    )
    assert spec_from_json(json.loads(json.dumps(spec_to_json(spec)))) == spec


def test_a_spec_written_before_memory_limits_loads_without_one(tmp_path: Path) -> None:
    spec = ReplicaSpec(trial_uuid="t", attempt=1, rank=0, argv=["python"], env={},
                       cwd=tmp_path, attempt_dir=tmp_path)
    old = spec_to_json(spec)
    del old["memory_limit"], old["memory_enforcement"]
    assert spec_from_json(old) == spec
    with pytest.raises(ValueError, match="memory_enforcement must be auto, cgroup or watchdog"):
        spec_from_json(spec_to_json(spec) | {"memory_enforcement": "magic"})


def test_an_exit_record_written_before_memory_limits_loads() -> None:
    old = {
        "returncode": -9, "exit_code": 137, "signal": "SIGKILL", "pid": 7, "start_ticks": 1,
        "started_at": 1.0, "ended_at": 2.0, "max_rss_bytes": 4096, "stop_requested": False,
        "signals_sent": [], "spawn_error": None, "spawn_errno": None, "log_bytes": 0,
    }
    record = exit_record_from_json(old)
    assert (record.oom, record.memory_limit_bytes, record.peak_memory_bytes) == (
        None, None, None)
    assert classify_exit(ExitObservation(0, record)).reason is Reason.INFRA
    # Before issue 31 `oom` was a bool, and only a memory limit could set it.
    for mechanism, source in (("cgroup-v1", OomSource.CGROUP), ("watchdog", OomSource.WATCHDOG)):
        full = old | {"oom": True, "memory_limit_bytes": 1, "memory_enforcement": mechanism}
        assert exit_record_from_json(full).oom == OomKill(source, 1)
    assert exit_record_from_json(old | {"oom": False}).oom is None


def test_an_oom_kill_survives_a_json_round_trip() -> None:
    record = ExitRecord(returncode=-9, exit_code=137, signal="SIGKILL", pid=7, start_ticks=1,
                        started_at=1.0, ended_at=2.0, max_rss_bytes=4096,
                        oom=OomKill(OomSource.KMSG, None, 24 << 30), peak_rss_bytes=5 << 20)
    data = json.loads(json.dumps(exit_record_to_json(record)))
    assert data["oom"] == {"source": "kmsg", "limit_bytes": None, "machine_bytes": 24 << 30}
    assert exit_record_from_json(data) == record


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (4 << 30, "4 GiB"),
        (int(4.2 * (1 << 30)), "4.2 GiB"),
        (int(4.96 * (1 << 30)), "5 GiB"),
        (150 * MiB, "150 MiB"),
        (150 * MiB + MiB // 2, "150.5 MiB"),
        (1536, "1.5 KiB"),
        (512, "512 B"),
        (0, "0 B"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


def test_a_watchdog_that_cannot_sample_kills_the_group_and_says_why(tmp_path: Path) -> None:
    """No silent degradation: the replica never runs on without its limit."""
    calls: list[int] = []

    def broken_proc(pgid: int) -> GroupSample:  # what a /proc that refuses to be read does
        calls.append(pgid)
        raise OSError(24, "Too many open files")

    proc = subprocess.Popen(["sleep", "60"], process_group=0)
    try:
        watchdog = RssWatchdog(LIMIT, interval_s=0.01, sample=broken_proc)
        watchdog.watch(proc.pid)
        wait_until(lambda: proc.poll() is not None, timeout=10, what="the group to be killed")
        report = watchdog.finish()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9 and len(calls) == WATCHDOG_FAILURES
    assert not report.oom and not watchdog.breached()
    assert report.error == watchdog.error
    assert report.error is not None and "OSError: [Errno 24] Too many open files" in report.error


def test_a_watchdog_that_recovers_in_time_keeps_watching() -> None:
    """Fewer failures in a row than WATCHDOG_FAILURES are only warnings."""
    samples: list[int | OSError] = [OSError("once"), OSError("twice"), 1 * MiB,
                                    OSError("again"), 2 * MiB]
    taken: list[int] = []

    def flaky(pgid: int) -> GroupSample:
        value = samples[min(len(taken), len(samples) - 1)]
        taken.append(pgid)
        if isinstance(value, OSError):
            raise value
        return GroupSample(value, ())

    proc = subprocess.Popen(["sleep", "60"], process_group=0)
    try:
        watchdog = RssWatchdog(LIMIT, interval_s=0.01, sample=flaky)
        watchdog.watch(proc.pid)
        wait_until(lambda: len(taken) > len(samples), timeout=10, what="every sample taken")
        report = watchdog.finish()
        assert proc.poll() is None and report.error is None and report.peak_bytes == 2 * MiB
    finally:
        proc.kill()
        proc.wait()


def test_an_unenforced_limit_is_an_internal_failure() -> None:
    record = ExitRecord(returncode=-9, exit_code=137, signal="SIGKILL", pid=1, start_ticks=1,
                        started_at=1.0, ended_at=2.0, max_rss_bytes=None,
                        memory_limit_bytes=LIMIT, memory_enforcement="watchdog",
                        memory_error="the RSS watchdog could not sample the process group")
    verdict = classify_exit(ExitObservation(0, record))
    assert verdict.reason is Reason.INTERNAL
    assert verdict.message == (
        "The replica worker-0 (rank 0) was stopped by muster: its memory limit of 150 MiB "
        "could not be enforced (the RSS watchdog could not sample the process group), and "
        "it must not run without it")


def test_the_cgroups_of_killed_shims_are_removed_and_no_other(tmp_path: Path) -> None:
    """A SIGKILLed shim leaves its replica cgroup behind; the supervisor's sweep removes it
    (`remove_orphaned_cgroups`), but never the cgroup of a shim that lives, nor one that
    still holds a process."""
    from muster.launch.memory import open_cgroup, remove_orphaned_cgroups

    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        orphan = open_cgroup(None, f"muster-t-a1-r0-{gone.pid}")
    except LaunchError as exc:
        pytest.skip(f"no memory cgroup can be made here: {exc}")
    living = open_cgroup(None, f"muster-t-a1-r1-{os.getpid()}")
    busy_gone = subprocess.Popen(["true"])
    busy_gone.wait()
    busy = open_cgroup(None, f"muster-t-a1-r2-{busy_gone.pid}")
    holder = subprocess.Popen(["sleep", "60"], preexec_fn=busy.child_setup())
    try:
        removed = remove_orphaned_cgroups()
        assert orphan.path in removed and not orphan.path.exists()
        assert living.path.exists() and busy.path.exists()
    finally:
        holder.kill()
        holder.wait()
        for guard in (living, busy):
            guard.close()
