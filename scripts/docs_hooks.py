"""MkDocs hooks (mkdocs.yml `hooks:`): the parts of the site generated at build time.

The CLI reference comes from the Typer app, the HTTP API reference from the app's
`/openapi.json` (built in this process, no server), the table of Determined's keys from the
config schema, the Concepts page's module map from docs/architecture.md; none is committed
twice, so none can go stale. The JSON contract page is committed
(tools outside the site read it) and held to `muster/api.py` by tests/test_contract_page.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the generators beside this file

import cli_reference
import determined_keys
import http_reference
import module_map

GENERATED = {
    "reference/cli.md": cli_reference.page,
    "reference/http-api.md": lambda: http_reference.page(http_reference.openapi_document()),
}


def on_files(files: Files, config: Any) -> Files:
    """Add each generated page to the site, as if it were a file under docs/."""
    for src_uri, make in GENERATED.items():
        files.append(File.generated(config, src_uri, content=make()))
    return files


PLACED = {
    determined_keys.PLACEHOLDER: determined_keys.table,
    module_map.PLACEHOLDER: module_map.module_map,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Put each generated part where its page's placeholder stands."""
    for placeholder, make in PLACED.items():
        if placeholder in markdown:
            markdown = markdown.replace(placeholder, make())
    return markdown
