"""Ingestion of a run directory's metrics lines and checkpoints, with real files, on both
database backends: exactly once, torn lines, restarts, NaN, malformed lines, corruption."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, event, select, type_coerce

from muster import checkpoint_files
from muster.errors import NotFound
from muster.store import Attempt, Checkpoint, IngestCursor, Metric, Store
from muster.supervise import ingest
from muster.supervise.ingest import ingest_trial
from tests.store.rows import add_experiment, add_trial
from tests.test_checkpoint_files import DAMAGES


@pytest.fixture
def store(shared_store: Store) -> Store:
    """One migrated store per module and backend: each test makes and reads its own rows."""
    return shared_store


@dataclass
class RunDir:
    """A trial's run directory, written by hand in the documented format."""

    trial_id: int
    root: Path

    def metrics_path(self, attempt: int = 1, rank: int = 0) -> Path:
        return self.root / f"attempt-{attempt}" / f"rank-{rank}.metrics.jsonl"

    def append(self, data: bytes, attempt: int = 1, rank: int = 0) -> None:
        path = self.metrics_path(attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as out:
            out.write(data)

    def report(self, step: int, attempt: int = 1, rank: int = 0, kind: str = "training",
               **metrics: float) -> None:
        self.append(report_line(step, rank=rank, kind=kind, **metrics), attempt, rank)

    def checkpoint(
        self, step: int, files: dict[str, bytes], overrides: dict[str, Any] | None = None
    ) -> Path:
        """A complete checkpoint directory, made as the harness makes it: .tmp- then rename."""
        folder = self.root / "checkpoints"
        tmp = folder / f".tmp-{secrets.token_hex(4)}"
        tmp.mkdir(parents=True)
        for relative, data in files.items():
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp / relative).write_bytes(data)
        metadata = {
            "step": step, "time": 1_700_000_000.5, "trial_id": self.trial_id, "attempt": 1,
            "rank": 0, "hparams": {"lr": 0.1}, "metadata": {"val_loss": 0.25},
            "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
            **(overrides or {}),
        }
        (tmp / "metadata.json").write_text(json.dumps(metadata))
        final = folder / f"step-{step:012d}-{secrets.token_hex(4)}"
        tmp.rename(final)
        return final


def report_line(step: int, rank: int = 0, kind: str = "training", **metrics: float) -> bytes:
    """One line as the harness writes it (Python's json: NaN/Infinity as bare tokens)."""
    line = {"kind": kind, "step": step, "metrics": metrics or {"loss": 1.0 / (step + 1)},
            "time": 1_700_000_000.0 + step, "rank": rank}
    return json.dumps(line).encode() + b"\n"


def add_run(store: Store, root: Path, attempts: int = 1) -> RunDir:
    """A trial with `attempts` attempts whose run directory is `root`."""
    with store.session_scope() as s:
        trial = add_trial(s, add_experiment(s), state="RUNNING")
        for number in range(1, attempts + 1):
            s.add(Attempt(trial=trial, number=number, state="RUNNING",
                          run_dir=str(root / f"attempt-{number}")))
        return RunDir(trial.id, root)


@pytest.fixture
def run(store: Store, tmp_path: Path) -> RunDir:
    return add_run(store, tmp_path / "runs" / "trial-uuid", attempts=2)


def stored(store: Store, trial_id: int) -> list[tuple[int, int, str, int, dict[str, Any]]]:
    """(attempt, rank, kind, step, values) of the trial's metrics rows, in insertion order."""
    with store.session_scope() as s:
        rows = s.scalars(select(Metric).where(Metric.trial_id == trial_id).order_by(Metric.id))
        return [(m.attempt, m.rank, m.kind, m.step, m.values) for m in rows]


def checkpoints(store: Store, trial_id: int) -> dict[str, Checkpoint]:
    with store.session_scope() as s:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial_id))
        return {c.name: c for c in rows}


# -- metrics ------------------------------------------------------------------------------


