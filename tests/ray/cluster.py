"""A real Ray cluster of two nodes on this machine, inside a loopback-only network namespace
(the tests' fixture in `conftest.py`, and the Ray benchmark's): see conftest.py's docstring.
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

START_TIMEOUT_S = 120.0
# What muster asks of every Ray node (docs/ray.md): the raylet adopts and kills whatever a
# dead worker leaves, so a shim, and the training process group under it (a session of its
# own), never outlive their actor. Ray 2.60's per-worker process groups are turned off for
# it: they take precedence over the subreaper and kill only the worker's own group, so the
# shim's session escaped them (seen here: the training process left running under PID 1).
NODE_VARIABLE = "TEST_RAY_NODE"
SPLIT_LINK = "mrlink0"  # each node's end of a split cluster's veth pair, in its namespace
GLOO_IFNAME_VARIABLE = "GLOO_SOCKET_IFNAME"
RAY_NODE_ENV = {"RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true",
                "RAY_process_group_cleanup_enabled": "false"}


@dataclass(frozen=True)
class RayCluster:
    """A running two-node cluster and the namespace it lives in."""

    namespace: str  # the network namespace's name (the head's, and the drivers')
    address: str  # the head's GCS address, "127.0.0.1:<port>" (split: "10.x.y.1:<port>")
    temp_dir: Path  # Ray's session files (logs of the raylets, for a failing test)
    # Every process of the cluster and every driver: its own token, so clusters of other
    # modules (their heads write ~/.ray/auth_token by default) never mix with this one.
    env: dict[str, str]
    # Split (`running_cluster(split=True)`): node b lives in a namespace of its own, joined
    # to the head's by a veth pair; its end there is the link a network fault cuts.
    node_b_namespace: str | None = None
    node_b_ip: str | None = None
    node_b_link: str | None = None

    @property
    def namespaces(self) -> list[str]:
        return [self.namespace, *([self.node_b_namespace] if self.node_b_namespace else [])]

    def link_command(self, state: str) -> list[str]:
        """An admin's command (`ray.drill_network.cut`/`restore`, `state` "down" or "up")
        that sets the link of the node at `{node_ip}` (only node b has one to set)."""
        assert self.node_b_namespace is not None, "only a split cluster has links to cut"
        script = (f'[ "$0" = "{self.node_b_ip}" ] || {{ echo "no link for node $0" >&2; '
                  f'exit 1; }}; exec ip -n {self.node_b_namespace} link set '
                  f'{self.node_b_link} {state}')
        return ["sh", "-c", script, "{node_ip}"]

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cluster's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def node_processes(self, node: str) -> list[int]:
        """The processes of node `node` ("a" or "b"): those of the namespace that inherited
        its TEST_RAY_NODE."""
        found = []
        for pid in (p for namespace in self.namespaces for p in _pids(namespace)):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue  # it ended between the listing and the read: not a node's process
            if f"{NODE_VARIABLE}={node}".encode() in environ:
                found.append(pid)
        return found

    def remove_node(self, node: str) -> list[int]:
        """Take node `node` away as a machine that fails does: SIGKILL every process on it
        (its raylet, its workers and what they started). Returns the pids killed."""
        pids = self.node_processes(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def run(self, script: str, *, timeout: float = 120.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Python `script` (dedented) inside the namespace, with RAY_ADDRESS set to
        this cluster; its output is captured."""
        environ = {**os.environ, **self.env, "RAY_ADDRESS": self.address, **(env or {})}
        return subprocess.run(self.command([sys.executable, "-c", textwrap.dedent(script)]),
                              capture_output=True, text=True, timeout=timeout, env=environ)


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


