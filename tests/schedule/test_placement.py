"""Placement as a strategy: each launcher backend's placement opened by the backend's name,
the local one's answers, the test-only fake's all-or-nothing reservations, and a local
server that never imports Ray."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from muster.config import ClusterConfig
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.backends import open_placement
from muster.schedule.local_placement import LocalPlacement
from muster.schedule.placement import READY, Bundle
from muster.store import Store
from tests.launch.fake_backend import FakeCluster, FakeLauncher, FakePlacement

NO_GPUS = ClusterConfig(gpus="none")


@pytest.fixture
def unopened_store(tmp_path: Path) -> Store:
    """A store the placements are made over; nothing here reads it."""
    return Store(f"sqlite:///{tmp_path / 'muster.db'}")


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home").ensure()


def test_the_local_backend_opens_this_machines_slots(unopened_store: Store, home: Home) -> None:
    placement = open_placement(LocalLauncher(), unopened_store,
                               ClusterConfig(slots=3, gpus="none"), home)
    assert isinstance(placement, LocalPlacement)
    assert placement.slots() == 3
    assert (placement.reserves, placement.places_gpus, placement.may_grow,
            placement.quarantines_nodes) == (False, False, False, False)
    assert placement.reserve("t", 1, [Bundle()]) is READY
    assert placement.sweep({("t", 1)}) == []
    assert placement.nodes() is None  # this machine alone: the caller describes it
    assert placement.node_of(home.runs_dir, 0) == socket.gethostname()
    assert placement.inventory.gpus() == []


def test_the_servers_slots_override_the_configs(unopened_store: Store, home: Home) -> None:
    placement = open_placement(LocalLauncher(), unopened_store,
                               ClusterConfig(slots=3, gpus="none"), home, slots=5)
    assert placement.slots() == 5


def test_a_backend_without_a_placement_is_refused_by_name(
    unopened_store: Store, home: Home
) -> None:
    class Unregistered(FakeLauncher):
        backend = "nowhere"

    with pytest.raises(KeyError, match="no placement is registered for the launcher backend "
                                       "'nowhere'"):
        open_placement(Unregistered(FakeCluster.of()), unopened_store, NO_GPUS, home)


def test_a_registered_backend_is_opened_by_its_name(unopened_store: Store, home: Home) -> None:
    cluster = FakeCluster.of(count=2, cpus=2)
    placement = open_placement(FakeLauncher(cluster), unopened_store, NO_GPUS, home)
    assert isinstance(placement, FakePlacement) and placement.cluster is cluster
    assert placement.slots() == 4


def test_the_fake_reserves_all_or_nothing_and_keeps_quarantined_nodes_out(
    unopened_store: Store
) -> None:
    cluster = FakeCluster.of(count=2, cpus=2)
    placement = FakePlacement(unopened_store, cluster)
    assert placement.reserve("a", 1, [Bundle()] * 3).ready
    assert cluster.reserved[("a", 1)] == ["fake-node-0", "fake-node-0", "fake-node-1"]
    waiting = placement.reserve("b", 1, [Bundle()] * 2)  # one CPU is left: none is taken
    assert not waiting.ready and waiting.reason is not None and "1 free" in waiting.reason
    assert ("b", 1) not in cluster.reserved
    placement.release("a", 1)
    placement.exclude_nodes({"fake-node-0"})
    assert placement.slots() == 2
    assert placement.reserve("b", 1, [Bundle()] * 2).ready
    assert cluster.reserved[("b", 1)] == ["fake-node-1", "fake-node-1"]
    assert placement.sweep(keep={("c", 1)}) == ["b:1"]
    assert cluster.reserved == {}


def test_a_local_server_never_imports_ray() -> None:
    """The placement, the launcher and the supervisor of one machine leave Ray alone: it
    is imported only where a Ray launcher is opened."""
    code = ("import sys, muster.schedule.backends, muster.supervise.supervisor, "
            "muster.server.app; assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
