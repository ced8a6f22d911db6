"""Errors of the trace-control API: one exception type carrying the spec's status code."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """The status codes of the trace-control spec (``TraceError.status``)."""

    INVALID_ARGS = "INVALID_ARGS"
    BAD_STATE = "BAD_STATE"
    NOT_SUPPORTED = "NOT_SUPPORTED"
    NO_RESOURCES = "NO_RESOURCES"
    NO_MEMORY = "NO_MEMORY"
    BUFFER_TOO_SMALL = "BUFFER_TOO_SMALL"
    ALREADY_BOUND = "ALREADY_BOUND"


class TraceError(Exception):
    """Every failure of the trace-control API.

    ``status`` is one of the spec's codes as a string (a :class:`Status`,
    which compares equal to the plain string, e.g. ``"BAD_STATE"``);
    ``str(err)`` says what was wrong in one line.
    """

    def __init__(self, status: Status | str, message: str = ""):
        self.status = Status(status)
        self.message = message
        super().__init__(f"{self.status}: {message}" if message else str(self.status))

    def __reduce__(self):
        return (type(self), (str(self.status), self.message))


def invalid(message: str) -> TraceError:
    return TraceError(Status.INVALID_ARGS, message)


def bad_state(message: str) -> TraceError:
    return TraceError(Status.BAD_STATE, message)


def not_supported(message: str) -> TraceError:
    return TraceError(Status.NOT_SUPPORTED, message)