def test_lines_are_ingested_incrementally_and_once(store: Store, run: RunDir) -> None:
    for step in range(3):
        run.report(step)
    first = ingest_trial(store, run.trial_id)
    assert (first.metrics_added, first.lines_skipped) == (3, 0)
    run.report(3, kind="validation", val_loss=0.5)
    run.report(4)
    assert ingest_trial(store, run.trial_id).metrics_added == 2
    again = ingest_trial(store, run.trial_id)
    assert not again.changed
    rows = stored(store, run.trial_id)
    assert [r[3] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[3] == (1, 0, "validation", 3, {"val_loss": 0.5})
    assert rows[0][4] == {"loss": 1.0}


def test_a_torn_last_line_waits_until_it_is_complete(store: Store, run: RunDir) -> None:
    whole = report_line(7, loss=0.125)
    run.report(6)
    run.append(whole[:20])
    assert ingest_trial(store, run.trial_id).metrics_added == 1
    assert ingest_trial(store, run.trial_id).metrics_added == 0  # still torn
    run.append(whole[20:])
    report = ingest_trial(store, run.trial_id)
    assert (report.metrics_added, report.lines_skipped) == (1, 0)
    assert stored(store, run.trial_id)[-1] == (1, 0, "training", 7, {"loss": 0.125})


def test_a_restarted_server_neither_repeats_nor_misses_lines(
    store: Store, run: RunDir
) -> None:
    for step in range(5):
        run.report(step)
    assert ingest_trial(store, run.trial_id).metrics_added == 5
    store.dispose()
    restarted = Store(store.url)
    try:
        assert ingest_trial(restarted, run.trial_id).metrics_added == 0
        run.report(5)
        run.report(6)
        assert ingest_trial(restarted, run.trial_id).metrics_added == 2
        assert [r[3] for r in stored(restarted, run.trial_id)] == list(range(7))
    finally:
        restarted.dispose()


def test_nan_and_infinity_survive_the_database(store: Store, run: RunDir) -> None:
    run.report(1, loss=math.nan, grad=math.inf, low=-math.inf, ok=0.5)
    ingest_trial(store, run.trial_id)
    values = stored(store, run.trial_id)[0][4]
    assert math.isnan(values["loss"])
    assert values["grad"] == math.inf and values["low"] == -math.inf and values["ok"] == 0.5
    with store.session_scope() as s:  # as the database holds them: strict JSON strings
        raw = s.scalars(select(type_coerce(Metric.values, JSON))
                        .where(Metric.trial_id == run.trial_id)).one()
    assert raw == {"loss": "NaN", "grad": "Infinity", "low": "-Infinity", "ok": 0.5}


def test_malformed_lines_are_skipped_counted_and_logged(
    store: Store, run: RunDir, caplog: pytest.LogCaptureFixture
) -> None:
    bad = [
        b"{not json\n",
        b"[1, 2]\n",
        b'{"kind": "test", "step": 1, "metrics": {}, "time": 1.0, "rank": 0}\n',
        b'{"kind": "training", "metrics": {"a": 1}, "time": 1.0, "rank": 0}\n',
        b'{"kind": "training", "step": 1, "metrics": {"a": true}, "time": 1.0, "rank": 0}\n',
        b'{"kind": "training", "step": 1, "metrics": {"a": "x"}, "time": 1.0, "rank": 0}\n',
        b'{"kind": "training", "step": 1, "metrics": {"a": 1}, "time": 1.0, "rank": 3}\n',
        b'{"kind": "training", "step": 1, "metrics": {"a": 1}, "time": NaN, "rank": 0}\n',
        b'{"kind": "training", "step": 1.5, "metrics": {"a": 1}, "time": 1.0, "rank": 0}\n',
        b"\xff\xfe not utf-8\n",
    ]
    run.report(0)
    run.append(b"".join(bad) + b"\n")  # and a blank line, which is no report and no problem
    run.report(1)
    with caplog.at_level(logging.WARNING, logger="muster.supervise.ingest"):
        report = ingest_trial(store, run.trial_id)
    assert (report.metrics_added, report.lines_skipped) == (2, len(bad))
    assert [r[3] for r in stored(store, run.trial_id)] == [0, 1]
    messages = [r.getMessage() for r in caplog.records]
    assert "skipped the line at byte" in messages[0] and "not valid JSON" in messages[0]
    assert any(f"skipped {len(bad) - 5} more malformed lines" in m for m in messages)


def test_attempts_and_ranks_keep_their_own_cursors(store: Store, run: RunDir) -> None:
    run.report(0, attempt=1, rank=0)
    run.report(0, attempt=1, rank=1)
    run.report(10, attempt=2, rank=0)
    assert ingest_trial(store, run.trial_id).metrics_added == 3
    run.report(11, attempt=2, rank=0)
    assert ingest_trial(store, run.trial_id).metrics_added == 1
    assert [(a, r, step) for a, r, _, step, _ in stored(store, run.trial_id)] == [
        (1, 0, 0), (1, 1, 0), (2, 0, 10), (2, 0, 11)]
    with store.session_scope() as s:
        cursors = s.scalars(select(IngestCursor).where(IngestCursor.trial_id == run.trial_id))
        offsets = {(c.attempt, c.rank): c.byte_offset for c in cursors}
    assert offsets == {(a, r): run.metrics_path(a, r).stat().st_size
                       for a, r in [(1, 0), (1, 1), (2, 0)]}


def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 64 KiB instead of 1 MiB: a few thousand lines make several batches."""
    monkeypatch.setattr(ingest, "BATCH_BYTES", 64 * 1024)


def test_a_large_file_is_ingested_in_batches(
    store: Store, run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_batches(monkeypatch)
    run.append(b"".join(report_line(step, acc=0.5, loss=0.25) for step in range(4_000)))
    assert run.metrics_path().stat().st_size > 5 * ingest.BATCH_BYTES
    assert ingest_trial(store, run.trial_id).metrics_added == 4_000
    assert [row[3] for row in stored(store, run.trial_id)] == list(range(4_000))


def test_nothing_new_means_no_writes(store: Store, run: RunDir, tmp_path: Path) -> None:
    run.report(0)
    run.checkpoint(0, {"state.pt": b"weights"})
    ingest_trial(store, run.trial_id)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement.split()[0].upper())

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        assert not ingest_trial(store, run.trial_id).changed
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    assert statements and set(statements) <= {"SELECT", "BEGIN", "PRAGMA"}


def test_two_ingestions_at_once_store_each_line_once(
    store: Store, run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_batches(monkeypatch)  # many batches, so the two ingestions meet in the middle
    run.append(b"".join(report_line(step) for step in range(6_000)))
    assert run.metrics_path().stat().st_size > 5 * ingest.BATCH_BYTES
    stores = [Store(store.url), Store(store.url)]
    added: list[int] = []
    threads = [threading.Thread(target=lambda s=s: added.append(
        ingest_trial(s, run.trial_id).metrics_added)) for s in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for other in stores:
            other.dispose()
    assert sum(added) == 6_000
    assert [r[3] for r in stored(store, run.trial_id)] == list(range(6_000))


def test_a_file_that_shrank_is_read_on_from_its_new_end(
    store: Store, run: RunDir, caplog: pytest.LogCaptureFixture
) -> None:
    run.report(0)
    run.report(1)
    ingest_trial(store, run.trial_id)
    run.metrics_path().write_bytes(report_line(0))
    with caplog.at_level(logging.WARNING, logger="muster.supervise.ingest"):
        assert ingest_trial(store, run.trial_id).metrics_added == 0
    assert "shrank" in caplog.text
    run.report(2)
    assert ingest_trial(store, run.trial_id).metrics_added == 1


def test_a_trial_without_attempts_has_nothing_to_ingest(store: Store) -> None:
    with store.session_scope() as s:
        trial_id = add_trial(s, add_experiment(s)).id
    assert not ingest_trial(store, trial_id).changed
    with pytest.raises(NotFound, match="trial 999999 does not exist"):
        ingest_trial(store, 999_999)


def test_attempt_directories_not_made_yet_are_fine(store: Store, tmp_path: Path) -> None:
    run = add_run(store, tmp_path / "never-written", attempts=1)
    assert not ingest_trial(store, run.trial_id).changed


# -- checkpoints --------------------------------------------------------------------------


def test_an_intact_checkpoint_is_registered_once(store: Store, run: RunDir) -> None:
    path = run.checkpoint(120, {"state.pt": b"w" * 1000, "opt/adam.pt": b"m" * 24})
    report = ingest_trial(store, run.trial_id)
    assert report.checkpoints_added == [path.name] and report.corrupt_checkpoints == []
    assert ingest_trial(store, run.trial_id).checkpoints_added == []
    found = checkpoints(store, run.trial_id)[path.name]
    assert (found.step, found.attempt, found.rank, found.intact, found.problem) == (
        120, 1, 0, True, None)
    assert found.path == str(path) and found.created_at == 1_700_000_000.5
    assert found.file_count == 3  # the two files and metadata.json
    assert found.size_bytes == 1024 + (path / "metadata.json").stat().st_size
    assert found.user_metadata == {"val_loss": 0.25}


def test_a_flipped_byte_marks_a_checkpoint_corrupt(store: Store, run: RunDir) -> None:
    path = run.checkpoint(5, {"state.pt": b"\x00" * 4096, "extra.bin": b"ok"})
    data = bytearray((path / "state.pt").read_bytes())
    data[2048] ^= 0x01
    (path / "state.pt").write_bytes(bytes(data))
    report = ingest_trial(store, run.trial_id)
    assert report.corrupt_checkpoints == [path.name]
    found = checkpoints(store, run.trial_id)[path.name]
    assert found.intact is False
    assert found.problem == "state.pt does not match its sha256 in metadata.json"


def test_missing_files_and_metadata_are_problems(store: Store, run: RunDir) -> None:
    lost = run.checkpoint(1, {"state.pt": b"a", "b.pt": b"b"})
    (lost / "b.pt").unlink()
    bare = run.root / "checkpoints" / f"step-{2:012d}-0badf00d"
    bare.mkdir()
    (bare / "state.pt").write_bytes(b"x")
    wrong_step = run.checkpoint(3, {"a": b"a"}, {"step": 4})
    ingest_trial(store, run.trial_id)
    found = checkpoints(store, run.trial_id)
    assert found[lost.name].problem == "b.pt is missing"
    assert (found[bare.name].problem, found[bare.name].step) == ("metadata.json is missing", 2)
    assert found[bare.name].attempt is None and found[bare.name].user_metadata == {}
    assert found[wrong_step.name].problem == (
        f"metadata.json says step 4 but the directory is {wrong_step.name}")
    assert not any(c.intact for c in found.values())


def test_registration_judges_as_the_shared_rule_does(store: Store, run: RunDir) -> None:
    """Every damage the integrity rule knows is registered with its verdict and words."""
    paths = []
    for number, (_, damage, _) in enumerate(DAMAGES, start=1):
        path = run.checkpoint(number, {"model.pt": b"weights"})
        damage(path)
        paths.append(path)
    report = ingest_trial(store, run.trial_id)
    assert sorted(report.corrupt_checkpoints) == sorted(p.name for p in paths)
    found = checkpoints(store, run.trial_id)
    for path in paths:
        judged = checkpoint_files.inspect(path, run.trial_id)
        assert (found[path.name].intact, found[path.name].problem) == (False, judged.problem)


def test_temporary_directories_are_never_read(store: Store, run: RunDir) -> None:
    tmp = run.root / "checkpoints" / ".tmp-12345"
    tmp.mkdir(parents=True)
    (tmp / "metadata.json").write_text("{half")
    assert ingest_trial(store, run.trial_id).checkpoints_added == []
    later = run.checkpoint(9, {"state.pt": b"s"})
    assert ingest_trial(store, run.trial_id).checkpoints_added == [later.name]
    assert set(checkpoints(store, run.trial_id)) == {later.name}


def test_nan_in_checkpoint_metadata_survives(store: Store, run: RunDir) -> None:
    path = run.checkpoint(1, {"s": b"s"}, {"metadata": {"best": math.nan, "tags": ["x"]}})
    ingest_trial(store, run.trial_id)
    metadata = checkpoints(store, run.trial_id)[path.name].user_metadata
    assert math.isnan(metadata["best"]) and metadata["tags"] == ["x"]
