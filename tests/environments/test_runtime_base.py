"""The runtime base on disk: built from a real installation (muster's own venv, or one made
here), published, rebuilt when the installation changes, and what a trial's layer over it
imports (real files and real `python` processes; no server)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from muster.config import load_config
from muster.environments.interpreters import Interpreter, own
from muster.environments.layers import lower_scripts, write_layer
from muster.environments.layout import EnvHome
from muster.environments.registry import Environments
from muster.environments.runtime_base import RuntimeBase, ensure_base
from muster.errors import LaunchError

IMPORTS = """\
import importlib, json
found = {}
for name in ("torch", "numpy", "sklearn", "muster.harness", "fastapi", "pytest", "uvicorn",
             "kept", "google.kept", "google.left", "server_only", "added"):
    try:
        importlib.import_module(name)
        found[name] = "imported"
    except ImportError:
        found[name] = "missing"
print(json.dumps(found))
"""


def imports_in_a_layer(envs: EnvHome, base: Interpreter, layer: Path) -> dict[str, str]:
    """What `python` in a trial's layer over `base` imports (the layer a launch makes)."""
    write_layer(layer, base, base.sites, lower_scripts(base.bin_dir), envs.ensure_harness())
    done = subprocess.run([str(layer / "bin" / "python"), "-c", IMPORTS], capture_output=True,
                          text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    found: dict[str, str] = json.loads(done.stdout)
    return found


def test_a_layer_over_the_base_of_musters_venv_imports_torch_but_not_musters_server(
        tmp_path: Path) -> None:
    envs = EnvHome(tmp_path / "envs").ensure()
    base = ensure_base(envs, own())
    found = imports_in_a_layer(envs, base, tmp_path / "layer")
    assert {name: found[name] for name in ("torch", "numpy", "sklearn", "muster.harness")} \
        == dict.fromkeys(("torch", "numpy", "sklearn", "muster.harness"), "imported")
    assert {name: found[name] for name in ("fastapi", "pytest", "uvicorn")} \
        == dict.fromkeys(("fastapi", "pytest", "uvicorn"), "missing")
    assert dict(base.packages)["torch"].startswith("2."), "torch is among its packages"
    assert "fastapi" not in dict(base.packages)
    # torchrun runs on the layer's python (rebased into the layer from the base's bin).
    torchrun = tmp_path / "layer" / "bin" / "torchrun"
    assert subprocess.run([str(torchrun), "--help"], capture_output=True, check=False,
                          env={"PATH": "/usr/bin:/bin"}).returncode == 0


def install(site: Path, name: str, files: dict[str, str], *, requires: tuple[str, ...] = (),
            extras: tuple[str, ...] = (), version: str = "1.0") -> None:
    """A distribution installed into `site` by hand: its files, METADATA and RECORD."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                        *(f"Requires-Dist: {r}\n" for r in requires),
                        *(f"Provides-Extra: {x}\n" for x in extras)])
    files = {**files, f"{info}/METADATA": metadata}
    for path, text in files.items():
        target = site / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if path.startswith("../"):
            target.chmod(0o755)
    record = [f"{path},," for path in files] + [f"{info}/RECORD,,"]
    (site / info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.fixture
def installation(tmp_path: Path) -> Interpreter:
    """A venv-shaped installation made here: muster (requiring `server-only` and a
    namespace package's left-out half), a training package with a script, a namespace
    package split between them."""
    prefix = tmp_path / "installed"
    server = own()
    site = prefix / "lib" / server.lib_dir / "site-packages"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(server.executable)
    python_line = f"#!{prefix / 'bin' / 'python'}\n"
    install(site, "muster", {}, requires=("server-only", "left"))
    install(site, "server-only", {"server_only.py": "", "../../../bin/serve": python_line})
    install(site, "left", {"google/left/__init__.py": ""})
    install(site, "kept", {"kept.py": "", "google/kept/__init__.py": "",
                           "../../../bin/kept-tool": python_line + "import kept\n"
                           "print('kept-tool ran')\n"})
    return dataclasses.replace(server, path=str(prefix / "bin" / "python"),
                               prefix=str(prefix), sites=(str(site),),
                               packages=(("kept", "1.0"),))


def test_the_base_holds_the_included_half_of_a_shared_namespace_and_their_scripts(
        tmp_path: Path, installation: Interpreter) -> None:
    envs = EnvHome(tmp_path / "envs").ensure()
    base = ensure_base(envs, installation)
    assert dict(base.packages) == {"kept": "1.0"}
    found = imports_in_a_layer(envs, base, tmp_path / "layer")
    assert (found["kept"], found["google.kept"]) == ("imported", "imported")
    assert (found["google.left"], found["server_only"]) == ("missing", "missing")
    bin_dir = Path(base.bin_dir)
    assert not (bin_dir / "serve").exists(), "a left-out distribution's script is not there"
    ran = subprocess.run([str(tmp_path / "layer" / "bin" / "kept-tool")], capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert ran.stdout == "kept-tool ran\n"
    assert (envs.runtime_current / ".muster" / "base.json").is_file()


def test_the_base_is_built_once_then_again_when_the_installation_changes(
        tmp_path: Path, installation: Interpreter) -> None:
    envs = EnvHome(tmp_path / "envs").ensure()
    ensure_base(envs, installation)
    first = envs.runtime_current.resolve()
    ensure_base(envs, installation)
    assert envs.runtime_current.resolve() == first, "the same content is not built again"
    install(Path(installation.sites[0]), "added", {"added.py": ""})
    base = ensure_base(envs, installation)
    second = envs.runtime_current.resolve()
    assert second != first and not first.exists(), "the old base went once replaced"
    assert "added" in dict(base.packages)
    # A layer names `current`, so one made before the change sees the new package.
    assert imports_in_a_layer(envs, base, tmp_path / "layer")["added"] == "imported"
    assert sorted(p.name for p in envs.runtime.iterdir()) == sorted(["current", second.name])


def test_under_run_as_the_base_is_root_s_and_readable_by_every_account(
        tmp_path: Path, installation: Interpreter) -> None:
    envs = EnvHome(tmp_path / "envs").ensure(shared=True)
    ensure_base(envs, installation)  # built before run_as was set: rebuilt for it
    ensure_base(envs, installation, shared=True)
    assert stat.S_IMODE(envs.runtime.stat().st_mode) == 0o711, "entered, never listed"
    built = envs.runtime_current.resolve()
    for folder, _dirs, files in os.walk(built):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755, folder
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                assert stat.S_IMODE(path.stat().st_mode) & 0o444 == 0o444, path
    assert os.access(built / "bin" / "kept-tool", os.X_OK)
    ensure_base(envs, installation, shared=False)  # jobs run as the server's user again
    assert envs.runtime_current.resolve() != built, "built again"
    assert stat.S_IMODE(envs.runtime.stat().st_mode) == 0o700, "the server's alone"


def config(environment: str = "") -> object:
    block = f"environment:\n{environment}" if environment else ""
    return load_config(f"name: x\nentrypoint: python train.py\n{block}", source="test")


def test_a_trial_without_an_environment_block_runs_on_the_base(tmp_path: Path) -> None:
    envs = Environments(tmp_path / "envs")
    plain = envs.for_trial(config(), None, tmp_path / "layer")  # type: ignore[arg-type]
    assert plain.lower_sites == (str(envs.layout.runtime_current / "lib" / own().lib_dir
                                     / "site-packages"),)
    assert plain.path[1] == str(envs.layout.runtime_current / "bin")
    own_python = envs.for_trial(config(f"  python: {sys.executable}\n"),  # type: ignore[arg-type]
                                None, tmp_path / "other")
    assert own_python.lower_sites == own().sites, "environment.python names its own packages"


def test_a_base_that_cannot_be_built_fails_the_launch_naming_the_fix(tmp_path: Path) -> None:
    envs = Environments(tmp_path / "envs")
    envs.layout.runtime.write_text("not a directory")  # where the base must be made
    with pytest.raises(LaunchError, match=r"runtime base .* cannot be built.*base_environment"):
        envs.for_trial(config(), None, tmp_path / "layer")  # type: ignore[arg-type]
    said = envs.runtime.summary().error
    assert said is not None and "File exists" in said
    envs.layout.runtime.unlink()  # fixed: the next try (a while later, or a restart) builds
    assert envs.runtime.summary().error == said, "told again, not tried at every look"
    assert not envs.layout.runtime.exists()
    restarted = Environments(tmp_path / "envs")
    restarted.for_trial(config(), None, tmp_path / "layer")  # type: ignore[arg-type]
    assert restarted.layout.runtime_current.is_dir()


def test_a_configured_base_environment_is_what_plain_trials_run_on(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([own().executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    envs = Environments(tmp_path / "envs", base_environment=str(venv))
    plain = envs.for_trial(config(), None, tmp_path / "layer")  # type: ignore[arg-type]
    assert plain.base.path == str(venv / "bin" / "python")
    assert plain.lower_sites == (str(venv / "lib" / own().lib_dir / "site-packages"),)
    assert not envs.layout.runtime_current.exists(), "nothing is computed"
    summary = envs.runtime.summary()
    assert (summary.source, summary.path, summary.error) == ("configured", str(venv), None)
    broken = RuntimeBase(envs.layout, configured=str(tmp_path / "nowhere"))
    assert "does not exist" in (broken.summary().error or "")
    assert os.path.isdir(venv)
