"""`muster up` with `launcher: ray` where there is no cluster to connect to: refused in
seconds with a message that names the address and what to check, never a hang (Ray's own
`ray.init` retries an address that does not answer for minutes) or a traceback. Needs Ray
installed, not a cluster."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed (`pip install 'muster[ray]'`)")

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends


def test_a_ray_address_where_nothing_answers_is_refused_at_once(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    config = tmp_path / "cluster.yaml"
    config.write_text(f"launcher: ray\nray: {{address: '{address}', "
                      f"storage_path: {tmp_path / 'shared'}}}\n")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "muster", "up", "--home", str(tmp_path / "home"),
                           "--port", "1", "--cluster-config", str(config)],
                          capture_output=True, text=True, timeout=90)
    took = time.monotonic() - began
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"Could not reach the Ray cluster at ray.address '{address}'" in done.stderr
    assert "ray start --head" in done.stderr
    assert "Traceback" not in done.stderr
    assert took < 60, took  # a bound on a hang, not a measure
