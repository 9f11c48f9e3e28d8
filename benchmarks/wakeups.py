"""(w) What the wake-ups (issue 19) buy: a server that learns of changes from events
against the same server polling every 0.2 s (`MUSTER_WAKEUPS=0`), side by side.

Two arms, each a fresh server with 8 slots, interleaved:

- idle cost: 8 trials that checked in through the harness and sleep (each heartbeat
  rewritten every 10 s, the harness's default); over a 20 s window, the server's CPU
  seconds (its process, all threads, from /proc) and its passes (`/health`);
- check-in → RUNNING: a trial whose script checks in (`harness: true`): from its first
  heartbeat's `written_at` to the time of the trial's RUNNING event;
- exit → SUCCEEDED ("noticed", as in (q), here with nothing else running): a trial of
  `python -c pass`, from the `ended_at` of its shim's exit record to the trial's `ended_at`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from measure import expect, median, ms
from muster_server import ServerProcess
from report import Outcome, Table, Target

from muster.client import Client
from muster.rundir import RankFile

SLOTS = 8
IDLE_TRIALS = 8
WINDOW_S = 20.0
TIMEOUT_S = 60.0
NOTICED_TARGET_S = 0.020
TRIVIAL = "name: noticed\nentrypoint: [python, -c, pass]\n"
SLEEPER = ("import time\nimport muster.harness as mh\nwith mh.init():\n"
           "    print('checked in', flush=True)\n    time.sleep(600)\n")
ARMS = {"wake-ups": {}, "polling (MUSTER_WAKEUPS=0)": {"MUSTER_WAKEUPS": "0"}}


def config(name: str, script: str) -> str:
    return (f"name: {name}\nentrypoint: {json.dumps(['python', '-c', script])}\n"
            "harness: true\nfailure_policy: {stop_grace: 1s}\n")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_running(client: Client, trial_id: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while (state := client.get_trial(trial_id)["state"]) != "RUNNING":
        expect(state in ("QUEUED", "STARTING"), f"trial {trial_id} became {state}")
        expect(time.monotonic() < deadline, f"trial {trial_id} never became RUNNING")
        time.sleep(0.02)


def idle_cost(server: ServerProcess, client: Client, context: Path) -> dict[str, float]:
    """CPU seconds and passes of the server over WINDOW_S with IDLE_TRIALS sleeping."""
    trials = [client.create_experiment(config(f"idle-{i}", SLEEPER), context)["trials"][0]["id"]
              for i in range(IDLE_TRIALS)]
    for trial_id in trials:
        wait_running(client, trial_id)
    time.sleep(1.0)  # the starts' passes are over
    passes, cpu = client.health()["supervisor"].get("passes", 0), cpu_seconds(server.pid)
    time.sleep(WINDOW_S)
    passes_after = client.health()["supervisor"].get("passes", 0)
    return {"cpu_s": cpu_seconds(server.pid) - cpu, "passes": passes_after - passes}


def check_in_to_running(server: ServerProcess, client: Client, context: Path) -> float:
    """Seconds from the rank's check-in (its first heartbeat's `written_at`) to the RUNNING
    transition the server recorded."""
    experiment = client.create_experiment(config("timed", SLEEPER), context)
    trial = experiment["trials"][0]
    wait_running(client, trial["id"])
    heartbeat = (server.home / "runs" / str(trial["uuid"]) / "attempt-1"
                 / f"rank-0.{RankFile.HEARTBEAT.value}")
    checked_in_at = float(json.loads(heartbeat.read_text())["written_at"])
    running_at = next(e["at"] for e in client.list_events(trial_id=trial["id"])
                      if e.get("to_state") == "RUNNING" and e["entity"] == "trial")
    client.kill_experiment(experiment["id"])
    client.wait_experiment(int(experiment["id"]), poll=0.05)  # its stop is over: not timed
    return float(running_at) - checked_in_at


def exit_to_succeeded(server: ServerProcess, client: Client, context: Path) -> float:
    """Seconds from the child's end (its exit record's `ended_at`, stamped by the shim when
    the child was reaped) to the trial's `ended_at`, with nothing else running."""
    experiment = client.create_experiment(TRIVIAL, context)
    trial = client.wait_experiment(int(experiment["id"]), poll=0.05)["trials"][0]
    expect(trial["state"] == "SUCCEEDED", f"trial {trial['id']} ended {trial['state']}")
    record = (server.home / "runs" / str(trial["uuid"]) / "attempt-1"
              / f"rank-0.{RankFile.EXIT.value}")
    exited_at = float(json.loads(record.read_text())["ended_at"])
    return float(trial["ended_at"]) - exited_at


def run(quick: bool) -> Outcome:
    rounds = 2 if quick else 3
    idle: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    latency: dict[str, list[float]] = {arm: [] for arm in ARMS}
    noticed: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="muster-bench-wakeups-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        for round_ in range(rounds):
            for arm, env in ARMS.items():
                root = Path(tmp) / f"{round_}-{len(idle[arm])}-{'w' if not env else 'p'}"
                with ServerProcess(root, slots=SLOTS, env=env) as server, \
                        server.client() as client:
                    latency[arm] += [check_in_to_running(server, client, context) for _ in range(5)]
                    noticed[arm] += [exit_to_succeeded(server, client, context) for _ in range(5)]
                    idle[arm].append(idle_cost(server, client, context))
    return _outcome(idle, latency, noticed, rounds)


def _outcome(idle: dict[str, list[dict[str, float]]], latency: dict[str, list[float]],
             noticed: dict[str, list[float]], rounds: int) -> Outcome:
    rows = []
    for arm in ARMS:
        cpu = median([sample["cpu_s"] for sample in idle[arm]])
        passes = median([sample["passes"] for sample in idle[arm]])
        rows.append([arm, f"{cpu / WINDOW_S * 100:.1f}%", f"{passes / WINDOW_S:.1f}",
                     f"{ms(median(latency[arm])):.0f}", f"{ms(max(latency[arm])):.0f}",
                     f"{ms(median(noticed[arm])):.0f}", f"{ms(max(noticed[arm])):.0f}"])
    table = Table(
        f"(w) wake-ups against polling: medians of {rounds} servers per arm, interleaved",
        ["server", f"CPU, {IDLE_TRIALS} trials sleeping", "passes per second",
         "check-in → RUNNING, median (ms)", "max (ms)", "exit → SUCCEEDED, median (ms)",
         "max (ms)"],
        rows)
    notes = [f"CPU: the server process's user + system time over {WINDOW_S:.0f} s while "
             f"{IDLE_TRIALS} harness trials sleep (heartbeats every 10 s), as a share of one "
             "core. Passes from /health (the polling arm counts them too).",
             "check-in → RUNNING: from the rank's first heartbeat (`written_at`, written by "
             "muster.harness.init()) to the time of the trial's RUNNING event (5 per "
             "server; the heartbeat is rewritten only every 10 s).",
             "exit → SUCCEEDED: a trial of `python -c pass` with nothing else running, from "
             "the `ended_at` of the shim's exit record (the child reaped) to the trial's "
             "`ended_at` (5 per server)."]
    woken = median(noticed["wake-ups"])
    targets = [Target(f"(w) child exit → SUCCEEDED ≤ {ms(NOTICED_TARGET_S):.0f} ms (median, "
                      "wake-ups, one trial at a time)", f"{ms(woken):.0f} ms",
                      woken <= NOTICED_TARGET_S)]
    data = {"idle": idle, "check_in_to_running_s": latency, "exit_to_succeeded_s": noticed}
    return Outcome("wakeups", [table], targets, notes, data)
