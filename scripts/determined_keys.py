"""The table of Determined config keys muster answers with a hint, from the schema itself.

Each config section's `FOREIGN_KEYS` maps a key Determined has and muster spells otherwise
(or does without) to the hint a submission gets; the site's "Coming from Determined" page
shows them all (the hook puts the table where the page says), so the page cannot miss one.
`python scripts/determined_keys.py` prints the table.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator

from pydantic import BaseModel

from muster.config.schema import ExperimentConfig

PLACEHOLDER = "<!-- generated: determined-keys -->"


def table() -> str:
    """A Markdown table: the Determined key by its path, and what muster says of it."""
    rows = [f"| `{path}` | {hint.replace('|', chr(92) + '|')} |"
            for path, hint in foreign_keys(ExperimentConfig, "")]
    return "\n".join(["| Determined key | What muster says |", "|---|---|", *rows])


def foreign_keys(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str]]:
    """(key path, hint) for `model`'s foreign keys, then its sections' in field order."""
    foreign: dict[str, str] = getattr(model, "FOREIGN_KEYS", {})
    for key, hint in foreign.items():
        yield prefix + key, hint
    for name, field in model.model_fields.items():
        for section in _sections(field.annotation):
            yield from foreign_keys(section, f"{prefix}{field.alias or name}.")


def _sections(annotation: object) -> list[type[BaseModel]]:
    candidates = [annotation, *typing.get_args(annotation)]
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


if __name__ == "__main__":
    print(table())
