"""Retry classification of Google SDK errors: an HTTP status in ``.code``, a gRPC status (enum,
number or name), a ``google.rpc.RetryInfo`` wait in the error body; and what must not be read
as a status (a websocket close code, an errno-like int, a bool, a free-text string).

No Google library is a dependency: the classes below copy the attribute shapes of the real
ones (google-genai 3.6 ``google/genai/errors.py``, google-api-core 2.44
``google/api_core/exceptions.py``), each naming the class it stands for.
"""

from __future__ import annotations

import asyncio
import enum
import urllib.error
import warnings
from typing import Any

import pytest

import beacon
from beacon.engine import BeaconSampler
from beacon.retry import (
    RetryAfterTooLongError,
    RetryPolicy,
    _status_of,
    is_retryable,
    retry_after_of,
)


# -- google-genai: google.genai.errors ---------------------------------------------------------
class GenaiAPIError(Exception):
    """Mimics ``google.genai.errors.APIError``: ``code`` the HTTP status (an int, or for the Live
    API a websocket close code such as 1006), ``status`` a gRPC status NAME string or None,
    ``details`` the whole JSON error body, ``response`` the httpx/requests/aiohttp response."""

    status: str | None = None
    message: str | None = None

    def __init__(self, code: int | None, response_json: Any, response: Any = None) -> None:
        self.response = response
        self.details = response_json
        err = response_json.get("error", {}) if isinstance(response_json, dict) else {}
        self.message = err.get("message") if isinstance(err, dict) else None
        self.status = err.get("status") if isinstance(err, dict) else None
        self.code = code if code else (err.get("code") if isinstance(err, dict) else None)
        super().__init__(f"{self.code} {self.status}. {self.details}")


GenaiAPIError.__module__ = "google.genai.errors"


class GenaiClientError(GenaiAPIError):
    """Mimics ``google.genai.errors.ClientError`` (4xx)."""


class GenaiServerError(GenaiAPIError):
    """Mimics ``google.genai.errors.ServerError`` (5xx)."""


def _genai_body(code: int, status: str, details: list[Any] | None = None) -> dict[str, Any]:
    """A Gemini API error body, as ``APIError.details`` holds it."""
    err: dict[str, Any] = {"code": code, "message": "m", "status": status}
    if details is not None:
        err["details"] = details
    return {"error": err}


def _retry_info(delay: str) -> dict[str, str]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


# -- google-api-core: google.api_core.exceptions ------------------------------------------------
class StatusCode(enum.Enum):
    """Mimics ``grpc.StatusCode``: a plain Enum whose values are (number, lowercase name)."""

    RESOURCE_EXHAUSTED = (8, "resource exhausted")
    INVALID_ARGUMENT = (3, "invalid argument")
    UNAVAILABLE = (14, "unavailable")
    UNKNOWN = (2, "unknown")
    NOT_FOUND = (5, "not found")


