"""The launcher a server runs replicas with, from the cluster config: `LocalLauncher` on
this machine (the default), or `RayLauncher` on the nodes of a Ray cluster, connected and
checked at start-up (docs/ray.md)."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import shutil
import socket

from muster.config import ClusterConfig, RayConfig
from muster.errors import ConfigError
from muster.home import Home
from muster.launch import ray_calls
from muster.launch.base import Launcher
from muster.launch.local import LocalLauncher

__all__ = ["open_launcher", "probe_storage"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0


def open_launcher(cluster: ClusterConfig, home: Home) -> tuple[Launcher, Home]:
    """The launcher the cluster config names, and the home as it lays out with it (with
    Ray, runs, the checkpoint cache and environments under `ray.storage_path`).

    Raises:
        ConfigError: Ray is not installed, the cluster cannot be reached, or a node cannot
            see `storage_path`.
    """
    if cluster.launcher == "local":
        return LocalLauncher(), home
    assert cluster.ray is not None  # the config's validator
    config = cluster.ray
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("launcher: ray needs Ray on the server: pip install 'muster[ray]' "
                          f"(the same Ray version as the cluster's) ({exc})") from exc
    from muster.launch.ray_launcher import RayLauncher

    _check_reachable(config.address)  # ray.init retries an address that never answers
    try:
        launcher = RayLauncher(address=config.address, namespace=config.namespace)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"Could not connect to the Ray cluster at ray.address "
                          f"{config.address!r}: {exc}") from exc
    try:
        config.storage_path.mkdir(parents=True, exist_ok=True)
        probe_storage(config)
    except (OSError, ConfigError) as exc:
        ray.shutdown()
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"ray.storage_path {config.storage_path} cannot be used here: "
                          f"{exc}") from exc
    log.info("replicas run on the Ray cluster at %s (namespace %s); run directories in %s",
             config.address, config.namespace, config.storage_path)
    return launcher, dataclasses.replace(home, shared=config.storage_path)


def _check_reachable(address: str) -> None:
    """A TCP connection to the head's address (GCS, or Ray Client's server), so that a
    wrong address is refused in seconds: `ray.init` would retry it for minutes.

    Raises:
        ConfigError: nothing answers there.
    """
    if address == "auto":
        return  # a cluster this machine is a node of: ray.init finds it, or says so at once
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)),
                                 timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"Could not reach the Ray cluster at ray.address {address!r}: {exc}. Is the "
            "head running there (`ray start --head`), and does this machine reach it?"
        ) from exc


def _write_probe(path: str, token: str) -> str:
    """Run on a node: write `token` to `path` (on the shared storage); returns the node's
    IP, or raises what the node saw."""
    with open(path, "w", encoding="ascii") as probe:
        probe.write(token)
    return ray_calls.node_ip()


def probe_storage(config: RayConfig) -> None:
    """Every live node writes a probe file under `storage_path`, and the server reads each
    back: a node that cannot see the same directory is refused, by name.

    Raises:
        ConfigError: naming every node that failed and what it saw.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import ray as ray_module

    probes = config.storage_path / f".probe-{secrets.token_hex(4)}"
    probes.mkdir(mode=0o700)
    try:
        token = secrets.token_hex(16)
        nodes = [node for node in ray_calls.nodes() if node.get("Alive")]
        task = ray_module.remote(num_cpus=0)(_write_probe)
        pending = {}
        for node in nodes:
            pinned = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            pending[node["NodeID"]] = task.options(scheduling_strategy=pinned).remote(
                str(probes / node["NodeID"]), token)
        failed = []
        for node_id, ref in pending.items():
            try:
                ray_module.get(ref, timeout=PROBE_TIMEOUT_S)
                seen = (probes / node_id).read_text(encoding="ascii")
            except (OSError, ray_module.exceptions.RayError) as exc:
                failed.append(f"node {node_id}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            if seen != token:
                failed.append(f"node {node_id}: wrote a probe the server did not read back")
        if failed:
            raise ConfigError(
                f"ray.storage_path {config.storage_path} must be one directory every Ray node "
                "and the server mount at the same path; these nodes could not write there "
                "what the server reads: " + "; ".join(failed))
        log.info("%d Ray node(s) see %s", len(nodes), config.storage_path)
    finally:
        shutil.rmtree(probes, ignore_errors=True)
        if probes.exists():
            log.warning("could not remove the probe directory %s", probes)
