"""`init()` and the `Context` it yields: everything training code does through the harness."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from muster.atomic import atomic_write_json
from muster.harness import determinism, snapshot
from muster.harness.arguments import check_count
from muster.harness.background import BackgroundThread, Task, run_warning_on_oserror
from muster.harness.checkpoints import Checkpoints, SaveFailures, Saver
from muster.harness.diagnostics import DiagnosticsLog
from muster.harness.drill_nan import CHECK_INTERVAL_S, NanRequest
from muster.harness.heartbeat import Heartbeat
from muster.harness.metrics import MetricsWriter
from muster.harness.run import Run, read_run
from muster.harness.samples import Samples
from muster.harness.stack_signal import StackSignal
from muster.harness.standby import wait_for_promotion
from muster.harness.stopping import StopRequest
from muster.rundir import Hparams, RunDir
from muster.states import Integration, MetricKind

FLUSH_INTERVAL_S = 1.0
THREAD_STOP_TIMEOUT_S = 5.0
# How long the end of init() waits for checkpoints still being written in the background
# (`ctx.checkpoint.save_sharded_async`); `PendingSave.result()` waits as long as it takes.
PENDING_SAVES_TIMEOUT_S = 120.0

_active: Context | None = None


class Context:
    """What training code gets from `init()`: who this run is, and how it reports.

    Attributes:
        samples: per-rank sample accounting, `ctx.samples.seen(n, epoch=e)`.
        checkpoint: `ctx.checkpoint.save(step)` and `ctx.checkpoint.restore()`; every rank
            together: `save_sharded(step)`, `save_sharded_async(step, start)`.
    """

    def __init__(self, env: Run, heartbeat_interval: float,
                 integration: Integration = Integration.HARNESS) -> None:
        self._env = env
        self._integration = integration
        run_dir = RunDir(env.run_dir)
        files = run_dir.attempt(env.attempt).rank(env.rank)
        files.attempt_dir.mkdir(parents=True, exist_ok=True)
        # A drill's request for a NaN loss (muster.harness.drill_nan): on the platform only.
        self._nan = NanRequest(files if env.trial_id is not None else None)
        self._metrics = MetricsWriter(files.metrics, env.rank, self._nan)
        self.samples = Samples(files.samples, env.rank)
        self._heartbeat = Heartbeat(files.heartbeat, heartbeat_interval,
                                    sources=[self._metrics, self.samples],
                                    integration=integration.value)
        saver = Saver(env.trial_id, env.attempt, env.rank, env.hparams, env.world_size)
        self.checkpoint = Checkpoints(run_dir.checkpoints, saver, self._heartbeat,
                                      env.latest_checkpoint, self._flush_accounting,
                                      SaveFailures(files.save_failures),
                                      source=env.source_checkpoint)
        self._plan = files.plan
        self._stop = StopRequest(files.stop_ack, self._heartbeat)
        # Every thread's stack on a signal, for muster's evidence where py-spy cannot attach.
        self._stack_signal = StackSignal(files)
        self._snapshot = files.snapshot
        # What muster.harness.torch's diagnostics record (`diagnose`); empty without them.
        self._diagnostics = DiagnosticsLog(files.diagnostics, env.diagnostics_interval)
        self._background = BackgroundThread([
            Task(f"writing {files.metrics}", FLUSH_INTERVAL_S, self._metrics.flush),
            Task(f"writing {files.samples}", FLUSH_INTERVAL_S, self.samples.flush),
            Task(f"writing {files.heartbeat}", heartbeat_interval, self._heartbeat.write),
            Task(f"writing {files.diagnostics}", FLUSH_INTERVAL_S, self._diagnostics.flush),
            Task(f"reading {files.drill_nan}", CHECK_INTERVAL_S, self._nan.check),
        ])

    def _flush_accounting(self) -> None:
        self.samples.flush()
        self._metrics.flush()

    @property
    def hparams(self) -> Hparams:
        """The trial's hyperparameters (MUSTER_HPARAMS; in a local run, `init(hparams=...)`)."""
        return self._env.hparams

    @property
    def max_length(self) -> int | None:
        """How far the searcher lets the trial train, in the steps it reports validation
        with (MUSTER_MAX_LENGTH, `searcher.max_length`); None when the config sets none."""
        return self._env.max_length

    @property
    def seed(self) -> int | None:
        """The trial's seed (MUSTER_SEED): derived from `reproducibility.experiment_seed`
        and the trial's number; None when the config sets no experiment seed."""
        return self._env.seed

    @property
    def trial_id(self) -> int | None:
        """The trial's id in muster; None in a local run."""
        return self._env.trial_id

    @property
    def attempt(self) -> int:
        return self._env.attempt

    @property
    def rank(self) -> int:
        return self._env.rank

    @property
    def world_size(self) -> int:
        return self._env.world_size

    @property
    def run_dir(self) -> Path:
        return self._env.run_dir

    def report_training(self, step: int, metrics: Mapping[str, object]) -> None:
        """Record training metrics for `step`: names to numbers (0-d tensors are fine).

        Cheap enough for every step: the line is buffered and written within a second.

        Raises:
            TypeError, ValueError: `step` is not an int ≥ 0, a metric is not a number, or
                its name breaks `muster.metrics_lines.NAME_RULE` (letters, digits and
                _ . / : @ + -); the message names the metric.
        """
        self._metrics.report(MetricKind.TRAINING, step, metrics)

    def report_validation(self, step: int, metrics: Mapping[str, object]) -> None:
        """Record validation metrics for `step`; as `report_training`."""
        self._metrics.report(MetricKind.VALIDATION, step, metrics)

    def plan(self, *, steps: int | None = None, epochs: int | None = None,
             batches: int | None = None, records: int | None = None) -> None:
        """Declare how far this run is planned to train, in one unit: steps (the training
        steps it reports; validation's if it reports no training), batches (the same),
        epochs (whole epochs of `samples.seen`) or records (samples seen).

        An exit 0 is verified only when the last reported progress reached the plan
        (`verify.expected_length` in the config wins over it). Call it once, early.

        Raises:
            TypeError, ValueError: not exactly one unit, or a length that is not an int ≥ 1.
        """
        given = [(unit, n) for unit, n in (("steps", steps), ("epochs", epochs),
                                           ("batches", batches), ("records", records))
                 if n is not None]
        if len(given) != 1:
            raise ValueError("plan() takes exactly one of steps=, epochs=, batches=, records=")
        unit, length = given[0]
        if check_count(length, f"plan: {unit}") < 1:
            raise ValueError(f"plan: {unit} must be at least 1, not {length}")
        plan: dict[str, object] = {"unit": unit, "length": length}
        if self._integration is not Integration.HARNESS:
            plan["integration"] = self._integration.value  # whose plan: the framework's
        atomic_write_json(self._plan, plan)

    def heartbeat(self, step: int | None = None) -> None:
        """Tell muster the loop is making progress, for stretches without any report."""
        checked = None if step is None else check_count(step, "heartbeat: step")
        self._heartbeat.progress(time.time(), checked)

    def should_stop(self) -> bool:
        """True once muster asked this run to stop (SIGTERM): save a checkpoint and leave."""
        return self._stop.requested()

    def _open(self) -> None:
        """Take over SIGTERM, check in (the first heartbeat), start the background thread.

        SIGTERM first: once muster sees the check-in, its stop must reach `should_stop()`.
        """
        self._stop.install()
        self._stack_signal.install()
        self._heartbeat.write()
        self._write_snapshot()
        self._background.start()

    def _close(self) -> None:
        """Finish (or drop) the checkpoints still being written, stop the thread, write
        everything one last time, give SIGTERM back.

        A failed final write is a warning, not an error, so it never hides the exception
        that is leaving the user's block.
        """
        try:
            self.checkpoint.close(PENDING_SAVES_TIMEOUT_S)
            self._background.stop(THREAD_STOP_TIMEOUT_S)
            run_warning_on_oserror(f"writing {self._metrics.path}", self._metrics.close)
            run_warning_on_oserror("recording the drill's NaN loss", self._nan.check)
            run_warning_on_oserror(f"writing {self.samples.path}", self.samples.flush)
            run_warning_on_oserror(f"writing {self._heartbeat.path}", self._heartbeat.write)
            run_warning_on_oserror(f"writing {self._diagnostics.path}", self._diagnostics.flush)
            self._write_snapshot()  # again: CUDA's libraries and GPUs are known by now
        finally:
            self._stack_signal.uninstall()
            self._stop.uninstall()

    def _write_snapshot(self) -> None:
        """What this rank is made of (`muster.harness.snapshot`), for `muster trial diff`."""
        run_warning_on_oserror(f"writing {self._snapshot}",
                               lambda: snapshot.write(self._snapshot, snapshot.capture()))


