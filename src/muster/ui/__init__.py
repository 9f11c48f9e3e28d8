"""The web UI's files: Jinja2 templates and static assets (`muster.server.pages` serves them).

`static/vendor/` holds the third-party scripts, copied from npm at install time
(`ui/package-lock.json`, `make install`) and never committed; `assets_missing()` says which
are absent, so a server installed without them says so on every page instead of serving
pages that cannot work.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC", "TEMPLATES", "VENDOR_FILES", "assets_missing"]

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
VENDOR_FILES = ("htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css", "hermes.iife.js")


def assets_missing() -> list[str]:
    """The vendor files that are not there (none after `make install`)."""
    return [name for name in VENDOR_FILES if not (STATIC / "vendor" / name).is_file()]
