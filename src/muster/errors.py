"""One exception hierarchy for muster; `muster.server` maps each class to an HTTP status."""

from __future__ import annotations


class MusterError(Exception):
    """Base of every error muster raises on purpose. The message is shown to the user."""

    http_status = 500


class ConfigError(MusterError):
    """A config (experiment or cluster) is invalid; the message names the key path and the fix."""

    http_status = 422


class InvalidRequest(MusterError):
    """A request is malformed (bad upload, bad parameter)."""

    http_status = 400


class PayloadTooLarge(InvalidRequest):
    """A request, or what it unpacks to, passes a size, count or time limit; the message
    names the limit and how to stay under it."""

    http_status = 413


class InvalidPattern(InvalidRequest):
    """A search pattern that is not a valid expression; the message names the error, its
    position and the fix."""

    http_status = 422


class NotFound(MusterError):
    http_status = 404


class Gone(NotFound):
    """What was asked for existed and was removed on purpose (the cluster config's
    `retention`); the message says when and by which rule, and what stays."""

    http_status = 410


class Unauthorized(MusterError):
    http_status = 401


class Forbidden(MusterError):
    """The caller is known but may not do this (its role, or someone else's experiment);
    the message names who may."""

    http_status = 403


class IllegalTransition(MusterError):
    """A state change the state machine forbids, e.g. leaving a terminal state."""

    http_status = 409


class Conflict(MusterError):
    """The request clashes with the current state (e.g. killing a finished experiment)."""

    http_status = 409


class TooManyRequests(MusterError):
    """A caller holds as many of something as one may at once (e.g. open log follows), or
    failed too often (password logins); it may retry after `retry_after` seconds."""

    http_status = 429

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QuotaExceeded(TooManyRequests):
    """A submission would queue more trials than a quota of its owner's allows
    (`max_queued_trials`); the message names the quota, its use, and what to do."""


class StoreError(MusterError):
    """The database failed or is unreachable; the message says which database and why."""

    http_status = 503


class LaunchError(MusterError):
    """muster itself could not start a process (spawn error, disk full at launch).

    `rank`: the replica that could not be launched, when a whole set was being launched
    (`Launcher.submit_all`)."""

    http_status = 500

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class InjectionError(MusterError):
    """A drill's fault could not be injected (`muster.drill.inject`); the message says why and
    what would allow it."""


class GpuError(MusterError):
    """A GPU could not be read (NVML failed, a fake GPU's file is bad); the message names it."""

    http_status = 503


class ServerUnavailable(MusterError):
    """The CLI/SDK could not reach the muster server (the connection itself failed)."""

    http_status = 503


class ServerError(MusterError):
    """The muster server answered with an error of its own (a 5xx), or broke a stream off."""

    http_status = 500


class StorageError(MusterError):
    """Checkpoint storage (a shared directory, an S3 bucket) failed or refused an operation;
    the message names the storage URL and what to check, in muster's words. Retried by the
    upload worker.

    What the remote said (its text, its exact status, how a connection failed) is `detail`:
    for the server's log, never for a user's message, so that a storage address a user
    named is no oracle of what answers there."""

    http_status = 502

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail

    def for_log(self) -> str:
        """The message, with what the remote said when there is more."""
        return f"{self} [{self.detail}]" if self.detail else str(self)


class ExportError(MusterError):
    """A hand-off to another system failed: the MLflow tracking server did not answer, or
    refused or broke off the export (`muster.mlflow_export`); the message names it and why."""

    http_status = 502
