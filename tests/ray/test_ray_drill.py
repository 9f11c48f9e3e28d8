"""A drill's `network` fault on a real Ray cluster whose worker node has a network namespace
of its own: node b is reached from the head (and the server, a Ray driver there) over a veth
pair, and the cluster config names the admin's commands that cut and restore that link
(`ray.drill_network`). The 2-rank DDP digits example runs a rank on each node (SPREAD); the
drill cuts the link of node b (the one of the two ranks' nodes that is not the server's)
for 60 s, mid-run, and muster must name it or the run must survive it, and the link must
be back afterwards.

The module's cluster is its own (`running_cluster(split=True)`): the fault may leave node b
given up by Ray for good.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ray.cluster import RayCluster, running_cluster
from tests.ray.conftest import _skip_or_fail, _unavailable
from tests.ray.servers import RayServer, serving_on
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
DRILL_TIMEOUT_S = 780.0


@pytest.fixture(scope="module")
def split_cluster() -> Iterator[RayCluster]:
    reason = _unavailable()
    if reason is not None:
        _skip_or_fail(reason)
    try:
        with running_cluster(split=True) as cluster:
            yield cluster
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def server(split_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RayServer]:
    with serving_on(split_cluster, tmp_path_factory.mktemp("ray-drill"),
                    placement_strategy="SPREAD",
                    ray_extra={"drill_network": {
                        "cut": split_cluster.link_command("down"),
                        "restore": split_cluster.link_command("up")}}) as running:
        yield running


def _ddp_context(tmp_path: Path) -> tuple[Path, Path]:
    pytest.importorskip("torch", reason="the DDP example needs the 'examples' extra")
    context = tmp_path / "context"
    context.mkdir()
    for name in ("ddp.py", "train.py"):
        shutil.copy2(EXAMPLE / name, context / name)
    subprocess.run([sys.executable, str(EXAMPLE / "prepare_data.py"), "--out",
                    str(context / "data")], capture_output=True, timeout=120, check=True)
    config = yaml.safe_load((EXAMPLE / "ddp.yaml").read_text())
    config["entrypoint"] = "python ddp.py --data data --epochs 200"
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, context


def _link_state(cluster: RayCluster) -> str:
    assert cluster.node_b_namespace and cluster.node_b_link
    shown = subprocess.run(["ip", "-n", cluster.node_b_namespace, "-j", "link", "show",
                            cluster.node_b_link], capture_output=True, text=True, check=True)
    flags: list[str] = json.loads(shown.stdout)[0]["flags"]
    return "UP" if "UP" in flags else "DOWN"


def test_a_cut_link_of_a_ranks_node_is_named_or_survived_and_restored(
        server: RayServer, split_cluster: RayCluster, tmp_path: Path) -> None:
    config, context = _ddp_context(tmp_path)
    done = server.cli("drill", str(config), str(context), "--faults", "network",
                      "--scale", "0.1", "--json", check=False, timeout=DRILL_TIMEOUT_S)
    assert done.stdout, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["clean"]["verified"] is True, report["clean"]
    (row,) = report["faults"]
    assert row["name"] == "network" and row["injected_at"] is not None, row
    # The rank on node b, whichever it is: the head is the server's own node, never cut.
    assert re.search(rf"the link of node {re.escape(str(split_cluster.node_b_ip))} "
                     r"\(rank [01]\) cut for 60 s", row["injection"]), row
    assert row["caught"] is True, (row, server.log()[-4000:])
    assert done.returncode == 0, done.stdout
    # Named: the attempt the cut hit ended in a failure. Under load it has ended STOPPED
    # once (the surviving rank's stop taken for the attempt's end, the node's loss not
    # named): a race in how an attempt's end is chosen, open, checked again at the end.
    stop_taken_for_the_end = row["detect_seconds"] is not None and row["class"] == "STOPPED"
    if row["detect_seconds"] is not None and not stop_taken_for_the_end:
        assert row["class"] in ("LOST", "INFRA", "STALLED"), row
    # The helper restored the link before the drill ended, and said so in the server's log.
    assert _link_state(split_cluster) == "UP"
    assert "muster drill link" in server.log() and "link restored" in server.log()
    # Nothing of the cut-off attempt trains on in node b once Ray has given the node up.
    wait_until(lambda: _training_on(split_cluster, "b") == [], timeout=60,
               what="no training process left on node b")
    if stop_taken_for_the_end:
        pytest.xfail(f"the cut was caught, but its attempt ended STOPPED, not LOST: {row}")


def _training_on(cluster: RayCluster, node: str) -> list[int]:
    """The DDP example's training processes still running on `node`."""
    found = []
    for pid in cluster.node_processes(node):
        try:
            if b"ddp.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended meanwhile
    return found
