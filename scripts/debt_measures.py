"""Print the measures issue 32 set for the code's seams, from the source as it is now.

    python scripts/debt_measures.py [--json] [ROOT]

- `dict[str, Any]` in src (what is left should be free JSON: hyperparameters, metrics,
  config blobs), and the named free-JSON aliases used instead;
- `# type: ignore` in src, and in client.py;
- readers of `on_cluster` outside `launch/` (a backend's differences are capabilities or a
  placement strategy, not one flag);
- `ExperimentConfig.model_validate(` outside `store/` and `config/loading.py` (the stored
  config has one home);
- enums defined outside `states.py`, and `.value` reads in src.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

_FREE_JSON_ALIAS = re.compile(r"^(\w+) = dict\[str, Any\]", re.M)


def _sources(src: Path) -> Iterator[tuple[str, str]]:
    for path in sorted(src.rglob("*.py")):
        yield path.relative_to(src).as_posix(), path.read_text(encoding="utf-8")


def _count(src: Path, pattern: str, keep: Callable[[str], bool] = lambda _: True) -> int:
    found = re.compile(pattern)
    return sum(len(found.findall(text)) for name, text in _sources(src) if keep(name))


def measures(root: Path) -> dict[str, int]:
    """Each measure's current value for the checkout at `root`."""
    src = root / "src" / "muster"
    aliases = {name for _, text in _sources(src) for name in _FREE_JSON_ALIAS.findall(text)}
    alias_uses = (rf"\b(?:{'|'.join(sorted(aliases))})\b(?! = dict)" if aliases else r"(?!)")
    return {
        "dict[str, Any] in src": _count(src, r"dict\[str, Any\]"),
        "free-JSON aliases of dict[str, Any]": len(aliases),
        "uses of those aliases": _count(src, alias_uses),
        "type: ignore in src": _count(src, r"type: ignore"),
        "type: ignore in client.py": _count(src, r"type: ignore", lambda n: n == "client.py"),
        "dict[str, Any] in services/views.py": _count(
            src, r"dict\[str, Any\]", lambda n: n == "services/views.py"),
        "on_cluster readers outside launch/": _count(
            src, r"\bon_cluster\b", lambda n: not n.startswith("launch/")),
        "config validations outside store/": _count(
            src, r"ExperimentConfig\.model_validate\(",
            lambda n: not n.startswith("store/") and n != "config/loading.py"),
        "enums defined outside states.py": _count(
            src, r"(?m)^class \w+\((?:str, )?(?:enum\.)?Enum\)", lambda n: n != "states.py"),
        ".value reads in src": _count(src, r"\.value\b"),
        "modules in src": sum(1 for _ in _sources(src)),
        "lines in src": sum(text.count("\n") for _, text in _sources(src)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).parents[1])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    found = measures(args.root)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        width = max(map(len, found))
        for name, value in found.items():
            print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
