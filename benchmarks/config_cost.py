"""What a 1 MiB config of plain constants costs the server (issue 29, Y8): `POST
/experiments` with the config alone, on a real server, and the server's peak RSS after each.

Two configs of about 1 MiB: the audit's (66,919 constants, 133,845 YAML values: refused
with a 422 since the loader counts values, `loading.MAX_NODES`) and the largest shape under
that bound (49,990 constants, accepted). Each is posted REPETITIONS times, interleaved; the
benchmark reports the median seconds to the answer, its status, and the server's peak RSS
(VmHWM) at the end. `load_config` alone is timed in this process too. Before libyaml's
parser and the bound (HEAD's loader at 451eac5), the audit's config took 44-95 s and 609
MiB on a busy server, and 5.4-6.2 s here.

    .venv/bin/python benchmarks/config_cost.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
from measure import interleave, median
from muster_server import ServerProcess

from muster.config import load_config
from muster.errors import ConfigError

REPETITIONS = 3
HEAD = ["name: constants", 'entrypoint: [sh, -c, "true"]', "hyperparameters:"]


def audit_config() -> str:
    """The audit's shape: `kN: N` lines up to 1 MiB."""
    lines, size, n = list(HEAD), sum(len(line) + 1 for line in HEAD), 0
    while size < 1024**2 - 40:
        line = f"  k{n}: {n}"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines) + "\n"


def bounded_config() -> str:
    """The most constants the value bound lets through, with keys long enough for ~1 MiB."""
    return "\n".join([*HEAD, *(f"  k{n:05d}pppp: {n}" for n in range(49_990))]) + "\n"


def load_seconds(text: str) -> tuple[float, str]:
    start = time.perf_counter()
    try:
        load_config(text)
        outcome = "loaded"
    except ConfigError:
        outcome = "refused"
    return time.perf_counter() - start, outcome


def peak_rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM"))
    return int(line.split()[1]) // 1024


def main() -> None:
    texts = {"audit": audit_config(), "bounded": bounded_config()}
    for name, text in texts.items():
        seconds, outcome = load_seconds(text)
        print(f"load_config {name:<8} {len(text):>9,} bytes  {seconds:6.2f} s  {outcome}")
    with tempfile.TemporaryDirectory(prefix="muster-config-cost-") as root, \
            ServerProcess(Path(root)) as server, httpx.Client(timeout=600) as http:
        token = server.home.joinpath("secrets", "token").read_text().strip()
        statuses: dict[str, set[int]] = {name: set() for name in texts}

        def post(name: str) -> float:
            start = time.perf_counter()
            answer = http.post(f"{server.url}/api/v1/experiments", data={"config": texts[name]},
                               headers={"Authorization": f"Bearer {token}"})
            statuses[name].add(answer.status_code)
            return time.perf_counter() - start

        seconds = interleave({name: (lambda name=name: post(name)) for name in texts},
                             REPETITIONS)
        for name in texts:
            print(f"POST /experiments {name:<8} median {median(seconds[name]):6.2f} s  "
                  f"status {sorted(statuses[name])}")
        print(f"server peak RSS {peak_rss_mib(server.pid)} MiB after "
              f"{REPETITIONS * len(texts)} creates")


if __name__ == "__main__":
    main()
