"""The cluster config's `retention:` as `muster up` reads it: ages as durations, the logs no
later than the runs, bounded lists, and one clear message per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.config.cluster import MAX_KEEP_LABELS, RetentionConfig, load_cluster_config
from muster.config.units import format_duration, parse_duration
from muster.errors import ConfigError


def _load(tmp_path: Path, text: str) -> RetentionConfig | None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return load_cluster_config(path, tmp_path / "absent.yaml").retention


def test_the_documented_example_reads_as_seconds(tmp_path: Path) -> None:
    retention = _load(tmp_path, "retention: {logs_after: 90d, runs_after: 180d, "
                                "keep_registered: true, keep_labels: [keep]}\n")
    assert retention is not None
    assert (retention.logs_after, retention.runs_after) == (90 * 86400.0, 180 * 86400.0)
    assert (retention.keep_registered, retention.keep_labels) == (True, ["keep"])


def test_left_out_it_is_off_and_each_age_is_optional(tmp_path: Path) -> None:
    assert _load(tmp_path, "slots: 2\n") is None
    only_runs = _load(tmp_path, "retention: {runs_after: 2s}\n")
    assert only_runs is not None
    assert (only_runs.logs_after, only_runs.runs_after) == (None, 2.0)
    assert (only_runs.keep_registered, only_runs.keep_labels) == (True, [])


@pytest.mark.parametrize(("text", "problem"), [
    ("retention: {logs_after: 180d, runs_after: 90d}",
     "retention: logs_after (180d) is longer than runs_after (90d), which removes the logs "
     "with the run: make logs_after at most runs_after, or leave it out"),
    ("retention: {logs_after: 90 days}", "retention.logs_after: must look like '30s'"),
    ("retention: {runs_after: 0s}", "retention.runs_after: must be > 0"),
    ("retention: {run_after: 2s}", "retention.run_after: unknown key; did you mean 'runs_after'?"),
    ("retention: {keep_registered: 'yes'}", "retention.keep_registered"),
    ("retention: {keep_labels: ['']}", "retention.keep_labels[0]: must not be empty"),
    (f"retention: {{keep_labels: [{', '.join(f'l{i}' for i in range(MAX_KEEP_LABELS + 1))}]}}",
     "retention.keep_labels"),
])
def test_a_mistake_names_its_key_and_the_fix(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, text + "\n")
    assert problem in str(raised.value)


@pytest.mark.parametrize("text", ["90d", "180d", "1s", "2s", "1h30m", "2d3h4m5s", "1.5s", "0s"])
def test_a_duration_is_said_as_a_config_says_it(text: str) -> None:
    assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)
    assert format_duration(parse_duration("90d")) == "90d"
    assert format_duration(parse_duration("500ms")) == "0.5s"
    with pytest.raises(ValueError, match="a duration is a number of seconds >= 0"):
        format_duration(-1.0)
