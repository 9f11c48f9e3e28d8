"""Loading configs from YAML: one ConfigError, one `<key path>: <problem>` line per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.config import ExperimentConfig, load_config, load_config_file
from muster.errors import ConfigError

GOOD = """\
name: digits-search
description: tiny CNN on sklearn digits
labels: [cnn, digits]
entrypoint: python train.py --epochs 5
environment: {variables: {OMP_NUM_THREADS: 1, LR: 0.5, DEBUG: true}}
failure_policy: {replica_restarts: 1, trial_retries: 2, internal_retries: 0,
                 retry_user_errors: 1, restart_scope: replica,
                 transient_exit_codes: [75, 143], stop_grace: 1m30s}
"""


def problems(text: str) -> list[str]:
    """The problem lines of the ConfigError that loading `text` raises (after the header)."""
    with pytest.raises(ConfigError) as info:
        load_config(text, source="exp.yaml")
    header, *lines = str(info.value).splitlines()
    assert header == "exp.yaml: invalid experiment config:"
    return lines


def one_problem(body: str) -> str:
    lines = problems("name: x\nentrypoint: python t.py\n" + body)
    assert len(lines) == 1, lines
    return lines[0]


def test_loads_a_full_config() -> None:
    config = load_config(GOOD)
    assert config.name == "digits-search"
    assert config.labels == ["cnn", "digits"]
    assert config.entrypoint == ["python", "train.py", "--epochs", "5"]
    assert config.environment.variables == {"OMP_NUM_THREADS": "1", "LR": "0.5", "DEBUG": "true"}
    policy = config.failure_policy
    assert (policy.replica_restarts, policy.trial_retries, policy.internal_retries) == (1, 2, 0)
    assert policy.retry_user_errors == 1
    assert policy.restart_scope == "replica"
    assert policy.transient_exit_codes == [75, 143]
    assert policy.stop_grace == 90.0


def test_loads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(GOOD, encoding="utf-8")
    assert load_config_file(path) == load_config(GOOD)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("name: x\nentrypoint: t\nfailure_polcy: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}: invalid experiment config:\n"):
        load_config_file(path)


def test_missing_file() -> None:
    with pytest.raises(
        ConfigError, match=r"cannot read the config file /nonexistent/x.yaml: No such"
    ):
        load_config_file("/nonexistent/x.yaml")


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"name: \xff\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text"):
        load_config_file(path)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        # unknown keys, with and without a close valid name
        ("failure_polcy: {}", "failure_polcy: unknown key; did you mean 'failure_policy'?"),
        ("enviroment: {}", "enviroment: unknown key; did you mean 'environment'?"),
        ("label: [a]", "label: unknown key; did you mean 'labels'?"),
        (
            "zzz: 1",
            "zzz: unknown key; the keys allowed here are artifacts, artifacts_limit, "
            "checkpoint_storage, compat, data, debug, description, diagnostics, entrypoint, "
            "environment, failure_policy, harness, hyperparameters, integrations, labels, "
            "name, reproducibility, resources, searcher, verify",
        ),
        (
            "failure_policy: {trial_retry: 1}",
            "failure_policy.trial_retry: unknown key; did you mean 'trial_retries'?",
        ),
        (
            "environment: {variable: {}}",
            "environment.variable: unknown key; did you mean 'variables'?",
        ),
        (
            "environment: {qqq: 1}",
            "environment.qqq: unknown key; the keys allowed here are inherit, pip, python, "
            "requirements, secrets, setup, variables",
        ),
        # numbers and their bounds, in nested sections
        (
            "failure_policy: {trial_retries: -1}",
            "failure_policy.trial_retries: must be >= 0, got -1",
        ),
        (
            "failure_policy: {replica_restarts: -2}",
            "failure_policy.replica_restarts: must be >= 0, got -2",
        ),
        (
            "failure_policy: {internal_retries: many}",
            "failure_policy.internal_retries: must be a whole number, got 'many'",
        ),
        (
            "failure_policy: {retry_user_errors: 1.5}",
            "failure_policy.retry_user_errors: must be a whole number, got 1.5",
        ),
        (
            "failure_policy: {trial_retries: true}",
            "failure_policy.trial_retries: must be a whole number, got true",
        ),
        (
            "failure_policy: {transient_exit_codes: [75, 0]}",
            "failure_policy.transient_exit_codes[1]: must be >= 1, got 0",
        ),
        (
            "failure_policy: {transient_exit_codes: [256]}",
            "failure_policy.transient_exit_codes[0]: must be <= 255, got 256",
        ),
        (
            "failure_policy: {transient_exit_codes: 75}",
            "failure_policy.transient_exit_codes: must be a list, got 75",
        ),
        (
            "failure_policy: {restart_scope: node}",
            "failure_policy.restart_scope: must be 'trial' or 'replica', got 'node'",
        ),
        (
            "failure_policy: {stop_grace: soon}",
            "failure_policy.stop_grace: must look like '30s', '500ms', '5m' or '1h30m' "
            "(or a number of seconds), got 'soon'",
        ),
        (
            "failure_policy: {stop_grace: -1}",
            "failure_policy.stop_grace: must be a number of seconds >= 0, got -1",
        ),
        ("failure_policy: 3", "failure_policy: must be a mapping (key: value pairs), got 3"),
        ("failure_policy: [a]", "failure_policy: must be a mapping (key: value pairs), got a list"),
        # strings and lists
        ("description: 5", "description: must be a string, got 5; put it in quotes"),
        ("labels: a", "labels: must be a list, got 'a'"),
        ("labels: [a, 2]", "labels[1]: must be a string, got 2; put it in quotes"),
        ("labels: [a, [b]]", "labels[1]: must be a string, got a list"),
        # environment variables
        (
            "environment: {variables: {1BAD: x}}",
            "environment.variables: '1BAD' is not a valid environment variable name "
            "(letters, digits and '_', not starting with a digit)",
        ),
        (
            "environment: {variables: {A-B: x}}",
            "environment.variables: 'A-B' is not a valid environment variable name "
            "(letters, digits and '_', not starting with a digit)",
        ),
        (
            "environment: {variables: {A: null}}",
            "environment.variables.A: must be a string, got null",
        ),
        (
            "environment: {variables: {A: [1]}}",
            "environment.variables.A: must be a string, got a list",
        ),
        (
            "environment: {variables: [A]}",
            "environment.variables: must be a mapping (key: value pairs), got a list",
        ),
    ],
)
def test_one_problem_per_line_with_its_key_path(body: str, problem: str) -> None:
    assert one_problem(body) == problem


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ("entrypoint: t", "name: required key is missing"),
        ("name: x", "entrypoint: required key is missing"),
        ("name: ''\nentrypoint: t", "name: must not be empty"),
        (
            "name: " + "n" * 129 + "\nentrypoint: t",
            "name: must be at most 128 characters long, got 129",
        ),
        ("name: 2024\nentrypoint: t", "name: must be a string, got 2024; put it in quotes"),
        ("name: x\nentrypoint: ''", "entrypoint: must not be empty"),
        ("name: x\nentrypoint: []", "entrypoint: must not be empty"),
        ("name: x\nentrypoint: '   '", "entrypoint: must not be empty"),
        (
            'name: x\nentrypoint: "python \'unclosed"',
            "entrypoint: cannot be split into arguments: No closing quotation",
        ),
        (
            "name: x\nentrypoint: 5",
            "entrypoint: must be a command line string or a list of arguments, got 5",
        ),
        (
            "name: x\nentrypoint: {python: t.py}",
            "entrypoint: must be a command line string or a list of arguments, got a mapping",
        ),
        (
            "name: x\nentrypoint: [python, 5]",
            "entrypoint[1]: must be a string, got 5; put it in quotes",
        ),
    ],
)
def test_name_and_entrypoint_problems(config: str, problem: str) -> None:
    assert problems(config) == [problem]


def test_deterministic_needs_a_seed() -> None:
    assert one_problem("reproducibility: {deterministic: true}") == (
        "reproducibility.experiment_seed: required by deterministic: true, which seeds every "
        "rank's generators from it; e.g. experiment_seed: 1234")


def test_every_problem_is_reported_at_once_in_field_order() -> None:
    text = """\
