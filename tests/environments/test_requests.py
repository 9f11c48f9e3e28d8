"""What an environment block asks for, its hash, and a layer over a real interpreter (real
files and real `python` processes; no server)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from muster.config import load_config
from muster.environments.interpreters import InterpreterError, inspect, own
from muster.environments.layers import (
    RELOCATABLE_HEADER,
    interpreter_header,
    lower_scripts,
    site_packages,
    write_layer,
)
from muster.environments.layout import EnvHome
from muster.environments.registry import Environments, TrialEnvironment
from muster.environments.request import BuildRequest, RequestError, build_request
from muster.environments.runtime_base import RuntimeBase
from tests.environments.wheels import make_wheel
from tests.waiting import wait_until


def config(environment: str) -> object:
    return load_config(f"name: x\nentrypoint: python train.py\nenvironment:\n{environment}",
                       source="test")


@pytest.fixture
def runtime(tmp_path: Path) -> RuntimeBase:
    """The base of trials of a home made here, computed from muster's own installation."""
    return RuntimeBase(EnvHome(tmp_path / "envs").ensure())


def request(tmp_path: Path, environment: str, files: dict[str, str] | None = None, *,
            runtime: RuntimeBase) -> object:
    context = tmp_path / "context"
    context.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_text(text)
    return build_request(config(environment), context,  # type: ignore[arg-type]
                         runtime=runtime)


def test_no_block_and_variables_alone_build_nothing(tmp_path: Path, runtime: RuntimeBase) -> None:
    assert request(tmp_path, "  variables: {A: '1'}\n", runtime=runtime) is None
    assert request(tmp_path, "  python: " + sys.executable + "\n", runtime=runtime) is None
    assert not runtime.layout.runtime.exists(), "the base is not built for nothing"


def test_the_hash_follows_the_content_not_the_spelling(tmp_path: Path,
                                                       runtime: RuntimeBase) -> None:
    a = request(tmp_path, "  pip: [tinyalpha==1.0]\n", runtime=runtime)
    from_file = request(tmp_path / "b", "  requirements: r.txt\n",
                        {"r.txt": "# pinned\n\ntinyalpha==1.0   # the one\n"}, runtime=runtime)
    other = request(tmp_path, "  pip: [tinyalpha==1.1]\n", runtime=runtime)
    clean = request(tmp_path, "  pip: [tinyalpha==1.0]\n  inherit: false\n", runtime=runtime)
    keys = [r.key for r in (a, from_file, other, clean)]  # type: ignore[attr-defined]
    assert keys[0] == keys[1], "the same lines are the same environment"
    assert len(set(keys)) == 3
    assert all(len(k) == 16 for k in keys)


def test_includes_are_read_in_and_must_stay_inside_the_context(tmp_path: Path,
                                                               runtime: RuntimeBase) -> None:
    found = request(tmp_path, "  requirements: reqs/main.txt\n", {
        "reqs/main.txt": "-r base.txt\n-c pins.txt\ntinybeta\n",
        "reqs/base.txt": "tinyalpha\n", "reqs/pins.txt": "tinyalpha==1.0\n"}, runtime=runtime)
    assert found.split() == (["tinyalpha", "tinybeta"], ["tinyalpha==1.0"])  # type: ignore[attr-defined]
    with pytest.raises(RequestError, match="not inside the context"):
        request(tmp_path / "c", "  requirements: r.txt\n", {"r.txt": "-r ../../etc/x\n"},
                runtime=runtime)
    with pytest.raises(RequestError, match="is not in the uploaded context"):
        request(tmp_path / "d", "  requirements: missing.txt\n", runtime=runtime)


def test_a_local_wheel_is_hashed_by_its_bytes(tmp_path: Path, runtime: RuntimeBase) -> None:
    wheel = make_wheel(tmp_path / "w", "tinyalpha", "1.0")
    line = f"  pip: ['tinyalpha @ file://{wheel}']\n"
    first = request(tmp_path, line, runtime=runtime).key  # type: ignore[attr-defined]
    make_wheel(tmp_path / "w", "tinyalpha", "1.0", code="VERSION = 'rebuilt'\n")
    assert request(tmp_path, line, runtime=runtime).key != first  # type: ignore[attr-defined]


