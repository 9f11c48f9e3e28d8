"""Metric and hyperparameter names in a submitted config follow the one rule of
`muster.metrics_lines` (NAME_RULE), stated in the problem; a config stored before the rule
is read back as it was accepted."""

from __future__ import annotations

import pytest
import yaml

from muster.config import ExperimentConfig, load_config
from muster.errors import ConfigError
from muster.metrics_lines import NAME_RULE

SEARCH = """\
name: x
entrypoint: python t.py
hyperparameters:
  {hparam}: {{type: double, minval: 0.1, maxval: 0.9}}
  model: {{depth: 3}}
verify: {{require_metrics: [loss, {required}]}}
searcher: {{name: random, max_trials: 2, metric: {metric}}}
"""
HOSTILE = "'<img src=x onerror=alert(1)>'"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(text, source="exp.yaml")
    return str(info.value).splitlines()[1:]


@pytest.mark.parametrize("name", ["val_loss", "train/loss", "eval_accuracy", "lr-Adam",
                                  "lr-Adam/pg1", "loss_step", "top1@5", "val:f1+"])
def test_the_names_real_code_reports_are_accepted(name: str) -> None:
    config = load_config(SEARCH.format(hparam="lr", required=name, metric=name))
    assert config.searcher.metric == name and config.verify.require_metrics == ["loss", name]


def test_each_name_that_breaks_the_rule_is_a_problem_stating_the_rule() -> None:
    text = SEARCH.format(hparam="'learning rate'", required="'a&b'", metric=HOSTILE)
    assert problems(text.replace("depth", "'de\"pth'")) == [
        f"verify.require_metrics[1]: a metric name must be {NAME_RULE}; got 'a&b'",
        f"hyperparameters.learning rate: a hyperparameter name must be {NAME_RULE}; "
        "got 'learning rate'",
        f"hyperparameters.model.de\"pth: a hyperparameter name must be {NAME_RULE}; "
        "got 'model.de\"pth'",
        f"searcher.metric: a metric name must be {NAME_RULE}; got "
        "'<img src=x onerror=alert(1)>'; name the validation metric as the script reports it",
    ]


def test_a_long_name_is_shown_cut() -> None:
    (problem,) = problems(SEARCH.format(hparam="lr", required="loss", metric="x" * 5000))
    assert problem.endswith("got '" + "x" * 60 + "'...; name the validation metric as the "
                            "script reports it")


def test_a_config_stored_before_the_rule_is_read_back() -> None:
    """The store's configs are validated again without the submission's rules: an old
    experiment with such a name still runs and shows (its page writes the name as text)."""
    stored = yaml.safe_load(SEARCH.format(hparam="'learning rate'", required="'a b'",
                                          metric=HOSTILE))
    config = ExperimentConfig.model_validate(stored)
    assert config.searcher.metric == "<img src=x onerror=alert(1)>"
    assert "learning rate" in config.space().params
