"""scan_manifest on real temporary directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from muster.errors import ConfigError
from muster.supervise.manifest import (
    LabelMode,
    Manifest,
    empty_data_problem,
    first_counted_file,
    scan_manifest,
)


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "data", {
        "cat/1.png": b"a" * 10,
        "cat/2.PNG": b"b" * 20,
        "cat/deep/3.jpg": b"c" * 30,
        "dog/4.png": b"d" * 40,
        "dog/notes.txt": b"e" * 50,
        "root.png": b"f" * 60,
        "README": b"g" * 70,
    })


def test_counts_every_file_without_a_filter(data: Path) -> None:
    manifest = scan_manifest(data, None, "none")
    assert (manifest.file_count, manifest.total_bytes) == (7, 280)
    assert manifest.by_extension == {"": 1, ".jpg": 1, ".png": 4, ".txt": 1}
    assert manifest.classes is None
    assert manifest.path == str(data.resolve())
    assert manifest.notes == ()


@pytest.mark.parametrize(
    ("extensions", "count", "total", "by_extension", "classes"),
    [
        ([".png"], 4, 130, {".png": 4}, {"": 1, "cat": 2, "dog": 1}),
        ([".PNG", ".jpg"], 5, 160, {".jpg": 1, ".png": 4}, {"": 1, "cat": 3, "dog": 1}),
        ([".txt"], 1, 50, {".txt": 1}, {"dog": 1}),
        ([".webp"], 0, 0, {}, {}),
        ([], 0, 0, {}, {}),
    ],
)
def test_extension_filter_and_labels_from_dirs(
    data: Path, extensions: list[str], count: int, total: int,
    by_extension: dict[str, int], classes: dict[str, int],
) -> None:
    manifest = scan_manifest(data, extensions, "from_dirs")
    assert (manifest.file_count, manifest.total_bytes) == (count, total)
    assert manifest.by_extension == by_extension
    assert manifest.classes == classes


def test_multi_part_extension(tmp_path: Path) -> None:
    data = make_tree(tmp_path, {"a.tar.gz": b"1", "b.gz": b"22", "c.tar": b"333"})
    manifest = scan_manifest(data, [".tar.gz", ".tar"], "none")
    assert manifest.by_extension == {".tar": 1, ".tar.gz": 1}
    assert manifest.total_bytes == 4


@pytest.mark.parametrize("extension", ["png", ".", ""])
def test_extension_without_a_dot_is_a_config_error(data: Path, extension: str) -> None:
    with pytest.raises(ConfigError, match=r"data\.manifest\.extensions"):
        scan_manifest(data, [extension], "none")


def test_unknown_labels_mode_is_a_config_error(data: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.manifest\.labels"):
        scan_manifest(data, None, "from_files")  # type: ignore[arg-type]


@pytest.mark.parametrize("make", ["missing", "file"])
def test_missing_or_non_directory_path_is_a_config_error(tmp_path: Path, make: str) -> None:
    path = tmp_path / "data"
    if make == "file":
        path.write_text("not a directory")
    with pytest.raises(ConfigError) as raised:
        scan_manifest(path, None, "none")
    assert str(path) in str(raised.value)
    assert "data.path" in str(raised.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_unreadable_subdirectory_is_a_config_error(data: Path) -> None:
    locked = data / "cat"
    locked.chmod(0)
    try:
        with pytest.raises(ConfigError, match=str(locked)):
            scan_manifest(data, None, "none")
    finally:
        locked.chmod(0o755)


# --- fingerprint --------------------------------------------------------------------------


def fingerprint(data: Path) -> str:
    return scan_manifest(data, [".png", ".jpg"], "from_dirs").fingerprint


def touch_forward(path: Path) -> None:
    """Move the mtime on by a second: a rewrite with the same size, as a filesystem sees it."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_fingerprint_is_stable_when_nothing_changed(data: Path) -> None:
    first = fingerprint(data)
    assert len(first) == 64
    assert fingerprint(data) == first
    (data / "dog" / "notes.txt").write_text("changed, but not a counted file")
    assert fingerprint(data) == first


@pytest.mark.parametrize(
    "change",
    [
        lambda d: touch_forward(d / "cat" / "1.png"),
        lambda d: (d / "cat" / "1.png").write_bytes(b"a" * 11),
        lambda d: (d / "dog" / "5.png").write_bytes(b""),
        lambda d: (d / "cat" / "deep" / "3.jpg").unlink(),
        lambda d: (d / "cat" / "1.png").rename(d / "dog" / "1.png"),
    ],
    ids=["touch", "resize", "add", "remove", "move"],
)
def test_fingerprint_changes(data: Path, change: object) -> None:
    before = fingerprint(data)
    assert callable(change)
    change(data)
    assert fingerprint(data) != before


# --- symlinks and odd entries -------------------------------------------------------------


