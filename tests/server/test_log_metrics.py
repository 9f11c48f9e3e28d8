"""Metrics read from the logs of scripts that do not use the harness, through a real server
(issue 30, item 5): plain scripts print what Hugging Face's Trainer, Lightning's progress
bar and nanoGPT-like loops print; their values are the trial's metrics, marked as read from
the log, while the run goes and after it, and a NaN among them makes the trial SUSPECT."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.server.experiments import (
    TRIAL_ENDED,
    only_trial,
    submit,
    wait_trial,
    write_context,
)
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

server = shared_server()

HF_STYLE = """\
import pathlib, sys, time
go = pathlib.Path(sys.argv[1])
for i in range(4):
    print({'loss': round(1.0 / (i + 1), 4), 'grad_norm': 1.5, 'learning_rate': 5e-05,
           'epoch': (i + 1) / 4}, flush=True)
print({'eval_loss': 0.75, 'eval_runtime': 0.1, 'epoch': 1.0}, flush=True)
while not go.exists():  # the test looks at the live trial meanwhile
    time.sleep(0.05)
print({'train_runtime': 1.0, 'train_loss': 0.5, 'epoch': 1.0}, flush=True)
"""

LIGHTNING_STYLE = """\
import sys
for epoch in range(2):
    for n in range(1, 6):
        bar = "\\u2588" * 2 * n + " " * (10 - 2 * n)
        loss = 1.0 / (epoch * 5 + n)
        sys.stderr.write(f"\\rEpoch {epoch}: {n * 20:3d}%|{bar}| {n}/5 [00:00<00:00, "
                         f"50.00it/s, v_num=0, train_loss={loss:.3g}]")
        sys.stderr.flush()
    sys.stderr.write("\\n")
print("`Trainer.fit` stopped: `max_epochs=2` reached.")
"""

LOSS_NAN = """\
for i in range(3):
    print(f"iter {i}: loss {2.0 - i / 10:.4f}, time 12.34ms")
