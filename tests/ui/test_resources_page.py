"""A trial's live resources on its page, in Chromium (issue 36, deliverable 5): while a
two-replica trial runs, its page charts each replica's CPU and memory (RSS) from the
`system/` series, a curve per rank, next to its metrics, and the charts grow as new samples
come in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.server.experiments import TRIAL_ENDED, wait_trial
from tests.servers import serving
from tests.ui.conftest import PASSWORD, Team

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

MiB = 1 << 20
# Holds 64 MiB and computes until the file argv[1] exists.
WORK = """\
import os, sys
held = b"x" * (64 << 20)
print("holding 64 MiB", flush=True)
while not os.path.exists(sys.argv[1]):
    sum(i * i for i in range(10_000))
"""


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    """The UI tests' team, on a server that samples each replica every 0.25 s."""
    top = tmp_path_factory.mktemp("resources-ui")
    cluster = top / "cluster.yaml"
    cluster.write_text("system_metrics_interval: 0.25s\n")
    with serving(top / "home", options=("--min-free-disk", "0",
                                        "--cluster-config", str(cluster))) as server:
        team = Team(server, {"admin": server.token})
        with team.client("admin") as admin:
            admin.edit_user("admin", password=PASSWORD)
            for name, role in (("alice", "user"), ("vera", "viewer")):
                team.tokens[name] = admin.create_user(name, role, password=PASSWORD)["token"]
        yield team


@pytest.fixture
def running_trial(team: Team, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """alice's two-replica trial of WORK, RUNNING; stopped at the end."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "work.py").write_text(WORK)
    stop = tmp_path / "stop"
    config = {"name": "live-resources", "entrypoint": ["python", "work.py", str(stop)],
              "resources": {"replicas": 2}, "failure_policy": {"stop_grace": "2s"}}
    with team.client("alice") as alice:
        exp = alice.create_experiment(json.dumps(config), context)
        trial = wait_trial(alice, exp["trials"][0]["id"], {"RUNNING"}, timeout=90)
        yield trial
        stop.touch()
        wait_trial(alice, trial["id"], TRIAL_ENDED | {"SUSPECT"}, timeout=60)


def system_series(team: Team, trial_id: int) -> dict[str, list[tuple[float, float]]]:
    """The trial's `system` series as the API serves them: name → [(seconds, value)]."""
    answer = httpx.get(f"{team.server.url}/api/v1/trials/{trial_id}/series",
                       headers={"Authorization": f"Bearer {team.tokens['alice']}"})
    assert answer.status_code == 200
    return {s["name"]: [(step / 1000, value) for step, value in zip(s["steps"], s["values"],
                                                                      strict=True)]
            for s in answer.json()["series"] if s["kind"] == "system"}


PLOTTED = """(name) => {
  const holder = document.querySelector(`#resource-charts .hp-chart[data-resource="${name}"]`);
  return holder && holder.musterPlotted ? holder.musterPlotted.map((p) => [p.rank, p.x, p.y]) : [];
}"""


GREW = """([name, before]) => {
  const holder = document.querySelector(`#resource-charts .hp-chart[data-resource="${name}"]`);
  return Boolean(holder && holder.musterPlotted && holder.musterPlotted.length > before);
}"""


def test_live_cpu_and_memory_of_each_replica_on_the_trial_page(
        page_of: Any, team: Team, running_trial: dict[str, Any]) -> None:
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{running_trial['id']}")
    charts = page.locator("#resource-charts[data-drawn]")
    cpu = charts.locator('.hp-chart[data-resource="system/cpu_percent"]')
    rss = charts.locator('.hp-chart[data-resource="system/rss_bytes"]')
    # A curve per replica: drawn on load, or at the next refresh while the samples come in.
    expect(cpu).to_have_attribute("data-curves", "2", timeout=30_000)
    expect(rss).to_have_attribute("data-curves", "2", timeout=30_000)
    expect(cpu.locator("canvas")).to_have_count(1)
    expect(cpu.locator("h3")).to_contain_text("CPU (% of one core) · 2 ranks; peak ")
    expect(rss.locator("h3")).to_contain_text("Memory (RSS, MiB)")
    # No GPU here: no GPU chart, rather than a flat line at 0.
    expect(charts.locator('.hp-chart[data-resource^="system/gpu"]')).to_have_count(0)
    # The metrics panel stays the run's own reports: it reported none.
    expect(page.locator("#metric-charts[data-drawn]")).to_contain_text("No metrics reported yet.")

    drawn = page.evaluate(PLOTTED, "system/rss_bytes")
    api = system_series(team, running_trial["id"])  # read after the page: it may hold more
    for rank in (0, 1):
        points = [(x, y) for r, x, y in drawn if r == rank]
        served = {(x, value / MiB) for x, value in api[f"system/rss_bytes/rank-{rank}"]}
        assert points and set(points) <= served, (rank, points)
        assert max(y for _, y in points) >= 64  # the 64 MiB each replica holds

    # Live: the page reads the series again while the trial runs, and draws the new samples.
    before = len(page.evaluate(PLOTTED, "system/cpu_percent"))
    page.wait_for_function(GREW, arg=["system/cpu_percent", before], timeout=30_000)
