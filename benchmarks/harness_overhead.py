"""(h) What `muster.harness` costs a training loop that reports on every step, next to what
MLflow's `log_metric` and TensorBoard's `add_scalar` cost the same loop.

Two training steps, each a PyTorch MLP on one CPU thread (cross-entropy, SGD: zero_grad,
forward, backward, step), named by what they take on an idle core of a recent server:

- "100 µs": 64 → 32 → 10, batch 32: about as short as a real training step gets, so the
  hardest case for a per-step cost;
- "1 ms": 256 → 512 → 10, batch 128: ~10x the arithmetic.

Loop arms, all in the same repetitions, interleaved (the order rotates each repetition):

- bare: the loop alone, twice ("bare, again" shows how far two runs of the same code
  differ here: the noise floor);
- muster: inside `with init()`, `ctx.report_training(step, {"loss": loss})` on every step
  (the 0-d loss tensor itself, which the harness turns into a number); at the 100 µs step
  also with `ctx.samples.seen(32, epoch=0)`;
- TensorBoard: `SummaryWriter(dir)`, `writer.add_scalar("loss", loss, step)` on every step
  (the loss tensor, as PyTorch's tutorial passes it), `close()`;
- MLflow: `with mlflow.start_run()`, `mlflow.log_metric("loss", loss.item(), step=step)`
  on every step, on a local file store (MLflow's cheapest local store; see SQLite below).

Each logger's run is a whole session (muster: check-in, the background thread's flushes,
the final flush; TensorBoard: its writer thread and `close()`; MLflow: the run's start and
end), and the same session with no steps is an arm of its own: its median is taken off
the arm's runs, so "µs per step" is the cost of a step in a long run, not the start-up
spread over a few thousand steps. MLflow and TensorBoard run fewer steps per run than the
bare loop, so that their runs last about as long. Every run checks what it wrote: muster's
metrics file has one line per step, in order (and its samples); TensorBoard's event file,
read back with its `EventAccumulator`, one scalar per step; MLflow's run, read back with
`MlflowClient.get_metric_history`, one value per step.

Per call: each call on its own in a loop that does nothing else, with a Python float and a
0-d tensor, as a session of many calls less the session with none: the cost of the call
and of everything it leaves for later (muster's and TensorBoard's background writes).
MLflow also on a SQLite store, the backend MLflow recommends now.

Every run is timed on two clocks: wall-clock, and the process's CPU time (all its threads,
so the loggers' background threads too), which other work on a shared machine inflates far
less. Every file goes to /dev/shm (when there is one), so the numbers are CPU costs, not the
disk's latency. MLflow and TensorBoard are not muster's dependencies: without them their
arms are skipped with the reason; `make bench-harness` runs this from a venv with both.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from measure import expect, interleave, median
from report import Outcome, Table, Target

import muster.harness as mh
from muster.metrics_lines import parse
from muster.rundir import RunDir

TARGET_OVERHEAD = 0.01  # at the 1 ms step
TARGET_CHEAPER = 5.0  # muster's call against each baseline's, per call
SHM = Path("/dev/shm")
FLOAT = 0.5
WALL, CPU = 0, 1  # the two clocks of a run's Seconds
MLFLOW_ENVIRONMENT = {
    # MLflow 3.7+ refuses a file store unless told; it is still its cheapest local store.
    "MLFLOW_ALLOW_FILE_STORE": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",  # a benchmark sends nothing anywhere
}


@dataclass(frozen=True)
class Model:
    """One training step: an MLP `inputs` → `hidden` → 10 on a batch of `batch`."""

    name: str  # what the step takes on an idle core of a recent server CPU
    inputs: int
    hidden: int
    batch: int

    def describe(self) -> str:
        return f"{self.inputs} → {self.hidden} → 10 MLP, batch {self.batch}"


SHORT = Model("100 µs", 64, 32, 32)
LONG = Model("1 ms", 256, 512, 128)


@dataclass(frozen=True)
class LoopPlan:
    """How many steps each arm runs per repetition, on one model."""

    model: Model
    steps: int  # bare and muster
    tensorboard_steps: int
    mlflow_steps: int
    with_samples: bool  # also the muster arm that calls samples.seen


@dataclass(frozen=True)
class Plan:
    loops: tuple[LoopPlan, ...]
    runs: int
    muster_calls: int
    tensorboard_calls: int
    mlflow_calls: int
    sqlite_calls: int
    call_runs: int


FULL = Plan((LoopPlan(SHORT, 5_000, 1_500, 300, True), LoopPlan(LONG, 2_000, 1_000, 200, False)),
            runs=10, muster_calls=200_000, tensorboard_calls=10_000, mlflow_calls=500,
            sqlite_calls=100, call_runs=5)
QUICK = Plan((LoopPlan(SHORT, 2_000, 500, 100, True), LoopPlan(LONG, 400, 200, 60, False)),
             runs=3, muster_calls=50_000, tensorboard_calls=2_000, mlflow_calls=100,
             sqlite_calls=20, call_runs=3)


def run(quick: bool) -> Outcome:
    # torch is imported here, not at the top: run.py imports every benchmark module, and
    # the others should not pay torch's import.
    import torch

    plan = QUICK if quick else FULL
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _scratch() as scratch, _environment(MLFLOW_ENVIRONMENT):
            loggers = _Loggers.available(scratch)
            loops = [_loop_times(torch, loop_plan, loggers, plan.runs)
                     for loop_plan in plan.loops]
            per_call = _per_call_costs(torch, loggers, plan)
    finally:
        torch.set_num_threads(threads)
    return _outcome(plan, loops, per_call, loggers.skipped)


Seconds = tuple[float, float]  # one run: wall-clock time, and the process's CPU time


def _clock() -> Seconds:
    return time.perf_counter(), time.process_time()


def _since(start: Seconds) -> Seconds:
    """Wall-clock and CPU seconds since `start`: the CPU time (every thread of this process)
    is what a run costs whatever else the shared machine runs meanwhile."""
    return time.perf_counter() - start[WALL], time.process_time() - start[CPU]


class TrainingLoop:
    def __init__(self, torch: Any, model: Model) -> None:
        torch.manual_seed(0)
        nn = torch.nn
        self.batch = model.batch
        self.model = nn.Sequential(nn.Linear(model.inputs, model.hidden), nn.ReLU(),
                                   nn.Linear(model.hidden, 10))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loss_fn = nn.CrossEntropyLoss()
        self.inputs = torch.randn(model.batch, model.inputs)
        self.targets = torch.randint(0, 10, (model.batch,))

    def step(self) -> Any:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def bare(self, steps: int) -> Seconds:
        start = _clock()
        for _ in range(steps):
            self.step()
        return _since(start)


class Logger(Protocol):
    """One way to record a training loss. Each call times a whole session and checks it."""

    kind: str  # "muster", "tensorboard", "mlflow": which step count of a LoopPlan it runs
    label: str  # the arm, in the tables
    session_label: str  # the same session with no steps or calls

    def train(self, loop: TrainingLoop, steps: int) -> Seconds:
        """Time of a session of `steps` training steps, each reporting its loss."""

    def calls(self, value: object, calls: int) -> Seconds:
        """Time of a session of `calls` reports of `value` and nothing else."""


class MusterHarness:
    kind = "muster"
    session_label = "muster: `with init()`"

    def __init__(self, scratch: _Scratch, samples: bool) -> None:
        self._scratch = scratch
        self._samples = samples
        self.label = ("muster: `report_training` + `samples.seen`" if samples
                      else "muster: `report_training`")

    def train(self, loop: TrainingLoop, steps: int) -> Seconds:
        run_dir = self._scratch.new_run_dir()
        start = _clock()
        with mh.init() as ctx:
            if self._samples:
                for step in range(steps):
                    loss = loop.step()
                    ctx.samples.seen(loop.batch, epoch=0)
                    ctx.report_training(step, {"loss": loss})
            else:
                for step in range(steps):
                    loss = loop.step()
                    ctx.report_training(step, {"loss": loss})
        elapsed = _since(start)
        _check_muster_run(run_dir, steps, loop.batch if self._samples else None)
        return elapsed

    def calls(self, value: object, calls: int) -> Seconds:
        run_dir = self._scratch.new_run_dir()
        start = _clock()
        with mh.init() as ctx:
            for step in range(calls):
                ctx.report_training(step, {"loss": value})
        elapsed = _since(start)
        _check_muster_run(run_dir, calls, None, value=float(value))  # type: ignore[arg-type]
        return elapsed

    def seen_calls(self, calls: int) -> Seconds:
        """Time of a session of `calls` calls of `samples.seen(32, epoch=0)`."""
        run_dir = self._scratch.new_run_dir()
        start = _clock()
        with mh.init() as ctx:
            for _ in range(calls):
                ctx.samples.seen(SHORT.batch, epoch=0)
        elapsed = _since(start)
        _check_muster_run(run_dir, 0, SHORT.batch, samples_seen=calls)
        return elapsed


def _check_muster_run(run_dir: Path, steps: int, batch: int | None, *,
                      value: float | None = None, samples_seen: int | None = None) -> None:
    """One metrics line per step, in order (each `value`, when given), and the samples."""
    files = RunDir(run_dir).attempt(1).rank(0)
    lines = [parse(line, 0) for line in files.metrics.read_bytes().splitlines(keepends=True)]
    expect([line.step if line else None for line in lines] == list(range(steps)),
           f"the metrics lines in {run_dir} are not steps 0..{steps - 1} in order")
    if value is not None:
        expect(all(line and line.metrics == {"loss": value} for line in lines),
               f"a metrics line in {run_dir} is not {{'loss': {value}}}")
    seen = steps if samples_seen is None else samples_seen
    if batch is not None and seen:
        epochs = json.loads(files.samples.read_bytes())["epochs"]
        expect(epochs == {"0": seen * batch}, f"samples.json says {epochs}")
    shutil.rmtree(run_dir)


class TensorBoardWriter:
    kind = "tensorboard"
    label = "TensorBoard: `add_scalar`"
    session_label = "TensorBoard: `SummaryWriter()` … `close()`"

    def __init__(self, scratch: _Scratch) -> None:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from torch.utils.tensorboard import SummaryWriter

        self._scratch = scratch
        self._writer = SummaryWriter
        self._accumulator = EventAccumulator

    def train(self, loop: TrainingLoop, steps: int) -> Seconds:
        log_dir = self._scratch.new_dir("tensorboard")
        start = _clock()
        writer = self._writer(str(log_dir))
        for step in range(steps):
            loss = loop.step()
            writer.add_scalar("loss", loss, step)
        writer.close()
        elapsed = _since(start)
        self._check(log_dir, steps, None)
        return elapsed

    def calls(self, value: object, calls: int) -> Seconds:
        log_dir = self._scratch.new_dir("tensorboard")
        start = _clock()
        writer = self._writer(str(log_dir))
        for step in range(calls):
            writer.add_scalar("loss", value, step)
        writer.close()
        elapsed = _since(start)
        self._check(log_dir, calls, float(value))  # type: ignore[arg-type]
        return elapsed

    def _check(self, log_dir: Path, steps: int, value: float | None) -> None:
        """The event file, read back as TensorBoard reads it, holds one scalar per step."""
        events = self._accumulator(str(log_dir), size_guidance={"scalars": 0}).Reload()
        scalars = events.Scalars("loss") if "loss" in events.Tags()["scalars"] else []
        expect([event.step for event in scalars] == list(range(steps)),
               f"{log_dir} holds {len(scalars)} scalars, not steps 0..{steps - 1} in order")
        if value is not None:
            expect(all(event.value == value for event in scalars),
                   f"a scalar in {log_dir} is not {value}")
        shutil.rmtree(log_dir)


class MLflowRun:
    kind = "mlflow"

    def __init__(self, store: str, tracking_uri: str) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        _quiet_mlflow()
        self.label = f"MLflow: `log_metric`, {store}"
        self.session_label = f"MLflow: `start_run()` … `end_run()`, {store}"
        self._mlflow = mlflow
        self._client = MlflowClient(tracking_uri)
        self._uri = tracking_uri

    def train(self, loop: TrainingLoop, steps: int) -> Seconds:
        mlflow = self._mlflow
        mlflow.set_tracking_uri(self._uri)
        start = _clock()
        with mlflow.start_run() as run:
            for step in range(steps):
                loss = loop.step()
                mlflow.log_metric("loss", loss.item(), step=step)
        elapsed = _since(start)
        self._check(run.info.run_id, steps, None)
        return elapsed

    def calls(self, value: object, calls: int) -> Seconds:
        mlflow = self._mlflow
        mlflow.set_tracking_uri(self._uri)
        start = _clock()
        with mlflow.start_run() as run:
            for step in range(calls):
                mlflow.log_metric("loss", value, step=step)
        elapsed = _since(start)
        self._check(run.info.run_id, calls, float(value))  # type: ignore[arg-type]
        return elapsed

    def _check(self, run_id: str, steps: int, value: float | None) -> None:
        """The run, read back through MLflow's client, has one value per step."""
        history = sorted(self._client.get_metric_history(run_id, "loss"),
                         key=lambda metric: metric.step)
        expect([metric.step for metric in history] == list(range(steps)),
               f"MLflow run {run_id} ({self._uri}) has {len(history)} loss values, "
               f"not steps 0..{steps - 1}")
        if value is not None:
            expect(all(metric.value == value for metric in history),
                   f"a loss value of MLflow run {run_id} is not {value}")


