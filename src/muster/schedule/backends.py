"""The placement of each launcher backend, by the backend's name (`Launcher.backend`):
chosen once, when the server is wired (`open_placement`).

`local` and `ray` are built in (Ray's module is imported only when a Ray launcher asks);
another backend registers its own with `register_placement`, and nothing in `supervise/`
or `server/` changes: they ask the placement, never the backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from muster.config import ClusterConfig
from muster.home import Home
from muster.launch.base import Launcher
from muster.schedule.inventory import open_inventory
from muster.schedule.local_placement import LocalPlacement
from muster.schedule.placement import Placement
from muster.store import Store

__all__ = ["PlacementSetting", "open_placement", "register_placement"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlacementSetting:
    """What a placement is made from, besides its launcher."""

    store: Store
    cluster: ClusterConfig
    home: Home
    slots: int | None = None  # the server's `--slots`, else the cluster config's


PlacementFactory = Callable[[Launcher, PlacementSetting], Placement]


def _local(launcher: Launcher, setting: PlacementSetting) -> Placement:
    cluster = setting.cluster
    inventory = open_inventory(cluster.gpus, setting.home.fake_gpus_dir)
    slots = setting.slots if setting.slots is not None else cluster.slots
    return LocalPlacement(setting.store, slots, inventory, cluster.gpu_release)


def _ray(launcher: Launcher, setting: PlacementSetting) -> Placement:
    from muster.launch.ray_launcher import RayLauncher
    from muster.schedule.ray_placement import RayPlacement

    cluster = setting.cluster
    if not isinstance(launcher, RayLauncher) or cluster.ray is None:
        raise TypeError(f"a Ray placement needs a RayLauncher and a `ray:` section, got "
                        f"{type(launcher).__name__}")
    return RayPlacement(setting.store, launcher.namespace, cluster.ray.placement_strategy,
                        cluster.gpu_release)


_FACTORIES: dict[str, PlacementFactory] = {"local": _local, "ray": _ray}


def register_placement(backend: str, factory: PlacementFactory) -> None:
    """Make `factory` the placement of launchers whose `backend` is that name."""
    _FACTORIES[backend] = factory


def open_placement(launcher: Launcher, store: Store, cluster: ClusterConfig, home: Home,
                   slots: int | None = None) -> Placement:
    """The placement of `launcher`'s backend, over `store` (its GPU pool), as the cluster
    config sets it up; `slots`, when given, overrides the config's (`muster up --slots`).

    Raises:
        KeyError: no placement is registered for the launcher's backend.
    """
    factory = _FACTORIES.get(launcher.backend)
    if factory is None:
        raise KeyError(f"no placement is registered for the launcher backend "
                       f"{launcher.backend!r} (known: {', '.join(sorted(_FACTORIES))}); "
                       "call muster.schedule.backends.register_placement first")
    placement = factory(launcher, PlacementSetting(store, cluster, home, slots))
    log.info("GPU inventory: %s", placement.inventory.note)
    return placement