name: x
entrypoint: python t.py
failure_polcy: {}
resources: {replicas: 0}
labels: [a, 1]
failure_policy: {trial_retries: -1, restart_scope: all, heartbeat_timeout: soon}
"""
    assert problems(text) == [
        "labels[1]: must be a string, got 1; put it in quotes",
        "failure_policy.trial_retries: must be >= 0, got -1",
        "failure_policy.restart_scope: must be 'trial' or 'replica', got 'all'",
        "failure_policy.heartbeat_timeout: must look like '30s', '500ms', '5m' or '1h30m' "
        "(or a number of seconds), got 'soon'",
        "resources.replicas: must be >= 1, got 0",
        "failure_polcy: unknown key; did you mean 'failure_policy'?",
    ]


def test_pydantic_wording_never_reaches_the_user() -> None:
    text = "name: 5\nentrypoint: {}\nfailure_policy: {trial_retries: x, bogus: 1}\nextra: 1\n"
    message = "\n".join(problems(text))
    for leak in ("pydantic", "errors.pydantic.dev", "Input should", "Extra inputs", "Value error"):
        assert leak not in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\n  bad: [\n", r"^exp\.yaml, line 2, column 6: invalid YAML: mapping values"),
        ("name: [x\n", r"^exp\.yaml, line 2, column 1: invalid YAML: .*flow sequence, line 1, col"),
        ("name: 'x\n", r"^exp\.yaml, line 2, column 1: invalid YAML: .*quoted scalar, line 1"),
        ("name: x\n\tentrypoint: t\n",
         r"^exp\.yaml, line 2, column 1: invalid YAML: found a tab character"),
        ("name: x\nname: y\n", r"^exp\.yaml, line 2, column 1: invalid YAML: duplicate key 'name'"),
        (
            "name: x\nfailure_policy: {trial_retries: 1, trial_retries: 2}\n",
            r"^exp\.yaml, line 2, column 36: invalid YAML: duplicate key 'trial_retries'",
        ),
        (
            "!!python/object:os.system x\n",
            r"^exp\.yaml, line 1, column 1: invalid YAML: .*constructor",
        ),
    ],
)
def test_yaml_syntax_errors_name_line_and_column(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(text, source="exp.yaml")


def test_yaml_merge_keys_are_not_duplicates() -> None:
    text = """\
