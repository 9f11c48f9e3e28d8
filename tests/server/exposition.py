"""A tiny reader of Prometheus's text format, strict enough to catch a malformed line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = rf'({_NAME})="((?:[^"\\\n]|\\[\\"n])*)"'
_SAMPLE = re.compile(rf"({_NAME})(?:\{{((?:{_LABEL},?)*)\}})? (\S+)")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass
class Exposition:
    help: dict[str, str] = field(default_factory=dict)
    type: dict[str, str] = field(default_factory=dict)
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def value(self, metric: str, /, **labels: str) -> float | None:
        """The value of the sample of `metric` whose labels include `labels`; None: none."""
        found = [v for n, have, v in self.samples
                 if n == metric and labels.items() <= have.items()]
        assert len(found) <= 1, f"{metric} {labels} matches {len(found)} samples"
        return found[0] if found else None


def parse(text: str) -> Exposition:
    """Every non-comment line must be `name{labels} value`; every metric must have HELP and
    TYPE before its samples."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    result = Exposition()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            result.help[name] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert kind in ("gauge", "counter"), line
            assert name in result.help, f"TYPE before HELP for {name}"
            result.type[name] = kind
        else:
            match = _SAMPLE.fullmatch(line)
            assert match is not None, f"malformed sample line: {line!r}"
            name, labels = match.group(1), match.group(2) or ""
            assert name in result.type, f"sample of {name} without HELP and TYPE"
            pairs = {k: re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], v)
                     for k, v in re.findall(_LABEL, labels)}
            result.samples.append((name, pairs, float(match.group(5))))
    return result
