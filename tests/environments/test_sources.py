"""Where a user's requirement lines may fetch from (`muster.environments.sources`): a table
of lines, each allowed or refused, against a real context directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from muster.config import ExperimentConfig, load_config
from muster.environments.sources import PYPI, configured_sources, package_source_problems

LAB = "https://pypi.lab.example/simple"
ALLOWED = [LAB, "wheels.lab.example"]  # a URL (its host and port) and a bare host (any port)
NO_UV: dict[str, str] = {}  # the server's uv uses PyPI


def config(pip: list[str], requirements: str | None = None) -> ExperimentConfig:
    environment: dict[str, object] = {"pip": pip}
    if requirements is not None:
        environment["requirements"] = requirements
    return load_config(json.dumps({"name": "x", "entrypoint": "python train.py",
                                   "environment": environment}), source="test")


def problems(context: Path, line: str, allowed: list[str] | None = None,
             environ: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """(where the line was, the problems): an option goes in the requirements file
    (`environment.pip` takes requirements only), anything else in `environment.pip`."""
    if line.startswith("-"):
        (context / "requirements.txt").write_text(f"tinyalpha\n{line}\n")
        checked, where = config([], "requirements.txt"), "environment.requirements"
    else:
        checked, where = config(["tinyalpha", line]), "environment.pip[1]"
    return where, package_source_problems(checked, context, ALLOWED if allowed is None
                                          else allowed, NO_UV if environ is None else environ)


@pytest.fixture
def context(tmp_path: Path) -> Path:
    root = tmp_path / "context"
    (root / "wheels").mkdir(parents=True)
    (root / "pkg").mkdir()
    return root


@pytest.mark.parametrize("line", [
    "tinyalpha==1.0",
    "tinyalpha[extra]>=1; python_version >= '3.10'",
    "tinyalpha==1.0 --hash=sha256:00ff",
    "x @ https://files.pythonhosted.org/packages/x-1.0-py3-none-any.whl",
    "x @ https://pypi.lab.example/packages/x-1.0-py3-none-any.whl",
    "x @ https://wheels.lab.example:8443/x-1.0-py3-none-any.whl",
    "git+https://wheels.lab.example/team/x.git@v1",
    "--index-url https://pypi.lab.example/simple",
    "--extra-index-url=https://pypi.org/simple",
    "-ihttps://pypi.lab.example/simple",
    "--find-links ./wheels",
    "-f wheels",
    "./pkg",
    "-e ./pkg",
    "-e .",
    "./wheels/x-1.0-py3-none-any.whl",
    "--no-index",
    "--pre",
    "--only-binary :all:",
])
def test_a_line_within_the_sources_and_the_context_is_allowed(context: Path,
                                                              line: str) -> None:
    assert problems(context, line)[1] == []


@pytest.mark.parametrize(("line", "said"), [
    ("x @ http://127.0.0.1:8000/x-1.0-py3-none-any.whl",
     "fetches from 127.0.0.1:8000, which is not a package source"),
    ("x@http://localhost/x.whl", "fetches from localhost:80"),
    ("http://169.254.169.254/latest/x.whl", "fetches from 169.254.169.254:80"),
    ("git+https://github.com/a/b.git", "fetches from github.com:443"),
    ("git+ssh://git@internal.example/b.git", "fetches from internal.example:22"),
    ("x @ https://pypi.lab.example:8443/x.whl", "fetches from pypi.lab.example:8443"),
    ("--index-url http://127.0.0.1:9/simple", "fetches from 127.0.0.1:9"),
    ("-i http://127.0.0.1:9/simple", "fetches from 127.0.0.1:9"),
    ("--extra-index-url=http://10.0.0.1/simple", "fetches from 10.0.0.1:80"),
    ("--index https://evil.example/simple", "fetches from evil.example:443"),
    ("--default-index https://evil.example/simple", "fetches from evil.example:443"),
    ("-f http://127.0.0.1:9/links", "fetches from 127.0.0.1:9"),
    ("--find-links /srv/wheels", "local path '/srv/wheels', which is outside"),
    ("--index-url ./simple", "names the local path './simple' where an index is expected"),
    ("/etc/passwd", "outside the submitted context"),
    ("x @ file:///root/x-1.0-py3-none-any.whl", "local path '/root/x-1.0"),
    ("../outside.whl", "outside the submitted context"),
    ("-e /home/bob/project", "outside the submitted context"),
    ("~/x.whl", "outside the submitted context"),
    ("--index-url", "gives --index-url without a value"),
    ("--cert /etc/ssl/private/key.pem", "gives the option --cert, which a user may not give"),
    ("tinyalpha; python_version > '3' --index-url http://127.0.0.1:9/",
     "fetches from 127.0.0.1:9"),
])
def test_a_line_naming_another_place_is_refused(context: Path, line: str, said: str) -> None:
    where, found = problems(context, line)
    assert len(found) == 1, found
    assert found[0].startswith(where), found
    assert said in found[0]
    assert "ask an admin to add it to package_sources in the cluster config" in found[0]


def test_the_requirements_file_is_checked_too_and_named(context: Path) -> None:
    (context / "requirements.txt").write_text(
        "tinyalpha\n-r more.txt\n")
    (context / "more.txt").write_text("--extra-index-url http://127.0.0.1:8080/simple\n")
    problems = package_source_problems(config([], "requirements.txt"), context, ALLOWED,
                                       NO_UV)
    assert len(problems) == 1
    assert problems[0].startswith("environment.requirements (requirements.txt): ")
    assert "127.0.0.1:8080" in problems[0]


def test_the_configured_index_is_allowed_and_pypi_only_without_one(context: Path) -> None:
    own = {"UV_INDEX_URL": "http://127.0.0.1:3141/root/pypi/+simple/"}
    assert configured_sources(NO_UV) == list(PYPI)
    assert configured_sources(own) == [own["UV_INDEX_URL"]]
    line = "x @ http://127.0.0.1:3141/root/pypi/x.whl"
    assert package_source_problems(config([line]), context, [], own) == []
    refused = package_source_problems(config(["x @ https://pypi.org/simple/x.whl"]), context,
                                      [], own)
    assert "fetches from pypi.org:443" in refused[0]
    assert "install from http://127.0.0.1:3141/root/pypi/+simple/" in refused[0]
    extra = {"UV_EXTRA_INDEX_URL": "https://a.example/simple https://b.example/simple",
             "UV_INDEX": "lab=https://c.example/simple"}
    assert configured_sources(extra) == [*PYPI, "https://a.example/simple",
                                         "https://b.example/simple", "https://c.example/simple"]
