"""The module map, as docs/architecture.md keeps it, for the site's Concepts page.

The map is spelled once, in architecture.md's "The module map" section (its engineers keep
it in step with the code); the Concepts page shows that section's text up to the end of its
first code block, the diagram, copied when the site is built.
"""

from __future__ import annotations

from pathlib import Path

ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
HEADING = "## The module map\n"
PLACEHOLDER = "<!-- generated: module-map -->"
FENCE = "\n```\n"


def module_map(text: str | None = None) -> str:
    """The section's text from below its heading to its diagram's closing fence.

    Raises:
        ValueError: architecture.md has no such section, or no diagram in it.
    """
    text = ARCHITECTURE.read_text() if text is None else text
    start = text.find(HEADING)
    opening = text.find("\n```", start)
    closing = text.find(FENCE, opening + 1)
    if start < 0 or opening < 0 or closing < 0:
        raise ValueError(f"{ARCHITECTURE} has no '{HEADING.strip()}' section with a diagram "
                         "for the Concepts page")
    return text[start + len(HEADING):closing + len(FENCE)].strip() + "\n"


if __name__ == "__main__":
    print(module_map(), end="")
