"""Issue 30 item 10: the numbers a person writes that are not what they meant.

YAML 1.1 reads `1e-5` (no dot) as a string: every numeric key of a config says so, in the
same words, with the spelling YAML reads as the number. A log range written as values
(`minval: 1.0e-5`) where its exponents are meant is refused with the exponents to write.
Through the real loader (`load_config`, `load_cluster_config`); the server's 422 is in
tests/server/test_submission_checks.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from muster.config import load_config
from muster.config.cluster import load_cluster_config
from muster.config.schema import ExperimentConfig
from muster.config.yaml_numbers import number_written_as_string, yaml_spelling
from muster.errors import ConfigError

BASE = "name: x\nentrypoint: python t.py\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(BASE + text, source="exp.yaml")
    return str(info.value).splitlines()[1:]


def _numeric_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()
                  ) -> list[tuple[tuple[str, ...], bool]]:
    """Every key of `model` (and its sections) that takes a number: (path, whole)."""
    found: list[tuple[tuple[str, ...], bool]] = []
    for name, field in model.model_fields.items():
        kinds = {arg for arg in (get_args(field.annotation) or (field.annotation,))
                 if arg is not type(None)}
        section = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)),
                       None)
        if section is not None:
            found += _numeric_keys(section, (*prefix, name))
        elif kinds and kinds <= {int, float} and bool not in kinds:
            found.append(((*prefix, name), kinds == {int}))
    return found


NUMERIC_KEYS = _numeric_keys(ExperimentConfig)


def test_the_table_below_covers_many_sections() -> None:
    sections = {path[0] for path, _ in NUMERIC_KEYS}
    assert {"failure_policy", "resources", "verify", "searcher"} <= sections, sections
    assert len(NUMERIC_KEYS) >= 15, NUMERIC_KEYS


@pytest.mark.parametrize(("path", "whole"), NUMERIC_KEYS,
                         ids=[".".join(p) for p, _ in NUMERIC_KEYS])
def test_every_numeric_key_says_yaml_read_1e3_as_a_string(path: tuple[str, ...],
                                                          whole: bool) -> None:
    """The same message, whatever the key's own validation (a duration, a size, a bound)."""
    tree: Any = "1e3"
    for part in reversed(path):
        tree = {part: tree}
    found = problems(yaml.safe_dump(tree).replace("'1e3'", "1e3"))
    fix = "1000" if whole else "1.0e+3"
    assert f"{'.'.join(path)}: YAML reads 1e3 as a string: write {fix}" in found, found


@pytest.mark.parametrize(("text", "expected"), [
    ("verify: {samples_tolerance: 1e-3}",
     "verify.samples_tolerance: YAML reads 1e-3 as a string: write 1.0e-3"),
    ("verify: {samples_tolerance: 1.0e-3}", None),  # a number: no problem
    ("failure_policy: {stop_grace: 1e1}",
     "failure_policy.stop_grace: YAML reads 1e1 as a string: write 1.0e+1"),
    ("failure_policy: {transient_exit_codes: [3, 1e2]}",
     "failure_policy.transient_exit_codes[1]: YAML reads 1e2 as a string: write 100"),
    ("resources: {memory_limit: 4e9}",
     "resources.memory_limit: YAML reads 4e9 as a string: write 4000000000"),
    ("searcher: {name: random, metric: l, max_trials: 1E1}\n"
     "hyperparameters: {x: {type: int, minval: 1, maxval: 9}}",
     "searcher.max_trials: YAML reads 1E1 as a string: write 10"),
    ("verify: {samples_tolerance: '0.5'}",
     "verify.samples_tolerance: must be a number, got '0.5', which is quoted: remove the "
     "quotes"),
    ("searcher: {name: random, metric: l, max_trials: 1.5e0}\n"
     "hyperparameters: {x: {type: int, minval: 1, maxval: 9}}",
     "searcher.max_trials: must be a whole number, got '1.5e0'"),
    ("hyperparameters: {lr: {type: double, minval: 1e-5, maxval: 1.0e-2}}",
     "hyperparameters.lr.minval: YAML reads 1e-5 as a string: write 1.0e-5"),
    ("hyperparameters: {lr: {type: log, minval: -5, maxval: 1e0, base: 2e0}}",
     "hyperparameters.lr.maxval: YAML reads 1e0 as a string: write 1.0e+0"),
    ("hyperparameters: {n: {type: int, minval: 1, maxval: 1e3, count: 1e1}}",
     "hyperparameters.n.maxval: YAML reads 1e3 as a string: write 1000"),
])
def test_numbers_yaml_reads_as_strings_say_what_to_write(text: str, expected: str | None
                                                         ) -> None:
    if expected is None:
        load_config(BASE + text)
    else:
        assert expected in problems(text)


def test_each_problem_of_a_space_is_named() -> None:
    found = problems("hyperparameters: {lr: {type: log, minval: -5, maxval: 1e0, base: 2e0},"
                     " n: {type: int, minval: 1, maxval: 9, count: 1e1}}")
    assert found == ["hyperparameters.lr.maxval: YAML reads 1e0 as a string: write 1.0e+0",
                     "hyperparameters.lr.base: YAML reads 2e0 as a string: write 2.0e+0",
                     "hyperparameters.n.count: YAML reads 1e1 as a string: write 10"]


def test_the_cluster_config_says_it_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("slots: 1e1\n")
    with pytest.raises(ConfigError) as info:
        load_cluster_config(path, tmp_path / "absent.yaml")
    assert "slots: YAML reads 1e1 as a string: write 10" in str(info.value)


@pytest.mark.parametrize("written", ["1e-5", "1e5", "1.0e5", "-2E-3", "+3e+2", "5e0"])
def test_the_spelling_offered_is_read_by_yaml_as_the_same_number(written: str) -> None:
    fixed = yaml_spelling(written)
    assert isinstance(yaml.safe_load(written), str)
    assert yaml.safe_load(fixed) == float(written) and isinstance(yaml.safe_load(fixed), float)


@pytest.mark.parametrize("value", ["abc", "1e999", "nan", "inf", "1_0", "", 5, 1.5, None])
def test_what_is_not_a_number_in_a_string_is_left_to_the_key_s_own_message(value: object
                                                                           ) -> None:
    assert number_written_as_string(value) is None


@pytest.mark.parametrize(("bounds", "fix"), [
    ("minval: 1.0e-5, maxval: 1.0e-2",
     "these are exponents of base 10: write minval: -5, maxval: -2"),
    ("minval: 0.0003, maxval: 0.1", "these are exponents of base 10: write minval: -3.52, "
                                    "maxval: -1"),
    ("minval: 0.001, maxval: 0.5, base: 2",
     "these are exponents of base 2: write minval: -9.97, maxval: -1"),
])
def test_a_log_range_written_as_values_is_refused_with_the_exponents(bounds: str, fix: str
                                                                    ) -> None:
    [problem] = problems(f"hyperparameters: {{lr: {{type: log, {bounds}}}}}")
    assert problem.startswith("hyperparameters.lr: minval ") and problem.endswith(fix), problem
    assert "are both between 0 and 1" in problem


@pytest.mark.parametrize("bounds", ["minval: -5, maxval: -2", "minval: -1, maxval: 0.5",
                                    "minval: 0, maxval: 0.5", "minval: 0.5, maxval: 1"])
def test_log_ranges_of_exponents_load(bounds: str) -> None:
    config = load_config(BASE + "searcher: {name: random, metric: l, max_trials: 2}\n"
                         f"hyperparameters: {{lr: {{type: log, {bounds}}}}}\n")
    assert "lr" in config.space().searched()
