"""A real muster server with `launcher: ray`, inside the test cluster's network namespace.

The server is a Ray driver, so it runs where the cluster is reachable: in the namespace
(`ip netns exec`). Its HTTP port is on the namespace's loopback, so the test talks to it the
way a user does, with the CLI run in the namespace too (`cli`); what the test reads
directly — the SQLite database, the run directories under `storage_path` — is on the file
system the test shares with the cluster, as a real `storage_path` is shared with the nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.ray.cluster import RayCluster
from tests.servers import RunningServer
from tests.waiting import wait_until

CLI_TIMEOUT_S = 120.0


@dataclass(kw_only=True)
class RayServer(RunningServer):
    """`muster up` on `home` (SQLite there), its replicas on `cluster`, run directories in
    `shared`; `kill`, `stop`, `store` and `url` are `RunningServer`'s."""

    cluster: RayCluster
    shared: Path
    placement_strategy: str = "PACK"
    extra: dict[str, Any] = field(default_factory=dict)  # more of the cluster config
    ray_extra: dict[str, Any] = field(default_factory=dict)  # more of its `ray:` section

    def env_for_ray(self) -> dict[str, str]:
        return {**os.environ, **self.cluster.env, "RAY_ADDRESS": self.cluster.address}

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "cluster.yaml"
        config.write_text(yaml.safe_dump({
            "launcher": "ray", "min_free_disk": 0,
            "ray": {"address": self.cluster.address, "namespace": "muster",
                    "storage_path": str(self.shared),
                    "placement_strategy": self.placement_strategy, **self.ray_extra},
            **self.extra}))
        argv = [sys.executable, "-m", "muster", "up", "--home", str(self.home),
                "--port", str(self.port), "--db", self.db_url,
                "--cluster-config", str(config)]
        log = open(self.home / "server.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(self.cluster.command(argv), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=self.env_for_ray())
        log.close()
        wait_until(self._healthy, timeout=120, what="the Ray server to answer /health")

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited: {self.log()[-4000:]}")
        done = subprocess.run(self.cluster.command([
            sys.executable, "-c",
            f"import httpx; httpx.get('{self.url}/api/v1/health', timeout=2).raise_for_status()"]),
            capture_output=True, timeout=30)
        return done.returncode == 0

    def log(self) -> str:
        return (self.home / "server.log").read_text(errors="replace")

    def cli(self, *args: str, check: bool = True, timeout: float = CLI_TIMEOUT_S
            ) -> subprocess.CompletedProcess[str]:
        """`muster ARGS` in the namespace, against this server."""
        done = subprocess.run(self.cluster.command(
            [sys.executable, "-m", "muster", *args, "--home", str(self.home)]),
            capture_output=True, text=True, timeout=timeout, env=self.env_for_ray())
        if check:
            assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def submit(self, config: dict[str, Any], context: Path) -> int:
        """`muster experiment create` of `config` with `context`; the experiment's id."""
        path = context.parent / f"{context.name}.yaml"
        path.write_text(yaml.safe_dump(config))
        created = self.json("experiment", "create", str(path), str(context))
        return int(created["id"])

    def trials(self, experiment_id: int) -> list[dict[str, Any]]:
        found: dict[str, Any] = self.json("experiment", "describe", str(experiment_id))
        return list(found["trials"])

    def wait_trial(self, experiment_id: int, until: Any, timeout: float = 240.0,
                   what: str = "the trial") -> dict[str, Any]:
        """Poll the experiment's only trial until `until(trial)` holds; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            trial = self.trials(experiment_id)[0]
            if until(trial):
                return trial
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {trial}\n"
                                     f"{self.log()[-3000:]}")
            time.sleep(1.0)

    def ray(self, script: str) -> Any:
        """Run a driver `script` in the namespace; the JSON of its last line of output."""
        done = self.cluster.run(script)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


@contextmanager
def serving_on(cluster: RayCluster, root: Path, **options: Any) -> Iterator[RayServer]:
    """A `RayServer` with its home and shared storage under `root`, started, and stopped
    afterwards."""
    home = root / "home"
    running = RayServer(cluster=cluster, home=home, shared=root / "shared",
                        db_url=f"sqlite:///{home / 'muster.db'}", **options)
    running.start()
    try:
        yield running
    finally:
        running.stop()
