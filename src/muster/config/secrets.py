"""Where a secret's value comes from (`environment.secrets`): `submit`, `env:NAME` or
`file:/absolute/path`. `muster.job_secrets` reads, keeps and masks the values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SUBMIT", "SecretSource", "source_of"]

SUBMIT = "submit"


@dataclass(frozen=True)
class SecretSource:
    kind: Literal["submit", "env", "file"]
    where: str = ""  # the variable (env) or the path (file)

    def describe(self) -> str:
        return {"submit": "sent with the submission", "env": f"the server's ${self.where}",
                "file": f"the server's file {self.where}"}[self.kind]


def source_of(text: str) -> SecretSource:
    """`submit`, `env:NAME` or `file:/absolute/path`.

    Raises:
        ValueError: anything else, with what to write.
    """
    if text == SUBMIT:
        return SecretSource("submit")
    kind, _, where = text.partition(":")
    if kind == "env" and where:
        return SecretSource("env", where)
    if kind == "file" and where.startswith("/"):
        return SecretSource("file", where)
    raise ValueError(f"{text!r} is not a source; write `submit` (sent with the submission), "
                     "`env:NAME` (the server's environment) or `file:/absolute/path` (a file "
                     "on the server)")