def test_symlinked_directory_is_not_followed(tmp_path: Path, data: Path) -> None:
    elsewhere = make_tree(tmp_path / "elsewhere", {"x.png": b"x" * 99})
    (data / "linked").symlink_to(elsewhere, target_is_directory=True)
    (data / "cat" / "loop").symlink_to(data, target_is_directory=True)
    manifest = scan_manifest(data, [".png"], "from_dirs")
    assert manifest.file_count == 4
    assert "linked" not in (manifest.classes or {})
    assert manifest.notes == ("cat/loop: a symlink to a directory, not followed",
                              "linked: a symlink to a directory, not followed")


def test_symlinked_files_count_only_inside_the_data_directory(
    tmp_path: Path, data: Path
) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"o" * 1000)
    (data / "dog" / "inside.png").symlink_to(data / "cat" / "1.png")
    (data / "dog" / "outside.png").symlink_to(outside)
    (data / "dog" / "dangling.png").symlink_to(data / "nowhere.png")
    manifest = scan_manifest(data, [".png"], "from_dirs")
    assert manifest.file_count == 5
    assert manifest.total_bytes == 130 + 10  # the link counts its target's size
    assert manifest.classes == {"": 1, "cat": 2, "dog": 2}
    assert sorted(manifest.notes) == [
        f"dog/dangling.png: a symlink to {data.resolve() / 'nowhere.png'}, "
        "which is missing or not a file",
        f"dog/outside.png: a symlink to {outside.resolve()}, outside the data directory",
    ]


def test_data_path_that_is_a_symlink_is_resolved(tmp_path: Path, data: Path) -> None:
    link = tmp_path / "data-link"
    link.symlink_to(data, target_is_directory=True)
    manifest = scan_manifest(link, None, "none")
    assert (manifest.path, manifest.file_count) == (str(data.resolve()), 7)


def test_fifo_is_left_out_with_a_note(data: Path) -> None:
    os.mkfifo(data / "cat" / "pipe.png")
    manifest = scan_manifest(data, [".png"], "none")
    assert manifest.file_count == 4
    assert manifest.notes == ("cat/pipe.png: not a regular file (a socket, FIFO or device)",)


def test_notes_are_capped_with_a_count(tmp_path: Path, data: Path) -> None:
    for n in range(25):
        (data / f"gone-{n:02d}.png").symlink_to(tmp_path / "nothing")
    notes = scan_manifest(data, [".png"], "none").notes
    assert len(notes) == 21
    assert notes[-1] == "... 5 more left out"


@pytest.mark.parametrize(
    ("extensions", "labels"),
    [([".png"], "from_dirs"), ([".png"], "none"), (None, "from_dirs"), (None, "none")],
)
def test_json_round_trip(data: Path, extensions: list[str] | None, labels: LabelMode) -> None:
    (data / "gone.png").symlink_to(data / "nothing")
    manifest = scan_manifest(data, extensions, labels)
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert Manifest.from_json(json.loads(json.dumps(manifest.to_json()))) == manifest


# -- first_counted_file: the submission's bounded look for one file to count ----------


@pytest.mark.parametrize(("files", "extensions", "found"), [
    ({}, None, False),
    ({"a/b/c/README": b"x"}, None, True),
    ({"notes.txt": b"x", "cat/a.json": b"{}"}, [".png"], False),
    ({"notes.txt": b"x", "cat/deep/1.PNG": b"png"}, [".png"], True),
    ({"empty/dirs/only/.keep/": b""}, [".png"], False),
])
def test_first_counted_file_finds_what_the_scan_would_count(
    tmp_path: Path, files: dict[str, bytes], extensions: list[str] | None, found: bool
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for relative, data in files.items():
        path = root / relative
        if relative.endswith("/"):
            path.mkdir(parents=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    assert first_counted_file(root, extensions) is found
    assert (scan_manifest(root, extensions, "none").file_count > 0) is found


def test_first_counted_file_does_not_count_a_link_out_of_the_data(tmp_path: Path) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"png")
    root = tmp_path / "data"
    root.mkdir()
    (root / "link.png").symlink_to(outside)
    assert first_counted_file(root, [".png"]) is False


def test_first_counted_file_stops_undecided_after_its_entries(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(50):
        (root / f"{i}.txt").write_text("x")
    assert first_counted_file(root, [".png"], max_entries=10) is None
    assert first_counted_file(root, [".png"], max_entries=100) is False
    (root / "z.png").write_bytes(b"png")
    assert first_counted_file(root, [".png"], max_entries=100) is True


def test_the_empty_data_problem_names_the_patterns_and_both_fixes() -> None:
    assert empty_data_problem("'/d'", None) == (
        "data.path: '/d' holds no file matching * (every file counts: data.manifest.extensions "
        "is not set), so a run over it would train on nothing; add the data files there (or "
        "fix the path), or set data.allow_empty: true if the script brings its own data")
    assert "matching *.png, *.jpg (data.manifest.extensions)" in empty_data_problem(
        "'/d'", [".png", ".jpg"])
