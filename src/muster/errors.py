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


class NotFound(MusterError):
    http_status = 404


class Unauthorized(MusterError):
    http_status = 401


class IllegalTransition(MusterError):
    """A state change the state machine forbids, e.g. leaving a terminal state."""

    http_status = 409


class Conflict(MusterError):
    """The request clashes with the current state (e.g. killing a finished experiment)."""

    http_status = 409


class StoreError(MusterError):
    """The database failed or is unreachable; the message says which database and why."""

    http_status = 503


class LaunchError(MusterError):
    """muster itself could not start a process (spawn error, disk full at launch)."""

    http_status = 500


class GpuError(MusterError):
    """A GPU could not be read (NVML failed, a fake GPU's file is bad); the message names it."""

    http_status = 503


class ServerUnavailable(MusterError):
    """The CLI/SDK could not reach the muster server."""

    http_status = 503