@dataclass
class _Loggers:
    """The arms that can run in this interpreter, and why the others cannot."""

    muster: MusterHarness
    muster_samples: MusterHarness
    tensorboard: TensorBoardWriter | None
    mlflow_file: MLflowRun | None
    mlflow_sqlite: MLflowRun | None
    skipped: list[str]

    @classmethod
    def available(cls, scratch: _Scratch) -> _Loggers:
        skipped = []
        tensorboard = mlflow_file = mlflow_sqlite = None
        try:
            tensorboard = TensorBoardWriter(scratch)
        except ImportError as exc:
            skipped.append(f"TensorBoard: needs the tensorboard package ({exc}); "
                           "`make bench-harness` has it")
        try:
            # A file store makes its default experiment only when it makes its folder.
            mlflow_file = MLflowRun("file store", scratch.new_path("mlruns").as_uri())
            mlflow_sqlite = MLflowRun("SQLite store",
                                      f"sqlite:///{scratch.new_path('mlflow')}.db")
        except ImportError as exc:
            skipped.append(f"MLflow: needs mlflow or mlflow-skinny ({exc}); "
                           "`make bench-harness` has it")
        return cls(MusterHarness(scratch, samples=False), MusterHarness(scratch, samples=True),
                   tensorboard, mlflow_file, mlflow_sqlite, skipped)

    def in_loops(self, with_samples: bool) -> list[Logger]:
        loggers: list[Logger | None] = [self.muster, self.muster_samples if with_samples
                                        else None, self.tensorboard, self.mlflow_file]
        return [logger for logger in loggers if logger is not None]


