"""The GPU inventory: one behaviour suite for every implementation, then the fake's files.

The NVML inventory is tested only where NVML opens (a machine with an NVIDIA driver);
elsewhere its cases are skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.config import FakeGpuConfig
from muster.config.cluster import gpu_type_from_name
from muster.errors import GpuError
from muster.schedule.inventory import (
    FakeInventory,
    GpuInventory,
    NoGpus,
    NvmlInventory,
    open_inventory,
)

GiB = 1 << 30

SPECS = [
    FakeGpuConfig(index=3, name="Fake-H200", memory=141 * GiB),
    FakeGpuConfig(index=0, name="Fake-A100", memory=40 * GiB),
    FakeGpuConfig(index=1, name="NVIDIA A100-SXM4-40GB", memory=40 * GiB, type="A100"),
]


def _nvml_problem() -> str | None:
    """Why NVML cannot be opened here, or None when it can."""
    try:
        NvmlInventory().close()
    except GpuError as exc:
        return str(exc)
    return None


NVML_PROBLEM = _nvml_problem()


@pytest.fixture
def fake(tmp_path: Path) -> FakeInventory:
    return FakeInventory(SPECS, tmp_path / "fake-gpus")


@pytest.fixture(params=["fake", "nvml"])
def inventory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GpuInventory]:
    if request.param == "nvml":
        if NVML_PROBLEM is not None:
            pytest.skip(f"no NVML on this machine: {NVML_PROBLEM}")
        opened: GpuInventory = NvmlInventory()
    else:
        opened = FakeInventory(SPECS, tmp_path / "fake-gpus")
        opened.set_used(0, 3 * GiB)
    yield opened
    opened.close()


# The contract, for every inventory.


def test_gpus_are_listed_by_index(inventory: GpuInventory) -> None:
    indices = [gpu.index for gpu in inventory.gpus()]
    assert indices == sorted(set(indices))


def test_every_gpu_has_a_name_a_type_and_memory(inventory: GpuInventory) -> None:
    for gpu in inventory.gpus():
        assert gpu.name
        assert gpu.type and gpu.type == gpu.type.lower()
        assert gpu.memory_total > 0


def test_memory_used_is_between_zero_and_the_total(inventory: GpuInventory) -> None:
    for gpu in inventory.gpus():
        assert 0 <= inventory.memory_used(gpu.index) <= gpu.memory_total


def test_an_unknown_index_is_a_gpu_error(inventory: GpuInventory) -> None:
    unknown = max((gpu.index for gpu in inventory.gpus()), default=0) + 1
    with pytest.raises(GpuError, match=rf"^there is no GPU {unknown}; "):
        inventory.memory_used(unknown)
    with pytest.raises(GpuError, match=rf"^there is no GPU {unknown}; "):
        inventory.gpu(unknown)


def test_gpu_finds_each_listed_gpu(inventory: GpuInventory) -> None:
    for gpu in inventory.gpus():
        assert inventory.gpu(gpu.index) == gpu


def test_the_note_and_source_describe_the_inventory(inventory: GpuInventory) -> None:
    count = len(inventory.gpus())
    assert inventory.source in ("fake", "nvml")
    assert inventory.note.startswith(f"{count} ")


def test_close_is_idempotent(inventory: GpuInventory) -> None:
    inventory.close()
    inventory.close()


# The fake inventory: its GPUs and their files.


def test_the_fake_lists_the_configured_gpus(fake: FakeInventory) -> None:
    assert [(g.index, g.name, g.type, g.memory_total) for g in fake.gpus()] == [
        (0, "Fake-A100", "a100", 40 * GiB),
        (1, "NVIDIA A100-SXM4-40GB", "a100", 40 * GiB),
        (3, "Fake-H200", "h200", 141 * GiB),
    ]
    assert fake.source == "fake"
    assert fake.note == "3 fake GPUs from the cluster config"


def test_set_used_round_trips_through_the_file(fake: FakeInventory) -> None:
    fake.set_used(3, 7 * GiB)
    assert fake.used_path(3).read_text() == f"{7 * GiB}\n"
    assert fake.memory_used(3) == 7 * GiB
    fake.set_used(3, 0)
    assert fake.memory_used(3) == 0


def test_a_missing_file_or_folder_reads_as_zero(fake: FakeInventory) -> None:
    assert not fake.root.exists()
    assert fake.memory_used(0) == 0
    fake.set_used(1, GiB)
    assert fake.memory_used(0) == 0


def test_whitespace_around_the_number_is_allowed(fake: FakeInventory) -> None:
    fake.used_path(0).parent.mkdir(parents=True)
    fake.used_path(0).write_text("  1024\n\n")
    assert fake.memory_used(0) == 1024


@pytest.mark.parametrize("content", ["lots", "-5", "1.5", "", "0x10"])
def test_garbage_in_the_file_is_a_gpu_error_naming_it(fake: FakeInventory, content: str) -> None:
    path = fake.used_path(0)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(GpuError) as info:
        fake.memory_used(0)
    assert str(info.value) == (
        f"cannot read the memory use of fake GPU 0 (Fake-A100): {path} must hold a whole "
        f"number of bytes, but holds {content!r}"
    )


def test_more_than_the_total_is_a_gpu_error(fake: FakeInventory) -> None:
    path = fake.used_path(0)
    path.parent.mkdir(parents=True)
    path.write_text(str(41 * GiB))
    with pytest.raises(GpuError) as info:
        fake.memory_used(0)
    assert str(info.value) == (
        f"fake GPU 0 (Fake-A100) has 40 GiB, but {path} says {41 * GiB} bytes are in use"
    )


def test_an_unreadable_file_is_a_gpu_error_naming_it(fake: FakeInventory) -> None:
    fake.used_path(0).mkdir(parents=True)  # a folder where the file should be
    with pytest.raises(GpuError, match=rf"cannot read {fake.used_path(0)}: Is a directory$"):
        fake.memory_used(0)


def test_set_used_refuses_bad_arguments(fake: FakeInventory) -> None:
    with pytest.raises(ValueError, match=r"but got used=-1$"):
        fake.set_used(0, -1)
    with pytest.raises(ValueError, match=rf"but got used={40 * GiB + 1}$"):
        fake.set_used(0, 40 * GiB + 1)
    with pytest.raises(GpuError, match=r"^there is no GPU 2; the GPUs are 0, 1, 3 \("):
        fake.set_used(2, 0)


# Opening an inventory from the cluster config's `gpus:` setting.


def test_a_list_opens_the_fake(tmp_path: Path) -> None:
    inventory = open_inventory(SPECS, tmp_path / "fake-gpus")
    assert isinstance(inventory, FakeInventory)
    assert inventory.root == tmp_path / "fake-gpus"


def test_none_is_no_gpus(tmp_path: Path) -> None:
    inventory = open_inventory("none", tmp_path)
    assert isinstance(inventory, NoGpus)
    assert inventory.source == "none"
    assert inventory.gpus() == []
    assert inventory.note == "no GPUs: the cluster config says gpus: none"
    with pytest.raises(
        GpuError, match=r"^there is no GPU 0; no GPUs: the cluster config says gpus: none$"
    ):
        inventory.memory_used(0)


@pytest.mark.skipif(NVML_PROBLEM is None, reason="NVML opens on this machine")
def test_auto_without_nvml_is_no_gpus_saying_why(tmp_path: Path) -> None:
    inventory = open_inventory("auto", tmp_path)
    assert isinstance(inventory, NoGpus)
    assert inventory.gpus() == []
    assert inventory.note == f"no GPUs: {NVML_PROBLEM}"
    assert inventory.note.startswith("no GPUs: NVML is not available (")


@pytest.mark.skipif(NVML_PROBLEM is not None, reason=f"no NVML on this machine: {NVML_PROBLEM}")
def test_auto_with_nvml_is_the_nvml_inventory(tmp_path: Path) -> None:
    inventory = open_inventory("auto", tmp_path)
    try:
        assert isinstance(inventory, NvmlInventory)
        assert inventory.note.endswith(" from NVML")
    finally:
        inventory.close()


@pytest.mark.parametrize(
    ("name", "gpu_type"),
    [
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("Tesla V100-PCIE-16GB", "v100"),
        ("Tesla V100S-PCIE-32GB", "v100s"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090 Ti", "rtx3090"),
        ("Quadro RTX 8000", "rtx8000"),
        ("NVIDIA TITAN V", "titanv"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("Fake-A100", "a100"),
        ("fake_h200", "h200"),
        ("NVIDIA", "nvidia"),
    ],
)
def test_gpu_type_from_name(name: str, gpu_type: str) -> None:
    assert gpu_type_from_name(name) == gpu_type