def test_an_environment_that_inherits_stands_on_the_trials_base_not_musters_venv(
        tmp_path: Path, runtime: RuntimeBase) -> None:
    """Without environment.python, what a build inherits is the runtime base (torch, not
    FastAPI) and its hash covers the base's key; inherit: false and a named interpreter
    are based as before."""
    inherits = request(tmp_path, "  pip: [tinyalpha==1.0]\n", runtime=runtime)
    assert isinstance(inherits, BuildRequest)
    base = runtime.base()
    assert inherits.base == base.interpreter and inherits.based_on == base.key
    assert inherits.base.sites == (str(site_packages(runtime.layout.runtime_current, own())),)
    assert "torch" in dict(inherits.base.packages)
    assert not {"fastapi", "uvicorn", "pytest"} & set(dict(inherits.base.packages))
    assert BuildRequest.from_json(inherits.to_json()) == inherits, "kept as it is"
    clean = request(tmp_path, "  pip: [tinyalpha==1.0]\n  inherit: false\n", runtime=runtime)
    named = request(tmp_path, f"  pip: [tinyalpha==1.0]\n  python: {sys.executable}\n",
                    runtime=runtime)
    assert isinstance(clean, BuildRequest) and isinstance(named, BuildRequest)
    assert (clean.base, clean.based_on) == (own(), None), "a clean venv needs only a binary"
    assert (named.base.path, named.based_on) == (sys.executable, None)
    assert named.base.sites == own().sites, "the interpreter named, with its own packages"
    assert len({inherits.key, clean.key, named.key}) == 3