def _quiet_mlflow() -> None:
    """MLflow logs its SQLite store's creation at INFO on stderr, among the progress lines."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


@dataclass
class Measured:
    """Arms run side by side; each arm's runs, less the median of its session alone."""

    counts: dict[str, int]  # steps or calls per run, per arm (none for a session alone)
    times: dict[str, list[Seconds]]  # every run of every arm, sessions alone included
    sessions: dict[str, str]  # arm → the arm of its session with no steps or calls

    def per_unit(self, arm: str, clock: int = WALL) -> list[float]:
        """Seconds per step (or call) of each run of `arm` on `clock`."""
        session = (median(self.of(self.sessions[arm], clock)) if arm in self.sessions
                   else 0.0)
        return [(t - session) / self.counts[arm] for t in self.of(arm, clock)]

    def of(self, arm: str, clock: int = WALL) -> list[float]:
        """Seconds of each run of `arm` on `clock`."""
        return [run[clock] for run in self.times[arm]]


@dataclass
class LoopResult:
    plan: LoopPlan
    measured: Measured


def _loop_times(torch: Any, plan: LoopPlan, loggers: _Loggers, runs: int) -> LoopResult:
    print(f"  (h) the {plan.model.name} step...", file=sys.stderr, flush=True)
    loop = TrainingLoop(torch, plan.model)
    loop.bare(max(plan.steps // 10, 100))  # warm-up: allocator, autograd, caches
    step_counts = {"muster": plan.steps, "tensorboard": plan.tensorboard_steps,
                   "mlflow": plan.mlflow_steps}
    arms: dict[str, Callable[[], Seconds]] = {"bare": partial(loop.bare, plan.steps),
                                              "bare, again": partial(loop.bare, plan.steps)}
    steps = {"bare": plan.steps, "bare, again": plan.steps}
    sessions: dict[str, str] = {}
    for logger in loggers.in_loops(plan.with_samples):
        logger.train(loop, 50)  # warm-up: imports, caches
        steps[logger.label] = step_counts[logger.kind]
        arms[logger.label] = partial(logger.train, loop, steps[logger.label])
        arms.setdefault(logger.session_label, partial(logger.train, loop, 0))
        sessions[logger.label] = logger.session_label
    return LoopResult(plan, Measured(steps, interleave(arms, runs), sessions))


@dataclass
class PerCall:
    measured: Measured
    value_kind: dict[str, str]  # arm → "float" or "tensor"; absent for samples.seen


def _per_call_costs(torch: Any, loggers: _Loggers, plan: Plan) -> PerCall:
    print("  (h) per call...", file=sys.stderr, flush=True)
    values = {"float": FLOAT, "tensor": torch.tensor(FLOAT)}
    candidates: list[tuple[Logger | None, str, int]] = [
        (loggers.muster, "`report_training(step, {'loss': %s})`", plan.muster_calls),
        (loggers.tensorboard, "`add_scalar('loss', %s, step)`", plan.tensorboard_calls),
        (loggers.mlflow_file, "`log_metric('loss', %s, step=step)`, file store",
         plan.mlflow_calls),
    ]
    arms: dict[str, Callable[[], Seconds]] = {}
    calls: dict[str, int] = {}
    value_kind: dict[str, str] = {}
    sessions: dict[str, str] = {}
    for logger, call, count in candidates:
        if logger is None:
            continue
        name = logger.label.partition(":")[0]
        for kind, value in values.items():
            arm = f"{name}: {call % kind}"
            logger.calls(value, 10)  # warm-up: the conversions' first use
            arms[arm] = partial(logger.calls, value, count)
            calls[arm], value_kind[arm], sessions[arm] = count, kind, logger.session_label
        arms[logger.session_label] = partial(logger.calls, FLOAT, 0)
    if loggers.mlflow_sqlite is not None:
        sqlite = loggers.mlflow_sqlite
        sqlite.calls(FLOAT, 1)  # warm-up: the first use creates the store's schema
        arm = "MLflow: `log_metric('loss', float, step=step)`, SQLite store"
        arms[arm] = partial(sqlite.calls, FLOAT, plan.sqlite_calls)
        calls[arm], value_kind[arm], sessions[arm] = plan.sqlite_calls, "float", \
            sqlite.session_label
        arms[sqlite.session_label] = partial(sqlite.calls, FLOAT, 0)
    seen = "muster: `samples.seen(32, epoch=0)`"
    arms[seen] = partial(loggers.muster.seen_calls, plan.muster_calls)
    calls[seen], sessions[seen] = plan.muster_calls, loggers.muster.session_label
    return PerCall(Measured(calls, interleave(arms, plan.call_runs), sessions), value_kind)


class _Scratch:
    """Fresh directories under one temporary folder, on /dev/shm when there is one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._count = iter(range(1_000_000_000))

    def new_path(self, prefix: str) -> Path:
        """A name in the folder that nothing has yet."""
        return self.root / f"{prefix}-{next(self._count)}"

    def new_dir(self, prefix: str) -> Path:
        path = self.new_path(prefix)
        path.mkdir()
        return path

    def new_run_dir(self) -> Path:
        """A new muster run directory, which the next `init()` writes into."""
        run_dir = self.root / f"run-{next(self._count)}"
        os.environ["MUSTER_RUN_DIR"] = str(run_dir)
        return run_dir


@contextmanager
def _scratch() -> Iterator[_Scratch]:
    """A temporary folder, and the platform's environment pointing the harness into it."""
    parent = SHM if SHM.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="muster-bench-harness-", dir=parent) as tmp:
        hparams = Path(tmp) / "hparams.json"
        hparams.write_text("{}")
        with _environment({"MUSTER_TRIAL_ID": "1", "MUSTER_ATTEMPT": "1",
                           "MUSTER_HPARAMS": str(hparams)},
                          unset=("MUSTER_RUN_DIR", "MUSTER_LATEST_CHECKPOINT",
                                 "MUSTER_HEARTBEAT_TIMEOUT", "RANK", "WORLD_SIZE")):
            yield _Scratch(Path(tmp))


@contextmanager
def _environment(values: dict[str, str], unset: tuple[str, ...] = ()) -> Iterator[None]:
    """Set `values` (and clear `unset`) in os.environ for the block; restore them after."""
    saved = {name: os.environ.get(name) for name in (*values, *unset)}
    for name in unset:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _outcome(plan: Plan, loops: list[LoopResult], per_call: PerCall,
             skipped: list[str]) -> Outcome:
    tables = [_loop_table(loop, plan.runs) for loop in loops]
    tables += [_per_call_table(per_call), _sessions_table(loops, per_call)]
    targets, notes = _targets(loops, per_call)
    notes += [f"skipped {reason}" for reason in skipped]
    notes += [
        "µs per step (or per call): a run's time less the median time of the same session "
        "with no steps (the session table), over its steps. Paired ratio: an arm's run over "
        "the bare run of the same repetition, which ran next to it, so a slow phase of the "
        "machine cancels out. Ratio of minimums: each arm's fastest run, the least disturbed "
        "by other work on the machine. CPU: the process's CPU time (all its threads), which "
        "waiting for a core on a shared machine does not inflate.",
        "\"bare, again\" runs the bare loop once more: its overhead is the noise floor.",
    ]
    ran = {arm.partition(":")[0] for arm in per_call.measured.counts}
    if "TensorBoard" in ran:
        notes.append("TensorBoard here is the `tensorboard` package without TensorFlow, as "
                     "`pip install tensorboard` gives it: its writer thread checksums each "
                     "record in pure Python.")
    if "MLflow" in ran:
        notes.append("MLflow: `mlflow.log_metric` is synchronous (MLflow's default), one "
                     "store write per call; telemetry off (MLFLOW_DISABLE_TELEMETRY).")
    data = {
        "loops": {loop.plan.model.name: {"model": loop.plan.model.describe(),
                                         **_raw(loop.measured)} for loop in loops},
        "per_call": _raw(per_call.measured),
        "skipped": skipped,
    }
    return Outcome("harness_overhead", tables, targets, notes, data)


def _raw(measured: Measured) -> dict[str, Any]:
    return {"per_run": measured.counts, "runs_wall_cpu_s": measured.times,
            "session_of": measured.sessions,
            "per_unit_s": {arm: measured.per_unit(arm) for arm in measured.counts},
            "per_unit_cpu_s": {arm: measured.per_unit(arm, CPU) for arm in measured.counts}}


def _overhead(bare: list[float], arm: list[float]) -> tuple[float, float, float]:
    """Ratios of the medians, of each repetition's pair (their median), of the minimums."""
    paired = [a / b for b, a in zip(bare, arm, strict=True)]
    return median(arm) / median(bare) - 1, median(paired) - 1, min(arm) / min(bare) - 1


def _loop_table(loop: LoopResult, runs: int) -> Table:
    measured = loop.measured
    bare, bare_cpu = measured.per_unit("bare"), measured.per_unit("bare", CPU)
    rows = []
    for arm, steps in measured.counts.items():
        wall, cpu = measured.per_unit(arm), measured.per_unit(arm, CPU)
        ratios = ["", "", "", ""] if arm == "bare" else [
            *(f"{r:+.2%}" for r in _overhead(bare, wall)),
            f"{median(cpu) / median(bare_cpu) - 1:+.2%}"]
        if arm not in ("bare", "bare, again"):
            ratios[0] = f"**{ratios[0]}**"
        rows.append([arm, str(steps), *_us(wall, 1), ratios[0], ratios[1], ratios[2],
                     f"{median(cpu) * 1e6:.1f}", ratios[3]])
    model = loop.plan.model
    return Table(
        f"(h) the {model.name} step ({model.describe()}), reporting its loss on every "
        f"step: {runs} interleaved runs per arm",
        ["arm", "steps per run", "median µs per step", "min µs", "max µs",
         "overhead: ratio of medians", "median of paired ratios", "ratio of minimums",
         "CPU µs per step", "CPU: ratio of medians"],
        rows)


def _us(values: list[float], digits: int) -> list[str]:
    """Median, min and max in µs (no thousands separator: report.py right-aligns numbers)."""
    return [f"{x * 1e6:.{digits}f}" for x in (median(values), min(values), max(values))]


def _per_call_table(per_call: PerCall) -> Table:
    measured = per_call.measured
    muster = _muster_medians(per_call)
    rows = []
    for arm, calls in measured.counts.items():
        wall = measured.per_unit(arm)
        kind = per_call.value_kind.get(arm)
        ratio = "" if kind is None or arm.startswith("muster") else \
            _times(median(wall) / muster[kind])
        rows.append([arm, str(calls), *_us(wall, 2),
                     f"{median(measured.per_unit(arm, CPU)) * 1e6:.2f}", ratio])
    return Table("(h) cost of one call (a session of many calls less the session with none; "
                 "µs)", ["call", "calls per run", "median µs", "min µs", "max µs",
                         "CPU µs (median)", "/ muster's (same value)"], rows)


def _sessions_table(loops: list[LoopResult], per_call: PerCall) -> Table:
    rows = []
    for where, measured in [*((f"{loop.plan.model.name} loop", loop.measured)
                              for loop in loops), ("per call", per_call.measured)]:
        for session in dict.fromkeys(measured.sessions.values()):
            wall = measured.of(session)
            rows.append([session, where, f"{median(wall) * 1e3:.1f}", f"{min(wall) * 1e3:.1f}",
                         f"{max(wall) * 1e3:.1f}",
                         f"{median(measured.of(session, CPU)) * 1e3:.1f}"])
    return Table("(h) one session with no steps or calls (ms; taken off its arms' runs)",
                 ["session", "measured in", "median ms", "min ms", "max ms", "CPU ms (median)"],
                 rows)


def _muster_medians(per_call: PerCall) -> dict[str, float]:
    """Median seconds of muster's report_training per call, by value kind."""
    return {kind: median(per_call.measured.per_unit(arm))
            for arm, kind in per_call.value_kind.items() if arm.startswith("muster")}


def _targets(loops: list[LoopResult], per_call: PerCall) -> tuple[list[Target], list[str]]:
    targets, notes = [], []
    muster = "muster: `report_training`"
    for loop in loops:
        measured = loop.measured
        bare, arm = measured.per_unit("bare"), measured.per_unit(muster)
        overhead = _overhead(bare, arm)[0]
        floor = _overhead(bare, measured.per_unit("bare, again"))[0]
        cpu, cpu_floor = (median(measured.per_unit(name, CPU))
                          / median(measured.per_unit("bare", CPU)) - 1
                          for name in (muster, "bare, again"))
        text = (f"{overhead:+.2%} ({(median(arm) - median(bare)) * 1e6:.1f} µs per step on a "
                f"{median(bare) * 1e6:,.0f} µs step; CPU time {cpu:+.2%}; noise floor, "
                f"\"bare, again\": {floor:+.2%}, CPU {cpu_floor:+.2%})")
        if loop.plan.model is LONG:
            targets.append(Target(f"(h) `report_training` on every step adds ≤ "
                                  f"{TARGET_OVERHEAD:.0%} to the ~1 ms training step (ratio "
                                  "of medians)", text, overhead <= TARGET_OVERHEAD))
        else:
            notes.append(f"At the {loop.plan.model.name} step `report_training` adds {text}.")
    muster_s = _muster_medians(per_call)
    ratios = {arm: median(per_call.measured.per_unit(arm)) / muster_s[kind]
              for arm, kind in per_call.value_kind.items() if not arm.startswith("muster")}
    if {arm.partition(":")[0] for arm in ratios} == {"MLflow", "TensorBoard"}:
        cheaper = ", ".join(f"{arm.partition(':')[0]} {_value_of(arm)} {_times(ratio)}"
                            for arm, ratio in ratios.items())
        targets.append(Target(f"(h) `report_training` ≥ {TARGET_CHEAPER:.0f}x cheaper per "
                              "call than MLflow `log_metric` and TensorBoard `add_scalar` "
                              "(medians, same value)", cheaper,
                              min(ratios.values()) >= TARGET_CHEAPER))
    else:
        notes.append(f"Not checked: `report_training` ≥ {TARGET_CHEAPER:.0f}x cheaper per "
                     "call than MLflow and TensorBoard (both are needed).")
    return targets, notes


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _value_of(arm: str) -> str:
    """How a per-call arm's name tells its value and store apart, for the targets line."""
    kind = "tensor" if "tensor" in arm else "float"
    return f"{kind}, SQLite" if "SQLite" in arm else kind


if __name__ == "__main__":
    from report import describe_machine, render_markdown

    outcome = run("--quick" in sys.argv)
    print(render_markdown(describe_machine(), [outcome], " ".join(sys.argv)))
