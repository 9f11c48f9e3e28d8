"""A memory cgroup a test makes and runs muster's shims in, so that the kernel's OOM killer
strikes a replica at the cgroup's limit: a real OOM kill without muster's memory_limit and
without exhausting the machine.

The cgroup is made under the test process's own (v1 `memory.limit_in_bytes`), and only the
shims join it (`sh -c 'echo $$ > cgroup.procs; exec shim'`): the test, its store and the
server stay outside, so the OOM killer can only pick the replica (the largest process in
the cgroup) or its shim. The shim then makes the replica's own cgroup under this one, as it
would under any cgroup it runs in.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from muster.errors import LaunchError
from muster.launch.base import LaunchRequest
from muster.launch.local import LocalLauncher
from muster.launch.memory import CgroupMemory, open_cgroup
from muster.launch.shim_launcher import spawn_shim
from muster.rundir import RankFiles

MiB = 1 << 20


@dataclass(frozen=True)
class ShimCgroup:
    """A memory cgroup with a limit, made by a test."""

    path: Path

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, run inside the cgroup from its first instruction."""
        join = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        return ["sh", "-c", join, str(self.path), *argv]


def cgroup_problem() -> str | None:
    """Why a test cannot run shims in a cgroup of its own here, or None (a probe is made
    and removed)."""
    try:
        probe = open_cgroup(16 * MiB, f"muster-test-probe-{os.getpid()}")
    except LaunchError as exc:
        return str(exc)
    probe.close()
    if probe.mechanism != "cgroup-v1":
        # A v2 cgroup that holds processes cannot enable controllers for cgroups below it
        # ("no internal processes"), so the shim could not make the replica's cgroup there.
        return (f"the memory cgroup here is {probe.mechanism}; a test cgroup holding the "
                "shims could not delegate memory to the replicas' own cgroups")
    return None


CGROUP_PROBLEM = cgroup_problem()
needs_cgroup = pytest.mark.skipif(
    CGROUP_PROBLEM is not None,
    reason=f"a test cannot make a memory cgroup to run shims in: {CGROUP_PROBLEM}",
)


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int, name: str) -> Iterator[ShimCgroup]:
    """A v1 memory cgroup with `limit_bytes`, removed (once empty) afterwards."""
    guard: CgroupMemory = open_cgroup(limit_bytes, f"muster-test-{name}-{os.getpid()}")
    try:
        yield ShimCgroup(guard.path)
    finally:
        guard.close()


class LauncherInCgroup(LocalLauncher):
    """A LocalLauncher whose shims start inside `cgroup`: as new interpreters, never through
    the fork server (which runs outside it; the caller sets MUSTER_SHIM_FORKSERVER=0)."""

    def __init__(self, cgroup: ShimCgroup) -> None:
        super().__init__()
        self.cgroup = cgroup

    def _spawn_shim(self, request: LaunchRequest, files: RankFiles) -> subprocess.Popen[bytes]:
        return spawn_shim(self.cgroup.wrap(request.argv), request.cwd, request.env,
                          files.shim_log)