class GoogleAPICallError(Exception):
    """Mimics ``google.api_core.exceptions.GoogleAPICallError``: ``code`` (HTTP status) and
    ``grpc_status_code`` are CLASS attributes (None on the base); ``response`` and
    ``details`` are read-only properties."""

    code: int | None = None
    grpc_status_code: Any = None

    def __init__(self, message: str, details: Any = (), response: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self._details = details
        self._response = response

    @property
    def response(self) -> Any:
        return self._response

    @property
    def details(self) -> list[Any]:
        return list(self._details)


class TooManyRequests(GoogleAPICallError):
    """Mimics ``google.api_core.exceptions.TooManyRequests``."""

    code = 429


class ResourceExhausted(TooManyRequests):
    """Mimics ``google.api_core.exceptions.ResourceExhausted``."""

    grpc_status_code = StatusCode.RESOURCE_EXHAUSTED


class ServiceUnavailable(GoogleAPICallError):
    """Mimics ``google.api_core.exceptions.ServiceUnavailable``."""

    code = 503
    grpc_status_code = StatusCode.UNAVAILABLE


class BadRequest(GoogleAPICallError):
    """Mimics ``google.api_core.exceptions.BadRequest``."""

    code = 400


class InvalidArgument(BadRequest):
    """Mimics ``google.api_core.exceptions.InvalidArgument``."""

    grpc_status_code = StatusCode.INVALID_ARGUMENT


class NotFound(GoogleAPICallError):
    """Mimics ``google.api_core.exceptions.NotFound``."""

    code = 404
    grpc_status_code = StatusCode.NOT_FOUND


class Unknown(GoogleAPICallError):
    """Mimics ``google.api_core.exceptions.Unknown``: no HTTP code, only a gRPC status."""

    grpc_status_code = StatusCode.UNKNOWN


class RetryInfo:
    """Mimics the protobuf ``google.rpc.error_details_pb2.RetryInfo`` that google-api-core puts
    in ``details`` for a gRPC call: ``retry_delay`` a ``Duration`` (seconds, nanos)."""

    class _Duration:
        def __init__(self, seconds: int, nanos: int) -> None:
            self.seconds, self.nanos = seconds, nanos

    def __init__(self, seconds: int, nanos: int) -> None:
        self.retry_delay = self._Duration(seconds, nanos)


# -- classification ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (GenaiClientError(429, _genai_body(429, "RESOURCE_EXHAUSTED")), 429),
        (GenaiServerError(503, _genai_body(503, "UNAVAILABLE")), 503),
        (GenaiServerError(500, _genai_body(500, "INTERNAL")), 500),
        (GenaiClientError(400, _genai_body(400, "INVALID_ARGUMENT")), 400),
        (GenaiClientError(404, _genai_body(404, "NOT_FOUND")), 404),
        (TooManyRequests("quota"), 429),
        (ResourceExhausted("quota"), 429),
        (ServiceUnavailable("down"), 503),
        (BadRequest("bad"), 400),
        (InvalidArgument("bad"), 400),
        (NotFound("gone"), 404),
    ],
)
def test_google_http_code_is_the_status(exc: Exception, status: int) -> None:
    # Before: .code was never read, so none had a status; the 429/5xx ones were not retried.
    assert _status_of(exc) == status
    assert is_retryable(exc) is (status in (429, 500, 503))


def test_a_grpc_status_without_an_http_code_is_mapped() -> None:
    # api-core's Unknown has code None and only grpc_status_code (HTTP 500 in Google's map).
    assert _status_of(Unknown("?")) == 500 and is_retryable(Unknown("?"))
    # the number form (from_grpc_status(14, ...) without grpcio installed keeps the int)
    e = GoogleAPICallError("x")
    e.grpc_status_code = 14
    assert _status_of(e) == 503 and is_retryable(e)
    e.grpc_status_code = 5
    assert _status_of(e) == 404 and not is_retryable(e)
    e.grpc_status_code = 99  # no gRPC status
    assert _status_of(e) is None and not is_retryable(e)


@pytest.mark.parametrize(
    ("name", "retried"),
    [
        ("RESOURCE_EXHAUSTED", True),
        ("UNAVAILABLE", True),
        ("DEADLINE_EXCEEDED", True),
        ("INTERNAL", True),
        ("INVALID_ARGUMENT", False),
        ("PERMISSION_DENIED", False),
    ],
)
def test_a_genai_error_known_only_by_its_status_name(name: str, retried: bool) -> None:
    # A body without a code (APIError falls back to the body's code, here absent): .code None.
    exc = GenaiAPIError(0, {"error": {"message": "m", "status": name}})
    assert exc.code is None and exc.status == name
    assert is_retryable(exc) is retried


@pytest.mark.parametrize("status", ["503", "busy", "Service Unavailable", "unavailable", ""])
def test_a_free_text_status_is_no_status_and_no_crash(status: str) -> None:
    exc = GenaiAPIError(0, {"error": {"message": "m", "status": status}})
    assert _status_of(exc) is None and not is_retryable(exc)


