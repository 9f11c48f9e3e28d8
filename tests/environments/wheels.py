"""Tiny wheels made in a test, so that builds install real packages without an index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Sequence
from pathlib import Path


def make_wheel(where: Path, name: str, version: str, *, requires: Sequence[str] = (),
               code: str | None = None) -> Path:
    """A pure-Python wheel of `name` (module `name` with `VERSION`) into `where`."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {
        f"{module}.py": code if code is not None else f"VERSION = {version!r}\n",
        f"{dist}.dist-info/METADATA": "".join(
            ["Metadata-Version: 2.1\n", f"Name: {name}\n", f"Version: {version}\n",
             *(f"Requires-Dist: {r}\n" for r in requires)]),
        f"{dist}.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: muster-tests\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = [f"{path},sha256={_digest(text.encode())},{len(text.encode())}"
              for path, text in files.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
