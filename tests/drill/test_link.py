"""The network fault's commands: a node from its rank's launch record, the admin's argv
filled in, the cut run at once and the restore run later by a detached helper (real
processes, real files)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from muster.config.cluster import NetworkDrillConfig
from muster.drill import link
from muster.errors import InjectionError
from muster.launch.identity import is_alive
from tests.waiting import wait_until


def launched_on(attempt: Path, rank: int, node_ip: str) -> None:
    attempt.mkdir(parents=True, exist_ok=True)
    (attempt / f"rank-{rank}.launch.json").write_text(json.dumps({
        "shim_pid": 1, "shim_start_ticks": 1, "actor": "a", "node_id": "n" * 56,
        "node_ip": node_ip, "hostname": "node-b"}))


def test_placeholders_are_filled_and_other_braces_left() -> None:
    node = {"node_ip": "10.0.0.2", "node_id": "abc", "hostname": "b"}
    assert link.with_node(["ssh", "{hostname}", "cut {node_ip} {node_id} {other}"], node) \
        == ["ssh", "b", "cut 10.0.0.2 abc {other}"]


def test_a_rank_not_launched_on_ray_cannot_have_its_link_cut(tmp_path: Path) -> None:
    with pytest.raises(InjectionError, match="no launch record"):
        link.node_of(tmp_path, 0)
    (tmp_path / "rank-0.launch.json").write_text(json.dumps({"shim_pid": 1}))
    with pytest.raises(InjectionError, match="names no Ray node"):
        link.node_of(tmp_path, 0)


def test_the_cut_runs_now_and_the_helper_restores_after_down_for(tmp_path: Path) -> None:
    attempt, state = tmp_path / "attempt-1", tmp_path / "link"
    launched_on(attempt, 1, "10.9.9.2")
    write = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + ' ' + sys.argv[3] + '\\n')"
    config = NetworkDrillConfig(cut=[sys.executable, "-c", write, str(state), "down",
                                     "{node_ip}"],
                                restore=[sys.executable, "-c", write, str(state), "up",
                                         "{node_ip}"],
                                down_for=1.0)
    log = tmp_path / "server.log"
    cut = link.cut_link(attempt, 1, config, log)
    assert state.read_text() == "down 10.9.9.2\n"  # at once
    assert "the link of node 10.9.9.2 (rank 1) cut for 1 s" in cut.said
    assert cut.back_by > time.time()
    wait_until(lambda: not is_alive(cut.helper), timeout=30, what="the helper to end")
    assert state.read_text() == "down 10.9.9.2\nup 10.9.9.2\n"
    assert "link restored" in log.read_text()


def test_a_failed_cut_is_the_injection_s_failure_and_starts_no_helper(tmp_path: Path) -> None:
    attempt = tmp_path / "attempt-1"
    launched_on(attempt, 0, "10.9.9.2")
    config = NetworkDrillConfig(cut=["sh", "-c", "echo 'no such link' >&2; exit 3"],
                                restore=["true"])
    with pytest.raises(InjectionError, match="exited 3: no such link"):
        link.cut_link(attempt, 0, config, tmp_path / "server.log")
    assert not (tmp_path / "server.log").exists()


def test_the_helper_tries_the_restore_again_and_says_each_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link, "RETRY_PAUSE_S", 0.0)
    counter = tmp_path / "tries"
    script = (f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); "
              "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); "
              "sys.exit(0 if n >= 3 else 1)")
    assert link.main(["--after", "0", "--", sys.executable, "-c", script]) == 0
    said = capsys.readouterr().out
    assert said.count("could not restore the link") == 2 and "link restored" in said
    assert link.main(["--after", "0"]) == 2


def test_the_rank_cut_is_the_last_one_off_the_servers_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cutting the server's own node would cut it from the cluster: the drill takes the last
    rank elsewhere, and refuses when every rank shares the server's node."""
    def on(attempt: Path, rank: int, node: str) -> None:
        launched_on(attempt, rank, "10.9.9.9")
        path = attempt / f"rank-{rank}.launch.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "node_id": node}))

    for rank, node in enumerate(["worker", "head", "head"]):
        on(tmp_path / "mixed", rank, node)
        on(tmp_path / "all-on-head", rank, "head")
    assert link.rank_to_cut(tmp_path / "mixed", 3) == 2  # outside Ray: no server node
    monkeypatch.setattr(link, "_server_node_id", lambda: "head")
    assert link.rank_to_cut(tmp_path / "mixed", 3) == 0
    with pytest.raises(InjectionError, match="every rank runs on the server's own Ray node"):
        link.rank_to_cut(tmp_path / "all-on-head", 3)
