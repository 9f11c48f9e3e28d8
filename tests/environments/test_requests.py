"""What an environment block asks for, its hash, and a layer over a real interpreter (real
files and real `python` processes; no server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from muster.config import load_config
from muster.environments.interpreters import InterpreterError, inspect, own
from muster.environments.layers import interpreter_header, lower_scripts, write_layer
from muster.environments.request import RequestError, build_request
from tests.environments.wheels import make_wheel


def config(environment: str) -> object:
    return load_config(f"name: x\nentrypoint: python train.py\nenvironment:\n{environment}",
                       source="test")


def request(tmp_path: Path, environment: str, files: dict[str, str] | None = None) -> object:
    context = tmp_path / "context"
    context.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_text(text)
    return build_request(config(environment), context)  # type: ignore[arg-type]


def test_no_block_and_variables_alone_build_nothing(tmp_path: Path) -> None:
    assert request(tmp_path, "  variables: {A: '1'}\n") is None
    assert request(tmp_path, "  python: " + sys.executable + "\n") is None


def test_the_hash_follows_the_content_not_the_spelling(tmp_path: Path) -> None:
    a = request(tmp_path, "  pip: [tinyalpha==1.0]\n")
    from_file = request(tmp_path / "b", "  requirements: r.txt\n",
                        {"r.txt": "# pinned\n\ntinyalpha==1.0   # the one\n"})
    other = request(tmp_path, "  pip: [tinyalpha==1.1]\n")
    clean = request(tmp_path, "  pip: [tinyalpha==1.0]\n  inherit: false\n")
    keys = [r.key for r in (a, from_file, other, clean)]  # type: ignore[attr-defined]
    assert keys[0] == keys[1], "the same lines are the same environment"
    assert len(set(keys)) == 3
    assert all(len(k) == 16 for k in keys)


def test_includes_are_read_in_and_must_stay_inside_the_context(tmp_path: Path) -> None:
    found = request(tmp_path, "  requirements: reqs/main.txt\n", {
        "reqs/main.txt": "-r base.txt\n-c pins.txt\ntinybeta\n",
        "reqs/base.txt": "tinyalpha\n", "reqs/pins.txt": "tinyalpha==1.0\n"})
    assert found.split() == (["tinyalpha", "tinybeta"], ["tinyalpha==1.0"])  # type: ignore[attr-defined]
    with pytest.raises(RequestError, match="not inside the context"):
        request(tmp_path / "c", "  requirements: r.txt\n", {"r.txt": "-r ../../etc/x\n"})
    with pytest.raises(RequestError, match="is not in the uploaded context"):
        request(tmp_path / "d", "  requirements: missing.txt\n")


def test_a_local_wheel_is_hashed_by_its_bytes(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "tinyalpha", "1.0")
    line = f"  pip: ['tinyalpha @ file://{wheel}']\n"
    first = request(tmp_path, line).key  # type: ignore[attr-defined]
    make_wheel(tmp_path / "w", "tinyalpha", "1.0", code="VERSION = 'rebuilt'\n")
    assert request(tmp_path, line).key != first  # type: ignore[attr-defined]


def test_an_unusable_interpreter_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match=r"environment\.python: /nowhere/python does not exist"):
        request(tmp_path, "  python: /nowhere/python\n  pip: [x]\n")
    with pytest.raises(InterpreterError, match="did not answer as a Python interpreter"):
        inspect("/bin/true")  # exits 0, says nothing
    with pytest.raises(InterpreterError, match="not a Python interpreter muster can use"):
        inspect("/bin/false")


def test_own_interpreter_lists_its_site_packages_and_packages() -> None:
    found = own()
    assert found.executable == str(Path(found.executable).resolve())
    assert any(name == "pydantic" for name, _ in found.packages)
    assert inspect(sys.executable) is found  # remembered


def test_a_layer_imports_its_lower_one_and_runs_its_scripts(tmp_path: Path) -> None:
    base = own()
    layer = tmp_path / "layer"
    write_layer(layer, base, base.sites, lower_scripts(base.bin_dir), None)
    python = layer / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import sys, yaml, muster.harness; "
                          "print(sys.prefix)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(layer)
    # `pip` is the layer's: its first line runs the layer's python.
    assert (layer / "bin" / "pip").read_bytes().startswith(interpreter_header(str(python)))
    done = subprocess.run([str(layer / "bin" / "pip"), "--version"], capture_output=True,
                          text=True, check=True)
    assert "pip" in done.stdout


@pytest.mark.parametrize("depth", [1, 3])
def test_a_lower_script_runs_on_the_layers_python(tmp_path: Path, depth: int) -> None:
    """A script of the lower layer (`torchrun`-like: its first line names the lower
    python) runs in the layer; past the kernel's 127 characters, with the /bin/sh header."""
    lower = tmp_path / "lower" / "bin"
    lower.mkdir(parents=True)
    (lower / "python").symlink_to(sys.executable)
    script = lower / "where"
    script.write_text(f"#!{lower / 'python'}\nimport sys\nprint(sys.prefix)\n")
    script.chmod(0o755)
    layer = tmp_path.joinpath(*[("d" * 50)] * depth) / "layer"
    base = own()
    write_layer(layer, base, base.sites, lower_scripts(str(lower)), None)
    header = interpreter_header(str(layer / "bin" / "python"))
    assert header.startswith(b"#!/bin/sh\n") == (len(str(layer / "bin" / "python")) > 125)
    done = subprocess.run([str(layer / "bin" / "where")], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == str(layer)