print("iter 3: loss nan, time 12.34ms")
print("done")
"""


def _start(client: Client, tmp_path: Path, script: str, *args: str,
           verify: dict[str, Any] | None = None,
           searcher: dict[str, Any] | None = None) -> int:
    context = write_context(tmp_path, ["python", "train.py", *args], files={"train.py": script})
    config = json.loads((context / "experiment.yaml").read_text())
    config.update({"verify": verify} if verify else {})
    config.update({"searcher": searcher} if searcher else {})
    (context / "experiment.yaml").write_text(json.dumps(config))
    trial: int = only_trial(submit(client, context))["id"]
    return trial


def _ended(client: Client, trial_id: int) -> dict[str, Any]:
    return wait_trial(client, trial_id, TRIAL_ENDED | {"SUSPECT"})


def _values(client: Client, trial_id: int) -> list[tuple[str, int, dict[str, Any], str]]:
    return [(m["kind"], m["step"], m["metrics"], m["source"])
            for m in client.get_metrics(trial_id)]


def test_hugging_face_dicts_are_metrics_while_it_runs_and_after(
        client: Client, tmp_path: Path) -> None:
    go = tmp_path / "go"
    trial_id = _start(client, tmp_path, HF_STYLE, str(go),
                      searcher={"name": "single", "metric": "eval_loss"})

    def seen_live() -> bool:
        return any("eval_loss" in values for _, _, values, _ in _values(client, trial_id))

    wait_until(seen_live, timeout=30, what="eval_loss read from the running trial's log")
    assert client.get_trial(trial_id)["state"] == "RUNNING"
    go.touch()
    trial = _ended(client, trial_id)
    assert trial["state"] == "SUCCEEDED", trial["message"]
    values = _values(client, trial_id)
    assert {source for *_, source in values} == {"log"}
    assert [(kind, step, v.get("loss")) for kind, step, v, _ in values[:4]] == [
        ("training", 0, 1.0), ("training", 1, 0.5), ("training", 2, 0.3333),
        ("training", 3, 0.25)]
    assert values[4][:3] == ("validation", 4, {"eval_loss": 0.75, "eval_runtime": 0.1,
                                               "epoch": 1.0})
    assert values[5][2]["train_loss"] == 0.5
    assert trial["best_validation"] == {"eval_loss": 0.75}  # the searcher's metric


def test_lightning_progress_bars_are_metrics_marked_as_read_from_the_log(
        client: Client, tmp_path: Path) -> None:
    trial_id = _start(client, tmp_path, LIGHTNING_STYLE)
    trial = _ended(client, trial_id)
    assert trial["state"] == "SUCCEEDED", trial["message"]
    values = _values(client, trial_id)
    assert [(kind, step, source) for kind, step, _, source in values] == [
        ("training", step, "log") for step in range(1, 11)]
    losses = [v["train_loss"] for _, _, v, _ in values]
    assert losses == [float(f"{1.0 / step:.3g}") for step in range(1, 11)]


def test_loss_nan_in_a_plain_scripts_log_is_stored_as_nan(
        client: Client, server: RunningServer, tmp_path: Path) -> None:
    trial_id = _start(client, tmp_path, LOSS_NAN)
    _ended(client, trial_id)
    values = _values(client, trial_id)
    assert [(step, v["loss"], source) for _, step, v, source in values] == [
        (0, 2.0, "log"), (1, 1.9, "log"), (2, 1.8, "log"), (3, "NaN", "log")]
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "NO_COLOR": "1", "COLUMNS": "200"}
    shown = subprocess.run([sys.executable, "-m", "muster", "trial", "metrics", str(trial_id)],
                           env=env, capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.count("training (log)") == 4 and "NaN" in shown.stdout


def test_log_metrics_off_reads_nothing_but_the_named_regexes(
        client: Client, tmp_path: Path) -> None:
    trial_id = _start(client, tmp_path, LOSS_NAN, verify={
        "log_metrics": "off", "metrics_from_log": {"ms": r"time (?P<value>[0-9.]+)ms"}})
    trial = _ended(client, trial_id)
    assert trial["state"] == "SUCCEEDED", trial["message"]
    values = _values(client, trial_id)
    assert [(step, v) for _, step, v, _ in values] == [(i, {"ms": 12.34}) for i in range(4)]
    assert all(math.isfinite(v["ms"]) for _, _, v, _ in values)


def test_loss_nan_in_a_plain_scripts_log_makes_the_trial_suspect(
        client: Client, tmp_path: Path) -> None:
    trial_id = _start(client, tmp_path, LOSS_NAN)
    trial = _ended(client, trial_id)
    assert trial["state"] == "SUSPECT", trial["message"]
    assert "loss was nan at line 4 of rank 0" in json.dumps(trial)


NANOGPT_LOOP = """\
import sys, traceback
max_iters = 20
try:
    for iter_num in range(max_iters + 1):
        if iter_num == int(sys.argv[1]):
            raise RuntimeError("Expected all tensors to be on the same device")
        if iter_num % 5 == 0:
            print(f"step {iter_num}: train loss {3.0 - iter_num / 10:.4f}, "
                  f"val loss {3.1 - iter_num / 10:.4f}", flush=True)
        print(f"iter {iter_num}: loss {3.0 - iter_num / 10:.4f}, time 12.34ms, mfu -100.00%",
              flush=True)
except RuntimeError:
    traceback.print_exc()
    print("training failed, exiting cleanly", flush=True)
"""


@pytest.mark.parametrize(("crash_at", "state", "completed"), [
    (99, "SUCCEEDED", "reached batch 21 of 20 (verify.expected_length)"),
    (13, "SUSPECT", "stopped at batch 13 of 20 (65%; verify.expected_length)"),
])
def test_a_plain_loop_is_judged_by_the_steps_its_log_reports(
        client: Client, tmp_path: Path, crash_at: int, state: str, completed: str) -> None:
    # nanoGPT's loop prints `iter N: loss …` per step (from 0) and `step N: train loss …,
    # val loss …` per evaluation; its planned length is max_iters, in training batches.
    trial_id = _start(client, tmp_path, NANOGPT_LOOP, str(crash_at), verify={
        "expected_length": {"batches": 20}, "require_metrics": ["loss", "val_loss"]})
    trial = _ended(client, trial_id)
    assert trial["state"] == state, trial["message"]
    checks = {c["name"]: c for c in trial["verification"]["checks"]}
    assert checks["completed"]["detail"] == completed
    assert trial["verification"]["verified"] is (state == "SUCCEEDED")
    if state == "SUSPECT":
        assert checks["log_errors"]["status"] == "failed"
        assert "Expected all tensors to be on the same device" in checks["log_errors"]["detail"]
