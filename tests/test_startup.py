"""`muster.startup`, what every Python process of a trial runs first: it names the job's
variables as `muster.jobenv` does, and costs a process that needs neither `compat` nor
`integrations` next to nothing (it imports nothing of muster's but itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from muster import jobenv, startup

SRC = Path(__file__).resolve().parents[1] / "src"


def test_it_names_the_variables_as_jobenv_does() -> None:
    assert (startup.COMPAT, startup.INTEGRATIONS, startup.RUN_DIR) == (
        jobenv.COMPAT, jobenv.INTEGRATIONS, jobenv.RUN_DIR)


def test_a_process_without_compat_or_integrations_imports_only_startup() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env["PYTHONPATH"] = str(SRC)
    code = ("import sys, json, muster.startup; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('muster'))))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == ["muster", "muster.startup"]


def test_integrations_on_import_no_more_of_the_standard_library_than_python_does(
        tmp_path: Path) -> None:
    """The import hook (`integrations: auto`, on by default) is in every Python process of a
    trial: it adds muster's three modules and `importlib`'s own, never `importlib.abc` (which
    imports `importlib.resources`, `pathlib`, `tempfile`, `typing`: ~28 ms a process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env["PYTHONPATH"] = str(SRC)
    # `site` is left out (-S): the modules compared are the hook's and what they import.
    code = "import os, sys, json; print(json.dumps(sorted(sys.modules)))"
    bare = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    env |= {startup.INTEGRATIONS: "auto", startup.RUN_DIR: str(tmp_path)}
    hooked = subprocess.run([sys.executable, "-S", "-c", f"import muster.startup; {code}"],
                            env=env, capture_output=True, text=True, timeout=60, check=True)
    added = {m for m in set(json.loads(hooked.stdout)) - set(json.loads(bare.stdout))
             if not m.startswith("importlib._")}  # importlib's frozen parts, named
    assert added == {"muster", "muster.startup", "muster.integrations",
                     "muster.integrations.autohook", "importlib", "warnings", "__future__"}, \
        added
    hooked_finders = subprocess.run(
        [sys.executable, "-S", "-c", "import sys, muster.startup; "
         "print(type(sys.meta_path[0]).__module__)"],
        env=env, capture_output=True, text=True, timeout=60, check=True)
    assert hooked_finders.stdout.strip() == "muster.integrations.autohook"  # ... and first
