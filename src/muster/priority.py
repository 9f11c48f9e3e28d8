"""Trial priorities: lower runs first. Kept apart from `muster.config` so that the CLI can
state the range without importing the config schema (pydantic) at start-up."""

MIN_PRIORITY, DEFAULT_PRIORITY, MAX_PRIORITY = 1, 42, 99
