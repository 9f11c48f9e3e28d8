"""A real Ray cluster of two nodes on this machine, inside a loopback-only network namespace.

Outside a namespace of its own, Ray picked this machine's external address for its control
service even when told 127.0.0.1, and hung; inside one that has only `lo`, 127.0.0.1 is all
it can pick. The namespace (`ip netns add`, root only) holds the cluster's two `ray start`
processes (a head with the custom resource `node_a`, a worker with `node_b`) and every
process that talks to it: a test runs its Ray driver with `cluster.run(...)`, a Python
script started inside the namespace. Files are shared with the test as they are (the same
file system), which is what `ray.storage_path` asks of a real cluster.

One cluster per test module (`scope="module"`): starting one takes seconds. Where it cannot
exist (not root, no `ip`, no Ray) the tests skip with the reason, except with
MUSTER_REQUIRE_RAY=1 (CI), where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT_S = 120.0
# What muster asks of every Ray node (docs/ray.md): the raylet adopts and kills whatever a
# dead worker leaves, so a shim, and the training process group under it (a session of its
# own), never outlive their actor. Ray 2.60's per-worker process groups are turned off for
# it: they take precedence over the subreaper and kill only the worker's own group, so the
# shim's session escaped them (seen here: the training process left running under PID 1).
RAY_NODE_ENV = {"RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true",
                "RAY_process_group_cleanup_enabled": "false"}


@dataclass(frozen=True)
class RayCluster:
    """A running two-node cluster and the namespace it lives in."""

    namespace: str  # the network namespace's name
    address: str  # the head's GCS address, "127.0.0.1:<port>"
    temp_dir: Path  # Ray's session files (logs of the raylets, for a failing test)
    # Every process of the cluster and every driver: its own token, so clusters of other
    # modules (their heads write ~/.ray/auth_token by default) never mix with this one.
    env: dict[str, str]

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cluster's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(self, script: str, *, timeout: float = 120.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Python `script` (dedented) inside the namespace, with RAY_ADDRESS set to
        this cluster; its output is captured."""
        environ = {**os.environ, **self.env, "RAY_ADDRESS": self.address, **(env or {})}
        return subprocess.run(self.command([sys.executable, "-c", textwrap.dedent(script)]),
                              capture_output=True, text=True, timeout=timeout, env=environ)


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "a Ray cluster runs in a network namespace of its own, which needs root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make a network namespace"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (`pip install 'muster[ray]'`, as make install does)"
    return None


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("MUSTER_REQUIRE_RAY") == "1":
        pytest.fail(f"{reason} (and MUSTER_REQUIRE_RAY=1 requires the Ray tests)")
    pytest.skip(reason)


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """Two `ray start` nodes (`node_a` head, `node_b` worker; 2 CPUs each) in a new
    loopback-only network namespace; stopped and the namespace deleted afterwards."""
    reason = _unavailable()
    if reason is not None:
        _skip_or_fail(reason)
    name = f"muster-ray-{uuid.uuid4().hex[:8]}"
    # Short: Ray's Unix sockets live under it, and a socket path has at most 107 bytes.
    temp_dir = Path(f"/tmp/mr-{name[-8:]}")
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    cluster = RayCluster(name, "127.0.0.1:6379", temp_dir, {
        **RAY_NODE_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex * 2})
    try:
        subprocess.run(cluster.command(["ip", "link", "set", "lo", "up"]), check=True,
                       capture_output=True)
        common = ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--disable-usage-stats"]
        for argv in ([_ray_cli(), "start", "--head", "--port=6379", "--include-dashboard=false",
                      f"--temp-dir={temp_dir}", '--resources={"node_a": 1}', *common],
                     [_ray_cli(), "start", f"--address={cluster.address}",
                      '--resources={"node_b": 1}', *common]):
            started = subprocess.run(cluster.command(argv), capture_output=True, text=True,
                                     timeout=START_TIMEOUT_S, env={**os.environ, **cluster.env})
            if started.returncode != 0:
                pytest.fail(f"`ray start` failed in {name}: {started.stdout}{started.stderr}")
        yield cluster
    finally:
        _stop(name)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop(namespace: str) -> None:
    """Every process in the namespace, SIGTERM then SIGKILL. Not `ray stop`: it finds Ray's
    processes by name, and would stop another module's cluster in its own namespace too."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                text=True)
        pids = [int(pid) for pid in listed.stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_exists(pid) for pid in pids):
            time.sleep(0.1)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
