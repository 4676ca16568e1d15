"""Typed errors of the reward scorers.

Retryable ones carry ``retryable = True`` (the engine's :func:`beacon.retry.is_retryable` reads
that attribute); malformed responses are :class:`beacon.RewardError` subclasses naming the
field path and the offending value, and are never retried. Messages never contain credentials.
"""

from __future__ import annotations

from typing import Any

from beacon.errors import BeaconError, RewardError
from beacon.retry import retryable_status

__all__ = [
    "RewardConnectionError",
    "RewardHTTPError",
    "RewardRequestError",
    "RewardResponseError",
    "RewardTimeoutError",
    "ScorerError",
]


class ScorerError(BeaconError):
    """Base class of transport-level scorer failures."""

    retryable = False


class RewardHTTPError(ScorerError):
    """The endpoint answered with a non-2xx status.

    Retryable for 408, 425, 429 and 5xx other than 501 and 505
    (:func:`beacon.retry.retryable_status`). ``retry_after`` holds the server's ``Retry-After``
    seconds when it sent one (the engine waits at least that long before retrying, or gives up
    at once when that is longer than its policy's ``max_retry_after``:
    :class:`beacon.retry.RetryAfterTooLongError`).
    """

    def __init__(self, status: int, url: str, body: str = "", retry_after: float | None = None):
        self.status = status
        self.url = url
        self.body = body
        self.retry_after = retry_after
        self.retryable = retryable_status(status)
        detail = f": {body}" if body else ""
        super().__init__(f"reward endpoint {url} returned HTTP {status}{detail}")


class RewardTimeoutError(ScorerError, TimeoutError):
    """The request did not complete within the scorer's timeout (retryable)."""

    retryable = True


class RewardConnectionError(ScorerError, ConnectionError):
    """Connecting to or reading from the endpoint failed (retryable)."""

    retryable = True


class RewardResponseError(RewardError):
    """The response is not JSON, lacks the score field, or the score is not a real number.

    ``path`` is the field path looked up (``"<body>"`` for the document itself) and ``value``
    what was found there. Not retryable: the same request would give the same answer.
    """

    retryable = False

    def __init__(self, path: str, value: Any, reason: str) -> None:
        super().__init__(path, value, reason)
        self.path = path
        text = repr(value)
        if len(text) > 200:
            text = text[:200] + "..."
        self.args = (f"invalid reward response at {path!r}: {text} ({reason})",)

    def __str__(self) -> str:
        return str(self.args[0])


class RewardRequestError(ScorerError, TypeError):
    """The request cannot be encoded: a value sent to the endpoint is not JSON-serializable.

    ``field`` names it (``"prompt"``, ``"response"``, ``"responses"``, or ``"request_template"``
    for a template constant), ``value`` is the value and ``reason`` why. Not retryable: the
    same call would fail the same way.
    """

    retryable = False

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        text = repr(value)
        if len(text) > 200:
            text = text[:200] + "..."
        super().__init__(f"cannot send the reward request: {field}={text} {reason}")