base: &base {trial_retries: 1, replica_restarts: 1}
"""
    merged = "name: x\nentrypoint: t\nfailure_policy:\n  <<: {trial_retries: 1, stop_grace: 5}\n"
    merged += "  trial_retries: 2\n"
    config = load_config(merged)
    assert config.failure_policy.trial_retries == 2
    assert config.failure_policy.stop_grace == 5.0
    with pytest.raises(ConfigError, match="line 1, column 7: anchors and aliases"):
        load_config(text + merged)


BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
    for i in range(8))


@pytest.mark.parametrize(("text", "problem"), [
    (BILLION_LAUGHS, "c.yaml, line 1, column 4: anchors and aliases (&name, *name, <<: *name) "
                     "are not accepted in a muster config: write each value out"),
    ("name: x\nentrypoint: t\nfailure_policy:\n  <<: *base\n",
     "c.yaml, line 4, column 7: anchors and aliases"),
    ("name: x\nentrypoint: t\nhyperparameters: " + "{a: " * 40 + "1" + "}" * 40 + "\n",
     "nested more than 32 levels deep; a config needs far fewer"),
    # libyaml's scanner reads ahead of the composer, and stops at its own 1,000 levels.
    ("[" * 100_000 + "]" * 100_000,
     "c.yaml, line 1, column 1001: invalid YAML: exceeded maximum nesting depth"),
    ("name: x\nentrypoint: t\ndescription: " + "d" * (1024**2), "the config is 1,048,611 bytes, "
     "over the 1 MiB limit; keep data and long lists in files the script reads"),
    ("name: x\nentrypoint: t\nlabels: [ok, " + "l" * 70_000 + "]\n",
     "labels[1]: a string of 70,000 characters, over the limit of 65,536"),
    ('name: x\nentrypoint: ["python", "t\\0.py"]\n',
     "entrypoint[1]: holds a NUL byte (\\0), which no argument, path or environment variable "
     "can carry; remove it"),
    ('name: x\nentrypoint: t\nenvironment: {variables: {"A\\0": "1"}}\n',
     "environment.variables: holds a NUL byte"),
])
def test_a_config_costs_bounded_memory_and_time(text: str, problem: str) -> None:
    """Issue 12: a 592-byte "billion laughs" config hung the server, and alias amplification
    stored 100 MB from a 102 KB request. Each is refused before anything grows."""
    with pytest.raises(ConfigError) as info:
        load_config(text, source="c.yaml")
    assert problem in str(info.value)


CONSTANTS = "name: x\nentrypoint: t\nhyperparameters:\n" + "".join(
    f"  k{i}: {i}\n" for i in range(66_000))  # 1 MiB of constants: 132,003 values


@pytest.mark.parametrize(("text", "problem"), [
    (CONSTANTS, "c.yaml, line 50000, column 11: more than 100,000 values (scalars, lists and "
                "mappings) in one config; keep long lists in files the script reads"),
    ("name: x\nentrypoint: t\nlabels: [" + "0, " * 100_000 + "]\n",
     "c.yaml, line 3, column 299989: more than 100,000 values"),
    ("name: x\nentrypoint: t\nhyperparameters: {n: " + "7" * 5000 + "}\n",
     "c.yaml, line 3, column 22: an integer of 5,000 digits, over the limit of 100; write a "
     "smaller number, or quote it as a string"),
    ("name: x\nentrypoint: t\nhyperparameters: {n: -0x" + "f" * 101 + "}\n",
     "an integer of 101 digits, over the limit of 100"),
])
def test_a_config_of_many_values_or_long_integers_is_refused_by_line(text: str, problem: str
                                                                      ) -> None:
    """Issue 29 (Y8): 1 MiB of plain constants took 44-95 s and 609 MiB to create, and a
    5,000-digit integer was a 500 (Python's int() refuses past 4,300 digits)."""
    with pytest.raises(ConfigError) as info:
        load_config(text, source="c.yaml")
    assert problem in str(info.value)


def test_values_and_digits_up_to_the_limits_load() -> None:
    many = "".join(f"  k{i}: {i}\n" for i in range(49_990))  # 99,980 values, with the keys
    config = load_config(f"name: x\nentrypoint: t\nhyperparameters:\n{many}")
    assert config.space().hparams({})["k49989"] == 49_989
    digits = int("9" * 100)
    config = load_config(f"name: x\nentrypoint: t\nhyperparameters: {{n: {digits}}}\n")
    assert config.space().hparams({})["n"] == digits


@pytest.mark.parametrize(("value", "shown"), [
    (".nan", "nan"), (".NaN", "nan"), (".inf", "inf"), ("-.inf", "-inf"), ("+.Inf", "inf"),
    ("1.0e+999", "inf"),
])
def test_a_float_that_is_not_finite_is_refused_with_its_key_path(value: str, shown: str
                                                                 ) -> None:
    """Issue 29 (Y7): `.nan` and `.inf` silently became null once stored as JSON."""
    assert one_problem(f"hyperparameters:\n  lr: {value}\n") == (
        f"hyperparameters.lr: {shown} is not a number muster can keep (YAML's .nan, .inf and "
        "-.inf, or a number too large for a float); write a finite number")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "(top level): the config is empty; it needs at least 'name' and 'entrypoint'"),
        (
            "# only a comment\n",
            "(top level): the config is empty; it needs at least 'name' and 'entrypoint'",
        ),
        (
            "- a\n- b\n",
            "(top level): must be a mapping of keys such as 'name:' and 'entrypoint:', got a list",
        ),
        (
            "just text",
            "(top level): must be a mapping of keys such as 'name:' and 'entrypoint:', "
            "got 'just text'",
        ),
        ("42", "(top level): must be a mapping of keys such as 'name:' and 'entrypoint:', got 42"),
    ],
)
def test_top_level_must_be_a_mapping(text: str, problem: str) -> None:
    assert problems(text) == [problem]


