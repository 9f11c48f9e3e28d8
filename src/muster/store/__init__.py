"""The store: SQLAlchemy models, sessions, migrations and the transition function."""

from muster.store.db import Store, redact
from muster.store.models import (
    MAX_BIGINT,
    MAX_INTEGER,
    MIN_BIGINT,
    ApiToken,
    Attempt,
    Base,
    Checkpoint,
    ClusterNode,
    Event,
    Experiment,
    GpuDevice,
    IdempotencyKey,
    IngestCursor,
    Metric,
    MetricSeries,
    Replica,
    Trial,
    User,
)
from muster.store.transitions import record_event, transition

__all__ = [
    "MAX_BIGINT",
    "MAX_INTEGER",
    "MIN_BIGINT",
    "ApiToken",
    "Attempt",
    "Base",
    "Checkpoint",
    "ClusterNode",
    "Event",
    "Experiment",
    "GpuDevice",
    "IdempotencyKey",
    "IngestCursor",
    "Metric",
    "MetricSeries",
    "Replica",
    "Store",
    "Trial",
    "User",
    "record_event",
    "redact",
    "transition",
]
