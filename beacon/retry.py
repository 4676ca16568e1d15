"""Retry policy for model and scorer calls: which errors are retryable, and how long to wait.

Backoff before retry ``i`` (1-based) is ``d_i = min(max_delay, base_delay * multiplier**(i-1))``
seconds, multiplied by a uniform jitter factor in ``[1 - jitter, 1]`` ("equal"/"full" jitter for
``jitter`` = 0.5 / 1.0), so that many queries failing together do not retry in lockstep.

A server's ``Retry-After`` (:func:`retry_after_of`) is a floor on that wait: the engine waits
``max(d_i, retry_after)``, in full even beyond ``max_delay`` (a retry before that time would
only be refused again and burn an attempt), up to ``max_retry_after`` seconds (default 60, the
order of the longest waits the OpenAI and Anthropic SDKs honour). A server asking for longer is
not waited for: :meth:`RetryPolicy.should_retry` ends the call with
:class:`RetryAfterTooLongError`. A query's ``Budget(max_seconds=...)`` still ends it at its
deadline, waits included.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import enum
import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

from beacon._checks import is_real, positive_int, real_as_float
from beacon.errors import ConfigError

__all__ = [
    "RetryAfterTooLongError",
    "RetryPolicy",
    "TransientError",
    "is_retryable",
    "parse_retry_after",
    "retry_after_of",
    "retryable_status",
]

RETRYABLE_STATUS = frozenset({408, 425, 429})
#: 5xx statuses that say the request can never succeed as sent: not retried.
PERMANENT_5XX = frozenset({501, 505})


class TransientError(Exception):
    """Raise (or subclass) this from a generate/score callable to request a retry."""

    retryable = True


class RetryAfterTooLongError(ConfigError):
    """A retryable failure whose server asked to wait longer than the policy allows.

    Raised (from the failure, its ``__cause__``) by :meth:`RetryPolicy.should_retry` instead of
    waiting longer than its ``max_retry_after`` or retrying before the server's
    ``Retry-After``: the call ends at once. A :class:`beacon.ConfigError` naming
    ``max_retry_after`` and its value, the setting to raise to wait that long; ``retry_after``
    is the server's wait in seconds. Not retryable.
    """

    retryable = False

    def __init__(self, retry_after: float, max_retry_after: float) -> None:
        self.retry_after = retry_after
        hint = (
            f" (raise max_retry_after to at least {retry_after:g} s to wait)"
            if math.isfinite(retry_after)
            else ""
        )
        super().__init__(
            "max_retry_after",
            max_retry_after,
            f"the server asked to wait {retry_after:g} s before retrying (Retry-After), "
            f"longer than max_retry_after allows; retrying sooner would be refused again, so "
            f"the call was not retried{hint}",
        )


def retryable_status(status: int) -> bool:
    """Whether a failure with HTTP ``status`` is worth retrying: 408, 425, 429, or a 5xx other
    than 501 and 505 (the server cannot do what was asked, however often it is asked)."""
    return status in RETRYABLE_STATUS or (status >= 500 and status not in PERMANENT_5XX)


def _is_int(v: object) -> TypeGuard[int]:
    """``v`` is an ``int`` (a status, a protobuf integer field), not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def _http_status(v: object) -> int | None:
    """``v`` when it is an HTTP status (an int in 100-599, never a bool), else ``None``."""
    return v if _is_int(v) and 100 <= v <= 599 else None


# gRPC status names (google/rpc/code.proto) in number order from 1 (0 is OK), each with the
# HTTP status Google maps it to: a failure known only by its gRPC status then meets the same
# rule as an HTTP one (RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, DEADLINE_EXCEEDED 504 and
# INTERNAL 500 are retried).
_GRPC_HTTP_STATUS = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}
_GRPC_NAMES = ("OK", *_GRPC_HTTP_STATUS)  # by number


