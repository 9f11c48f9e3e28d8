"""RayPlacement: an attempt's replicas on the nodes of a Ray cluster (issue 18).

An attempt's replica set is one detached placement group named `muster:<trial
uuid>:<attempt>` with one bundle per replica (`reserve`), so it starts all or nothing;
`RayLauncher` pins each replica's actor to its rank's bundle. The group is removed when
the attempt has ended (`release`), and `sweep` removes groups and actors of attempts that
are no longer live (a crash between two steps). Quarantined nodes are kept out of new
groups by a label selector on Ray's `ray.io/node-id`. Ray places the GPUs (a bundle asks
for them), so muster's own GPU pool is empty, and the slots are the CPUs of the live
nodes that are not quarantined: one per replica.

Ray is imported when the placement is made, never by `import muster`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from muster.atomic import read_json
from muster.config import GpuReleaseConfig
from muster.launch import ray_calls
from muster.launch.ray_replica import attempt_of, group_name, kill_actor, named_group
from muster.rundir import RankFiles
from muster.schedule.gpu_pool import GpuPool
from muster.schedule.inventory import NoGpus
from muster.schedule.placement import READY, Bundle, NodeInfo, Placement, Reservation
from muster.store import Store

__all__ = ["RayPlacement"]

NODE_ID_LABEL = "ray.io/node-id"
SLOTS_TTL_S = 1.0
CREATE_WAIT_S = 0.5  # for a new placement group to be placed, before the pass goes on
Strategy = str  # PACK | SPREAD | STRICT_SPREAD


class RayPlacement(Placement):
    """A placement group per attempt, on the nodes of the Ray cluster this process joined."""

    reserves = True
    places_gpus = True
    may_grow = True
    quarantines_nodes = True

    def __init__(self, store: Store, namespace: str, strategy: Strategy = "PACK",
                 release: GpuReleaseConfig | None = None) -> None:
        import ray

        super().__init__(GpuPool(store, NoGpus("GPUs are Ray's to place: its nodes' GPUs "
                                               "are in `nodes`"),
                                 release or GpuReleaseConfig()))
        self._ray = ray
        self._namespace = namespace  # where the replicas' actors are named
        self._strategy = strategy
        self._excluded: set[str] = set()  # quarantined nodes: no new bundle goes there
        self._slots: tuple[float, int] | None = None  # (read at, slots)

    def reserve(self, trial_uuid: str, attempt: int, bundles: list[Bundle]) -> Reservation:
        """The attempt's placement group, made on the first call (one bundle per replica,
        the configured strategy, quarantined nodes excluded); ready once Ray placed every
        bundle, else waiting with Ray's scheduling state and what the cluster has free."""
        name = group_name(trial_uuid, attempt)
        group = named_group(name)
        if group is None:
            group = self._create(name, bundles)
        table = self._ray.util.placement_group_table(group)
        if table.get("state") == "CREATED":
            placed_on = set((table.get("bundles_to_node_id") or {}).values())
            if placed_on & self._excluded:  # placed before its node was quarantined
                self._ray.util.remove_placement_group(group)
                return Reservation(False, "its placement was on a node quarantined since; "
                                          "placing it again")
            return READY
        return Reservation(False, self._pending_reason(bundles, table))

    def _create(self, name: str, bundles: list[Bundle]) -> Any:
        from ray.util.placement_group import placement_group

        shapes = [_shape(bundle) for bundle in bundles]
        selector = ([{NODE_ID_LABEL: f"!in({','.join(sorted(self._excluded))})"}]
                    * len(shapes) if self._excluded else None)
        group = placement_group(shapes, strategy=self._strategy, name=name,
                                lifetime="detached", bundle_label_selector=selector)
        # A group that fits is placed in milliseconds: wait that long, not a pass.
        group.wait(timeout_seconds=CREATE_WAIT_S)
        return group

    def release(self, trial_uuid: str, attempt: int) -> None:
        group = named_group(group_name(trial_uuid, attempt))
        if group is not None:
            self._ray.util.remove_placement_group(group)

    def sweep(self, keep: set[tuple[str, int]]) -> list[str]:
        """Remove muster's placement groups and replica actors whose attempt is not in
        `keep`; returns their names."""
        removed = []
        for info in self._ray.util.placement_group_table().values():
            name = info.get("name") or ""
            key = attempt_of(name)
            if key is None or key in keep or info.get("state") == "REMOVED":
                continue
            group = named_group(name)
            if group is not None:
                self._ray.util.remove_placement_group(group)
                removed.append(name)
        for name in self._ray.util.list_named_actors():
            key = attempt_of(name)
            if key is not None and key not in keep:
                kill_actor(name, self._namespace)
                removed.append(name)
        return removed

    def exclude_nodes(self, node_ids: set[str]) -> None:
        if node_ids != self._excluded:
            self._slots = None  # the quarantined nodes' CPUs are out now
        self._excluded = set(node_ids)

    def nodes(self) -> list[NodeInfo]:
        """Ray's nodes (the dead ones too, as Ray still lists them), with their totals and,
        for live ones, what is free now."""
        free = ray_calls.available_per_node()
        found = []
        for node in ray_calls.nodes():
            total = node.get("Resources") or {}
            node_id, alive = str(node["NodeID"]), bool(node.get("Alive"))
            left = free.get(node_id) if alive else None
            found.append(NodeInfo(
                id=node_id, address=str(node.get("NodeManagerAddress", "")), alive=alive,
                cpus=float(total.get("CPU", 0)), gpus=float(total.get("GPU", 0)),
                cpus_free=None if left is None else float(left.get("CPU", 0)),
                gpus_free=None if left is None else float(left.get("GPU", 0)),
                hostname=node.get("NodeManagerHostname")))
        return found

    def slots(self) -> int:
        """The CPUs of the live nodes that are not quarantined: one per replica. Read from
        Ray at most once a second (every pass asks)."""
        now = time.monotonic()
        if self._slots is None or now - self._slots[0] > SLOTS_TTL_S:
            self._slots = (now, int(sum(node.cpus for node in self.nodes()
                                        if node.alive and node.id not in self._excluded)))
        return self._slots[1]

    def node_of(self, attempt_dir: Path, rank: int) -> str | None:
        """The Ray node id `RayLauncher` recorded at the replica's launch."""
        launch = read_json(RankFiles(attempt_dir, rank).launch)
        return str(launch["node_id"]) if isinstance(launch, dict) and "node_id" in launch else None

    def _pending_reason(self, bundles: list[Bundle], table: dict[str, Any]) -> str:
        state = (table.get("stats") or {}).get("scheduling_state") or table.get("state")
        shape = _shape(bundles[0]) if bundles else {}
        alive = [node for node in self.nodes() if node.alive]
        usable = [node for node in alive if node.id not in self._excluded]
        free = ", ".join(f"{node.id[:8]}: {node.cpus_free:g} CPUs, {node.gpus_free:g} GPUs free"
                         for node in usable)
        excluded = (f"; {len(alive) - len(usable)} quarantined node(s) excluded"
                    if len(usable) < len(alive) else "")
        return (f"waiting for Ray to place {len(bundles)} bundle(s) of {shape} "
                f"({self._strategy}): {state}; {len(usable)} usable node(s) "
                f"({free or 'none'}){excluded}")


def _shape(bundle: Bundle) -> dict[str, float]:
    shape: dict[str, float] = {"CPU": bundle.cpus}
    if bundle.gpus:
        shape["GPU"] = bundle.gpus
    if bundle.memory:
        shape["memory"] = bundle.memory
    return shape