@contextmanager
def init(
    *, hparams: Mapping[str, Any] | None = None, heartbeat_interval: float | None = None,
    integration: Integration = Integration.HARNESS,
) -> Iterator[Context]:
    """Connect this training process to muster for the duration of the block.

    On the platform it reads the environment muster sets (MUSTER_RUN_DIR and the rest);
    without MUSTER_RUN_DIR it is a local run writing into `./muster-run/` as attempt 1,
    rank 0 (or RANK/WORLD_SIZE when set), with `hparams` as the hyperparameters.

    It takes over SIGTERM for the block (see `Context.should_stop`); Python lets only the
    main thread do that, so called from another thread, `should_stop()` stays False.

    Args:
        hparams: the hyperparameters of a local run; on the platform the trial's own
            (MUSTER_HPARAMS) are used and this is ignored.
        heartbeat_interval: seconds between heartbeat rewrites; by default 10 s, or a third
            of MUSTER_HEARTBEAT_TIMEOUT when that is shorter.
        integration: what connects the script (`muster.integrations` opens it for a
            framework; the trial's `integration` says which).

    Raises:
        RuntimeError: another `init()` block is active in this process.
        ValueError: the environment is malformed, or an argument is out of range.
        TypeError: `hparams` is not JSON-serialisable.
    """
    global _active
    if _active is not None:
        raise RuntimeError("muster.harness.init() is already active in this process; "
                           "use the context it yielded")
    wait_for_promotion()  # a warm standby waits here until it becomes the next attempt
    env = read_run(os.environ, Path.cwd(), _checked_hparams(hparams))
    if env.deterministic:
        determinism.apply(env.seed, env.rank)  # before the snapshot: it records the switches
    context = Context(env, _checked_interval(heartbeat_interval, env), Integration(integration))
    _active = context
    try:
        context._open()
        yield context
    finally:
        try:
            context._close()
        finally:
            _active = None


def active() -> Context | None:
    """The context of the `init()` block open in this process, if any: an integration joins
    the one the script opened itself rather than opening a second."""
    return _active


def _checked_hparams(hparams: Mapping[str, Any] | None) -> Hparams | None:
    if hparams is None:
        return None
    if not isinstance(hparams, Mapping):
        raise TypeError(f"hparams must be a mapping, got {type(hparams).__name__}")
    try:
        json.dumps(dict(hparams))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"hparams must be JSON-serialisable (they go into every "
                        f"checkpoint's metadata.json): {exc}") from None
    return dict(hparams)


def _checked_interval(interval: float | None, env: Run) -> float:
    if interval is None:
        return env.heartbeat_interval()
    if not interval > 0:
        raise ValueError(f"heartbeat_interval must be a positive number of seconds, "
                         f"got {interval=}")
    return float(interval)
