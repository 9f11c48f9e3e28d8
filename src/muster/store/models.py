"""The store's tables. The schema is created and changed only by Alembic migrations
(`muster/store/alembic/versions/`); keep those in step with this module."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def now() -> float:
    """Wall-clock time as stored: seconds since the epoch (float, UTC)."""
    return time.time()


def new_uuid() -> str:
    """A fresh random UUID as text: unique even for rows created in the same instant."""
    return str(uuid.uuid4())


# Named constraints, so migrations can later alter or drop them by name on every backend
# (SQLite's batch mode cannot drop an unnamed constraint).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Events name experiments, trials and attempts by id without a foreign key, so an id must
# never be handed out twice; plain SQLite reuses the highest id after a delete.
NO_ID_REUSE = {"sqlite_autoincrement": True}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = NO_ID_REUSE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=new_uuid)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[str]] = mapped_column(JSON, default=list)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # normalized, validated config
    config_yaml: Mapped[str] = mapped_column(Text)  # what the user submitted, verbatim
    context_dir: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(20), index=True)
    stop_requested: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)

    trials: Mapped[list[Trial]] = relationship(
        back_populates="experiment", order_by="Trial.id", cascade="all, delete-orphan"
    )


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = NO_ID_REUSE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=new_uuid)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    state: Mapped[str] = mapped_column(String(20), index=True)
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    stop_requested: Mapped[bool] = mapped_column(default=False)
    # Budgets consumed so far (see muster.supervise.policy).
    replica_restarts: Mapped[int] = mapped_column(Integer, default=0)
    trial_retries: Mapped[int] = mapped_column(Integer, default=0)
    internal_retries: Mapped[int] = mapped_column(Integer, default=0)
    user_error_retries: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    experiment: Mapped[Experiment] = relationship(back_populates="trials")
    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="trial", order_by="Attempt.number", cascade="all, delete-orphan"
    )


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("trial_id", "number"), NO_ID_REUSE)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # from 1
    state: Mapped[str] = mapped_column(String(20), index=True)
    run_dir: Mapped[str] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    trial: Mapped[Trial] = relationship(back_populates="attempts")
    replicas: Mapped[list[Replica]] = relationship(
        back_populates="attempt", order_by="Replica.rank", cascade="all, delete-orphan"
    )


class Replica(Base):
    """One process of an attempt (rank r), and how it ended (invariant 7)."""

    __tablename__ = "replicas"
    __table_args__ = (UniqueConstraint("attempt_id", "rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    log_path: Mapped[str] = mapped_column(Text)
    shim_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    shim_start_ticks: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_ticks: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    max_rss_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    attempt: Mapped[Attempt] = relationship(back_populates="replicas")


class Event(Base):
    """Append-only log of every state transition and every supervisor decision."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, default=now, index=True)
    entity: Mapped[str] = mapped_column(String(16))  # experiment | trial | attempt
    entity_id: Mapped[int] = mapped_column(Integer)
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    from_state: Mapped[str | None] = mapped_column(String(20), nullable=True)
    to_state: Mapped[str | None] = mapped_column(String(20), nullable=True)
    reason: Mapped[str] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(64))  # e.g. "user", "supervisor", "review:alice"
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