@contextlib.contextmanager
def running_cluster(dashboard: bool = False, split: bool = False) -> Iterator[RayCluster]:
    """Two `ray start` nodes (`node_a` head, `node_b` worker with one GPU declared; 2 CPUs
    each) in a new loopback-only network namespace; stopped and the namespace deleted
    afterwards. With `dashboard`, the head serves Ray's dashboard and job API on
    127.0.0.1:8265 there (it needs `ray[default]`). With `split`, node b runs in a
    namespace of its own, reached over a veth pair (10.x.y.1 the head, 10.x.y.2 node b):
    a link a test can cut (`RayCluster.link_command`).

    Raises:
        RuntimeError: a `ray start` failed (its output says why).
    """
    tag = uuid.uuid4().hex[:8]
    name = f"muster-ray-{tag}"
    # Short: Ray's Unix sockets live under it, and a socket path has at most 107 bytes.
    temp_dir = Path(f"/tmp/mr-{tag}")
    env = {**RAY_NODE_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex * 2}
    subnet = f"10.{int(tag[:2], 16)}.{int(tag[2:4], 16)}"
    if split:  # gloo (DDP on CPU) finds its address from the link, as on a real cluster
        env[GLOO_IFNAME_VARIABLE] = SPLIT_LINK
    cluster = (RayCluster(name, f"{subnet}.1:6379", temp_dir, env, f"{name}-b",
                          f"{subnet}.2", SPLIT_LINK) if split
               else RayCluster(name, "127.0.0.1:6379", temp_dir, env))
    try:
        for namespace in cluster.namespaces:
            subprocess.run(["ip", "netns", "add", namespace], check=True, capture_output=True)
            subprocess.run(["ip", "-n", namespace, "link", "set", "lo", "up"], check=True,
                           capture_output=True)
        if split:
            _join(cluster, tag, f"{subnet}.1")
        head_ip = cluster.address.rpartition(":")[0]
        common = ["--num-cpus=2", "--disable-usage-stats"]
        head = (["--include-dashboard=true", "--dashboard-host=127.0.0.1"] if dashboard
                else ["--include-dashboard=false"])
        for node, argv in (
                ("a", [_ray_cli(), "start", "--head", "--port=6379", *head,
                       f"--node-ip-address={head_ip}", f"--temp-dir={temp_dir}",
                       '--resources={"node_a": 1}', *common]),
                # One GPU declared (there is none): Ray assigns it, and sets
                # CUDA_VISIBLE_DEVICES, as on a real GPU node.
                ("b", [_ray_cli(), "start", f"--address={cluster.address}", "--num-gpus=1",
                       f"--node-ip-address={cluster.node_b_ip or head_ip}",
                       '--resources={"node_b": 1}', *common])):
            argv = ["ip", "netns", "exec", cluster.namespaces[-1] if node == "b" else name,
                    *argv]
            # TEST_RAY_NODE (not MUSTER_*, which a job does not inherit): every process of
            # the node inherits it (its raylet, workers, and the shims and training
            # processes they start), so a test can tell where a process runs, and take a
            # whole node away (`RayCluster.remove_node`).
            started = subprocess.run(argv, capture_output=True, text=True,
                                     timeout=START_TIMEOUT_S,
                                     env={**os.environ, **cluster.env, NODE_VARIABLE: node})
            if started.returncode != 0:
                raise RuntimeError(f"`ray start` failed in {name}: "
                                   f"{started.stdout}{started.stderr}")
        yield cluster
    finally:
        _stop(cluster.namespaces)
        for namespace in cluster.namespaces:  # a veth goes with its namespace
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _join(cluster: RayCluster, tag: str, head_ip: str) -> None:
    """The veth pair between the head's namespace and node b's, addressed and up. Made
    with names unique on the machine, each end is renamed SPLIT_LINK in its namespace: one
    name on every node, as `eth0` is (GLOO_SOCKET_IFNAME names it)."""
    assert cluster.node_b_namespace and cluster.node_b_ip
    ends = ((f"mra{tag}", cluster.namespace, head_ip),
            (f"mrb{tag}", cluster.node_b_namespace, cluster.node_b_ip))
    subprocess.run(["ip", "link", "add", ends[0][0], "type", "veth", "peer", "name",
                    ends[1][0]], check=True, capture_output=True)
    for link, namespace, address in ends:
        for argv in (["ip", "link", "set", link, "netns", namespace],
                     ["ip", "-n", namespace, "link", "set", link, "name", SPLIT_LINK],
                     ["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", SPLIT_LINK],
                     ["ip", "-n", namespace, "link", "set", SPLIT_LINK, "up"]):
            subprocess.run(argv, check=True, capture_output=True)


def _pids(namespace: str) -> list[int]:
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(pid) for pid in listed.stdout.split()]


def _stop(namespaces: list[str]) -> None:
    """Every process in the namespaces, SIGTERM then SIGKILL. Not `ray stop`: it finds Ray's
    processes by name, and would stop another module's cluster in its own namespace too.
    The SIGTERM gets 2 s: the GCS and the raylets outlive it by far more (10 s measured)."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
        pids = [pid for namespace in namespaces for pid in _pids(namespace)]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_exists(pid) for pid in pids):
            time.sleep(0.1)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
