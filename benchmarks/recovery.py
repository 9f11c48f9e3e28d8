"""(k) Recovery time of a 2-rank DDP trial after one rank is SIGKILLed: muster vs torchrun.

Both run the same script, examples/digits/ddp.py (2 ranks, gloo on CPU, a checkpoint every
epoch through muster.harness.torch), wrapped by kill_at_step.py: rank 1 SIGKILLs itself
after its optimizer step KILL_STEP of the first run (epoch 30 of 40, some seconds into the
run), and each rank of the next run stamps its first optimizer step. Recovery is from the
kill to the first step after resume (the earliest rank's), read from those stamps.

- muster: a real server (2 slots) runs the config with `resources: {replicas: 2}` and
  `failure_policy.warm_standby` (as examples/digits/ddp.yaml does): the next attempt's
  replicas start ahead and wait in `muster.harness.init()`, imports and data loaded. The
  trial must end SUCCEEDED with 2 attempts run (plus the standby it did not need).
- torchrun: `torchrun --standalone --nproc-per-node 2 --max-restarts 3` of the same command
  in a fresh directory (the harness runs off-platform, writing ./muster-run/); it must exit
  0.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import expect, interleave, median
from muster_server import ServerProcess
from report import Outcome, Table, Target

from muster.client import Client

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"
PROBE = Path(__file__).resolve().parent / "kill_at_step.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
EPOCHS = 40
KILL_STEP = 690  # rank 1's optimizer steps, ~23 an epoch: epoch 30 of 40, ~8 s into the run
TARGET_RATIO = 0.5
TIMEOUT_S = 300.0
HANG_S = 120.0  # a torchrun run that has not ended by then is counted as hung
OUT = Path(__file__).resolve().parent / "out"


def run(quick: bool) -> Outcome:
    repetitions = 1 if quick else 5
    with tempfile.TemporaryDirectory(prefix="muster-bench-recovery-") as tmp:
        root = Path(tmp)
        context = _context(root / "context")
        count = iter(range(1000))
        with ServerProcess(root / "server", slots=2) as server, server.client() as client:
            times = interleave({
                "muster": lambda: _muster(client, context, root / f"marks-{next(count)}"),
                "torchrun": lambda: _torchrun(context, root / f"marks-{next(count)}"),
            }, repetitions)
    return _outcome(times, repetitions)


def _context(context: Path) -> Path:
    """The example's scripts, the probe and the digits data, as one upload."""
    context.mkdir(parents=True)
    for script in DIGITS.glob("*.py"):
        shutil.copy(script, context)
    shutil.copy(PROBE, context)
    subprocess.run([sys.executable, str(DIGITS / "prepare_data.py"), "--out",
                    str(context / "data")], check=True, capture_output=True)
    return context


def _command(data: str) -> list[str]:
    return [PROBE.name, "ddp.py", "--data", data, "--epochs", str(EPOCHS)]


def _probe_env(marks: Path) -> dict[str, str]:
    marks.mkdir()
    return {"BENCH_MARKS": str(marks), "BENCH_KILL_RANK": "1",
            "BENCH_KILL_STEP": str(KILL_STEP), "OMP_NUM_THREADS": "1"}


def _muster(client: Client, context: Path, marks: Path) -> float:
    env = _probe_env(marks)
    config = (
        "name: bench-recovery\n"
        f"entrypoint: {['python', *_command('data')]}\n"
        f"environment: {{variables: {env}}}\n"
        "harness: true\n"
        "resources: {replicas: 2}\n"
        "data: {path: data, manifest: {extensions: [.png], labels: from_dirs}}\n"
        "failure_policy: {stop_grace: 10s, warm_standby: true}\n"
    )
    trial_id = client.create_experiment(config, context)["trials"][0]["id"]
    deadline = time.monotonic() + TIMEOUT_S
    settled = ("SUCCEEDED", "SUSPECT", "FAILED", "CANCELED")
    while (trial := client.get_trial(trial_id))["state"] not in settled:
        expect(time.monotonic() < deadline, f"trial {trial_id} did not end")
        time.sleep(0.2)
    expect(trial["state"] == "SUCCEEDED",
           f"the muster run ended {trial['state']}: {trial.get('message')}")
    ran = [a for a in trial["attempts"] if not a["standby"]]
    expect(len(ran) == 2, f"{len(ran)} attempts ran, expected 2")
    return _recovery(marks)