def test_loaded_config_survives_the_store_round_trip() -> None:
    config = load_config(GOOD)
    assert ExperimentConfig.from_json_dict(config.to_json_dict()) == config


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("verify: {samples_tolerance: -0.01}",
         "verify.samples_tolerance: must be >= 0.0, got -0.01"),
        ("verify: {expected_samples: 0}", "verify.expected_samples: must be >= 1, got 0"),
        ("data: {manifest: {labels: from_dirs}}", "data.path: required key is missing"),
        ("data: {path: d, manifest: {labels: folders}}",
         "data.manifest.labels: must be 'from_dirs' or 'none', got 'folders'"),
        ("data: {path: d, manifest: {extensions: []}}",
         "data.manifest.extensions: must list at least one extension, or be left out to count "
         "all"),
        ("failure_policy: {heartbeat_timeout: 0s}",
         "failure_policy.heartbeat_timeout: must be > 0.0, got 0.0"),
    ],
)
def test_data_verify_and_heartbeat_settings_are_checked(body: str, problem: str) -> None:
    assert one_problem(body) == problem


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("harness: yes please", "harness: must be true or false, got 'yes please'"),
        ("harness: 1", "harness: must be true or false, got 1"),
        ("failure_policy: {warm_standby: true}",
         "failure_policy: warm_standby: true needs `harness: true` at the top level: a standby "
         "waits in muster.harness.init(), and a script that never calls it would run its "
         "training twice. Call mh.init() on every rank and set `harness: true`, or drop "
         "warm_standby"),
        ("harness: false\nfailure_policy: {warm_standby: true}",
         "failure_policy: warm_standby: true needs `harness: true` at the top level: a standby "
         "waits in muster.harness.init(), and a script that never calls it would run its "
         "training twice. Call mh.init() on every rank and set `harness: true`, or drop "
         "warm_standby"),
    ],
)
def test_the_harness_declaration_is_checked(body: str, problem: str) -> None:
    assert one_problem(body) == problem


