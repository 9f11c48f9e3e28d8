"""The one checkpoint integrity rule, on real directories: what intact means, every way a
checkpoint can be damaged, which one is "latest", and that the harness's restore(), the
server's registration and verification reach the same verdict with the same words."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from muster import checkpoint_files
from muster.checkpoint_files import Inspection, inspect, inspect_all, latest_intact
from muster.harness.checkpoints import Checkpoints, Saver
from muster.harness.heartbeat import Heartbeat
from muster.supervise.verification import gather_evidence

SAVED_AT = 1_700_000_000.25


def write(
    root: Path, step: int, files: dict[str, bytes], *, suffix: str = "ab12cd34",
    saved_at: float = SAVED_AT, **overrides: Any,
) -> Path:
    """A published checkpoint as the harness leaves it: the files, then metadata.json."""
    path = root / f"step-{step:012d}-{suffix}"
    for relative, data in files.items():
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        (path / relative).write_bytes(data)
    path.mkdir(parents=True, exist_ok=True)
    document = {"step": step, "time": saved_at, "trial_id": 7, "attempt": 2, "rank": 1,
                "hparams": {}, "metadata": {"epoch": 3},
                "files": {r: hashlib.sha256(d).hexdigest() for r, d in files.items()},
                **overrides}
    (path / "metadata.json").write_text(json.dumps(document))
    return path


def test_an_intact_checkpoint_and_what_it_records(tmp_path: Path) -> None:
    path = write(tmp_path, 12, {"model.pt": b"w" * 100, "optim/adam.pt": b"m" * 20})
    found = inspect(path, trial_id=7)
    assert found.intact and found.problem is None and found.problems == ()
    assert (found.name, found.step, found.saved_at) == (path.name, 12, SAVED_AT)
    assert found.user_metadata == {"epoch": 3}
    assert (found.recorded_int("attempt"), found.recorded_int("rank")) == (2, 1)
    metadata_size = (path / "metadata.json").stat().st_size
    assert found.file_sizes == {"model.pt": 100, "optim/adam.pt": 20,
                                "metadata.json": metadata_size}
    assert found.size_bytes == 120 + metadata_size


def _flip_a_byte(path: Path) -> None:
    data = bytearray((path / "model.pt").read_bytes())
    data[5] ^= 0x01
    (path / "model.pt").write_bytes(bytes(data))


def _swap_for_symlink(path: Path) -> None:
    target = path.parent / "elsewhere.pt"
    target.write_bytes((path / "model.pt").read_bytes())  # same bytes: only the type is wrong
    (path / "model.pt").unlink()
    (path / "model.pt").symlink_to(target)


DAMAGES: list[tuple[str, Callable[[Path], None], str]] = [
    ("a flipped byte", _flip_a_byte, "model.pt does not match its sha256 in metadata.json"),
    ("a removed file", lambda p: (p / "model.pt").unlink(), "model.pt is missing"),
    ("a symlink", _swap_for_symlink, "model.pt is not a regular file"),
    ("no metadata.json", lambda p: (p / "metadata.json").unlink(), "metadata.json is missing"),
    ("truncated metadata.json", lambda p: (p / "metadata.json").write_text('{"step": 3, "fi'),
     "metadata.json is not valid JSON (Unterminated string starting at: line 1 column 13 "
     "(char 12))"),
    ("metadata.json a list", lambda p: (p / "metadata.json").write_text("[]"),
     "metadata.json is not a JSON object"),
    ("no file list", lambda p: (p / "metadata.json").write_text('{"step": 3}'),
     'metadata.json has no "files" object of sha256 sums'),
    ("a path outside", lambda p: (p / "metadata.json").write_text(
        json.dumps({"step": 3, "files": {"../secret": "0" * 64}})),
     "metadata.json lists '../secret', which is outside the checkpoint directory"),
    ("a digest that is not a string", lambda p: (p / "metadata.json").write_text(
        json.dumps({"step": 3, "files": {"model.pt": 5}})),
     "model.pt has no sha256 in metadata.json"),
    ("another step", lambda p: (p / "metadata.json").write_text(
        json.dumps({"step": 4, "files": {}})),
     "metadata.json says step 4 but the directory is step-000000000003-ab12cd34"),
]


@pytest.mark.parametrize(("damage", "problem"), [(d, p) for _, d, p in DAMAGES],
                         ids=[name for name, _, _ in DAMAGES])
def test_each_damage_is_named(
    tmp_path: Path, damage: Callable[[Path], None], problem: str
) -> None:
    path = write(tmp_path / "checkpoints", 3, {"model.pt": b"weights-3"})
    damage(path)
    found = inspect(path)
    assert not found.intact
    assert found.problem == problem


def test_another_trials_checkpoint_is_not_intact_for_this_trial(tmp_path: Path) -> None:
    path = write(tmp_path, 1, {"a": b"a"}, trial_id=9)
    assert inspect(path).intact  # no trial to compare with
    assert inspect(path, trial_id=9).intact
    assert inspect(path, trial_id=3).problem == (
        "metadata.json names trial 9, but the checkpoint is in trial 3's run directory")


def test_every_problem_is_listed_and_the_line_is_bounded(tmp_path: Path) -> None:
    files = {f"shard-{i}.pt": bytes([i]) for i in range(8)}
    path = write(tmp_path, 1, files)
    for name in files:
        (path / name).unlink()
    found = inspect(path)
    assert len(found.problems) == 8
    assert found.problem == ("shard-0.pt is missing; shard-1.pt is missing; shard-2.pt is "
                             "missing; shard-3.pt is missing; shard-4.pt is missing; and 3 more")


def test_a_checkpoint_that_is_gone_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        inspect(tmp_path / "step-000000000001-00000000")


def test_only_published_directories_are_read(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    write(folder, 2, {"a": b"a"})
    write(folder, 1, {"a": b"a"}, suffix="00000000")
    (folder / ".tmp-step-000000000009-ffffffff").mkdir()  # a save in progress
    (folder / "step-000000000008-ffffffff").write_bytes(b"a file, not a directory")
    (folder / "notes").mkdir()
    (folder / "step-5").mkdir()  # copied in by hand: judged, not ignored
    assert [p.name for p in checkpoint_files.published(folder)] == [
        "step-000000000001-00000000", "step-000000000002-ab12cd34", "step-5"]
    assert [(c.step, c.intact) for c in inspect_all(folder)] == [
        (1, True), (2, True), (5, False)]
    assert checkpoint_files.published(tmp_path / "nothing-here") == []


def test_latest_is_the_highest_step_then_the_latest_save(tmp_path: Path) -> None:
    older = write(tmp_path, 10, {"a": b"1"}, suffix="ffffffff", saved_at=SAVED_AT)
    newer = write(tmp_path, 10, {"a": b"2"}, suffix="00000000", saved_at=SAVED_AT + 1)
    write(tmp_path, 9, {"a": b"3"}, saved_at=SAVED_AT + 99)
    found = latest_intact(tmp_path)
    assert found is not None and found.path == newer
    assert [c.path for c in inspect_all(tmp_path)][-2:] == [older, newer]


def test_latest_skips_corrupt_ones_and_says_which(tmp_path: Path) -> None:
    good = write(tmp_path, 5, {"model.pt": b"weights-5"})
    bad = write(tmp_path, 6, {"model.pt": b"weights-6"})
    _flip_a_byte(bad)
    skipped: list[Inspection] = []
    found = latest_intact(tmp_path, on_corrupt=skipped.append)
    assert found is not None and found.path == good
    assert [(s.path, s.problem) for s in skipped] == [
        (bad, "model.pt does not match its sha256 in metadata.json")]


def test_the_preferred_checkpoint_wins_only_when_intact(tmp_path: Path) -> None:
    low = write(tmp_path, 1, {"model.pt": b"weights-1"})
    high = write(tmp_path, 2, {"model.pt": b"weights-2"})
    found = latest_intact(tmp_path, preferred=low)
    assert found is not None and found.path == low
    _flip_a_byte(low)
    skipped: list[Inspection] = []
    found = latest_intact(tmp_path, preferred=low, on_corrupt=skipped.append)
    assert found is not None and found.path == high
    assert [s.path for s in skipped] == [low]  # checked once, though it is also in the list


def test_no_intact_checkpoint_is_none(tmp_path: Path) -> None:
    assert latest_intact(tmp_path / "missing") is None
    _flip_a_byte(write(tmp_path, 1, {"model.pt": b"weights-1"}))
    assert latest_intact(tmp_path) is None


def test_the_harness_and_verification_agree_with_the_rule(tmp_path: Path) -> None:
    """restore() skips what inspect() calls corrupt, with its words; verification reports
    the same words. (Registration by the server: tests/supervise/test_ingest.py.)"""
    folder = tmp_path / "checkpoints"
    intact = write(folder, 1, {"model.pt": b"weights-1"})
    damaged = []
    for number, (_, damage, _) in enumerate(DAMAGES, start=2):
        path = write(folder, number, {"model.pt": b"weights-x"}, suffix=f"{number:08x}")
        damage(path)
        damaged.append(path)
    judged = {c.path: c for c in inspect_all(folder)}

    restoring = Checkpoints(folder, Saver(None, 1, 0, {}),
                            Heartbeat(tmp_path / "heartbeat.json", 10.0), preferred=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = restoring.restore()
    assert restored is not None and restored.path == intact
    warned = [str(w.message) for w in caught]
    assert len(warned) == len(damaged)
    for path in damaged:
        problem = judged[path].problem
        assert problem is not None
        assert f"skipping the corrupt checkpoint {path}: {problem}" in "\n".join(warned)

    evidence = gather_evidence(tmp_path, [1])
    assert {Path(c.path): (c.intact, c.problem) for c in evidence.checkpoints} == {
        path: (c.intact, c.problem) for path, c in judged.items()}


def test_reading_never_writes(tmp_path: Path) -> None:
    path = write(tmp_path, 1, {"model.pt": b"weights"})
    _flip_a_byte(path)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in path.rglob("*")}
    inspect(path)
    latest_intact(tmp_path)
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in path.rglob("*")} == before
    assert sorted(os.listdir(tmp_path)) == [path.name]
