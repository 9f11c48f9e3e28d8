"""The one format of metrics lines: what the harness writes parses back, each kind of damage
is refused with its reason, and ingestion and verification judge the same lines alike."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from muster import metrics_lines
from muster.config import VerifyConfig
from muster.harness.metrics import MetricsWriter
from muster.metrics_lines import BadLine, MetricLine, parse
from muster.states import MetricKind
from muster.store import Store
from muster.supervise.ingest import ingest_trial
from muster.supervise.verification import gather_evidence, verify
from tests.supervise.test_ingest import add_run, stored

GOOD = b'{"kind": "training", "step": 3, "metrics": {"loss": 0.5}, "time": 17e8, "rank": 0}'
# Every way a complete line can fail, and the words of its refusal.
DAMAGED = [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "a report is a JSON object"),
    (b'{"kind": "test", "step": 3, "metrics": {}, "time": 1.0, "rank": 0}', '"kind"'),
    (b'{"kind": ["training"], "step": 3, "metrics": {}, "time": 1.0, "rank": 0}', '"kind"'),
    # the shim's resource samples have a file of their own: a run cannot report one
    (b'{"kind": "system", "step": 3, "metrics": {}, "time": 1.0, "rank": 0}',
     '"kind" must be "training" or "validation", got \'system\''),
    (b'{"kind": "training", "step": "3", "metrics": {}, "time": 1.0, "rank": 0}', '"step"'),
    (b'{"kind": "training", "step": 3.0, "metrics": {}, "time": 1.0, "rank": 0}', '"step"'),
    (b'{"kind": "training", "step": true, "metrics": {}, "time": 1.0, "rank": 0}', '"step"'),
    (b'{"kind": "training", "step": 9223372036854775808, "metrics": {}, "time": 1.0, '
     b'"rank": 0}', '"step"'),
    (b'{"kind": "training", "step": 3, "metrics": {}, "rank": 0}', '"time"'),
    (b'{"kind": "training", "step": 3, "metrics": {}, "time": NaN, "rank": 0}', '"time"'),
    (b'{"kind": "training", "step": 3, "metrics": {}, "time": 1.0}', '"rank"'),
    (b'{"kind": "training", "step": 3, "metrics": {}, "time": 1.0, "rank": 1}', '"rank"'),
    (b'{"kind": "training", "step": 3, "metrics": [1], "time": 1.0, "rank": 0}', '"metrics"'),
    (b'{"kind": "training", "step": 3, "metrics": {"loss": "low"}, "time": 1.0, "rank": 0}',
     "'loss' is 'low'"),
    (b'{"kind": "training", "step": 3, "metrics": {"loss": true}, "time": 1.0, "rank": 0}',
     "'loss' is True"),
    (b"[" * 100_000, "not valid JSON"),
    # a hand-written line with a name the harness refuses (NAME_RULE): never stored
    (b'{"kind": "validation", "step": 3, "metrics": {"<img src=x onerror=alert(1)>": 1.0}, '
     b'"time": 1.0, "rank": 0}', "a metric name must be 1 to 128 characters"),
    (b'{"kind": "training", "step": 3, "metrics": {"val loss": 1.0}, "time": 1.0, "rank": 0}',
     "got 'val loss'"),
    (b'{"kind": "training", "step": 3, "metrics": {"": 1.0}, "time": 1.0, "rank": 0}',
     "a metric name must be"),
]
# Names real code reports (Lightning, Hugging Face, torchmetrics, Keras), and names a page or
# a terminal could take for markup, quoting or control.
GOOD_NAMES = ["loss", "train/loss", "val_loss", "eval_accuracy", "lr-Adam", "lr-Adam/pg1",
              "epoch", "loss_step", "loss_epoch", "top1@5", "val_loss/dataloader_idx_0",
              "MulticlassAccuracy", "_private", "0.5-quantile", "val:f1+", "x" * 128]
BAD_NAMES = ["", "<img src=x onerror=alert(1)>", "a&b", 'say"hi"', "it's", "`id`", "val loss",
             "tab\tname", "new\nline", "nul\x00", "100%", "-flag", "/abs", ".hidden",
             "é", "x" * 129]


def test_a_good_line_parses() -> None:
    assert parse(GOOD + b"\n", 0) == MetricLine("training", 3, 1.7e9, 0, {"loss": 0.5})


def test_a_file_of_resource_samples_holds_system_lines_alone() -> None:
    sample = b'{"kind": "system", "step": 17000, "metrics": {"system/cpu_percent": 98.5}, ' \
        b'"time": 17.0, "rank": 1}\n'
    assert parse(sample, 1, metrics_lines.SYSTEM_KINDS) == MetricLine(
        MetricKind.SYSTEM, 17000, 17.0, 1, {"system/cpu_percent": 98.5})
    with pytest.raises(BadLine, match='"kind" must be "system", got \'training\''):
        parse(GOOD, 0, metrics_lines.SYSTEM_KINDS)


@pytest.mark.parametrize("line", [b"", b"\n", b"  \t \n"])
def test_a_blank_line_is_no_report(line: bytes) -> None:
    assert parse(line, 0) is None


@pytest.mark.parametrize(("line", "why"), DAMAGED)
def test_damaged_lines_are_refused_with_the_reason(line: bytes, why: str) -> None:
    with pytest.raises(BadLine, match=re.escape(why)):
        parse(line, 0)


def test_only_a_line_with_its_newline_is_complete() -> None:
    assert metrics_lines.is_complete(GOOD + b"\n") and not metrics_lines.is_complete(GOOD)


def test_what_the_harness_writes_parses_back_exactly(tmp_path: Path) -> None:
    path = tmp_path / "rank-2.metrics.jsonl"
    writer = MetricsWriter(path, rank=2)
    reports = [("training", 0, {"loss": 0.1 + 0.2, "lr-Adam/pg1": 3}),
               ("validation", 2**62, {"acc": math.inf, "neg": -math.inf}),
               ("training", 7, {"loss": math.nan, "top1@5": 1e-300})]
    for kind, step, values in reports:
        writer.report(kind, step, values)
    writer.close()
    lines = path.read_bytes().splitlines(keepends=True)
    parsed = [parse(line, 2) for line in lines]
    assert all(metrics_lines.is_complete(line) for line in lines)
    for (kind, step, values), got in zip(reports, parsed, strict=True):
        assert got is not None and (got.kind, got.step, got.rank) == (kind, step, 2)
        assert got.metrics.keys() == values.keys()
        for name, value in values.items():
            assert got.metrics[name] == value or (math.isnan(value)
                                                  and math.isnan(got.metrics[name]))
        assert math.isfinite(got.time)


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_a_name_real_code_reports_is_written_and_read_back(name: str) -> None:
    line = metrics_lines.template("validation", (name,), 0) % (3, 0.5, 1_764_487_282 * 10**9)
    parsed = parse(line.encode(), 0)
    assert parsed is not None and parsed.metrics == {name: 0.5}


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_that_breaks_the_rule_is_refused_with_the_rule(name: str) -> None:
    assert not re.fullmatch(metrics_lines.NAME_PATTERN, name)
    with pytest.raises(ValueError, match=re.escape(metrics_lines.NAME_RULE)):
        metrics_lines.template("training", ("loss", name), 0)


def test_json_number_writes_what_the_parser_reads() -> None:
    for value in (0, -3, 2**70, 0.1, -1e-310, math.inf, -math.inf):
        assert metrics_lines.json_number(value) in (repr(value), "Infinity", "-Infinity")
    assert metrics_lines.json_number(math.nan) == "NaN"


def test_ingestion_and_verification_give_one_verdict(store: Store, tmp_path: Path) -> None:
    """The same damaged file, read by what fills the store and by what judges an exit 0:
    each line is either stored and counted, or refused by both."""
    run = add_run(store, tmp_path / "runs" / "trial-uuid")
    good = [GOOD.replace(b'"step": 3', f'"step": {n}'.encode()) for n in range(4)]
    body = [good[0], *(line for line, _ in DAMAGED), good[1], b"", good[2], b"   ", good[3]]
    torn = b'{"kind": "training", "step": 99, "metr'
    run.append(b"\n".join(body) + b"\n" + torn)
    # rank 1's file with rank 0's lines: every one of them is refused
    run.append(b"\n".join(good) + b"\n", rank=1)

    report = ingest_trial(store, run.trial_id)
    evidence = gather_evidence(run.root, [1])

    refused = len(DAMAGED) + len(good)
    assert (report.metrics_added, report.lines_skipped) == (len(good), refused)
    assert (evidence.metric_lines, evidence.unreadable_metric_lines) == (len(good), refused)
    assert [step for _, _, _, step, _ in stored(store, run.trial_id)] == [0, 1, 2, 3]
    readable = {c.name: c for c in verify(evidence, VerifyConfig(), None).checks}
    assert not readable["metrics_readable"].passed