def test_the_harness_declaration_defaults_to_false_and_allows_a_standby() -> None:
    assert not load_config("name: x\nentrypoint: t\n").harness
    config = load_config("name: x\nentrypoint: t\nharness: true\n"
                         "failure_policy: {warm_standby: true}\n")
    assert config.harness and config.failure_policy.warm_standby
    assert type(config).from_json_dict(config.to_json_dict()) == config


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("resources: {gpu_type: a100}",
         "resources.gpu_type: is 'a100', but resources.gpus_per_replica is 0: set how many GPUs "
         "each replica needs, or leave gpu_type out"),
        ("resources: {replicas: 4, max_slots: 2}",
         "resources.max_slots: is 2, fewer than one trial's 4 replicas: no trial could ever "
         "start; raise it or lower resources.replicas"),
        ("resources: {priority: 0}", "resources.priority: must be >= 1, got 0"),
        ("resources: {priority: 100}", "resources.priority: must be <= 99, got 100"),
        ("resources: {gpus_per_replica: -1}", "resources.gpus_per_replica: must be >= 0, got -1"),
    ],
)
def test_scheduling_resources_are_checked(body: str, problem: str) -> None:
    assert one_problem(body) == problem


def test_scheduling_resources_default_and_normalise() -> None:
    plain = load_config("name: x\nentrypoint: t\n").resources
    assert (plain.gpus_per_replica, plain.gpu_type, plain.max_slots, plain.priority) == (
        0, None, None, 42)
    asked = load_config("name: x\nentrypoint: t\nresources: {replicas: 2, gpus_per_replica: "
                        "2, gpu_type: A100, max_slots: 4, priority: 5}\n").resources
    assert (asked.gpus_per_replica, asked.gpu_type, asked.max_slots, asked.priority) == (
        2, "a100", 4, 5)


def test_data_and_verify_sections_normalise() -> None:
    config = load_config(
        "name: x\nentrypoint: t\ndata: {path: d, manifest: {extensions: [PNG, .jpg]}}\n"
        "verify: {require_metrics: [loss]}\nfailure_policy: {heartbeat_timeout: 2m}\n"
    )
    assert config.data is not None and config.data.manifest.extensions == [".png", ".jpg"]
    assert config.verify.require_metrics == ["loss"] and config.verify.samples_tolerance == 0.01
    assert config.failure_policy.heartbeat_timeout == 120.0
