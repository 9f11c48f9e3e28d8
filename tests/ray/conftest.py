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

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.ray.cluster import NODE_VARIABLE, RAY_NODE_ENV, RayCluster, running_cluster

__all__ = ["NODE_VARIABLE", "RAY_NODE_ENV", "RayCluster", "ray_cluster"]


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


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """Two `ray start` nodes (`node_a` head, `node_b` worker; 2 CPUs each) in a new
    loopback-only network namespace; stopped and the namespace deleted afterwards."""
    reason = _unavailable()
    if reason is not None:
        _skip_or_fail(reason)
    try:
        with running_cluster() as cluster:
            yield cluster
    except RuntimeError as exc:
        pytest.fail(str(exc))
