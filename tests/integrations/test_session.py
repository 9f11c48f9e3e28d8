"""What every integration reports and how it fails: metric values and names made reportable,
batch sizes read from any batch, and an error of muster's side that turns the integration
off with one line instead of breaking the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from muster.integrations.lightning import batch_size
from muster.integrations.session import Session, reportable
from muster.states import Integration

torch = pytest.importorskip("torch", reason="needs the 'examples' extra")


def test_numbers_and_scalar_tensors_are_kept_under_names_muster_accepts() -> None:
    metrics = {"loss": torch.tensor(0.5), "val/acc": 0.25, "steps": 3, "lr-Adam/pg1": 1e-3,
               "top 1": 0.9, "flag": True, "name": "adam", "vector": torch.ones(3),
               "np": torch.tensor([2.0]).numpy()[0], "<b>": 1.0}

    assert reportable(metrics) == {"loss": 0.5, "val/acc": 0.25, "steps": 3,
                                   "lr-Adam/pg1": 1e-3, "top_1": pytest.approx(0.9),
                                   "np": 2.0, "_b_": 1.0}


@pytest.mark.parametrize(("batch", "size"), [
    (torch.zeros(7, 3), 7),
    ((torch.zeros(5, 2), torch.zeros(5)), 5),
    ({"input_ids": torch.zeros(4, 16), "labels": torch.zeros(4, 16)}, 4),
    ([{"x": torch.zeros(6)}], 6),
    ({"text": ["a", "b"]}, None),
    (torch.tensor(3.0), None),
])
def test_a_batch_size_is_the_first_dimension_of_its_first_tensor(batch: object,
                                                                 size: int | None) -> None:
    assert batch_size(batch) == size


def test_an_integration_that_cannot_reach_muster_says_so_once_and_stays_out_of_the_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "run"
    blocked.write_text("a file where the run directory should be")
    monkeypatch.setenv("MUSTER_RUN_DIR", str(blocked))
    session = Session(Integration.LIGHTNING)

    assert session.start() is None
    session.report(False, 1, {"loss": 1.0})
    session.plan("steps", 10)
    with session.saving(1, {}) as directory:
        assert directory is None  # the framework writes where it asked
    assert not session.should_stop() and session.latest() is None

    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1
    assert said[0].startswith("muster: the lightning integration is off for the rest of this "
                              "run: connecting to muster failed: ")


def test_a_session_joins_the_block_the_script_opened_and_leaves_it_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import muster.harness as mh

    monkeypatch.setenv("MUSTER_RUN_DIR", str(tmp_path / "run"))
    with mh.init() as ctx:
        session = Session(Integration.TRANSFORMERS)
        assert session.start() is ctx
        session.report(True, 3, {"eval_loss": 0.5})
        session.close()  # not its block: nothing happens
        ctx.report_training(4, {"loss": 1.0})
    lines = (tmp_path / "run" / "attempt-1" / "rank-0.metrics.jsonl").read_text().splitlines()
    assert [(json.loads(line)["kind"], json.loads(line)["step"]) for line in lines] == [
        ("validation", 3), ("training", 4)]
    heartbeat = json.loads((tmp_path / "run/attempt-1/rank-0.heartbeat.json").read_text())
    assert heartbeat["integration"] == "harness"  # the script's own block