def test_the_hash_changes_with_the_base(tmp_path: Path) -> None:
    """A base rebuilt (here: for jobs that run as other accounts) or a configured venv
    whose packages changed gives the same environment block a new hash."""
    layout = EnvHome(tmp_path / "envs").ensure()
    line = "  pip: [tinyalpha==1.0]\n"
    first = request(tmp_path, line, runtime=RuntimeBase(layout))
    rebuilt = request(tmp_path, line, runtime=RuntimeBase(layout, shared=True))
    assert isinstance(first, BuildRequest) and isinstance(rebuilt, BuildRequest)
    assert first.base.sites == rebuilt.base.sites, "both name envs/runtime/current"
    assert first.based_on != rebuilt.based_on and first.key != rebuilt.key

    venv = tmp_path / "train-venv"
    subprocess.run([own().executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    configured = RuntimeBase(layout, configured=str(venv))
    before = request(tmp_path, line, runtime=configured)
    assert isinstance(before, BuildRequest)
    assert before.base.path == str(venv / "bin" / "python")
    make_wheel(tmp_path / "w", "tinybeta", "2.0")
    site = Path(before.base.sites[0])
    with zipfile.ZipFile(tmp_path / "w" / "tinybeta-2.0-py3-none-any.whl") as wheel:
        wheel.extractall(site)  # installed by hand: the venv has no pip
    after = request(tmp_path, line, runtime=configured)
    assert isinstance(after, BuildRequest)
    assert ("tinybeta", "2.0") in after.base.packages
    assert after.based_on != before.based_on and after.key != before.key


def test_an_unusable_interpreter_is_refused_with_the_reason(tmp_path: Path,
                                                            runtime: RuntimeBase) -> None:
    with pytest.raises(RequestError, match=r"environment\.python: /nowhere/python does not exist"):
        request(tmp_path, "  python: /nowhere/python\n  pip: [x]\n", runtime=runtime)
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
    # `pip` is the layer's: its first lines run the python beside it.
    assert (layer / "bin" / "pip").read_bytes().startswith(RELOCATABLE_HEADER)
    done = subprocess.run([str(layer / "bin" / "pip"), "--version"], capture_output=True,
                          text=True, check=True)
    assert "pip" in done.stdout


def _prefix_of(script: Path, *, via_path: bool = False) -> str:
    """`sys.prefix` in the Python that runs `script` (a lower layer's `where`-like one)."""
    env = {"PATH": f"{script.parent}:/usr/bin:/bin"}
    argv = [script.name] if via_path else [str(script)]
    return subprocess.run(argv, capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


def _where_script(tmp_path: Path) -> Path:
    """A lower bin directory with one script that prints the prefix it runs in."""
    lower = tmp_path / "lower" / "bin"
    lower.mkdir(parents=True)
    (lower / "python").symlink_to(sys.executable)
    script = lower / "where"
    script.write_text(f"#!{lower / 'python'}\nimport sys\nprint(sys.prefix)\n")
    script.chmod(0o755)
    return lower


def test_a_layer_renamed_runs_its_scripts_in_itself(tmp_path: Path) -> None:
    """Made under one name, renamed (as a layer made ahead of time is), its scripts run on
    the python beside them: by path, through PATH, and through a link from elsewhere."""
    lower = _where_script(tmp_path)
    base = own()
    made = tmp_path / "made-here"
    write_layer(made, base, base.sites, lower_scripts(str(lower)), None)
    moved = tmp_path / "somewhere" / "else"
    moved.parent.mkdir()
    made.rename(moved)
    assert _prefix_of(moved / "bin" / "where") == str(moved)
    assert _prefix_of(moved / "bin" / "where", via_path=True) == str(moved)
    link = tmp_path / "links" / "where"
    link.parent.mkdir()
    link.symlink_to(moved / "bin" / "where")
    assert _prefix_of(link) == str(moved)


def test_a_trial_layer_is_made_ahead_and_renamed_into_place(tmp_path: Path) -> None:
    """After a trial's layer is made, the next one of the same kind is made on a thread;
    the next trial's launch renames it into its run directory (and another is made)."""
    envs = Environments(tmp_path / "envs")
    base = own()

    def trial(name: str) -> TrialEnvironment:
        return TrialEnvironment(layer=tmp_path / "runs" / name / "env", base=base,
                                built=None, inherit=True, key=None)

    def spares() -> list[Path]:
        return [p for p in envs.layout.spares.iterdir() if not p.name.startswith(".")]

    first, second = trial("first"), trial("second")
    assert envs.prepare(first)
    made = wait_until(lambda: spares() or None, timeout=60, what="a layer made ahead")
    assert isinstance(made, list) and len(made) == 1
    spare_inode = made[0].stat().st_ino
    assert envs.prepare(second)
    assert second.layer.stat().st_ino == spare_inode, "the spare was renamed into place"
    assert not envs.prepare(second), "made once: every attempt shares it"
    for layer in (first.layer, second.layer):
        assert (layer / "bin" / "pip").read_bytes().startswith(RELOCATABLE_HEADER)
        subprocess.run([str(layer / "bin" / "pip"), "--version"], capture_output=True,
                       check=True)
        prefix = subprocess.run([str(layer / "bin" / "python"), "-c",
                                 "import sys; print(sys.prefix)"], capture_output=True,
                                text=True, check=True).stdout.strip()
        assert prefix == str(layer)
    wait_until(lambda: spares() or None, timeout=60, what="the next layer made ahead")
    Environments(tmp_path / "envs")  # a restarted server's
    assert list(envs.layout.spares.iterdir()) == [], "it starts without the last one's spares"


@pytest.mark.parametrize("depth", [1, 3])
def test_a_lower_script_runs_on_the_layers_python(tmp_path: Path, depth: int) -> None:
    """A script of the lower layer (`torchrun`-like: its first line names the lower
    python) runs in the layer; past the kernel's 127 characters, with the /bin/sh header."""
    lower = _where_script(tmp_path)
    layer = tmp_path.joinpath(*[("d" * 50)] * depth) / "layer"
    base = own()
    write_layer(layer, base, base.sites, lower_scripts(str(lower)), None)
    header = interpreter_header(str(layer / "bin" / "python"))
    assert header.startswith(b"#!/bin/sh\n") == (len(str(layer / "bin" / "python")) > 125)
    done = subprocess.run([str(layer / "bin" / "where")], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == str(layer)
