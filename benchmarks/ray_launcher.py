"""(y) muster on Ray, side by side with Ray's own tools on the same two-node cluster.

- create → RUNNING: one small script (`job.py`: prints a line, sleeps 2 s), one process.
  muster: `Client.create_experiment` (the context uploaded) until the trial is RUNNING, on
  a server with `launcher: ray`; Ray Jobs: `JobSubmissionClient.submit_job` with the same
  directory as `runtime_env.working_dir`, until the job is RUNNING. Each run waits for the
  last one's end first.
- recovery after a killed rank: the 2-rank DDP digits MLP (examples/digits/ddp.py, 40
  epochs), rank 1 SIGKILLed at its optimizer step KILL_STEP of the first run
  (kill_at_step.py), from the kill to the first optimizer step after the resume. muster: the
  example unchanged on the Ray server (its failure policy restarts the trial from the
  latest checkpoint; no warm standby on Ray). Ray Train: `TorchTrainer` with
  `FailureConfig(max_failures=3)` running the same model, data, optimizer and per-epoch
  checkpoint (`ray_train_digits.py`), resumed from `ray.train.get_checkpoint()`.

The cluster is two `ray start` nodes of 2 CPUs in a loopback-only network namespace (as in
tests/ray/), the head with Ray's dashboard for the job API. Needs root and
`ray[default,train]`: `make bench-ray` runs it from a venv of its own (.venv-bench-ray).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from measure import expect, interleave, median
from report import Outcome, Table, Target

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.ray: the cluster and the server in its namespace

from tests.ray.cluster import RayCluster, running_cluster  # noqa: E402
from tests.ray.servers import RayServer, serving_on  # noqa: E402

DIGITS = ROOT / "examples" / "digits"
HERE = Path(__file__).resolve().parent
EPOCHS = 40
KILL_STEP = 690  # as (k): rank 1's optimizer steps, ~23 an epoch: epoch 30 of 40
TARGET_START = 1.0  # muster's create → RUNNING must be ahead of Ray Jobs' (ratio < 1)
TARGET_RECOVERY = 0.5
JOB = "import time\nprint('up', flush=True)\ntime.sleep(2)\n"

START_MUSTER = """
import json, sys, time
from pathlib import Path
from muster.client import Client
from muster.home import Home
url, home, context, config = sys.argv[1:5]
with Client(url=url, home=Home(Path(home))) as client:
    began = time.monotonic()
    trial = client.create_experiment(config, Path(context))["trials"][0]["id"]
    while (state := client.get_trial(trial)["state"]) not in ("RUNNING", "FAILED", "SUCCEEDED"):
        time.sleep(0.02)
    took = time.monotonic() - began
    assert state in ("RUNNING", "SUCCEEDED"), state
    while client.get_trial(trial)["state"] not in ("SUCCEEDED", "FAILED", "CANCELED", "SUSPECT"):
        time.sleep(0.2)
print(json.dumps(took))
"""

START_RAY_JOB = """
import json, sys, time
from ray.job_submission import JobStatus, JobSubmissionClient
client = JobSubmissionClient("http://127.0.0.1:8265")
began = time.monotonic()
job = client.submit_job(entrypoint="python job.py", runtime_env={"working_dir": sys.argv[1]})
while (status := client.get_job_status(job)) not in (JobStatus.RUNNING, JobStatus.SUCCEEDED,
                                                     JobStatus.FAILED):
    time.sleep(0.02)
took = time.monotonic() - began
assert status != JobStatus.FAILED, client.get_job_logs(job)
while not client.get_job_status(job).is_terminal():
    time.sleep(0.2)
print(json.dumps(took))
"""

RECOVER_MUSTER = """
import json, sys, time
from pathlib import Path
from muster.client import Client
from muster.home import Home
url, home, context, config = sys.argv[1:5]
with Client(url=url, home=Home(Path(home))) as client:
    trial = client.create_experiment(config, Path(context))["trials"][0]["id"]
    while (found := client.get_trial(trial))["state"] not in ("SUCCEEDED", "FAILED",
                                                               "CANCELED", "SUSPECT"):
        time.sleep(0.5)
