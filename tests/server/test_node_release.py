"""`POST /api/v1/cluster/nodes/{node_id}/release` and `muster cluster node release NODE`
against a real server: a node the circuit breaker quarantined (a row written straight into
the server's database) returns to the pool once, only an admin may release it, and a node
muster has no record of is a 404."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import Conflict, Forbidden, NotFound
from muster.home import Home
from muster.store import ClusterNode
from muster.store.models import now
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server

API = "/api/v1"
REASON = "replicas of 3 different trials in a row ended INFRA (trials 1, 2, 3)"

server = shared_server()  # `client` (tests/server/conftest.py) is this server's admin


def _post_release(server: RunningServer, node: str, token: str) -> httpx.Response:
    return httpx.post(f"{server.url}{API}/cluster/nodes/{node}/release",
                      headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _quarantine(server: RunningServer, node: str) -> None:
    with server.store() as store, store.session_scope() as s:
        s.merge(ClusterNode(id=node, failed_trials=[1, 2, 3], quarantined_at=now(),
                            quarantine_reason=REASON, updated_at=now()))


def _row(server: RunningServer, node: str) -> tuple[list[int], float | None, str | None]:
    with server.store() as store, store.session_scope() as s:
        row = s.get_one(ClusterNode, node)
        return list(row.failed_trials), row.quarantined_at, row.quarantine_reason


def _cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url}
    return subprocess.run([sys.executable, "-m", "muster", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def _local_node(client: Client) -> dict[str, Any]:
    [node] = [n for n in client.cluster_status()["nodes"] if n["id"] == socket.gethostname()]
    return node


def test_an_unknown_node_is_a_404_that_says_where_the_nodes_are(server: RunningServer,
                                                                client: Client) -> None:
    response = _post_release(server, "no-such-node", server.token)
    assert response.status_code == 404, response.text
    body = response.json()
    assert body["error"] == "NotFound"
    assert "no-such-node" in body["message"] and "muster cluster status" in body["message"]
    with pytest.raises(NotFound, match="muster cluster status"):
        client.release_node("no-such-node")


def test_the_cli_releases_a_quarantined_node_once(server: RunningServer,
                                                  client: Client) -> None:
    node = socket.gethostname()  # the local launcher's one node, as `cluster status` lists it
    _quarantine(server, node)
    shown = _local_node(client)
    assert shown["quarantined"] is True and shown["quarantine_reason"] == REASON
    listed = _cli(server, "cluster", "status")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert f"QUARANTINED: {REASON}" in " ".join(listed.stdout.split())  # (wrapped at 80)

    released = _cli(server, "cluster", "node", "release", node)
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"node {node} is back in the pool" in released.stdout
    assert _row(server, node) == ([], None, None)
    shown = _local_node(client)
    assert shown["quarantined"] is False and shown["quarantine_reason"] is None

    again = _cli(server, "cluster", "node", "release", node)
    assert again.returncode != 0
    assert "not quarantined" in again.stdout + again.stderr
    assert _row(server, node) == ([], None, None)


def test_the_api_answers_200_then_409(server: RunningServer, client: Client) -> None:
    node = "ray-node-0123abcd"  # a node the launcher does not list (any more): still released
    _quarantine(server, node)
    response = _post_release(server, node, server.token)
    assert response.status_code == 200, response.text
    assert response.json() == {"id": node, "released": True}
    assert _row(server, node) == ([], None, None)
    response = _post_release(server, node, server.token)
    assert response.status_code == 409, response.text
    assert response.json()["error"] == "Conflict"
    assert "not quarantined" in response.json()["message"]
    with pytest.raises(Conflict, match="not quarantined"):
        client.release_node(node)


@pytest.mark.parametrize("role", ["viewer", "user"])
def test_only_an_admin_may_release_a_node(server: RunningServer, client: Client,
                                          role: str) -> None:
    node = f"ray-node-{role}"
    _quarantine(server, node)
    token = client.create_user(f"not-admin-{role}", role)["token"]
    response = _post_release(server, node, token)
    assert response.status_code == 403, response.text
    with (Client(url=server.url, token=token, home=Home(server.home)) as theirs,
          pytest.raises(Forbidden)):
        theirs.release_node(node)
    failed, quarantined_at, reason = _row(server, node)
    assert failed == [1, 2, 3] and quarantined_at is not None and reason == REASON
    assert _post_release(server, node, server.token).status_code == 200


def test_the_cluster_shows_the_local_node_not_quarantined(server: RunningServer) -> None:
    response = httpx.get(f"{server.url}{API}/cluster",
                         headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
    assert response.status_code == 200, response.text
    [node] = [n for n in response.json()["nodes"] if n["id"] == socket.gethostname()]
    assert node["quarantined"] is False and node["quarantine_reason"] is None
