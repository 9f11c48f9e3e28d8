"""The exceptions of Determined's that a Core API script catches or raises."""

from __future__ import annotations


class InvalidHP(Exception):
    """Raised by a script whose hyperparameters cannot work.

    Determined ends such a trial with exit 0 and tells its searcher; muster has no such
    ending, so the exception leaves `det.core.init()`'s block as it is, and the trial fails
    with its message (a user error, not retried).
    """

    def __init__(self, msg: str = "...") -> None:
        if not isinstance(msg, str):
            raise TypeError(f"InvalidHP takes a message string, got {type(msg).__name__}")
        super().__init__(msg)
        self.msg = msg


class CheckpointNotFound(Exception):
    """No checkpoint of the trial has this storage id."""


class InvalidCheckpointException(Exception):
    """The checkpoint of this storage id is not intact: a file is missing or changed."""
