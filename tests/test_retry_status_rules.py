"""HTTP statuses no retry can fix (501, 505) and botocore's dict-shaped error response."""

from __future__ import annotations

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
