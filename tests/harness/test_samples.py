"""Sample accounting: per rank, per epoch, written when it changed and at exit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import muster.harness as mh
from muster.harness.samples import Samples
from tests.harness.conftest import Platform


def test_samples_are_counted_per_epoch(on_platform: Platform) -> None:
    with mh.init() as ctx:
        for epoch in range(3):
            for _ in range(4):
                ctx.samples.seen(32, epoch=epoch)
        ctx.samples.seen(np.int64(5), epoch=2)  # type: ignore[arg-type]
    document = json.loads(on_platform.rank_file(".samples.json").read_text())
    assert document == {"rank": 1, "epochs": {"0": 128, "1": 128, "2": 133}}


def test_the_file_is_rewritten_only_when_the_counts_changed(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.samples.json"
    samples = Samples(path, rank=0)
    samples.flush()
    assert not path.exists()  # nothing seen, nothing to say
    samples.seen(3, epoch=0)
    samples.flush()
    assert json.loads(path.read_text())["epochs"] == {"0": 3}
    path.unlink()
    samples.flush()
    assert not path.exists()  # unchanged: not rewritten
    samples.seen(1, epoch=1)
    samples.flush()
    assert json.loads(path.read_text())["epochs"] == {"0": 3, "1": 1}


@pytest.mark.parametrize(
    ("n", "epoch", "error", "message"),
    [
        (-1, 0, ValueError, "samples.seen: n must be ≥ 0"),
        (1.5, 0, TypeError, "samples.seen: n must be an int, got float"),
        (1, -2, ValueError, "samples.seen: epoch must be ≥ 0"),
        (1, "0", TypeError, "samples.seen: epoch must be an int, got str"),
    ],
)
def test_bad_counts_are_refused(
    tmp_path: Path, n: object, epoch: object, error: type[Exception], message: str
) -> None:
    samples = Samples(tmp_path / "s.json", rank=0)
    with pytest.raises(error, match=message):
        samples.seen(n, epoch=epoch)  # type: ignore[arg-type]
    assert samples.by_epoch() == {}
