"""Metrics read from logs (`muster.supervise.log_metrics`): the recognisers against lines
as the real trainers print them, the scan's positions (a scan resumed anywhere reads what
one whole scan reads), the bounds, the child process, and the evidence's words."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import pytest

from muster.config import ExperimentConfig
from muster.launch.local import LocalLauncher
from muster.launch.logs import FileLog
from muster.metrics_lines import name_problem
from muster.rundir import RankFiles
from muster.supervise import log_metrics
from muster.supervise.log_metrics import (
    LogMetricEvidence,
    NonFiniteValue,
    Position,
    ScanSpec,
    log_metric_evidence,
    recognise,
    scan,
    scan_log,
)
from muster.supervise.log_samples import MAX_LINE_BYTES

NAN = math.nan
INF = math.inf

# Lines as the trainers print them (copied from their output and their print statements).
RECOGNISED = [
    # Hugging Face Trainer (ProgressCallback.on_log / PrinterCallback: `str(logs)`)
    ("{'loss': 0.1234, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}",
     {"loss": 0.1234, "grad_norm": 1.2, "learning_rate": 5e-05, "epoch": 0.5}, None),
    ("{'eval_loss': 0.6931, 'eval_accuracy': 0.5, 'eval_runtime': 1.25, "
     "'eval_samples_per_second': 80.0, 'eval_steps_per_second': 10.0, 'epoch': 1.0}",
     {"eval_loss": 0.6931, "eval_accuracy": 0.5, "eval_runtime": 1.25,
      "eval_samples_per_second": 80.0, "eval_steps_per_second": 10.0, "epoch": 1.0}, None),
    ("{'loss': nan, 'grad_norm': inf, 'learning_rate': 4.5e-05, 'epoch': 0.1}",
     {"loss": NAN, "grad_norm": INF, "learning_rate": 4.5e-05, "epoch": 0.1}, None),
    ("{'train_runtime': 12.3, 'train_samples_per_second': 8.1, 'train_loss': 0.45, "
     "'epoch': 3.0}",
     {"train_runtime": 12.3, "train_samples_per_second": 8.1, "train_loss": 0.45,
      "epoch": 3.0}, None),
    ("{'loss': np.float64(0.25), 'epoch': 2.0}", {"loss": 0.25, "epoch": 2.0}, None),
    # Lightning 1.x and 2.x progress bars (TQDMProgressBar: postfix after the rate)
    ("Epoch 0:  50%|█████     | 5/10 [00:01<00:01,  4.50it/s, loss=0.123, v_num=0]",
     {"loss": 0.123}, 5),
    ("Epoch 2: 100%|██████████| 10/10 [00:02<00:00,  4.61it/s, v_num=3, train_loss=nan, "
     "val_loss=1.2e+03]",
     {"train_loss": NAN, "val_loss": 1200.0}, 30),
    ("Epoch 1:  30%|███       | 3/? [00:00<00:00, 12.00it/s, loss=0.5]", {"loss": 0.5}, 3),
    ("100%|██████████| 100/100 [00:10<00:00,  9.86it/s, loss=2.31]", {"loss": 2.31}, 100),
    # nanoGPT (train.py): validation every eval_interval, training every log_interval
    ("step 100: train loss 2.3456, val loss 2.4567",
     {"train_loss": 2.3456, "val_loss": 2.4567}, 100),
    ("iter 100: loss 2.3456, time 123.45ms, mfu 12.34%", {"loss": 2.3456}, 100),
    # pytorch/examples word_language_model (main.py)
    ("| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 12.34 | loss  6.99 | "
     "ppl  1085.61", {"loss": 6.99, "ppl": 1085.61}, None),
    ("| end of epoch   1 | time: 30.12s | valid loss  5.65 | valid ppl   284.81",
     {"valid_loss": 5.65, "valid_ppl": 284.81}, None),
    ("| End of training | test loss  5.52 | test ppl   249.83",
     {"test_loss": 5.52, "test_ppl": 249.83}, None),
    # plain prints
    ("loss: 0.123", {"loss": 0.123}, None),
    ("loss=nan", {"loss": NAN}, None),
    ("val loss 5.43", {"val_loss": 5.43}, None),
    ("Loss is nan, stopping training", {"loss": NAN}, None),  # torchvision's references
    ("Epoch 3, Train Loss: -inf, Val Accuracy: 0.91", {"train_loss": -INF,
                                                       "val_accuracy": 0.91}, None),
    ("step: 40 loss = 1e-3", {"loss": 0.001}, 40),
]

NOT_RECOGNISED = [
    '  File "/home/me/train/loss.py", line 12, in forward',
    "lossy compression 0.5",
    "epoch 3 done, lr 0.001",
    "Validation DataLoader 0: 100%|██████████| 5/5 [00:00<00:00, 50.00it/s]",
    "{'note': 'no numbers here'}",
    "",
]


@pytest.mark.parametrize(("line", "values", "step"), RECOGNISED)
def test_recognisers_read_what_the_trainers_print(
    line: str, values: dict[str, float], step: int | None
) -> None:
    (found, found_step), unusable = recognise(line)
    assert found.keys() == values.keys()
    for name, value in values.items():
        assert found[name] == value or (math.isnan(value) and math.isnan(found[name]))
        assert name_problem(name) is None
    assert (found_step, unusable) == (step, 0)


@pytest.mark.parametrize("line", NOT_RECOGNISED)
def test_recognisers_leave_other_lines_alone(line: str) -> None:
    assert recognise(line) == (({}, None), 0)


def test_named_regexes_come_first_and_builtin_ones_can_be_off() -> None:
    patterns = {"tokens_per_s": re.compile(r"tok/s (?P<value>\S+)"),
                "loss": re.compile(r"L=(?P<value>\S+) @(?P<step>\d+)"),
                "bad": re.compile(r"bad=(?P<value>\w+)")}
    line = "L=0.5 @7 tok/s 1234.5 bad=oops loss: 9.0"
    assert recognise(line, patterns) == (({"tokens_per_s": 1234.5, "loss": 0.5}, 7), 1)
    assert recognise("loss: 9.0", patterns, builtin=False) == (({}, None), 0)


def _log(*lines: str, end: str = "\n") -> bytes:
    return (end.join(lines) + end).encode()


def test_a_scan_reports_lines_offsets_steps_and_kinds() -> None:
    data = _log("starting", "{'loss': 0.5, 'epoch': 0.5}", "{'eval_loss': nan, 'epoch': 1.0}",
                "step 9: train loss 2.0, val loss 2.5")
    result = scan(io.BytesIO(data), ScanSpec())
    rows = [(r.kind, r.step, r.values, r.line, r.offset) for r in result.reports]
    eval_at = data.index(b"{'eval")
    assert rows[0] == ("training", 0, {"loss": 0.5, "epoch": 0.5}, 2, 9)
    assert rows[1][:2] == ("validation", 1) and rows[1][3:] == (3, eval_at)
    assert set(rows[1][2]) == {"eval_loss", "epoch"}  # HF's epoch stays with its eval
    assert rows[2:] == [("training", 9, {"train_loss": 2.0}, 4, data.index(b"step 9")),
                        ("validation", 9, {"val_loss": 2.5}, 4, data.index(b"step 9"))]
    assert result.end == Position(len(data), 4, 3)
    assert repr(result.non_finite) == repr([("eval_loss", NAN, 1, 3, eval_at)])
    assert result.non_finite_count == 1


def test_tqdm_rewrites_are_pieces_and_a_torn_one_waits() -> None:
    bar = "Epoch 0: {p}%|█| {n}/10 [00:00<00:01, 9.9it/s, loss={v}, v_num=0]"
    data = (bar.format(p=10, n=1, v=0.5) + "\r" + bar.format(p=10, n=1, v=0.5) + "\r"
            + bar.format(p=20, n=2, v=0.4) + "\r" + "Epoch 0: 30").encode()
    result = scan(io.BytesIO(data), ScanSpec())
    assert [(r.step, r.values, r.line) for r in result.reports] == [
        (1, {"loss": 0.5}, 1), (2, {"loss": 0.4}, 1)]  # the redraw with the same values: once
    assert result.end.offset == data.rindex(b"\r") + 1 and result.end.lines == 0
    final = scan(io.BytesIO(data[result.end.offset:]),
                 ScanSpec(start=result.end, final=True))
    assert final.end.offset == len(data) and final.reports == []


def test_a_scan_resumed_anywhere_reads_what_one_scan_reads() -> None:
    lines = [f"iter {i}: loss {i / 10}" if i % 3 else f"noise {i}" for i in range(40)]
    lines[17] = "step 17: train loss nan, val loss 3.0"
    data = _log(*lines)
    whole = scan(io.BytesIO(data), ScanSpec())
    for cut in (1, 7, 100, len(data) // 2, len(data) - 3):
        first = scan(io.BytesIO(data[:cut]), ScanSpec())
        rest = scan(io.BytesIO(data[first.end.offset:]), ScanSpec(start=first.end))
        assert repr(first.reports + rest.reports) == repr(whole.reports)  # (NaN != NaN)
        assert rest.end == whole.end


def test_long_lines_are_cut_and_counted_once() -> None:
    data = b"x" * (3 * MAX_LINE_BYTES) + b" loss: 1.0\nloss: 2.0\n"
    result = scan(io.BytesIO(data), ScanSpec())
    assert [(r.values, r.line) for r in result.reports] == [({"loss": 2.0}, 2)]
    assert result.end == Position(len(data), 2, 1)


def test_a_bar_redrawn_for_megabytes_on_one_line_is_read_piece_by_piece() -> None:
    pieces = [f"Epoch 0: |#| {n}/9000 [00:00<00:01, 9.9it/s, loss={n}]" for n in range(9000)]
    data = ("\r".join(pieces) + "\n").encode()  # ~460 KB: pieces span the 64 KiB reads
    result = scan(io.BytesIO(data), ScanSpec())
    assert [r.step for r in result.reports] == list(range(9000))
    assert all(data[r.offset:].startswith(pieces[r.step].encode()) for r in result.reports)
    assert {r.line for r in result.reports} == {1} and result.end == Position(len(data), 1,
                                                                               9000)


def test_past_the_bound_reports_are_thinned_but_non_finite_ones_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_metrics, "MAX_REPORTS_KEPT", 10)
    lines = [f"loss: {i}" for i in range(100)]
    lines[55] = "loss: nan"
    result = scan(io.BytesIO(_log(*lines)), ScanSpec())
    kept = [r.step for r in result.reports]
    assert kept[:10] == list(range(10)) and 55 in kept
    assert 20 <= len(kept) <= 10 + 5 * 4 + 1  # 10 in full, then one in 2, 4, 8, 16
    assert result.values == 100 and result.end.reports == 100


def _spec_config(**verify: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {"name": "t", "entrypoint": "python train.py", "verify": verify})


def _write_log(attempt_dir: Path, rank: int, data: bytes) -> None:
    path = RankFiles(attempt_dir, rank).log
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_evidence_names_the_first_nan_by_line_and_rank(tmp_path: Path) -> None:
    lines = [f"iter {i}: loss {1 / (i + 1):.3f}" for i in range(1300)]
    lines[1203] = "iter 1203: loss nan"
    lines[1250] = "iter 1250: loss inf"
    _write_log(tmp_path / "attempt-1", 0, _log(*lines))
    _write_log(tmp_path / "attempt-1", 1, _log("loss: 0.5"))
    evidence = log_metric_evidence(LocalLauncher(), {1: (tmp_path / "attempt-1", [0, 1])},
                                   _spec_config())
    assert evidence.scanned and evidence.names == {"loss"}
    assert evidence.values == 1301 and evidence.non_finite_count == 2
    assert evidence.steps == {0, 1, 2}  # a few distinct steps: the report was a series
    assert evidence.describe() == ("loss was nan at line 1,204 of rank 0; and 1 more "
                                   "non-finite value")
    first = evidence.non_finite[0]
    assert (first.attempt, first.rank, first.step, first.line) == (1, 0, 1203, 1204)
    assert first.offset == _log(*lines).index(b"iter 1203: loss nan")


def test_evidence_reads_nothing_where_nothing_applies(tmp_path: Path) -> None:
    _write_log(tmp_path / "attempt-1", 0, _log("loss: nan"))
    where = {1: (tmp_path / "attempt-1", [0])}
    for config, harness_metrics in ((_spec_config(log_metrics="off"), False),
                                    (_spec_config(), True)):
        assert log_metric_evidence(LocalLauncher(), where, config,
                                   harness_metrics) == LogMetricEvidence()
    named = _spec_config(log_metrics="off", metrics_from_log={"acc": r"acc (?P<value>\S+)"})
    assert log_metric_evidence(LocalLauncher(), where, named).scanned


def test_describe_words() -> None:
    value = NonFiniteValue("val_loss", -INF, 3, 2, 1, 12_345, 99)
    assert value.describe() == "val_loss was -inf at line 12,345 of rank 1"
    assert LogMetricEvidence().describe() is None


def test_a_pattern_that_backtracks_costs_its_timeout_not_the_server(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"a" * 60_000 + b"!\n")
    spec = ScanSpec({"x": r"(a|aa)+$(?P<value>1)"}, builtin=False)
    result = scan_log(FileLog(0, path), spec, timeout=1)
    assert result.problem is not None and "took longer than 1 s" in result.problem
    assert result.end == Position() and result.reports == []