def test_a_non_http_int_code_is_not_a_status() -> None:
    # the Live API raises APIError(1006, reason) on an abnormal websocket close
    live = GenaiAPIError(1006, "Abnormal closure.")
    assert live.code == 1006 and live.status is None
    assert _status_of(live) is None and not is_retryable(live)

    class ErrnoLike(Exception):
        code = 2

    assert _status_of(ErrnoLike()) is None and not is_retryable(ErrnoLike())

    class Flag(ConnectionError):
        code = True  # a bool is never a status: the ConnectionError rule decides

    assert _status_of(Flag()) is None and is_retryable(Flag())


def test_http_code_precedence() -> None:
    # status / status_code / http_status come before code; code before response.status_code
    exc = GenaiClientError(429, _genai_body(429, "RESOURCE_EXHAUSTED"))
    exc.status_code = 400  # type: ignore[attr-defined]
    assert _status_of(exc) == 400

    class Resp:
        status_code = 400

    exc = GenaiServerError(503, _genai_body(503, "UNAVAILABLE"), response=Resp())
    assert _status_of(exc) == 503  # .code before .response.status_code
    # an HTTP .code beats a contradicting gRPC status name
    exc = GenaiClientError(404, _genai_body(404, "UNAVAILABLE"))
    assert _status_of(exc) == 404 and not is_retryable(exc)


def test_a_code_property_is_not_run() -> None:
    # websockets' ConnectionClosed.code is a deprecated property that warns on every read
    class Closed(Exception):
        @property
        def code(self) -> int:
            raise AssertionError("the code property was read")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _status_of(Closed()) is None and not is_retryable(Closed())
    ws = pytest.importorskip("websockets")
    from websockets.frames import Close

    real = ws.exceptions.ConnectionClosedError(Close(1011, "internal"), None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not is_retryable(real)


def test_urllib_http_error_code_agrees() -> None:
    # urllib's HTTPError has the status in .code and in .status (a property): read either way
    for code, retried in ((503, True), (429, True), (404, False)):
        e = urllib.error.HTTPError("http://h/", code, "x", None, None)  # type: ignore[arg-type]
        assert _status_of(e) == code and is_retryable(e) is retried


def test_google_connection_errors_are_retryable() -> None:
    # google-genai's Interactions API (google/genai/_interactions_errors.py) and google-auth
    base = type("APIError", (Exception,), {"__module__": "google.genai._interactions_errors"})
    conn = type("APIConnectionError", (base,), {"__module__": base.__module__})
    timeout = type("APITimeoutError", (conn,), {"__module__": base.__module__})
    transport = type("TransportError", (Exception,), {"__module__": "google.auth.exceptions"})
    for cls in (conn, timeout, transport):
        assert is_retryable(cls("x")), cls
    other = type("TransportError", (Exception,), {"__module__": "mylib.errors"})
    assert not is_retryable(other("x"))


def test_httpx2_network_errors_are_retryable() -> None:
    httpx2 = pytest.importorskip("httpx2")
    for exc in (
        httpx2.ConnectError("refused"),
        httpx2.ReadTimeout("slow"),
        httpx2.RemoteProtocolError("server disconnected"),
    ):
        assert is_retryable(exc), exc
    assert not is_retryable(httpx2.InvalidURL("no scheme"))


# -- the server's wait -------------------------------------------------------------------------
def test_retry_info_in_the_genai_body_is_the_wait() -> None:
    body = _genai_body(429, "RESOURCE_EXHAUSTED", [{"@type": "x.QuotaFailure"}, _retry_info("58s")])
    assert retry_after_of(GenaiClientError(429, body)) == 58.0
    frac = _genai_body(429, "RESOURCE_EXHAUSTED", [_retry_info("0.25s")])
    assert retry_after_of(GenaiClientError(429, frac)) == 0.25
    # the error object itself as the body (a replayed response's segment)
    assert retry_after_of(GenaiClientError(429, frac["error"])) == 0.25
    for junk in ("soon", "58", "-1s", "nans", 58, None):
        bad = _genai_body(429, "RESOURCE_EXHAUSTED", [_retry_info(junk)])  # type: ignore[arg-type]
        assert retry_after_of(GenaiClientError(429, bad)) is None, junk
    assert retry_after_of(GenaiClientError(429, _genai_body(429, "RESOURCE_EXHAUSTED"))) is None
    assert retry_after_of(GenaiAPIError(1006, "Abnormal closure.")) is None


def test_retry_info_in_api_core_details_is_the_wait() -> None:
    rest = TooManyRequests("quota", details=[_retry_info("7s")])  # REST: JSON dicts
    assert retry_after_of(rest) == 7.0
    grpc_err = ResourceExhausted("quota", details=[RetryInfo(3, 500_000_000)])  # gRPC: protobuf
    assert retry_after_of(grpc_err) == 3.5


def test_a_retry_after_header_of_the_genai_response_wins_over_the_body() -> None:
    httpx = pytest.importorskip("httpx")
    body = _genai_body(429, "RESOURCE_EXHAUSTED", [_retry_info("58s")])
    resp = httpx.Response(429, headers={"Retry-After": "2"})
    assert retry_after_of(GenaiClientError(429, body, resp)) == 2.0
    no_header = httpx.Response(429)
    assert retry_after_of(GenaiClientError(429, body, no_header)) == 58.0


def test_a_retry_info_beyond_max_retry_after_ends_the_call() -> None:
    body = _genai_body(429, "RESOURCE_EXHAUSTED", [_retry_info("3600s")])
    exc = GenaiClientError(429, body)
    with pytest.raises(RetryAfterTooLongError) as ei:
        RetryPolicy().should_retry(exc, 1)
    assert ei.value.retry_after == 3600.0 and ei.value.__cause__ is exc


# -- through the engine ------------------------------------------------------------------------
def _cfg() -> beacon.BeaconConfig:
    return beacon.BeaconConfig(family="bernoulli", cost=0.05, horizon=4)


def _model(fails: list[Exception]) -> Any:
    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0)
        if fails:
            raise fails.pop(0)
        return "r=1"

    return gen