def _torchrun(context: Path, marks: Path) -> float | None:
    """Seconds to recover under torchrun, or None when it did not: it hung (killed after
    HANG_S) or gave up (exited non-zero after its restarts; its output's tail is kept)."""
    workdir = marks.parent / f"{marks.name}-cwd"
    workdir.mkdir()
    env = {**os.environ, **_probe_env(marks)}
    for name in [n for n in env if n.startswith("MUSTER_")]:
        del env[name]
    # --standalone: a free rendezvous port per run (a fixed 29500 could meet a straggler).
    argv = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
            str(context / PROBE.name), str(context / "ddp.py"),
            *_command(str(context / "data"))[2:]]
    log = workdir / "torchrun.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _kill_leftovers(context)
            return None
    if code != 0:
        failed = OUT / f"recovery-torchrun-{marks.name}-{int(time.time())}.log"
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_bytes(log.read_bytes()[-200_000:])
        print(f"torchrun exited {code}; its output: {failed}", file=sys.stderr)
        return None
    return _recovery(marks)


def _kill_leftovers(context: Path) -> None:
    """Workers torchrun started in their own sessions, still holding CPU after it died."""
    subprocess.run(["pkill", "-KILL", "-f", str(context / PROBE.name)], check=False)


def _recovery(marks: Path) -> float:
    kill = float((marks / "kill").read_text())
    # The first step of any later run: torchrun sometimes needs a second restart (a gloo
    # connection refused at the rendezvous), and that is part of its recovery.
    firsts = [float(p.read_text()) for p in marks.glob("first-step-*-rank-*")]
    expect(bool(firsts), f"no first step after the restart in {marks}")
    return min(firsts) - kill


def _outcome(times: dict[str, list[float | None]], repetitions: int) -> Outcome:
    """The tables and the target. A baseline that never recovered is a result (the
    comparison's most telling one), not a failure of the benchmark; muster never
    recovering is one."""
    done = {name: [t for t in values if t is not None] for name, values in times.items()}
    hung = {name: len(values) - len(done[name]) for name, values in times.items()}
    expect(bool(done["muster"]), f"muster never recovered: {hung}")
    muster = median(done["muster"])
    ratio = muster / median(done["torchrun"]) if done["torchrun"] else None
    table = Table(
        f"(k) SIGKILL of rank 1 at its step {KILL_STEP} → first step after resume, 2-rank "
        f"DDP digits, {repetitions} interleaved runs per arm",
        ["arm", "median s", "min s", "max s", f"did not recover (hung > {HANG_S:.0f} s, "
         "or gave up)"],
        [[name, *([f"{median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}"] if v
                  else ["—", "—", "—"]), str(hung[name])]
         for name, v in done.items()],
    )
    if ratio is not None:
        target = Target(f"(k) recovery: muster / torchrun ≤ {TARGET_RATIO} (medians)",
                        f"{ratio:.2f}", ratio <= TARGET_RATIO)
    else:
        target = Target(f"(k) recovery: muster / torchrun ≤ {TARGET_RATIO} (medians)",
                        f"torchrun never recovered ({hung['torchrun']} of {repetitions} "
                        f"runs); muster {muster:.2f} s", True)
    notes = ["torchrun restarts every rank: a new Python, `import torch`, the data loaded "
             "again, the gloo rendezvous and the checkpoint restored. muster promotes its "
             "warm standby, which did the imports and the data ahead: the rendezvous and the "
             "restore remain. Medians over the runs that recovered; a run that hung or gave "
             "up is counted in its column, not in the median.",
             "torchrun's recovery includes a second restart when its first one fails (a "
             "gloo connection refused at the new rendezvous), and its 30 s SIGTERM grace "
             "when the survivor, blocked in a collective, does not exit."]
    return Outcome("recovery", [table], [target], notes,
                   {"runs_s": times, "ratio": ratio, "hung": hung})
