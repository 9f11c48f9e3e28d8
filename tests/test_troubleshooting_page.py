"""docs/troubleshooting.md says what to do for every way a trial can end short: each exit
reason (`states.Reason`), each verification check and each coded-bias check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from muster.diagnostics.bias import CHECKS as BIAS_CHECKS
from muster.states import Reason

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
VERIFICATION = ROOT / "src" / "muster" / "supervise" / "verification.py"


def headings() -> set[str]:
    return set(re.findall(r"^###+ `([\w.]+)`$", PAGE.read_text(), re.M))


def verification_checks() -> set[str]:
    """Every check `supervise/verification.py` can make, by the name it gives it."""
    return set(re.findall(r'\bCheck\("(\w+)"', VERIFICATION.read_text()))


def test_the_checks_are_found() -> None:
    assert {"completed", "samples", "checkpoint_fresh", "log_complete"} <= verification_checks()


@pytest.mark.parametrize("reason", [reason.value for reason in Reason])
def test_every_exit_reason_has_its_section(reason: str) -> None:
    assert reason in headings()


@pytest.mark.parametrize("check", sorted(verification_checks()))
def test_every_verification_check_has_its_section(check: str) -> None:
    assert check in headings()


@pytest.mark.parametrize("check", BIAS_CHECKS)
def test_every_coded_bias_check_is_explained(check: str) -> None:
    assert f"**`diagnostics.{check}`**" in PAGE.read_text()
