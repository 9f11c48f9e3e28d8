"""`verify.metrics_from_log` and `verify.log_metrics`: bounded, checked at submission, with
messages that name the key and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from muster.config import ExperimentConfig
from muster.config.schema import MAX_LOG_METRIC_PATTERNS, MAX_PATTERN_CHARS
from muster.errors import ConfigError


def _config(**verify: Any) -> ExperimentConfig:
    return ExperimentConfig.from_json_dict(
        {"name": "t", "entrypoint": "python train.py", "verify": verify})


def test_defaults_read_logs_of_plain_scripts_with_no_named_regex() -> None:
    verify = _config().verify
    assert (verify.log_metrics, verify.metrics_from_log) == ("auto", {})
    assert _config(log_metrics=False).verify.log_metrics == "off"  # YAML's bare `off`


@pytest.mark.parametrize(("patterns", "message"), [
    ({"acc": "acc (?P<val>[0-9.]+)"},
     r"verify\.metrics_from_log\.acc: needs a named group `value`"),
    ({"acc": "acc (?P<value>[0-9.]+"},
     r"verify\.metrics_from_log\.acc: is not a regular expression"),
    ({"two words": "x (?P<value>1)"},
     r"verify\.metrics_from_log\.two words: a metric name must be 1 to 128 characters"),
    ({"acc": "(?P<value>1)" + "x" * MAX_PATTERN_CHARS},
     rf"must be a regular expression of 1 to {MAX_PATTERN_CHARS} characters"),
    ({f"m{i}": "(?P<value>1)" for i in range(MAX_LOG_METRIC_PATTERNS + 1)},
     r"verify\.metrics_from_log: .*at most 20"),
    ({"acc": 5}, r"verify\.metrics_from_log\.acc: .*string"),
])
def test_bad_named_regexes_are_refused_with_the_fix(patterns: dict[str, Any],
                                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(metrics_from_log=patterns)


def test_a_good_named_regex_is_kept() -> None:
    patterns = {"tokens_per_s": r"tok/s (?P<value>\S+) at step (?P<step>\d+)"}
    assert _config(metrics_from_log=patterns).verify.metrics_from_log == patterns


def test_log_metrics_takes_auto_or_off() -> None:
    with pytest.raises(ConfigError, match=r"verify\.log_metrics"):
        _config(log_metrics="always")