def _grpc_http_status(v: object, numeric: bool) -> int | None:
    """The HTTP status of gRPC status ``v``: a ``grpc.StatusCode``-like enum (by its name), an
    exact name such as ``"UNAVAILABLE"``, or, when ``numeric``, its number (0-16)."""
    if isinstance(v, enum.Enum):
        v = v.name
    elif numeric and _is_int(v) and 0 <= v < len(_GRPC_NAMES):
        v = _GRPC_NAMES[v]
    return _GRPC_HTTP_STATUS.get(v) if isinstance(v, str) else None


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed call, or ``None``; first found of, in order:

    1. an int HTTP status (100-599, never a bool) in ``exc.status``, ``exc.status_code``,
       ``exc.http_status``, then ``exc.code`` (google-genai's ``APIError`` and
       google-api-core's ``GoogleAPICallError`` carry it there, as urllib's ``HTTPError`` and
       tornado's ``HTTPClientError`` do); ``code`` last, as the most overloaded name: an int
       outside 100-599 (a websocket close code such as 1006, an errno-like 2) is no status;
    2. ``exc.response.status_code`` (httpx and requests responses), or, for a dict
       ``exc.response``, its ``ResponseMetadata.HTTPStatusCode`` (botocore's ``ClientError``,
       e.g. a Bedrock ``ThrottlingException`` is a 429);
    3. a gRPC status mapped to its HTTP status: ``exc.grpc_status_code`` (google-api-core: a
       ``grpc.StatusCode``, or its number), then ``exc.status`` when it is a gRPC name (the
       string google-genai's ``APIError`` carries, e.g. ``"RESOURCE_EXHAUSTED"``); any other
       string is neither read as a number nor an error; last, grpcio's own ``RpcError``
       by its ``code()`` (:func:`_raw_grpc_status`).

    ``code`` is read without running a property (:func:`inspect.getattr_static`): websockets'
    ``ConnectionClosed.code`` is a deprecated property that warns on every read.
    """
    for name in ("status", "status_code", "http_status"):
        status = _http_status(getattr(exc, name, None))
        if status is not None:
            return status
    status = _http_status(inspect.getattr_static(exc, "code", None))
    if status is not None:
        return status
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        # botocore's ClientError (Bedrock through boto3): the parsed response is a dict
        meta = resp.get("ResponseMetadata")
        status = _http_status(meta.get("HTTPStatusCode") if isinstance(meta, dict) else None)
        if status is not None:
            return status
    elif resp is not None:
        status = _http_status(getattr(resp, "status_code", None))
        if status is not None:
            return status
    status = _grpc_http_status(getattr(exc, "grpc_status_code", None), numeric=True)
    if status is not None:
        return status
    status = _grpc_http_status(getattr(exc, "status", None), numeric=False)
    if status is not None:
        return status
    return _raw_grpc_status(exc)


def _raw_grpc_status(exc: BaseException) -> int | None:
    """The HTTP status of grpcio's own ``RpcError`` (``grpc.aio.AioRpcError``, or a
    synchronous call's error, which is also a ``grpc.Call``), whose status is the value of its
    ``code()`` method (a ``grpc.StatusCode``): a model or reward server called over gRPC
    directly. Only for exceptions of (or derived from) the ``grpc`` package's classes, whose
    ``code()`` returns a stored value; another library's ``code`` method is never called."""
    if not any(c.__module__.partition(".")[0] == "grpc" for c in type(exc).__mro__):
        return None
    code = getattr(exc, "code", None)
    if not callable(code):
        return None
    try:
        value = code()
    except Exception:  # a bare RpcError (not a Call) may not implement it
        return None
    return _grpc_http_status(value, numeric=False)


def parse_retry_after(value: Any) -> float | None:
    """A ``Retry-After`` header value as seconds from now: delay-seconds, or an HTTP date (RFC
    9110 section 10.2.3; a date in the past is 0). ``None`` when absent or unreadable (then the
    backoff policy decides)."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:  # not a delay (a negative or NaN one is no date either: None below)
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as HTTP dates are
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def _seconds(value: Any) -> float | None:
    """``value`` as a finite number >= 0 (what ``float`` reads), else ``None``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _header(headers: Any, name: str) -> Any:
    get = getattr(headers, "get", None)
    if not callable(get):
        return None
    try:  # httpx, requests and aiohttp headers are case-insensitive; a plain dict is not
        v = get(name)
        return v if v is not None else get(name.title())
    except Exception:  # an exotic headers object: no hint, the backoff policy decides
        return None


def retry_after_of(exc: BaseException) -> float | None:
    """The wait (seconds) a failed call's server asked for, or ``None``.

    An ``exc.retry_after`` number (this package's HTTP scorer sets it) wins; otherwise the
    ``retry-after-ms`` or ``retry-after`` header of ``exc.response`` (the OpenAI and Anthropic
    SDKs' and httpx's status errors, and google-genai's ``APIError``, carry the response), else
    of ``exc.headers`` (aiohttp's ``ClientResponseError`` from ``raise_for_status()`` and
    urllib's ``HTTPError`` carry the headers themselves); else a ``google.rpc.RetryInfo`` in
    the error's ``details`` (:func:`_retry_info_of`: Google APIs put their wait there, e.g. a
    Gemini 429's ``"retryDelay": "58s"``, rather than in a header).
    """
    ra = getattr(exc, "retry_after", None)
    if ra is not None and is_real(ra):
        f = real_as_float(ra)
        return f if f >= 0 else None  # NaN and negatives: no hint; inf: beyond max_retry_after
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        headers = getattr(exc, "headers", None)
    if headers is not None:
        ms = _seconds(_header(headers, "retry-after-ms"))
        if ms is not None:
            return ms / 1000.0
        after = parse_retry_after(_header(headers, "retry-after"))
        if after is not None:
            return after
    return _retry_info_of(exc)


_RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"


def _retry_info_of(exc: BaseException) -> float | None:
    """The ``retryDelay`` of a ``google.rpc.RetryInfo`` among ``exc.details``, seconds, or
    ``None``.

    ``details`` is google-genai's ``APIError.details`` (the error body: a dict whose
    ``error.details``, or own ``details``, lists the entries) or google-api-core's
    ``GoogleAPICallError.details`` (the entries: JSON dicts from a REST call, protobuf
    messages from a gRPC one). A JSON entry is ``{"@type": ".../google.rpc.RetryInfo",
    "retryDelay": "58s"}``; a protobuf one a ``RetryInfo`` whose ``retry_delay`` has
    ``seconds`` and ``nanos``. Anything else is no hint.
    """
    details = getattr(exc, "details", None)
    if isinstance(details, dict):
        body = details.get("error", details)
        details = body.get("details") if isinstance(body, dict) else None
    if not isinstance(details, list | tuple):
        return None
    for entry in details:
        if isinstance(entry, dict):
            if entry.get("@type") == _RETRY_INFO_TYPE:
                return _duration_seconds(entry.get("retryDelay"))
        elif type(entry).__name__ == "RetryInfo":
            delay = getattr(entry, "retry_delay", None)
            secs, nanos = getattr(delay, "seconds", None), getattr(delay, "nanos", None)
            if _is_int(secs) and _is_int(nanos):
                return _seconds(real_as_float(secs) + real_as_float(nanos) / 1e9)
    return None


def _duration_seconds(value: Any) -> float | None:
    """A protobuf JSON ``Duration`` (``"58s"``, ``"0.5s"``) as seconds >= 0, else ``None``."""
    if isinstance(value, str) and value.endswith("s"):
        return _seconds(value[:-1])
    return None


# Transient network failures of HTTP clients and model SDKs whose errors are not OSErrors:
# (top-level package, class name in the error's MRO). Duck-typed: none of them is imported.
_TRANSIENT_CLIENT_ERRORS = frozenset(
    {
        ("aiohttp", "ClientError"),  # connection resets, server disconnects
        ("httpx", "TimeoutException"),  # connect / read / write / pool timeouts
        ("httpx", "NetworkError"),  # connect / read / write errors
        ("httpx", "RemoteProtocolError"),  # the server dropped the connection mid-answer
        ("openai", "APIConnectionError"),  # and its APITimeoutError
        ("anthropic", "APIConnectionError"),  # and its APITimeoutError
        # google-genai's Interactions API (and its APITimeoutError, APIWebSocketError)
        ("google", "APIConnectionError"),
        ("google", "TransportError"),  # google-auth: the network failed refreshing a credential
        # httpx2, the fork of httpx that google-genai also accepts: the same classes as above
        ("httpx2", "TimeoutException"),
        ("httpx2", "NetworkError"),
        ("httpx2", "RemoteProtocolError"),
        # botocore (boto3, Bedrock): the endpoint could not be reached or dropped the
        # connection; its timeouts are OSErrors already
        ("botocore", "EndpointConnectionError"),
        ("botocore", "ConnectionClosedError"),
    }
)


def _is_transient_client_error(exc: BaseException) -> bool:
    return any(
        (t.__module__.partition(".")[0], t.__name__) in _TRANSIENT_CLIENT_ERRORS
        for t in type(exc).__mro__
    )


def is_retryable(exc: BaseException) -> bool:
    """Default classification of a failed call.

    In order: an explicit boolean ``exc.retryable`` attribute wins (``False`` except on the
    SDK network failures listed below, which it cannot make permanent); an HTTP status
    (:func:`_status_of`: ``status``, ``status_code``, ``http_status``, ``code``, then
    ``response.status_code``, then a gRPC status such as Google SDKs' ``RESOURCE_EXHAUSTED``
    mapped to its HTTP one) is retryable iff 408, 425, 429 or 5xx other than 501 (Not
    Implemented, gRPC ``UNIMPLEMENTED``) and 505 (HTTP Version Not Supported); timeouts
    (``TimeoutError``, which ``asyncio.TimeoutError`` is), ``ConnectionError`` and other
    ``OSError`` are retryable; so are the network failures of HTTP clients and model SDKs
    that are none of those: aiohttp client errors (connection resets, server disconnects),
    httpx's (and its fork httpx2's) timeouts, network errors and ``RemoteProtocolError``, the
    OpenAI and Anthropic SDKs' ``APIConnectionError`` (``APITimeoutError`` included),
    google-genai's ``APIConnectionError``, google-auth's ``TransportError`` and botocore's
    ``EndpointConnectionError`` / ``ConnectionClosedError``. Everything else (``ValueError``,
    ``TypeError``, ...) is not.
    """
    flag = getattr(exc, "retryable", None)
    # a False flag does not veto a known transient failure: google-auth's TransportError has
    # a retryable property that is False unless its raiser says otherwise, and none does
    if isinstance(flag, bool) and (flag or not _is_transient_client_error(exc)):
        return flag
    status = _status_of(exc)
    if status is not None:
        return retryable_status(status)
    if isinstance(exc, TimeoutError | ConnectionError | OSError):
        return True
    return _is_transient_client_error(exc)


@dataclass(frozen=True)
class RetryPolicy:
    """How each model or scorer call is retried.

    Attributes:
        max_attempts: attempts per call, the first included (1 = no retry).
        base_delay: seconds before the first retry.
        multiplier: growth factor of the delay per retry (exponential backoff).
        max_delay: cap on one backoff delay, seconds (not on a server's ``Retry-After``).
        max_retry_after: the longest server ``Retry-After`` waited for, seconds; a longer one
            ends the call (see :meth:`should_retry`).
        jitter: fraction of the delay randomised away, in [0, 1]; the wait is uniform in
            ``[d * (1 - jitter), d]``.
        retry_on: predicate deciding retryability; ``None`` uses :func:`is_retryable`. The
            engine calls it with the ``Exception`` a call raised (never with a bare
            ``BaseException`` such as a cancellation), so it may be typed ``(Exception) -> bool``.
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 10.0
    max_retry_after: float = 60.0
    jitter: float = 1.0
    retry_on: Callable[[Exception], bool] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_attempts", positive_int("max_attempts", self.max_attempts))
        # compared as floats: an int of hundreds of digits is infinite, not an OverflowError
        for name in ("base_delay", "max_delay", "max_retry_after"):
            v = getattr(self, name)
            if not is_real(v) or not 0 <= real_as_float(v) < math.inf:
                raise ConfigError(name, v, "must be a finite number of seconds >= 0")
        m = self.multiplier
        if not is_real(m) or not 1 <= real_as_float(m) < math.inf:
            raise ConfigError("multiplier", m, "must be a finite number >= 1")
        j = self.jitter
        if not is_real(j) or not 0 <= j <= 1:
            raise ConfigError("jitter", j, "must be in [0, 1]")
        if self.retry_on is not None and not callable(self.retry_on):
            raise ConfigError("retry_on", self.retry_on, "must be a callable exc -> bool, or None")
        for name in ("base_delay", "max_delay", "max_retry_after", "multiplier", "jitter"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def none(cls) -> RetryPolicy:
        """No retries: every failure is final."""
        return cls(max_attempts=1)

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """Retry after failed attempt number ``attempt`` (1-based)?

        ``False`` when the attempts are spent or ``exc`` is not retryable (``retry_on``, else
        :func:`is_retryable`). A retryable ``exc`` whose server asked to wait longer than
        ``max_retry_after`` (its :func:`retry_after_of`) raises
        :class:`RetryAfterTooLongError` from ``exc`` instead: a retry before that time would
        be refused again and burn an attempt. Otherwise the caller waits
        ``max(delay(attempt), retry_after)`` seconds.
        """
        if attempt >= self.max_attempts:
            return False
        # ``retry_on`` is typed for the Exceptions the engine passes; a direct caller passing
        # another BaseException reaches it unchanged, as before.
        pred = cast(Callable[[BaseException], bool], self.retry_on or is_retryable)
        try:
            retry = bool(pred(exc))
        except Exception as perr:
            # A broken predicate must not hide the call's own error: report both.
            raise ConfigError(
                "retry_on", pred, f"raised {perr!r} deciding whether to retry {exc!r}"
            ) from exc
        if not retry:
            return False
        ra = retry_after_of(exc)
        if ra is not None and ra > self.max_retry_after:
            raise RetryAfterTooLongError(ra, self.max_retry_after) from exc
        return True

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based), jitter applied (the
        backoff alone: a server's ``Retry-After`` is a floor on it, see the module doc)."""
        try:
            growth = self.multiplier ** (retry - 1)
        except OverflowError:  # hundreds of retries: the cap has long been reached
            growth = math.inf
        d = min(self.max_delay, self.base_delay * growth) if self.base_delay else 0.0
        if self.jitter:
            u = (rng or random).random()
            d *= 1.0 - self.jitter * u
        return d

    async def sleep(self, retry: int, rng: random.Random | None = None) -> None:
        await asyncio.sleep(self.delay(retry, rng))

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "base_delay": self.base_delay,
            "multiplier": self.multiplier,
            "max_delay": self.max_delay,
            "max_retry_after": self.max_retry_after,
            "jitter": self.jitter,
        }
