"""HttpRewardScorer: score responses with a reward model behind an HTTP JSON endpoint (aiohttp).

One :class:`aiohttp.ClientSession` per event loop, created lazily on first use and closed by
:meth:`HttpRewardScorer.aclose` (or ``async with scorer:``), with a bounded connection pool.

Request: ``request_template`` is any JSON value; string values that are exactly a placeholder
are replaced by the value itself (keeping its JSON type), placeholders inside longer strings are
replaced by its text. Placeholders:

* ``{prompt}`` -- the prompt as given (a string, a list of messages, any JSON value);
* ``{response}`` -- the response text (single mode);
* ``{responses}`` / ``{prompts}`` -- the list of response texts / the prompt repeated once per
  response (batched mode);
* ``{messages}`` -- chat messages: the prompt as a user message (or the prompt's own list of
  ``{"role", "content"}`` messages) followed by ``{"role": "assistant", "content": response}``.

Response: ``score_path`` is a dotted path (``"data.0.score"``; integers index lists) to the
score, or in batched mode to a list of scores, or a path with one ``*`` (``"data.*.score"``)
collecting one score per list element; or a callable ``f(json) -> score | [scores]``.

The body is encoded as strict JSON before it is sent: a prompt or response that is not
JSON-serializable (a set, an arbitrary object, NaN) is a :class:`RewardRequestError` naming the
field, never retried.

Spend: ``usage`` says where the endpoint reports the tokens it billed (an LLM judge, a hosted
reward model), so that the engine counts them as the scorer's (``score_input_tokens`` /
``score_output_tokens``) and against the budget's ``max_tokens`` / ``max_cost``: a dotted path
(as ``score_path``, without ``*``) to an OpenAI-style (``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details.cached_tokens``) or Anthropic-style (``input_tokens``,
``output_tokens``, ``cache_read_input_tokens``, ``cache_creation_input_tokens``) object, or a
callable ``f(json) -> mapping | beacon.Score | None``. The scorer then returns a
:class:`beacon.Score` (batched: the call's spend on the batch's first value, never once per
response). :meth:`HttpRewardScorer.openai_compatible` reads ``"usage"`` by default.

Auth: ``api_key_env`` names an environment variable read when the scorer is created; its value
is sent as ``{auth_header}: {auth_scheme} <value>`` and never appears in ``repr``, errors or
events.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import math
import os
import re
import threading
import warnings
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from beacon._checks import is_real
from beacon.engine.calls import attach_spend
from beacon.engine.protocol import Score, as_reward
from beacon.errors import ConfigError, RewardError
from beacon.retry import parse_retry_after
from beacon_integrations import import_extra
from beacon_integrations.scorers.errors import (
    RewardConnectionError,
    RewardHTTPError,
    RewardRequestError,
    RewardResponseError,
    RewardTimeoutError,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = ["HttpRewardScorer", "UsageWarning", "extract_path"]


_T = TypeVar("_T")
_PLACEHOLDER = re.compile(r"\{(prompt|prompts|response|responses|messages)\}")
# How much of an error status's body is read: enough for the message (and to scrub a key in it).
_ERROR_BODY_BYTES = 8192
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _safe_url(url: str) -> str:
    """The URL without credentials, query or fragment (they may carry keys)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
    except ValueError:  # a malformed port or IPv6 literal: show no netloc at all
        return "<malformed URL>"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _check_url(url: Any) -> None:
    if not isinstance(url, str):
        raise ConfigError("url", url, "must be an http(s) URL string")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError("url", _safe_url(url), f"is malformed ({exc})") from exc
    if parts.scheme not in ("http", "https"):
        raise ConfigError("url", _safe_url(url), "must be an http(s) URL")
    if not host:
        raise ConfigError("url", _safe_url(url), "has no host (expected http(s)://host/path)")


# The control characters a header field may not hold (RFC 9110 section 5.5; horizontal tab is
# allowed): aiohttp refuses to send them, but only at request time, with a bare ValueError.
_BAD_HEADER_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _check_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ConfigError(
            "headers", headers, "must be a mapping of header names to string values"
        )
    seen: dict[str, str] = {}
    for k, v in headers.items():
        if not isinstance(k, str) or not k or _BAD_HEADER_CHARS.search(k):
            raise ConfigError(
                "headers", k,
                "header names must be non-empty one-line strings without control characters",
            )
        # Header names are case-insensitive: both spellings would be sent, and a server
        # refuses a duplicated header (aiohttp's own answers 400).
        if k.lower() in seen:
            raise ConfigError(
                "headers", k, f"names the same header as {seen[k.lower()]!r} (names ignore case)"
            )
        seen[k.lower()] = k
        if not isinstance(v, str) or _BAD_HEADER_CHARS.search(v):
            raise ConfigError(
                f"headers[{k!r}]", v,
                "header values must be one-line strings without control characters",
            )
    return dict(headers)


