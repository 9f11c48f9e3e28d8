"""The calls into Ray that Ray leaves unannotated, each typed once here.

Ray 2.60 declares no types for these, so mypy would see every call as untyped; each is
named here with the signature Ray's documentation gives, and what it returns is what
muster reads. Ray is imported inside each call: importing this module is cheap, and a
server without the Ray backend never imports Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

__all__ = ["RayNode", "available_per_node", "exit_actor", "node_ip", "nodes"]


class RayNode(TypedDict, total=False):
    """An entry of `ray.nodes()` (the keys muster reads; Ray lists dead nodes too)."""

    NodeID: str
    Alive: bool
    NodeManagerAddress: str
    NodeManagerHostname: str
    Resources: dict[str, float]  # its totals: "CPU", "GPU", custom resources


def node_ip() -> str:
    """This node's IP address, as Ray's other nodes reach it."""
    import ray.util

    get: Callable[[], str] = ray.util.get_node_ip_address
    return get()


def nodes() -> list[RayNode]:
    """The cluster's nodes, the dead ones included."""
    import ray

    listed: Callable[[], list[RayNode]] = ray.nodes
    return listed()


def available_per_node() -> dict[str, dict[str, float]]:
    """What each live node has free now, by node id (not in a public API in Ray 2.60)."""
    from ray._private import state

    available: Callable[[], dict[str, dict[str, float]]] = state.available_resources_per_node
    return available()


def exit_actor() -> None:
    """End the actor this runs in (Ray unwinds the call with an exception)."""
    import ray.actor

    end: Callable[[], None] = ray.actor.exit_actor
    end()