def _score(prompt: Any, text: str) -> float:
    return 1.0


async def test_the_engine_retries_google_429_and_503() -> None:
    fails: list[Exception] = [
        GenaiClientError(429, _genai_body(429, "RESOURCE_EXHAUSTED")),
        ServiceUnavailable("down"),
        Unknown("?"),
    ]
    s = BeaconSampler(
        _model(fails), _score, _cfg(), retry=RetryPolicy(max_attempts=4, base_delay=0)
    )
    res = await s.arun("q")
    assert res.n_failed == 0 and res.error is None
    assert res.usage.failed_calls == 3 and res.usage.retries == 3


async def test_the_engine_does_not_retry_a_google_400() -> None:
    fails: list[Exception] = [GenaiClientError(400, _genai_body(400, "INVALID_ARGUMENT"))]
    s = BeaconSampler(
        _model(fails), _score, _cfg(), retry=RetryPolicy(max_attempts=4, base_delay=0)
    )
    res = await s.arun("q")
    c0 = res.candidates[0]
    assert c0.failed and c0.usage.model_calls == 1 and res.usage.retries == 0


async def test_the_engine_waits_a_gemini_retry_delay() -> None:
    loop = asyncio.get_running_loop()
    times: list[float] = []
    body = _genai_body(429, "RESOURCE_EXHAUSTED", [_retry_info("0.15s")])
    fails: list[Exception] = [GenaiClientError(429, body)]

    async def gen(prompt: Any) -> str:
        times.append(loop.time())
        return await _model(fails)(prompt)

    s = BeaconSampler(gen, _score, _cfg(), retry=RetryPolicy(base_delay=0.0, max_delay=1.0))
    res = await s.arun("q")
    assert res.usage.retries == 1 and times[1] - times[0] >= 0.14
