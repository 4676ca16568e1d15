"""HTTP statuses no retry can fix (501, 505) and botocore's dict-shaped error response."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from beacon.retry import is_retryable, retryable_status
from beacon_integrations.scorers.errors import RewardHTTPError


class BotoClientError(Exception):
    """The shape of ``botocore.exceptions.ClientError``: ``response`` is the parsed error dict
    (``Error.Code``, ``ResponseMetadata.HTTPStatusCode``), ``operation_name`` the API call."""

    def __init__(self, error_response: dict[str, Any], operation_name: str) -> None:
        super().__init__(f"An error occurred ({error_response['Error']['Code']})")
        self.response = error_response
        self.operation_name = operation_name


def _boto(code: str, status: Any) -> BotoClientError:
    meta: dict[str, Any] = {"RequestId": "r-1", "RetryAttempts": 0}
    if status is not None:
        meta["HTTPStatusCode"] = status
    return BotoClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": meta},
                           "InvokeModel")


@pytest.mark.parametrize(("code", "status", "retry"), [
    ("ThrottlingException", 429, True),
    ("ServiceUnavailableException", 503, True),
    ("ModelTimeoutException", 408, True),
    ("ValidationException", 400, False),
    ("AccessDeniedException", 403, False),
])
def test_a_botocore_client_error_is_classified_by_its_http_status(
    code: str, status: int, retry: bool
) -> None:
    assert is_retryable(_boto(code, status)) is retry


@pytest.mark.parametrize("status", [None, "429", True, 42])
def test_a_botocore_error_without_an_http_status_is_not_retried(status: Any) -> None:
    assert is_retryable(_boto("Weird", status)) is False


class Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize("status", [501, 505])
def test_a_status_no_retry_can_fix_is_not_retried(status: int) -> None:
    assert retryable_status(status) is False
    assert is_retryable(Status(status)) is False
    assert RewardHTTPError(status, "http://127.0.0.1:1/score").retryable is False


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504, 599])
def test_transient_statuses_stay_retried(status: int) -> None:
    assert retryable_status(status) is True
    assert is_retryable(Status(status)) is True
    assert RewardHTTPError(status, "http://127.0.0.1:1/score").retryable is True


# -- review findings: google-auth's retryable flag, raw grpcio errors, botocore connections ---
class GoogleAuthError(Exception):
    """The shape of ``google.auth.exceptions.GoogleAuthError``: a ``retryable`` property that
    is False unless the raiser passed ``retryable=True`` (no TransportError raiser does)."""

    __module__ = "google.auth.exceptions"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args)
        self._retryable = kwargs.get("retryable", False)

    @property
    def retryable(self) -> bool:
        return bool(self._retryable)


class TransportError(GoogleAuthError):
    """``google.auth.exceptions.TransportError``: the network failed (refreshing a token)."""

    __module__ = "google.auth.exceptions"


class RefreshError(GoogleAuthError):
    """``google.auth.exceptions.RefreshError``: bad credentials, permanent unless flagged."""

    __module__ = "google.auth.exceptions"


def test_google_auth_transport_error_is_retried_despite_its_default_flag() -> None:
    assert TransportError("connection reset").retryable is False
    assert is_retryable(TransportError("connection reset")) is True
    # the flag still decides for what is not a known network failure
    assert is_retryable(RefreshError("invalid_grant")) is False
    assert is_retryable(RefreshError("temporarily unavailable", retryable=True)) is True


class StatusCode(enum.Enum):
    """``grpc.StatusCode`` (value: (number, name))."""

    OK = (0, "ok")
    INVALID_ARGUMENT = (3, "invalid argument")
    DEADLINE_EXCEEDED = (4, "deadline exceeded")
    RESOURCE_EXHAUSTED = (8, "resource exhausted")
    UNAVAILABLE = (14, "unavailable")


class RpcError(Exception):
    """``grpc.RpcError``: the base of grpcio's call errors."""

    __module__ = "grpc"


class AioRpcError(RpcError):
    """``grpc.aio.AioRpcError``: the status is the value of its ``code()`` method."""

    __module__ = "grpc.aio._call"

    def __init__(self, code: StatusCode) -> None:
        super().__init__(code.name)
        self._code = code

    def code(self) -> StatusCode:
        return self._code


@pytest.mark.parametrize(("code", "retry"), [
    (StatusCode.UNAVAILABLE, True),
    (StatusCode.RESOURCE_EXHAUSTED, True),
    (StatusCode.DEADLINE_EXCEEDED, True),
    (StatusCode.INVALID_ARGUMENT, False),
])
def test_a_raw_grpc_error_is_classified_by_its_code_method(code: StatusCode, retry: bool) -> None:
    assert is_retryable(AioRpcError(code)) is retry


def test_a_bare_rpc_error_and_foreign_code_methods_are_not_called() -> None:
    assert is_retryable(RpcError("no status")) is False
    calls: list[int] = []

    class Foreign(Exception):
        def code(self) -> str:
            calls.append(1)
            return "UNAVAILABLE"

    assert is_retryable(Foreign("x")) is False and calls == []


def _boto_class(name: str) -> type[Exception]:
    base = type("BotoCoreError", (Exception,), {"__module__": "botocore.exceptions"})
    conn = type("ConnectionError", (base,), {"__module__": "botocore.exceptions"})
    return type(name, (conn,), {"__module__": "botocore.exceptions"})


@pytest.mark.parametrize("name", ["EndpointConnectionError", "ConnectionClosedError"])
def test_botocore_connection_failures_are_retried(name: str) -> None:
    assert is_retryable(_boto_class(name)("Could not connect to the endpoint URL")) is True


def test_other_botocore_errors_are_not() -> None:
    assert is_retryable(_boto_class("NoCredentialsError")("Unable to locate credentials")) is False