def _messages(prompt: Any, response: str) -> list[Any]:
    if isinstance(prompt, list) and all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt
    ):
        msgs = [dict(m) for m in prompt]
    else:
        msgs = [{"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt)}]
    msgs.append({"role": "assistant", "content": response})
    return msgs


def _render(template: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(template, str):
        m = _PLACEHOLDER.fullmatch(template)
        if m is not None:
            key = m.group(1)
            if key not in values:
                raise ConfigError("request_template", template, f"{{{key}}} is not available here")
            return values[key]

        def sub(mm: re.Match[str]) -> str:
            key = mm.group(1)
            if key not in values:
                raise ConfigError("request_template", template, f"{{{key}}} is not available here")
            v = values[key]
            return v if isinstance(v, str) else json.dumps(v)

        return _PLACEHOLDER.sub(sub, template)
    if isinstance(template, Mapping):
        return {k: _render(v, values) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [_render(v, values) for v in template]
    return template


_SINGLE_ONLY = {"response", "messages"}
_BATCH_ONLY = {"responses", "prompts"}


def _placeholders(template: Any) -> set[str]:
    if isinstance(template, str):
        return set(_PLACEHOLDER.findall(template))
    if isinstance(template, Mapping):
        return set().union(*(_placeholders(v) for v in template.values()))
    if isinstance(template, list | tuple):
        return set().union(*(_placeholders(v) for v in template))
    return set()


def _check_placeholders(template: Any, batched: bool) -> None:
    found = _placeholders(template)
    bad = found & (_SINGLE_ONLY if batched else _BATCH_ONLY)
    if bad:
        mode = "batched" if batched else "single"
        raise ConfigError(
            "request_template", template,
            f"placeholder(s) {sorted(bad)} are not available in {mode} mode",
        )
    need = "responses" if batched else "response"
    if need not in found and not (not batched and "messages" in found):
        raise ConfigError("request_template", template, f"must contain {{{need}}}")


_REQUIRED: Any = object()  # extract_path's default: every step of the path must be there


def extract_path(doc: Any, path: str, *, absent: Any = _REQUIRED) -> Any:
    """Follow a dotted ``path`` (integers index lists, one ``*`` maps over a list) in ``doc``.

    Raises :class:`RewardResponseError` naming the path prefix that could not be followed.
    With ``absent`` given, a field that is missing or ``null`` and a list index out of range
    give ``absent`` instead (a server may leave its usage out, or send ``"usage": null``); a
    path running into a value of the wrong kind (a scalar) is still the error.
    """
    optional = absent is not _REQUIRED
    parts = path.split(".") if path else []
    cur: Any = doc
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if part == "*":
            if not isinstance(cur, list):
                raise RewardResponseError(here, cur, "expected a list to map over")
            rest = ".".join(parts[i + 1 :])
            return [extract_path(el, rest, absent=absent) if rest else el for el in cur]
        if isinstance(cur, Mapping):
            if part not in cur:
                if optional:
                    return absent
                raise RewardResponseError(here, _keys(cur), "field missing; found these keys")
            cur = cur[part]
        elif isinstance(cur, list):
            index = re.fullmatch(r"-?\d+", part) is not None
            if not index or not -len(cur) <= int(part) < len(cur):
                if optional and index:
                    return absent
                raise RewardResponseError(here, len(cur), "list index missing or out of range")
            cur = cur[int(part)]
        else:
            raise RewardResponseError(here, cur, "cannot index into a scalar")
        if optional and cur is None:
            return absent
    return cur


def _keys(d: Mapping[str, Any]) -> list[str]:
    return sorted(str(k) for k in d)[:20]


def _as_score(value: Any, path: str) -> float:
    """The engine's rule (:func:`beacon.engine.protocol.as_reward`): a finite real number, or
    a JSON ``true``/``false`` as 1.0/0.0 (a binary verifier's verdict); else a
    :class:`RewardResponseError` naming ``path`` and the value."""
    try:
        return as_reward(value, path)
    except RewardError as exc:
        raise RewardResponseError(path, value, exc.reason) from None


def _checked(value: Any, path: str) -> float | RewardResponseError:
    """``value`` as a score, or the :class:`RewardResponseError` saying why it is not one (a
    batch keeps it in that response's place, see :meth:`HttpRewardScorer.__call__`)."""
    if isinstance(value, RewardResponseError):
        return value
    try:
        return _as_score(value, path)
    except RewardResponseError as exc:
        return exc


def number_in_text(path: str) -> Callable[[Any], float]:
    """Score extractor: the first number in the string at ``path`` (e.g. ``"reward:-3.5"``)."""

    def extract(doc: Any) -> float:
        text = extract_path(doc, path)
        if not isinstance(text, str):
            return _as_score(text, path)
        m = _NUMBER.search(text)
        if m is None:
            raise RewardResponseError(path, text, "no number in the text")
        return _as_score(float(m.group(0)), path)

    return extract


def _vllm_batch_scores(doc: Any) -> list[float | RewardResponseError]:
    """The scores of a vLLM ``/score`` answer, in the order of the request's responses.

    Each ``data`` element's ``index`` says which response it scores; the indices must be
    exactly a permutation of ``0..len(data)-1`` (every response once), else a
    :class:`RewardResponseError` naming ``data.*.index`` and the indices: a duplicate or a
    1-based index would otherwise give a score to the wrong response. A ``data`` list with no
    ``index`` at all is taken in list order. An element without a valid ``score`` gives its
    response's error (``data.<i>.score``) in its place: it fails that response alone.
    """
    data = extract_path(doc, "data")
    if not isinstance(data, list):
        raise RewardResponseError("data", data, "expected a list")
    items = list(enumerate(data))
    if any(isinstance(d, Mapping) and "index" in d for d in data):
        indices: list[Any] = [
            d.get("index", "<missing>") if isinstance(d, Mapping) else "<missing>" for d in data
        ]
        n = len(data)
        if not all(type(i) is int for i in indices) or sorted(indices) != list(range(n)):
            raise RewardResponseError(
                "data.*.index", indices,
                f"indices must be a permutation of 0..{n - 1} (each response exactly once)",
            )
        items = sorted(zip(indices, data, strict=True), key=lambda t: t[0])
    out: list[float | RewardResponseError] = []
    for i, d in items:
        path = f"data.{i}.score"
        if isinstance(d, Mapping) and "score" in d:
            out.append(_checked(d["score"], path))
        else:
            out.append(RewardResponseError(path, d, "no score for this response"))
    return out


def _vllm_single_score(doc: Any) -> float:
    """The score of a vLLM ``/score`` answer to a request for one response.

    ``data`` must be a list of exactly one element, whose ``index`` (where it has one) is 0;
    anything else is a :class:`RewardResponseError` naming ``data`` or ``data.0.index`` and
    the value found there, as batched mode checks its indices.
    """
    data = extract_path(doc, "data")
    if not isinstance(data, list) or len(data) != 1:
        raise RewardResponseError("data", data, "expected a list of exactly 1 score")
    item = data[0]
    if isinstance(item, Mapping) and "index" in item:
        idx = item["index"]
        if type(idx) is not int or idx != 0:
            raise RewardResponseError("data.0.index", idx, "expected 0 (one response was sent)")
    return _as_score(extract_path(doc, "data.0.score"), "data.0.score")


_ABSENT = object()  # a usage path that the response does not hold: no spend reported
_USAGE_KEYS = (
    "prompt_tokens and completion_tokens (OpenAI) or input_tokens and output_tokens (Anthropic)"
)


def _field_name(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _token_count(obj: Mapping[str, Any], key: str, where: str, *, required: bool) -> int | None:
    """``obj[key]`` as a token count: a JSON integer >= 0 (not a bool, not ``1.0``); else a
    :class:`RewardResponseError` naming the field and value. An optional count that is missing
    or ``null`` is ``None`` (not reported); a required one is an error."""
    v = obj.get(key, _ABSENT)
    if v is None and not required:
        return None
    if v is _ABSENT:
        if not required:
            return None
        raise RewardResponseError(
            _field_name(where, key), _keys(obj), "token count missing; found these keys"
        )
    if type(v) is not int or v < 0:  # a required null too
        raise RewardResponseError(_field_name(where, key), v, "must be an integer >= 0")
    return v


def _sub(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    """The nested object ``obj[key]`` (``None`` when missing or ``null``), else an error."""
    v = obj.get(key)
    if v is None or isinstance(v, Mapping):
        return v
    raise RewardResponseError(_field_name(where, key), v, "expected an object")


def _nested_count(obj: Mapping[str, Any], key: str, count: str, where: str) -> int | None:
    """The optional token count ``obj[key][count]`` (``None`` when either is absent)."""
    sub = _sub(obj, key, where)
    if sub is None:
        return None
    return _token_count(sub, count, _field_name(where, key), required=False)


def _usage_spend(obj: Any, where: str) -> Score:
    """A spend-only :class:`beacon.Score` of the usage object ``obj`` found at ``where``.

    Read as the engine reads an SDK response's usage: OpenAI's ``prompt_tokens`` include the
    cached ones (``prompt_tokens_details.cached_tokens``, reads); Anthropic's ``input_tokens``
    do not, so its ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` are added to
    them (``cache_creation.ephemeral_1h_input_tokens``: the 1-hour part of the writes); plain
    ``input_tokens`` / ``output_tokens`` (OpenAI's Responses API, or a server's own) with
    ``input_tokens_details.cached_tokens`` as reads. Both counts of a style are required.
    """
    if not isinstance(obj, Mapping):
        raise RewardResponseError(
            where or "<usage>", obj, f"expected a usage object with {_USAGE_KEYS}"
        )
    if "prompt_tokens" in obj or "completion_tokens" in obj:
        names = ("prompt_tokens", "completion_tokens")
    elif "input_tokens" in obj or "output_tokens" in obj:
        names = ("input_tokens", "output_tokens")
    else:
        raise RewardResponseError(
            where or "<usage>", _keys(obj), f"no token counts: expected {_USAGE_KEYS}"
        )
    it = _token_count(obj, names[0], where, required=True)
    ot = _token_count(obj, names[1], where, required=True)
    assert it is not None and ot is not None
    write = h1 = None
    read_at = f"{names[0]}_details.cached_tokens"  # OpenAI's chat or Responses API
    read = _nested_count(obj, f"{names[0]}_details", "cached_tokens", where)
    if names[0] == "input_tokens":
        anthropic_read = _token_count(obj, "cache_read_input_tokens", where, required=False)
        write = _token_count(obj, "cache_creation_input_tokens", where, required=False)
        if anthropic_read is not None or write is not None:
            # Anthropic: the cache is not in its input_tokens, yet was processed and billed
            read, read_at = anthropic_read, "cache_read_input_tokens"
            it += (read or 0) + (write or 0)
            h1 = _nested_count(obj, "cache_creation", "ephemeral_1h_input_tokens", where)
            if h1 is not None and h1 > (write or 0):
                raise RewardResponseError(
                    _field_name(where, "cache_creation.ephemeral_1h_input_tokens"),
                    h1,
                    f"more than the {write or 0} cache_creation_input_tokens it is part of",
                )
    if read is not None and read > it:
        raise RewardResponseError(
            _field_name(where, read_at), read, f"more cached tokens than the {it} input tokens"
        )
    return Score(None, it, ot, None, read, write, h1)


def _check_usage(usage: Any) -> None:
    if usage is None or callable(usage):
        return
    if not isinstance(usage, str):
        raise ConfigError(
            "usage",
            usage,
            "must be a dotted path to the answer's usage object, a callable json -> usage "
            "mapping / beacon.Score / None, or None",
        )
    if not usage:
        raise ConfigError("usage", usage, "must name the answer's usage object, e.g. 'usage'")
    if "*" in usage.split("."):
        raise ConfigError("usage", usage, "cannot map over a list ('*'): a call bills once")


class UsageWarning(UserWarning):
    """An endpoint's ``usage`` object could not be read, so its spend is not counted."""


class _LenientUsage:
    """:meth:`HttpRewardScorer.openai_compatible`'s default ``usage``: the answer's usage
    object at ``path``, read as ``usage=path`` reads it, except that a malformed one (a server
    sending a partial block, e.g. no ``completion_tokens``) reports no spend, with one
    :class:`UsageWarning` per scorer, instead of failing every sample of a user who asked for
    no usage at all."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.warned = False

    def __call__(self, doc: Any) -> Score | None:
        try:
            found = extract_path(doc, self.path, absent=_ABSENT)
            return None if found is _ABSENT else _usage_spend(found, self.path)
        except RewardResponseError as exc:
            if not self.warned:
                self.warned = True
                warnings.warn(
                    f"the reward endpoint's usage is not counted: {exc} (pass usage='usage' to "
                    "make this an error, or usage=None to not read it)",
                    UsageWarning,
                    stacklevel=2,
                )
            return None


_OPENAI_USAGE: Any = object()  # openai_compatible's default: _LenientUsage("usage")


class HttpRewardScorer:
    """A reward scorer calling an HTTP JSON endpoint; usable as a BeaconSampler ``score``.

    Args:
        url: the endpoint (POST); an ``http``/``https`` URL with a host.
        request_template: JSON body with placeholders (see module docs). Default
            ``{"prompt": "{prompt}", "response": "{response}"}``, or with ``"responses":
            "{responses}"`` in batched mode.
        score_path: dotted path or callable locating the score (list of scores when batched).
        batched: one request scores all responses of a batch (the endpoint accepts lists).
        headers: extra request headers, a mapping of ``str`` names to ``str`` values (do not
            put secrets here; use ``api_key_env``). Names ignore case: two spellings of one
            name are a :class:`beacon.ConfigError`, and a ``Content-Type`` (``content-type``)
            given replaces the default ``application/json``.
        api_key_env: name of the environment variable holding the API key.
        auth_header / auth_scheme: how the key is sent (``Authorization: Bearer <key>``);
            ``auth_scheme=""`` sends the bare key (e.g. ``auth_header="x-api-key"``). The key,
            header and scheme must be fit for a header (no line break or other control
            character, as a key read with its file's trailing newline has): else a
            :class:`beacon.ConfigError` when the scorer is created, naming ``api_key_env``
            (never the key).
        timeout: seconds allowed to connect, and between bytes of the response (waiting for a
            pooled connection excluded) -> :class:`RewardTimeoutError`; a finite number > 0.
        total_timeout: optional cap on a whole request, pool waiting included (finite, > 0);
            the :class:`RewardTimeoutError` says which of the two limits ran out.
        max_connections / max_connections_per_host: connection-pool limits (0 = unlimited).
        max_response_bytes: largest response body read (default 10 MiB); a larger one is a
            :class:`RewardResponseError` at ``"<body>"``, never read into memory whole. An
            error status's body is read only as far as the message needs.
        usage: where the answer reports what the call billed (see "Spend" below); ``None``
            (default) reads nothing and costs nothing per call.

    Spend: with ``usage`` set, a call whose answer reports its tokens gives a
    :class:`beacon.Score` (a batched call: on its first value alone, the others bare, so one
    POST is counted once) with ``cost=None``: the engine counts the tokens as the scorer's
    (``Usage.score_input_tokens`` / ``score_output_tokens``, and in ``total_tokens`` for the
    budget's ``max_tokens``) and prices them with the budget's per-token prices
    (``price_per_input_token``, ``price_per_output_token``, the cache prices), as it prices a
    model response that reports tokens only, into ``score_cost`` and ``max_cost`` (a budget
    with a ``max_cost`` but no prices lists it in ``budget_unenforced``). ``usage`` is one of:

    * a dotted path to the usage object, as ``score_path`` (no ``*``: a call bills once), e.g.
      ``"usage"``. Its keys are OpenAI's ``prompt_tokens`` / ``completion_tokens`` (with
      ``prompt_tokens_details.cached_tokens`` as cache reads) or Anthropic's ``input_tokens``
      / ``output_tokens`` (with ``cache_read_input_tokens`` / ``cache_creation_input_tokens``,
      added to its input tokens as the engine does for Anthropic responses);
    * a callable ``f(json)`` returning such a mapping, a :class:`beacon.Score` (its counts and
      ``cost`` are taken, its reward ignored: the way to report money in the budget's
      currency) or ``None``.

    An answer without the usage object (the path missing, or ``null``) reports nothing: the
    reward stands as a bare number. A usage object that is present but malformed (a count
    missing, negative, fractional, a bool or a string; more cached tokens than input tokens)
    is a :class:`RewardResponseError` naming the field and value, which fails the sample (not
    retried) although its reward may be fine: a budget trusts these counts, and a call whose
    spend cannot be read would escape the caps unnoticed. Pass ``usage=None`` to not count
    such an endpoint's spend. An answer that reports usage but whose reward cannot be read
    still counts: the spend rides on the error as ``beacon_spend`` (the engine's
    ``SPEND_ATTR``), as the LangChain and LlamaIndex adapters do for a failed judge call.
    :meth:`score` and :meth:`score_batch` return the rewards alone; the engine calls the
    scorer itself, which returns the ``Score``.

    Redirects are not followed: a 3xx answer is a (non-retryable) :class:`RewardHTTPError`
    naming the status and the ``Location`` (without its query), since following it would send
    the body as a GET (301/302/303) or the API key to whatever host it names. A ``Retry-After``
    header of a failed request, in seconds or as an HTTP date, becomes the error's
    ``retry_after`` seconds: the engine waits at least that long before its retry, and a wait
    longer than its policy's ``max_retry_after`` (default 60 s) ends the call at once with
    :class:`beacon.retry.RetryAfterTooLongError` (an earlier retry would be refused again).
    """

    def __init__(
        self,
        url: str,
        *,
        request_template: Any = None,
        score_path: str | Callable[[Any], Any] = "score",
        batched: bool = False,
        headers: Mapping[str, str] | None = None,
        api_key_env: str | None = None,
        auth_header: str = "Authorization",
        auth_scheme: str = "Bearer",
        timeout: float = 30.0,
        total_timeout: float | None = None,
        max_connections: int = 64,
        max_connections_per_host: int = 0,
        max_response_bytes: int = 10 * 2**20,
        usage: str | Callable[[Any], Any] | None = None,
    ) -> None:
        _check_url(url)
        _check_usage(usage)
        if not (isinstance(score_path, str) or callable(score_path)):
            raise ConfigError("score_path", score_path, "must be a dotted path or a callable")
        if isinstance(score_path, str) and score_path.count("*") > 1:
            raise ConfigError("score_path", score_path, "at most one '*' is supported")
        for name, t in (("timeout", timeout), ("total_timeout", total_timeout)):
            if t is None and name == "total_timeout":
                continue
            # finite: aiohttp turns an infinite timeout into an OverflowError at request time
            if t is None or not is_real(t) or not 0 < t < math.inf:
                raise ConfigError(name, t, "must be a finite positive number of seconds")
        for name, v in (("max_connections", max_connections),
                        ("max_connections_per_host", max_connections_per_host)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(name, v, "must be an integer >= 0")
        if (
            isinstance(max_response_bytes, bool)
            or not isinstance(max_response_bytes, int)
            or max_response_bytes < 1
        ):
            raise ConfigError("max_response_bytes", max_response_bytes, "must be an integer >= 1")
        self.url = url
        self.batched = bool(batched)
        if request_template is None:
            request_template = (
                {"prompt": "{prompt}", "responses": "{responses}"}
                if self.batched
                else {"prompt": "{prompt}", "response": "{response}"}
            )
        _check_placeholders(request_template, self.batched)
        self.request_template = request_template
        self.score_path = score_path
        self.usage = usage
        self.headers = _check_headers(headers)
        self.api_key_env = api_key_env
        self._auth: dict[str, str] = {}
        if not isinstance(auth_header, str) or not auth_header or _BAD_HEADER_CHARS.search(
            auth_header
        ):
            raise ConfigError(
                "auth_header", auth_header, "must be a non-empty header name on one line"
            )
        if not isinstance(auth_scheme, str) or _BAD_HEADER_CHARS.search(auth_scheme):
            raise ConfigError("auth_scheme", auth_scheme, "must be a one-line string")
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                raise ConfigError("api_key_env", api_key_env, "environment variable is not set")
            if _BAD_HEADER_CHARS.search(key):
                # Checked here, not by aiohttp at every request; the key itself is not shown.
                raise ConfigError(
                    "api_key_env", api_key_env,
                    "the environment variable's value holds a line break or another control "
                    "character (a trailing newline of the file it was read from?), which no "
                    "HTTP header can carry; strip it",
                )
            self._auth = {auth_header: f"{auth_scheme} {key}" if auth_scheme else key}
            self._secret: str | None = key
        else:
            self._secret = None
        self._redact = _url_secrets(url)
        if self._secret:
            self._redact.insert(0, self._secret)
        self.max_response_bytes = max_response_bytes
        self.timeout = float(timeout)
        self.total_timeout = None if total_timeout is None else float(total_timeout)
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        self._sessions: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, AsyncGenerator[None, None]]
        ] = weakref.WeakKeyDictionary()
        self._sessions_lock = threading.Lock()  # loops in several threads share the scorer

    # -- presets --------------------------------------------------------------------------------
    @classmethod
    def openai_compatible(
        cls,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        score_path: str | Callable[[Any], Any] | None = None,
        usage: str | Callable[[Any], Any] | None = _OPENAI_USAGE,
        **kwargs: Any,
    ) -> HttpRewardScorer:
        """A reward model served through an OpenAI-compatible chat-completions API.

        Assumed shape (NVIDIA-NIM-style reward models such as Nemotron-70B-Reward): POST
        ``{base_url}/chat/completions`` with ``{"model": model, "messages": [user prompt,
        assistant response]}``; the reward is the first number in
        ``choices[0].message.content`` (e.g. ``"reward:-3.25"`` or ``"0.82"``). Override
        ``score_path`` for servers that put it elsewhere. Unbatched (one response per request).

        The answer's standard ``usage`` object (``prompt_tokens``, ``completion_tokens``,
        ``prompt_tokens_details.cached_tokens``) is read by default: the scorer returns a
        :class:`beacon.Score` with those tokens, which the engine counts as the scorer's and
        prices by the budget's per-token prices (see the class's "Spend"); an answer without
        ``usage`` gives the bare reward. ``usage=None`` turns this off. Read by default, a
        ``usage`` object that is malformed (a count missing or not an integer >= 0: some
        servers send a partial one) reports no spend and warns once (:class:`UsageWarning`)
        instead of failing the sample; ``usage="usage"`` given explicitly makes it an error.
        """
        if usage is _OPENAI_USAGE:
            usage = _LenientUsage("usage")
        return cls(
            base_url.rstrip("/") + "/chat/completions",
            request_template={"model": model, "messages": "{messages}"},
            score_path=score_path or number_in_text("choices.0.message.content"),
            api_key_env=api_key_env,
            usage=usage,
            **kwargs,
        )

    @classmethod
    def vllm_score(
        cls,
        base_url: str,
        model: str,
        *,
        batched: bool = True,
        path: str = "/score",
        api_key_env: str | None = None,
        **kwargs: Any,
    ) -> HttpRewardScorer:
        """vLLM's score API (``vllm serve <model> --task score``).

        Assumed shape: POST ``{base_url}/score`` with ``{"model": model, "text_1": prompt,
        "text_2": response}`` (batched: ``"text_2": [responses]``) answering ``{"data":
        [{"index": i, "score": s}, ...]}``; scores are read from ``data.0.score`` (batched:
        every ``data[*].score``, ordered by ``index``). Indices that are not exactly a
        permutation of ``0..n-1`` -- a duplicate, a 1-based index, in single mode anything
        but 0 -- are a :class:`RewardResponseError` naming the field (``data.*.index``,
        ``data.0.index``) and the value; a single answer must have exactly one ``data``
        element. The prompt should be a string. vLLM reports the prompt tokens it processed
        in ``usage``; ``usage="usage"`` counts them as the scorer's (not read by default: a
        self-hosted model bills no tokens, and a budget's ``max_tokens`` would count them).
        """
        return cls(
            base_url.rstrip("/") + path,
            request_template={
                "model": model,
                "text_1": "{prompt}",
                "text_2": "{responses}" if batched else "{response}",
            },
            score_path=_vllm_batch_scores if batched else _vllm_single_score,
            batched=batched,
            api_key_env=api_key_env,
            **kwargs,
        )

    # -- scoring --------------------------------------------------------------------------------
    async def __call__(self, prompt: Any, response: Any) -> Any:
        """``(prompt, text) -> float``; in batched mode ``(prompt, [texts]) -> [floats]``.

        This is the engine's entry: in batched mode a response whose score is invalid (null,
        a string, NaN...) gets its :class:`RewardResponseError` in its place, so the engine
        fails that sample alone, reporting the error (as for any batched scorer, see
        :func:`beacon.engine.protocol.as_reward`). :meth:`score_batch` raises it instead.
        With ``usage`` set, an answer that reports its spend gives a :class:`beacon.Score`
        (batched: the first value, which may carry that response's error as its reward).
        """
        if self.batched:
            if isinstance(response, str | bytes) or not isinstance(response, Iterable):
                # a lone text would be split into characters, one request item each
                raise RewardRequestError(
                    "responses", response, "a batched scorer takes a list of response texts"
                )
            scores, spend = await self._batch(prompt, list(response))
            if spend is None or not scores:
                return scores
            values: list[Any] = list(scores)
            values[0] = dataclasses.replace(spend, reward=values[0])
            return values
        reward, spend = await self._single(prompt, response)
        return reward if spend is None else dataclasses.replace(spend, reward=reward)

    async def score(self, prompt: Any, response: str) -> float:
        """Score one response (one request, whatever the mode); the reward alone."""
        return (await self._single(prompt, response, spend=False))[0]

    async def score_batch(self, prompt: Any, responses: list[str]) -> list[float]:
        """Score many responses: one request in batched mode, else concurrent single requests.

        Any invalid score is a :class:`RewardResponseError` naming its field. Unbatched, the
        first failed request's error is raised once the other requests are cancelled and
        finished: none is left running after the call. The rewards alone.
        """
        if not self.batched:
            tasks = [asyncio.ensure_future(self.score(prompt, r)) for r in responses]
            try:
                return list(await asyncio.gather(*tasks))
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return _strict((await self._batch(prompt, responses, spend=False))[0])

    async def _single(
        self, prompt: Any, response: str, spend: bool = True
    ) -> tuple[float, Score | None]:
        """One request for one response: its reward and the call's spend (``None``: none
        reported, or ``spend`` False: not read)."""
        values = {"prompt": prompt, "response": response, "messages": _messages(prompt, response)}
        body = _render(self.request_template, values) if not self.batched else _render(
            self.request_template,
            {**values, "responses": [response], "prompts": [prompt]},
        )
        doc = await self._post(_encode(body, values))
        return self._parse(doc, self._one_reward, spend)

    def _one_reward(self, doc: Any) -> float:
        out = self._extract(doc)
        if self.batched:
            return _strict(self._as_list(out, 1))[0]
        return _as_score(out, self._path_name())

    async def _batch(
        self, prompt: Any, responses: list[str], spend: bool = True
    ) -> tuple[list[float | RewardResponseError], Score | None]:
        """One request for all ``responses``: their scores (an invalid one left as its error)
        and the call's spend (not read when ``spend`` is False)."""
        if not responses:
            return [], None
        values = {"prompt": prompt, "responses": list(responses)}
        body = _render(
            self.request_template, {**values, "prompts": [prompt] * len(responses)}
        )
        doc = await self._post(_encode(body, values))
        n = len(responses)
        return self._parse(doc, lambda d: self._as_list(self._extract(d), n), spend)

    def _parse(
        self, doc: Any, read: Callable[[Any], _T], spend: bool = True
    ) -> tuple[_T, Score | None]:
        """``read(doc)`` (the reward or rewards) and the spend ``doc`` reports.

        The spend is read first, so that a reward that cannot be read still has it: it goes on
        that error (:func:`beacon.engine.calls.attach_spend`). With no ``usage`` set, or
        ``spend`` False (:meth:`score` and :meth:`score_batch` return the rewards alone), this
        is ``read(doc)`` alone."""
        if self.usage is None or not spend:
            return read(doc), None
        found = self._spend(doc)
        if found is None:
            return read(doc), None
        try:
            return read(doc), found
        except Exception as exc:
            attach_spend(exc, found)  # a score_path callable's own spend on it is kept
            raise

    def _spend(self, doc: Any) -> Score | None:
        """The spend-only :class:`beacon.Score` that ``doc`` reports per ``usage``, or ``None``
        (no usage object, or one reporting neither tokens nor cost)."""
        usage = self.usage
        if isinstance(usage, str):
            found = extract_path(doc, usage, absent=_ABSENT)
            return None if found is _ABSENT else _usage_spend(found, usage)
        assert usage is not None
        got = usage(doc)
        if got is None:
            return None
        if isinstance(got, Score):
            # only its spend: the reward comes from score_path
            return dataclasses.replace(got, reward=None) if got.reports else None
        if isinstance(got, Mapping):
            return _usage_spend(got, "<usage>")
        raise ConfigError(
            "usage", got, "the usage callable must return a usage mapping, a beacon.Score or None"
        )

    def _path_name(self) -> str:
        return self.score_path if isinstance(self.score_path, str) else "<score_path>"

    def _extract(self, doc: Any) -> Any:
        if callable(self.score_path):
            return self.score_path(doc)
        return extract_path(doc, self.score_path)

    def _as_list(self, out: Any, n: int) -> list[float | RewardResponseError]:
        """``n`` scores, each a float or the error of an invalid one (a wrong list raises)."""
        name = self._path_name()
        if not isinstance(out, list):
            raise RewardResponseError(name, out, f"expected a list of {n} scores")
        if len(out) != n:
            raise RewardResponseError(name, out, f"expected {n} scores, got {len(out)}")
        return [_checked(v, f"{name}[{i}]") for i, v in enumerate(out)]

    # -- transport ------------------------------------------------------------------------------
    async def _session(self) -> aiohttp.ClientSession:
        aiohttp = import_extra("aiohttp", __name__, "http")

        loop = asyncio.get_running_loop()
        entry = self._sessions.get(loop)
        if entry is None or entry[0].closed:
            self._forget_finished()
            s = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=self.max_connections_per_host
                ),
                # Connect and read gaps are bounded, not the wait for a pooled connection:
                # under load that wait is queueing, and the engine's per-call timeout bounds
                # the whole call anyway.
                timeout=aiohttp.ClientTimeout(
                    total=self.total_timeout, sock_connect=self.timeout, sock_read=self.timeout
                ),
                headers=self._session_headers(),
            )
            # A started async generator is finalised by the loop's shutdown_asyncgens()
            # (asyncio.run does that), which closes a session that aclose() never got to:
            # sync callers (BeaconSampler.run) get a fresh loop per call.
            keeper = _close_at_loop_shutdown(s)
            await keeper.__anext__()
            entry = (s, keeper)
            with self._sessions_lock:
                self._sessions[loop] = entry
        return entry[0]

    def _session_headers(self) -> dict[str, str]:
        """The user's headers, after a JSON ``Content-Type`` unless they set their own (in any
        case: ``content-type`` too), which would otherwise be sent twice, a request that
        servers refuse with 400."""
        if any(k.lower() == "content-type" for k in self.headers):
            return dict(self.headers)
        return {"Content-Type": "application/json", **self.headers}

    def _forget_finished(self) -> None:
        """Drop the entries of closed loops and closed sessions.

        Each value holds its session, which holds its loop: the weak keys alone would never
        let a finished loop go, so every sync call (a fresh loop each: ``BeaconSampler.run``,
        ``BeaconRunnable.invoke``) would leave a closed session and a dead loop behind.
        """
        with self._sessions_lock:
            for lp, (s, _keeper) in list(self._sessions.items()):
                if s.closed or lp.is_closed():
                    del self._sessions[lp]

    def _scrub(self, text: str) -> str:
        """``text`` with the API key and the URL's credentials and query replaced by ``***``."""
        for secret in self._redact:
            text = text.replace(secret, "***")
        return text

    def _snippet(self, raw: bytes) -> str:
        """The start of a body for a message: scrubbed *before* it is cut, so a secret that
        straddles the cut cannot leave its first characters behind."""
        return self._scrub(raw.decode("utf-8", "replace"))[:200]

    async def _read(
        self, resp: aiohttp.ClientResponse, limit: int, *, prefix: bool = False
    ) -> tuple[bytes, bool]:
        """At most ``limit`` bytes of the body, and whether there was more. A body announced
        larger than ``limit`` is not read at all, unless ``prefix`` (an error page: its first
        bytes say what went wrong)."""
        if not prefix and resp.content_length is not None and resp.content_length > limit:
            return b"", True
        buf = bytearray()
        while len(buf) <= limit:
            chunk = await resp.content.read(limit + 1 - len(buf))
            if not chunk:
                return bytes(buf), False
            buf += chunk
        return bytes(buf[:limit]), True

    async def _post(self, data: bytes) -> Any:
        """POST the JSON-encoded ``data`` (Content-Type from the session headers)."""
        aiohttp = import_extra("aiohttp", __name__, "http")

        url = _safe_url(self.url)
        try:
            session = await self._session()
            async with session.post(
                self.url, data=data, headers=self._auth, allow_redirects=False
            ) as resp:
                if resp.status >= 300:
                    raw, _more = await self._read(resp, _ERROR_BODY_BYTES, prefix=True)
                    if resp.status >= 400:
                        text = self._snippet(raw)
                    else:
                        loc = resp.headers.get("Location")
                        where = "no Location" if loc is None else (
                            f"Location {self._scrub(_safe_url(loc))}"
                        )
                        text = (
                            f"redirect ({where}) not followed; set url to the endpoint itself"
                        )
                    raise RewardHTTPError(
                        resp.status, url, text, parse_retry_after(resp.headers.get("Retry-After"))
                    )
                raw, more = await self._read(resp, self.max_response_bytes)
        except (RewardHTTPError, asyncio.CancelledError):
            raise
        except TimeoutError as exc:
            raise RewardTimeoutError(f"reward endpoint {url} {self._timed_out(exc)}") from exc
        except aiohttp.ClientError as exc:
            msg = self._scrub(str(exc))
            raise RewardConnectionError(
                f"reward endpoint {url}: {type(exc).__name__}: {msg}"
            ) from exc
        if more:
            raise RewardResponseError(
                "<body>", f"more than {self.max_response_bytes} bytes",
                "response larger than max_response_bytes",
            )
        try:
            return json.loads(raw)
        except ValueError as exc:
            snippet = self._snippet(raw[:_ERROR_BODY_BYTES])
            raise RewardResponseError("<body>", snippet, "response is not valid JSON") from exc

    def _timed_out(self, exc: TimeoutError) -> str:
        """Which limit ran out: aiohttp raises a ``ServerTimeoutError`` for the connect and
        between-bytes limits (``timeout``) and a plain ``TimeoutError`` for the whole-request
        cap (``total_timeout``)."""
        aiohttp = import_extra("aiohttp", __name__, "http")

        if self.total_timeout is not None and not isinstance(exc, aiohttp.ServerTimeoutError):
            return f"did not answer within total_timeout={self.total_timeout}s"
        return f"timed out after {self.timeout}s (timeout: to connect, or between bytes)"

    async def aclose(self) -> None:
        """Close the session of the running loop and forget all sessions.

        Sessions of other (finished) loops were closed when their loop shut down.
        """
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._sessions_lock:
            entries = list(self._sessions.items())
            self._sessions.clear()
        for lp, (s, _keeper) in entries:
            if lp is loop:
                await s.close()

    async def __aenter__(self) -> HttpRewardScorer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        auth = f", api_key_env={self.api_key_env!r}" if self.api_key_env else ""
        return (
            f"HttpRewardScorer(url={_safe_url(self.url)!r}, batched={self.batched}, "
            f"score_path={self._path_name()!r}{auth})"
        )


async def _close_at_loop_shutdown(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await session.close()


def _strict(scores: list[float | RewardResponseError]) -> list[float]:
    """The scores, or the first invalid one's error raised."""
    out: list[float] = []
    for v in scores:
        if isinstance(v, RewardResponseError):
            raise v
        out.append(v)
    return out


def _encode(body: Any, values: Mapping[str, Any]) -> bytes:
    """The request body as strict JSON, or :class:`RewardRequestError` naming the culprit.

    ``values`` are the placeholders' values, tried one by one to name the field (``prompt``,
    ``response`` or ``responses``) that is not JSON-serializable (a set, an object, NaN...).
    """
    try:
        return json.dumps(body, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        for name, value in values.items():
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as inner:
                raise RewardRequestError(name, value, f"is not JSON-serializable: {inner}") \
                    from exc
        raise RewardRequestError("request_template", body, f"is not JSON-serializable: {exc}") \
            from exc


def _url_secrets(url: str) -> list[str]:
    """What of ``url`` may carry a key and must not reach a message: the URL itself, its
    password (and the Basic credential aiohttp builds from the user info) and its query."""
    parts = urlsplit(url)
    out = [url] if parts.password or parts.query else []
    if parts.password:
        out.append(parts.password)
        cred = f"{parts.username or ''}:{parts.password}".encode()
        out.append(base64.b64encode(cred).decode())
    if parts.query:
        out.append(parts.query)
    return [s for s in out if s]