print(json.dumps([found["state"], len(found["attempts"]), found["message"]]))
"""


def run(quick: bool) -> Outcome:
    missing = _missing()
    if missing:
        return Outcome("ray_launcher", [], [], [f"skipped: {missing}"], {"skipped": missing})
    repetitions = 1 if quick else 5
    with tempfile.TemporaryDirectory(prefix="muster-bench-ray-") as tmp, \
            running_cluster(dashboard=True) as cluster, \
            serving_on(cluster, Path(tmp)) as server:
        root = Path(tmp)
        job = root / "job"
        job.mkdir()
        (job / "job.py").write_text(JOB)
        starts = interleave({
            "muster": lambda: _start_muster(cluster, server, job),
            "ray job submit": lambda: _driver(cluster, START_RAY_JOB, str(job)),
        }, repetitions)
        context = _digits(root / "digits")
        count = iter(range(1000))
        recoveries = interleave({
            "muster": lambda: _recover_muster(cluster, server, context,
                                              server.shared / f"marks-{next(count)}"),
            "Ray Train": lambda: _recover_ray_train(cluster, context, server.shared,
                                                    server.shared / f"marks-{next(count)}"),
        }, repetitions)
    return _outcome(starts, recoveries, repetitions)


def _missing() -> str | None:
    try:
        import ray.job_submission
        import ray.train.torch  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        return (f"needs ray[default,train] and torch in this interpreter ({exc}); run "
                "`make bench-ray`")
    if shutil.which("ip") is None:
        return "needs `ip` (iproute2) and root for the cluster's network namespace"
    return None


def _driver(cluster: RayCluster, script: str, *args: str, timeout: float = 600.0) -> Any:
    """Run `script` in the cluster's namespace; the JSON of its last line of output."""
    done = subprocess.run(cluster.command([sys.executable, "-c", script, *args]),
                          capture_output=True, text=True, timeout=timeout,
                          env=_env(cluster))
    expect(done.returncode == 0, f"a driver failed: {done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env(cluster: RayCluster) -> dict[str, str]:
    return {**os.environ, **cluster.env, "RAY_ADDRESS": cluster.address}


def _start_muster(cluster: RayCluster, server: RayServer, job: Path) -> float:
    config = ("name: bench-ray-start\nentrypoint: python job.py\n"
              "verify: {require_checkpoint: false}\n")
    took: float = _driver(cluster, START_MUSTER, server.url, str(server.home), str(job), config)
    return took


def _digits(context: Path) -> Path:
    """The example's scripts, the probe, the Ray Train loop and the digits data."""
    context.mkdir(parents=True)
    for script in DIGITS.glob("*.py"):
        shutil.copy(script, context)
    shutil.copy(HERE / "kill_at_step.py", context)
    shutil.copy(HERE / "ray_train_digits.py", context)
    subprocess.run([sys.executable, str(DIGITS / "prepare_data.py"), "--out",
                    str(context / "data")], check=True, capture_output=True)
    return context


def _probe_env(marks: Path) -> dict[str, str]:
    marks.mkdir()
    return {"BENCH_MARKS": str(marks), "BENCH_KILL_RANK": "1",
            "BENCH_KILL_STEP": str(KILL_STEP), "OMP_NUM_THREADS": "1"}


def _recover_muster(cluster: RayCluster, server: RayServer, context: Path,
                    marks: Path) -> float:
    env = _probe_env(marks)
    config = (
        "name: bench-ray-recovery\n"
        f"entrypoint: [python, kill_at_step.py, ddp.py, --data, data, --epochs, '{EPOCHS}']\n"
        f"environment: {{variables: {env}}}\n"
        "harness: true\n"
        "resources: {replicas: 2}\n"
        "data: {path: data, manifest: {extensions: [.png], labels: from_dirs}}\n"
        "failure_policy: {stop_grace: 10s}\n"
    )
    state, attempts, message = _driver(cluster, RECOVER_MUSTER, server.url, str(server.home),
                                       str(context), config)
    expect(state == "SUCCEEDED", f"the muster run ended {state}: {message}")
    expect(attempts == 2, f"{attempts} attempts ran, expected 2")
    return _recovery(marks)


def _recover_ray_train(cluster: RayCluster, context: Path, shared: Path,
                       marks: Path) -> float | None:
    """Seconds to recover under Ray Train, or None when it did not (it gave up: a result
    of the comparison, counted, with its output's tail on stderr)."""
    env = _probe_env(marks)
    done = subprocess.run(
        cluster.command([sys.executable, str(context / "ray_train_digits.py"),
                         "--data", str(context / "data"), "--epochs", str(EPOCHS),
                         "--storage", str(shared / "ray-train")]),
        capture_output=True, text=True, timeout=600, env={**_env(cluster), **env})
    if done.returncode != 0 or not any(marks.glob("first-step-*")):
        print(f"Ray Train did not recover (exit {done.returncode}): "
              f"{done.stdout[-2000:]}{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return _recovery(marks)


def _recovery(marks: Path) -> float:
    kill = float((marks / "kill").read_text())
    firsts = [float(p.read_text()) for p in marks.glob("first-step-*-rank-*")]
    expect(bool(firsts), f"no first step after the restart in {marks}")
    return min(firsts) - kill


def _outcome(starts: dict[str, list[float]], recoveries: dict[str, list[float | None]],
             repetitions: int) -> Outcome:
    start_ratio = median(starts["muster"]) / median(starts["ray job submit"])
    recovered = {name: [t for t in v if t is not None] for name, v in recoveries.items()}
    failed = {name: len(v) - len(recovered[name]) for name, v in recoveries.items()}
    expect(bool(recovered["muster"]), f"muster never recovered: {failed}")
    recovery_ratio = (median(recovered["muster"]) / median(recovered["Ray Train"])
                      if recovered["Ray Train"] else None)

    def rows(times: dict[str, list[float]]) -> list[list[str]]:
        return [[name, *([f"{median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}"] if v
                         else ["—", "—", "—"])] for name, v in times.items()]

    tables = [
        Table(f"(y) create → RUNNING of a one-process job on a 2-node Ray cluster, "
              f"{repetitions} interleaved runs per arm", ["arm", "median s", "min s", "max s"],
              rows(starts)),
        Table(f"(y) SIGKILL of rank 1 at its step {KILL_STEP} → first step after resume, "
              f"2-rank DDP digits on Ray, {repetitions} interleaved runs per arm",
              ["arm", "median s", "min s", "max s", "did not recover"],
              [[*row, str(failed[row[0]])] for row in rows(recovered)]),
    ]
    targets = [
        Target(f"(y) create → RUNNING: muster / ray job submit < {TARGET_START} (medians)",
               f"{start_ratio:.2f}", start_ratio < TARGET_START),
        Target(f"(y) recovery: muster / Ray Train ≤ {TARGET_RECOVERY} (medians)",
               f"{recovery_ratio:.2f}" if recovery_ratio is not None
               else f"Ray Train never recovered ({failed['Ray Train']} of {repetitions})",
               recovery_ratio is None or recovery_ratio <= TARGET_RECOVERY),
    ]
    notes = ["Both arms on the same cluster, one after the other: two `ray start` nodes of "
             "2 CPUs on this machine (tests/ray/cluster.py), the muster server a driver of it.",
             "Ray Jobs' RUNNING: the job's driver process started; muster's: every replica "
             "started (its shim and training process on a node)."]
    return Outcome("ray_launcher", tables, targets, notes,
                   {"start_s": starts, "recovery_s": recoveries, "start_ratio": start_ratio,
                    "recovery_ratio": recovery_ratio})


if __name__ == "__main__":
    from report import describe_machine, render_markdown

    outcome = run("--quick" in sys.argv)
    print(render_markdown(describe_machine(), [outcome], " ".join(sys.argv)))
