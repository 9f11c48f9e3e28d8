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
