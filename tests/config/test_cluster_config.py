"""The cluster config: defaults, a full file, and one `<key path>: <problem>` line per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.config import ClusterConfig, FakeGpuConfig, GpuReleaseConfig, load_cluster_config
from muster.errors import ConfigError

GiB = 1 << 30

FULL = """\
slots: 2
gpus:
  - {index: 1, name: Fake-H200, memory: 141GiB}
  - {index: 0, name: Fake-A100, memory: 40GiB, type: A100}
min_free_disk: 10GiB
preemption: true
gpu_release: {max_used_fraction: 0.1, timeout: 2m}
"""


def load_text(tmp_path: Path, text: str) -> ClusterConfig:
    path = tmp_path / "cluster.yaml"
    path.write_text(text, encoding="utf-8")
    return load_cluster_config(path, tmp_path / "unused.yaml")


def problems(tmp_path: Path, text: str) -> list[str]:
    """The problem lines of the ConfigError that loading `text` raises (after the header)."""
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    header, *lines = str(info.value).splitlines()
    assert header == f"{tmp_path / 'cluster.yaml'}: invalid cluster config:"
    return lines


def test_defaults() -> None:
    config = ClusterConfig()
    assert config.slots is None
    assert config.gpus == "auto"
    assert config.min_free_disk == 5 * GiB
    assert config.preemption is False
    assert config.gpu_release == GpuReleaseConfig(max_used_fraction=0.05, timeout=60.0)


def test_a_full_file(tmp_path: Path) -> None:
    config = load_text(tmp_path, FULL)
    assert config.slots == 2
    assert config.gpus == [
        FakeGpuConfig(index=1, name="Fake-H200", memory=141 * GiB, type="h200"),
        FakeGpuConfig(index=0, name="Fake-A100", memory=40 * GiB, type="a100"),
    ]
    assert config.min_free_disk == 10 * GiB
    assert config.preemption is True
    assert config.gpu_release == GpuReleaseConfig(max_used_fraction=0.1, timeout=120.0)


@pytest.mark.parametrize("setting", ["auto", "none"])
def test_gpus_settings(tmp_path: Path, setting: str) -> None:
    assert load_text(tmp_path, f"gpus: {setting}\n").gpus == setting


def test_no_free_disk_guard(tmp_path: Path) -> None:
    assert load_text(tmp_path, "min_free_disk: 0\n").min_free_disk == 0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("slot: 2", "slot: unknown key; did you mean 'slots'?"),
        (
            "zzz: 1",
            "zzz: unknown key; the keys allowed here are base_environment, build_logs, "
            "checkpoint_storage, "
            "data_roots, gpu_release, gpus, interpreters, launcher, log_limit, min_free_disk, "
            "mlflow, node_quarantine, notification_hosts, notifications, package_sources, "
            "preemption, priority_floor, public_url, quotas, ray, registry, retention, "
            "run_as, "
            "secret_sources, slots, storage_endpoints, storage_paths, system_metrics_interval, "
            "trusted_proxies",
        ),
        ("launcher: slurm", "launcher: must be 'local' or 'ray', got 'slurm'"),
        ("base_environment: venv", "base_environment: must be the absolute path of a Python "
                                   "interpreter or a venv on the server, such as "
                                   "/opt/train-venv, got 'venv'"),
        ("launcher: ray", "(top level): launcher: ray needs a `ray:` section with at least "
                          "`storage_path:` (a directory every node and the server mount), e.g. "
                          "ray: {address: auto, storage_path: /shared/muster-runs}"),
        ("ray: {storage_path: /shared}", "(top level): a `ray:` section is only read with "
                                         "`launcher: ray`; add `launcher: ray`, or remove the "
                                         "section"),
        ("{launcher: ray, ray: {storage_path: shared}}",
         "ray.storage_path: must be an absolute path (the same on every node), got 'shared'"),
        ("{launcher: ray, ray: {storage_path: /s, address: 'http://x'}}",
         "ray.address: must be 'auto', a GCS address such as 'head:6379' or a Ray Client "
         "address such as 'ray://head:10001', got 'http://x'"),
        ("{launcher: ray, ray: {storage_path: /s, placement_strategy: STRICT_PACK}}",
         "ray.placement_strategy: must be 'PACK', 'SPREAD' or 'STRICT_SPREAD', "
         "got 'STRICT_PACK'"),
        ("{launcher: ray, ray: {storage_path: /s, drill_network: {cut: [], restore: [x]}}}",
         "ray.drill_network.cut: must not be empty"),
        ("{launcher: ray, ray: {storage_path: /s, drill_network: {cut: [x], restore: [y], "
         "down_for: 0.5s}}}", "ray.drill_network.down_for: must be >= 1.0, got 0.5"),
        ("{launcher: ray, ray: {storage_path: /s, drill_network: {cut: [x]}}}",
         "ray.drill_network.restore: required key is missing"),
        ("{launcher: ray, ray: {storage_path: /s}, run_as: owner}",
         "(top level): run_as is not supported with launcher: ray yet (jobs run as the Ray "
         "worker's user); remove run_as"),
        ("node_quarantine: {failures: 0}", "node_quarantine.failures: must be >= 1, got 0"),
        ("slots: 0", "slots: must be >= 1, got 0"),
        ("slots: '2'", "slots: must be a whole number, got '2', which is quoted: remove the "
                        "quotes"),
        ("slots: 1.5", "slots: must be a whole number, got 1.5"),
        (
            "gpus: all",
            "gpus: must be 'auto', 'none' or a list of fake GPUs such as "
            "[{index: 0, name: Fake-A100, memory: 40GiB}], got 'all'",
        ),
        (
            "gpus: 2",
            "gpus: must be 'auto', 'none' or a list of fake GPUs such as "
            "[{index: 0, name: Fake-A100, memory: 40GiB}], got 2",
        ),
        ("gpus: []", "gpus: must list at least one fake GPU; write `gpus: none` for no GPUs"),
        (
            "gpus: [{index: 0, name: a, memory: 1GiB}, {index: 0, name: b, memory: 1GiB}]",
            "gpus: GPU index 0 is listed twice; each index must be unique",
        ),
        ("gpus: [{name: a, memory: 1GiB}]", "gpus[0].index: required key is missing"),
        ("gpus: [{index: -1, name: a, memory: 1GiB}]", "gpus[0].index: must be >= 0, got -1"),
        ("gpus: [{index: 0, name: '', memory: 1GiB}]", "gpus[0].name: must not be empty"),
        (
            "gpus: [{index: 0, name: 100, memory: 1GiB}]",
            "gpus[0].name: must be a string, got 100; put it in quotes",
        ),
        ("gpus: [{index: 0, name: a}]", "gpus[0].memory: required key is missing"),
        ("gpus: [{index: 0, name: a, memory: 0}]", "gpus[0].memory: must be > 0, got 0"),
        (
            "gpus: [{index: 0, name: a, memory: lots}]",
            "gpus[0].memory: must look like '4GiB', '512MiB' or '1.5GB', got 'lots'",
        ),
        ("gpus: [{index: 0, name: a, memory: 1GiB, type: ''}]", "gpus[0].type: must not be empty"),
        (
            "gpus: [{index: 0, name: a, memory: 1GiB, typ: a100}]",
            "gpus[0].typ: unknown key; did you mean 'type'?",
        ),
        ("gpus: [a100]", "gpus[0]: must be a mapping (key: value pairs), got 'a100'"),
        (
            "min_free_disk: -1",
            "min_free_disk: must be a whole number of bytes >= 0, got -1",
        ),
        (
            "min_free_disk: 5 gigs",
            "min_free_disk: must look like '4GiB', '512MiB' or '1.5GB', got '5 gigs'",
        ),
        ("preemption: yes please", "preemption: must be true or false, got 'yes please'"),
        (
            "gpu_release: {max_used_fraction: 1.5}",
            "gpu_release.max_used_fraction: must be <= 1.0, got 1.5",
        ),
        (
            "gpu_release: {max_used_fraction: -0.1}",
            "gpu_release.max_used_fraction: must be >= 0.0, got -0.1",
        ),
        (
            "gpu_release: {timeout: -1}",
            "gpu_release.timeout: must be a number of seconds >= 0, got -1",
        ),
        (
            "gpu_release: {timeout: soon}",
            "gpu_release.timeout: must look like '30s', '500ms', '5m' or '1h30m' "
            "(or a number of seconds), got 'soon'",
        ),
        (
            "gpu_release: {timeout: 1m, fraction: 0.1}",
            "gpu_release.fraction: unknown key; did you mean 'max_used_fraction'?",
        ),
        (
            "gpu_release: {zzz: 1}",
            "gpu_release.zzz: unknown key; the keys allowed here are max_used_fraction, timeout",
        ),
        ("gpu_release: 60s", "gpu_release: must be a mapping (key: value pairs), got '60s'"),
        (
            "- slots: 2",
            "(top level): must be a mapping of keys such as 'slots:' and 'gpus:', got a list",
        ),
    ],
)
def test_one_problem_per_line_with_its_key_path(
    tmp_path: Path, text: str, problem: str
) -> None:
    assert problems(tmp_path, text + "\n") == [problem]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = "slots: 0\ngpus: [{index: 0, name: a, memory: 0}]\npreemption: 1\n"
    assert problems(tmp_path, text) == [
        "slots: must be >= 1, got 0",
        "gpus[0].memory: must be > 0, got 0",
        "preemption: must be true or false, got 1",
    ]


def test_the_type_is_derived_from_the_name_or_lowercased() -> None:
    assert FakeGpuConfig(index=0, name="Fake-A100", memory=1).type == "a100"
    assert FakeGpuConfig(index=0, name="x", memory=1, type="H200").type == "h200"


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line 2, column 1: invalid YAML: duplicate key 'slots'"):
        load_text(tmp_path, "slots: 1\nslots: 2\n")


def test_a_named_file_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    default = tmp_path / "cluster.yaml"
    default.write_text("slots: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_cluster_config(missing, default)
    assert str(info.value) == (
        f"cannot read the cluster config file {missing}: No such file or directory"
    )


def test_the_default_file_is_read_when_no_file_is_named(tmp_path: Path) -> None:
    default = tmp_path / "cluster.yaml"
    default.write_text("slots: 3\n", encoding="utf-8")
    assert load_cluster_config(None, default).slots == 3


def test_no_default_file_means_defaults(tmp_path: Path) -> None:
    assert load_cluster_config(None, tmp_path / "cluster.yaml") == ClusterConfig()


@pytest.mark.parametrize("text", ["", "# nothing set yet\n"])
def test_an_empty_file_means_defaults(tmp_path: Path, text: str) -> None:
    assert load_text(tmp_path, text) == ClusterConfig()


def test_errors_in_the_default_file_name_it(tmp_path: Path) -> None:
    default = tmp_path / "cluster.yaml"
    default.write_text("slots: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_cluster_config(None, default)
    assert str(info.value) == f"{default}: invalid cluster config:\nslots: must be >= 1, got 0"


def test_the_mlflow_section(tmp_path: Path) -> None:
    assert load_text(tmp_path, "").mlflow is None
    found = load_text(tmp_path, "mlflow: {tracking_uri: 'http://mlflow.lab:5000/'}\n").mlflow
    assert found is not None
    assert (found.tracking_uri, found.export, found.registered_model_prefix) == (
        "http://mlflow.lab:5000", "manual", "")
    assert problems(tmp_path, "mlflow: {tracking_uri: mlflow.lab:5000, export: always, "
                              "registered_model_prefix: 'a/b'}\n") == [
        "mlflow.tracking_uri: must be the http:// or https:// URL of an MLflow tracking "
        "server, such as http://mlflow.lab:5000, got 'mlflow.lab:5000'",
        "mlflow.export: must be 'on_register' or 'manual', got 'always'",
        "mlflow.registered_model_prefix: must be letters, digits and . _ - (MLflow's registry "
        "takes no / or : in a name), got 'a/b'"]
    assert problems(tmp_path, "mlflow: {export: on_register}\n") == [
        "mlflow.tracking_uri: required key is missing"]
