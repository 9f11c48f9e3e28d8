"""The `diagnostics` and `debug` sections: what loads, what is refused, and what each rank's
environment gets from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.config import DiagnosticsConfig, ExperimentConfig, load_config
from muster.errors import ConfigError
from muster.rundir import RunDir
from muster.supervise.launching import AttemptPlan, replica_specs

BASE = "name: x\nentrypoint: python t.py\n"
CHECK_NAMES = ("sampler_overlap", "rank_seeds", "grad_norm_spread", "replica_hash",
               "finite_all_ranks", "sample_balance", "epoch_order")


def loaded(body: str) -> ExperimentConfig:
    return load_config(BASE + body, source="exp.yaml")


def problem(body: str) -> str:
    with pytest.raises(ConfigError) as info:
        loaded(body)
    return str(info.value)


def test_defaults() -> None:
    config = loaded("")
    assert config.diagnostics == DiagnosticsConfig()
    diagnostics = config.diagnostics
    assert (diagnostics.record, diagnostics.interval) == (True, 20)
    assert {name: getattr(diagnostics, name) for name in CHECK_NAMES} == {
        "sampler_overlap": "suspect", "rank_seeds": "suspect", "grad_norm_spread": "suspect",
        "replica_hash": "suspect", "finite_all_ranks": "suspect", "sample_balance": "warn",
        "epoch_order": "warn"}
    assert (diagnostics.overlap_bound, diagnostics.spread_bound, diagnostics.ratio_bound,
            diagnostics.imbalance_bound) == (0.5, 0.5, 20.0, 1.2)
    assert config.debug.torch_distributed == "off"


@pytest.mark.parametrize("check", CHECK_NAMES)
@pytest.mark.parametrize("mode", ["suspect", "warn", "off"])
def test_each_mode_is_accepted_for_each_check(check: str, mode: str) -> None:
    diagnostics = loaded(f"diagnostics: {{{check}: '{mode}'}}\n").diagnostics
    assert getattr(diagnostics, check) == mode


@pytest.mark.parametrize(("body", "section", "key"), [
    ("diagnostics: {sampler_overlap: off}\n", "diagnostics", "sampler_overlap"),
    ("debug: {torch_distributed: off}\n", "debug", "torch_distributed"),
], ids=["check", "debug"])
def test_off_loads_unquoted_as_the_docs_write_it(body: str, section: str, key: str) -> None:
    # YAML 1.1 reads a bare `off` as false; docs/diagnostics.md and docs/config.md write
    # `torch_distributed: off` and `each check: suspect | warn | off` without quotes.
    assert getattr(getattr(loaded(body), section), key) == "off"


def test_the_documented_example_loads() -> None:
    text = (Path(__file__).parents[2] / "docs" / "diagnostics.md").read_text()
    [example] = [block for block in text.split("```yaml\n")[1:]
                 if block.startswith("diagnostics:")]
    config = loaded(example.split("```")[0])
    assert config.diagnostics == DiagnosticsConfig()
    assert config.debug.torch_distributed == "off"


def test_a_full_section_loads() -> None:
    diagnostics = loaded(
        "diagnostics: {record: false, interval: 5, overlap_bound: 0.1, spread_bound: 2,\n"
        "              ratio_bound: 1.5, imbalance_bound: 3}\n").diagnostics
    assert (diagnostics.record, diagnostics.interval) == (False, 5)
    assert (diagnostics.overlap_bound, diagnostics.spread_bound, diagnostics.ratio_bound,
            diagnostics.imbalance_bound) == (0.1, 2.0, 1.5, 3.0)


def test_a_bad_mode_names_its_key() -> None:
    message = problem("diagnostics: {sampler_overlap: strict}\n")
    assert "diagnostics.sampler_overlap" in message
    assert "'suspect'" in message and "'warn'" in message and "'off'" in message


@pytest.mark.parametrize(("body", "key"), [
    ("interval: 0", "diagnostics.interval"),
    ("interval: -5", "diagnostics.interval"),
    ("interval: 1000001", "diagnostics.interval"),
    ("interval: 2.5", "diagnostics.interval"),
    ("overlap_bound: 0", "diagnostics.overlap_bound"),
    ("overlap_bound: 1.5", "diagnostics.overlap_bound"),
    ("spread_bound: 0", "diagnostics.spread_bound"),
    ("spread_bound: -1", "diagnostics.spread_bound"),
    ("ratio_bound: 1", "diagnostics.ratio_bound"),
    ("ratio_bound: 0.5", "diagnostics.ratio_bound"),
    ("imbalance_bound: 1", "diagnostics.imbalance_bound"),
    ("imbalance_bound: 0", "diagnostics.imbalance_bound"),
    ("record: maybe", "diagnostics.record"),
    ("sampler_overlaps: warn", "diagnostics.sampler_overlaps"),
])
def test_out_of_range_values_are_refused(body: str, key: str) -> None:
    assert key in problem(f"diagnostics: {{{body}}}\n")


@pytest.mark.parametrize("body", ["interval: 1", "interval: 1000000", "overlap_bound: 1",
                                  "ratio_bound: 1.01", "imbalance_bound: 1.01"])
def test_values_at_the_bounds_are_accepted(body: str) -> None:
    loaded(f"diagnostics: {{{body}}}\n")


@pytest.mark.parametrize("value", ["true", "false"])
def test_determined_debug_flag_is_refused_with_the_muster_spelling(value: str) -> None:
    message = problem(f"debug: {value}\n")
    assert "debug" in message
    assert "torch_distributed" in message
    assert "Determined" in message


def test_debug_refuses_other_levels() -> None:
    message = problem("debug: {torch_distributed: info}\n")
    assert "debug.torch_distributed" in message


def test_debug_detail_loads() -> None:
    assert loaded("debug: {torch_distributed: detail}\n").debug.torch_distributed == "detail"


# --- what the ranks get -------------------------------------------------------------------

RUN = RunDir(Path("/home/runs/trial-uuid"))


def specs_env(body: str) -> list[dict[str, str]]:
    config = loaded("resources: {replicas: 2}\n" + body)
    plan = AttemptPlan(trial_id=7, trial_uuid="trial-uuid", trial_number=3, number=1,
                       dir=RUN.attempt(1), config=config, workdir=RUN.workdir,
                       master_port=29500, latest_checkpoint=None, gpus=None, seed=None)
    return [spec.env for spec in replica_specs(plan)]


@pytest.mark.parametrize(("body", "diagnostics", "debug"), [
    ("", "20", None),
    ("diagnostics: {interval: 7}\n", "7", None),
    ("diagnostics: {record: false, interval: 7}\n", "off", None),
    ("debug: {torch_distributed: detail}\n", "20", "DETAIL"),
    ("debug: {torch_distributed: 'off'}\n", "20", None),
])
def test_every_rank_gets_the_diagnostics_and_debug_variables(
        body: str, diagnostics: str, debug: str | None) -> None:
    envs = specs_env(body)
    assert len(envs) == 2
    for env in envs:
        assert env["MUSTER_DIAGNOSTICS"] == diagnostics
        assert env.get("TORCH_DISTRIBUTED_DEBUG") == debug


def test_the_config_variables_do_not_override_the_diagnostics_switch() -> None:
    envs = specs_env("environment: {variables: {MUSTER_DIAGNOSTICS: '3'}}\n"
                     "diagnostics: {record: false}\n")
    assert {env["MUSTER_DIAGNOSTICS"] for env in envs} == {"off"}
