"""The small protocol the engine takes for models and scorers, and its normalisation.

Model (``generate``): any of

* a callable ``generate(prompt)``, sync or async, returning ``str`` or :class:`Generation`;
* an object with an async ``ainvoke(prompt)`` (LangChain runnables and chat models) or
  ``acomplete(prompt)`` (LlamaIndex LLMs), found by duck typing; never imported here.

Its return value may be a ``str``, a :class:`Generation`, or (duck-typed) a LangChain or
Anthropic SDK message (``.content``, with ``.usage_metadata`` or ``.usage``), an OpenAI SDK
``ChatCompletion`` / ``Completion`` (its first choice; ``.usage``) or Responses API ``Response``
(``.output_text``; ``.usage``), a LlamaIndex
``CompletionResponse`` (``.text``) or ``ChatResponse`` (``.message.content``). The original
object is kept as ``Generation.raw``.

Scorer (``score``): a callable ``score(prompt, response_text) -> float`` (sync or async), or a
batched one ``score(prompt, [texts]) -> [floats]``. Batching is declared, never guessed: wrap the
callable in :class:`BatchScorer`, or give the callable/object a ``batched = True`` attribute.
Each value a scorer returns becomes a reward by :func:`as_reward`, or by the scorer's own
``as_reward(value, position)`` method where it has one (see :func:`reward_rule`); an invalid
value fails that one sample, even within a batch.

A wrong type given for any of these (or for a :class:`~beacon.engine.BeaconSampler` argument) is
a :class:`beacon.ConfigTypeError`: a :class:`beacon.ConfigError` naming the field and value
that is also a ``TypeError``, as the Stopper raises for a wrong ``cfg``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import numbers
from collections.abc import Awaitable, Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

import numpy as np

from beacon._checks import is_integer, is_real, real_as_float
from beacon._sync import call_in_thread
from beacon.engine.calls import within
from beacon.errors import ConfigError, ConfigTypeError, RewardError

__all__ = [
    "BatchScorer",
    "GenerateFn",
    "GenerateLike",
    "Generation",
    "Score",
    "ScoreFn",
    "ScoreLike",
    "SupportsAcomplete",
    "SupportsAinvoke",
    "as_reward",
    "batch_rewards",
    "coerce_generation",
    "is_batched",
    "is_inline_sync",
    "make_generate",
    "make_score",
    "reward_rule",
]


@dataclass(slots=True)
class Generation:
    """One model response.

    Attributes:
        text: the response text passed to the scorer and kept on the candidate.
        input_tokens / output_tokens: tokens billed for this call, if the model reports them.
            ``input_tokens`` is every prompt token the model processed, those read from or
            written to a prompt cache included (Anthropic's usage counts them apart; see
            :func:`coerce_generation`).
        cost: money for this call, if known (currency of your choice, consistent with any
            :class:`~beacon.budget.Budget`).
        raw: the model's own response object (e.g. an ``AIMessage``); kept in memory, never
            serialized.
        cache_read_tokens / cache_write_tokens: how many of ``input_tokens`` were read from /
            written to the provider's prompt cache, if reported. They are billed at their own
            rates, which a :class:`~beacon.budget.Budget` may set
            (``price_per_cache_read_token`` / ``price_per_cache_write_token``).
        cache_write_1h_tokens: how many of ``cache_write_tokens`` were written with a 1-hour
            lifetime (Anthropic's ``cache_creation.ephemeral_1h_input_tokens``), if reported;
            Anthropic bills them at 2x the input price, 5-minute writes at 1.25x
            (``Budget.price_per_cache_write_1h_token``).
    """

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    raw: Any = field(default=None, repr=False, compare=False)
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None

    def __post_init__(self) -> None:
        # Checked here because a budget trusts these numbers: a NaN cost would never reach a
        # cap and negative tokens would lower the count. Raised from the model call, the error
        # fails that sample (reported on the candidate) and the query goes on.
        if not isinstance(self.text, str):
            raise TypeError(f"Generation.text must be a str, got {type(self.text).__name__}")
        _check_spend(self, "Generation")


def _check_spend(obj: Generation | Score, owner: str) -> None:
    """Check (and store as plain numbers) the token counts and cost of ``obj``: counts
    integers >= 0 or None, the cache counts parts of ``input_tokens``, the cost a finite number
    >= 0 or None. ``owner`` names the class in the :class:`beacon.ConfigError`."""
    _check_counts(obj, owner, "input_tokens", "output_tokens")
    if (obj.cache_read_tokens is not None or obj.cache_write_tokens is not None
            or obj.cache_write_1h_tokens is not None):
        _check_cache(obj, owner)  # apart: no cost per sample where none is reported
    c = obj.cost
    if c is not None:
        # compared as a float: an int of hundreds of digits is infinite, not an OverflowError
        if not is_real(c) or not 0 <= (f := real_as_float(c)) < math.inf:
            raise ConfigError(f"{owner}.cost", c, "must be a finite number >= 0 or None")
        obj.cost = f


def _check_counts(obj: Any, owner: str, *names: str) -> None:
    """Each token count of ``names`` is None or an integer >= 0 (stored as ``int``)."""
    for name in names:
        v = getattr(obj, name)
        if v is not None:
            if not is_integer(v) or v < 0:
                raise ConfigError(f"{owner}.{name}", v, "must be an integer >= 0 or None")
            setattr(obj, name, int(v))


def _check_cache(obj: Generation | Score, owner: str) -> None:
    _check_counts(obj, owner, "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens")
    h1 = obj.cache_write_1h_tokens
    if h1 and (obj.cache_write_tokens is None or h1 > obj.cache_write_tokens):
        # a part of the writes: a 1-hour count beyond them would be priced twice
        raise ConfigError(
            f"{owner}.cache_write_tokens", obj.cache_write_tokens,
            f"must include the {h1} 1-hour cache write tokens reported",
        )
    cached = (obj.cache_read_tokens or 0) + (obj.cache_write_tokens or 0)
    if cached and (obj.input_tokens is None or cached > obj.input_tokens):
        # a part of input_tokens: a cache count beyond it would be priced twice
        raise ConfigError(
            f"{owner}.input_tokens", obj.input_tokens,
            f"must include the {cached} cache read/write tokens reported",
        )


@dataclass(slots=True)
class Score:
    """A reward with what the scorer spent computing it: an LLM judge's tokens and money.

    A scorer may return a ``Score`` in place of a bare reward (a batched one, in place of any
    of its rewards), so that the tokens and money of its own model calls are counted in the
    sample's and the query's :class:`~beacon.result.Usage` (``score_input_tokens``,
    ``score_output_tokens``, ``score_cost``) and by the :class:`~beacon.budget.Budget` caps
    (``max_tokens``, ``max_cost``). A judge that scores a whole batch in one call may put the
    call's spend on one of the batch's values, or share it out. A bare number costs nothing.

    Attributes:
        reward: the reward, made one by the scorer's rule as a bare value is (a real number, a
            bool; for the LangChain / LlamaIndex adapters also a numeric string or message).
        input_tokens / output_tokens: tokens the scorer's model calls billed for this value
            (``input_tokens`` counting any read from or written to a prompt cache).
        cost: money for them (the budget's currency); ``None``: priced by the budget's
            per-token prices from the token counts, as a model response is.
        cache_read_tokens / cache_write_tokens / cache_write_1h_tokens: the cache parts of
            ``input_tokens`` (and the 1-hour part of the writes), as on :class:`Generation`,
            for the budget's cache prices.

    The counts and cost are checked as a :class:`Generation`'s are: a bad one is a
    :class:`beacon.ConfigError` naming it, raised from the scorer call (the sample fails).
    """

    reward: Any
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None

    def __post_init__(self) -> None:
        _check_spend(self, "Score")

    @property
    def reports(self) -> bool:
        """Whether any token count or cost is reported (``Score(x)`` alone reports none)."""
        return (self.input_tokens is not None or self.output_tokens is not None
                or self.cost is not None)


class BatchScorer:
    """Marks ``fn(prompt, [texts]) -> [floats]`` (sync or async) as a batched scorer."""

    batched = True

    def __init__(self, fn: Callable[[Any, list[str]], Any]) -> None:
        if not callable(fn):
            raise TypeError(f"BatchScorer needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def __call__(self, prompt: Any, texts: list[str]) -> Any:
        return self.fn(prompt, texts)

    def __repr__(self) -> str:
        return f"BatchScorer({self.fn!r})"


GenerateFn = Callable[[Any], Awaitable[Generation]]
ScoreFn = Callable[[Any, list[str]], Awaitable[list[float]]]


class SupportsAinvoke(Protocol):
    """A model with an async ``ainvoke(prompt)`` (LangChain runnables and chat models)."""

    def ainvoke(self, input: Any, /) -> Awaitable[Any]: ...


class SupportsAcomplete(Protocol):
    """A model with an async ``acomplete(prompt)`` (LlamaIndex LLMs)."""

    def acomplete(self, prompt: Any, /) -> Awaitable[Any]: ...


GenerateLike: TypeAlias = Callable[[Any], Any] | SupportsAinvoke | SupportsAcomplete
"""What ``BeaconSampler`` takes as ``generate``: ``generate(prompt)``, sync or async, returning
``str``, :class:`Generation` or a framework response object, or an object with an async
``ainvoke`` / ``acomplete``."""

ScoreLike: TypeAlias = Callable[[Any, Any], Any]
"""What ``BeaconSampler`` takes as ``score``: ``score(prompt, text) -> reward`` or, declared
batched (:class:`BatchScorer`, ``batched = True``), ``score(prompt, [texts]) -> [rewards]``;
sync or async."""


def is_batched(score: Any) -> bool:
    """Declared batched: a ``batched`` attribute that is exactly ``True``."""
    return getattr(score, "batched", False) is True


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a dict, ``obj.name`` of an SDK object (``None`` when absent): providers
    give the same response as either, LangChain as dicts and the vendor SDKs as objects."""
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _block_text(block: Any) -> str | None:
    """A content block's text: a string, a ``{"type": "text", "text": ...}`` dict (LangChain)
    or a block object with a ``text`` string (the Anthropic SDK's ``TextBlock``); ``None`` for
    the other kinds (tool use, images, reasoning), which are not the answer's text."""
    if isinstance(block, str):
        return block
    text = _field(block, "text")
    return text if isinstance(text, str) else None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks (LangChain, Anthropic SDK)
        return "".join(t for t in map(_block_text, content) if t is not None)
    raise TypeError(f"model response content must be str or list, got {type(content).__name__}")


def _int_or_none(v: Any) -> int | None:
    """A reported token count, or None where the provider's usage field is not one."""
    if v is None:  # the common absent field: no number checks
        return None
    if not is_real(v) or not 0 <= v < math.inf:
        return None
    return int(v)


def _call_view(call: Any) -> Any:
    """One tool call as ``{"name", "args"}``: LangChain's ``{"name", "args"}``, the OpenAI SDK's
    ``function.name`` / ``function.arguments`` (a JSON string, parsed where it is JSON; a
    Responses API ``function_call`` item's ``name`` / ``arguments`` likewise) or an
    Anthropic ``tool_use`` block's ``name`` / ``input``; anything else as it is."""
    function = _field(call, "function")
    if function is not None:
        name, args = _field(function, "name"), _field(function, "arguments")
        if isinstance(args, str):
            # a model may emit arguments that are not JSON: those are kept as the string
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        return {"name": name, "args": args}
    kind = _field(call, "type")
    if kind == "tool_use":
        return {"name": _field(call, "name"), "args": _field(call, "input")}
    if kind == "function_call":  # an OpenAI Responses API output item
        return _call_view({"function": call})
    if isinstance(call, Mapping):
        return {"name": call.get("name"), "args": call.get("args")}
    return call


def _message_text(msg: Any) -> str:
    """A chat message's text; a reply that is only tool calls (empty text, and ``tool_calls``
    set or ``tool_use`` content blocks, as an agent model's often is) is its calls as JSON,
    ``[{"name", "args"}, ...]``, so the scorer judges the calls rather than an empty string.
    No content (``None``: an OpenAI SDK message that only calls tools) is no text, as for a
    LlamaIndex ``ChatResponse``. An OpenAI SDK message the model refused (no content, its
    ``refusal`` set) is its refusal, the answer it gave."""
    content = msg.content
    text = "" if content is None else _content_text(content)
    if text.strip():
        return text
    refusal = getattr(msg, "refusal", None)
    if isinstance(refusal, str) and refusal.strip():
        return refusal
    calls = getattr(msg, "tool_calls", None)
    if not calls or not isinstance(calls, list):
        # the Anthropic SDK's message has no tool_calls: its calls are content blocks
        calls = [
            b for b in (content if isinstance(content, list) else ())
            if _field(b, "type") == "tool_use"
        ]
    return _calls_json(calls) if calls else text


def _calls_json(calls: list[Any]) -> str:
    view = [_call_view(c) for c in calls]
    try:
        return json.dumps(view, sort_keys=True, ensure_ascii=False, default=str)
    except TypeError:  # keys of mixed types cannot be sorted
        return json.dumps(view, ensure_ascii=False, default=str)


def _response_text(text: str, out: Any) -> str:
    """An OpenAI Responses API ``Response``'s text; one that only calls functions is its
    ``function_call`` output items as JSON, as :func:`_message_text` does for a message."""
    if text.strip():
        return text
    items = getattr(out, "output", None)
    calls = [i for i in (items if isinstance(items, list) else ())
             if _field(i, "type") == "function_call"]
    return _calls_json(calls) if calls else text


_Counts: TypeAlias = tuple[int | None, int | None, int | None, int | None, int | None]


def _usage_counts(out: Any) -> _Counts:
    """``(input, output, cache_read, cache_write, cache_write_1h)`` tokens a response reports
    (``None``: not reported), ``input`` counting every prompt token processed, cached ones
    included, and ``cache_write_1h`` the part of ``cache_write`` written with a 1-hour lifetime.

    * LangChain's ``usage_metadata``: ``input_tokens`` already includes the cache, whose part
      is in ``input_token_details`` (``cache_read`` / ``cache_creation``; langchain-anthropic
      copies Anthropic's TTL split there as ``ephemeral_1h_input_tokens``).
    * The Anthropic SDK's ``usage``: ``input_tokens`` are only the uncached ones; the tokens
      read from and written to the cache (``cache_read_input_tokens`` /
      ``cache_creation_input_tokens``) are added to them (the model processed them, and they
      are billed). ``cache_creation.ephemeral_1h_input_tokens`` is the 1-hour part of the
      writes (billed at 2x the input price, 5-minute writes at 1.25x).
    * The OpenAI SDK's ``usage``: ``prompt_tokens`` (``input_tokens`` for the Responses API)
      includes the cached ones (``prompt_tokens_details`` / ``input_tokens_details``
      ``.cached_tokens``, reads).
    """
    usage = getattr(out, "usage_metadata", None)
    langchain = isinstance(usage, Mapping)
    if not langchain:
        usage = getattr(out, "usage", None)
    if usage is None:
        return None, None, None, None, None
    get = _getter(usage)
    it, ot = get("input_tokens"), get("output_tokens")
    if it is None and ot is None:  # OpenAI Chat Completions
        read = _getter(get("prompt_tokens_details"))("cached_tokens")
        return (_int_or_none(get("prompt_tokens")), _int_or_none(get("completion_tokens")),
                _int_or_none(read), None, None)
    it, ot = _int_or_none(it), _int_or_none(ot)
    if langchain:
        details = _getter(usage.get("input_token_details"))
        return (it, ot, _int_or_none(details("cache_read")),
                _int_or_none(details("cache_creation")),
                _int_or_none(details("ephemeral_1h_input_tokens")))
    read = _int_or_none(get("cache_read_input_tokens"))
    write = _int_or_none(get("cache_creation_input_tokens"))
    if read is not None or write is not None:  # Anthropic: not in its input_tokens
        h1 = _int_or_none(_getter(get("cache_creation"))("ephemeral_1h_input_tokens"))
        return (it or 0) + (read or 0) + (write or 0), ot, read, write, h1
    # OpenAI's Responses API: input_tokens includes its cached ones
    return (it, ot, _int_or_none(_getter(get("input_tokens_details"))("cached_tokens")),
            None, None)


def _getter(obj: Any) -> Callable[[str], Any]:
    """``name -> value`` of ``obj``'s field (:func:`_field`, with the dict-or-object test done
    once for several fields); ``None`` for every name of ``None``."""
    if isinstance(obj, Mapping):
        return obj.get
    if obj is None:
        return _none
    return lambda name: getattr(obj, name, None)


def _none(name: str) -> None:
    return None


def _consistent(counts: _Counts) -> _Counts:
    """``counts`` (:func:`_usage_counts`) with a cache split that does not fit in its total
    dropped: the total stands, unsplit (priced as input tokens, or the writes at the one
    write price), rather than failing a paid call or pricing tokens twice."""
    it, ot, read, write, h1 = counts
    if it is None or (read or 0) + (write or 0) > it:
        return it, ot, None, None, None
    if h1 is not None and (write is None or h1 > write):
        return it, ot, read, write, None
    return counts


def _generation(text: str, out: Any) -> Generation:
    """A :class:`Generation` of ``text`` with the usage ``out`` reports (kept as ``raw``)."""
    it, ot, read, write, h1 = _consistent(_usage_counts(out))
    return Generation(text, it, ot, None, out, read, write, h1)


def coerce_generation(out: Any) -> Generation:
    """Normalise a model's return value to a :class:`Generation` (``TypeError`` if unknown)."""
    if isinstance(out, Generation):
        return out
    if isinstance(out, str):
        return Generation(out)
    if hasattr(out, "content"):  # LangChain BaseMessage, Anthropic SDK Message
        return _generation(_message_text(out), out)
    text = getattr(out, "text", None)
    if isinstance(text, str):  # LlamaIndex CompletionResponse
        return Generation(text, raw=out)
    text = getattr(out, "output_text", None)
    if isinstance(text, str):  # OpenAI SDK Responses API Response
        return _generation(_response_text(text, out), out)
    msg = getattr(out, "message", None)
    if msg is not None and hasattr(msg, "content"):  # LlamaIndex ChatResponse
        content = msg.content
        return Generation("" if content is None else _content_text(content), raw=out)
    choices = getattr(out, "choices", None)
    if isinstance(choices, list | tuple):  # OpenAI SDK ChatCompletion / Completion
        if not choices:
            raise TypeError(f"model response {type(out).__name__} has no choices")
        first = choices[0]
        msg = getattr(first, "message", None)
        if msg is not None and hasattr(msg, "content"):
            return _generation(_message_text(msg), out)
        text = getattr(first, "text", None)
        if isinstance(text, str):
            return _generation(text, out)
    raise TypeError(
        "generate must return str, Generation, or a message/response with text content; "
        f"got {type(out).__name__}"
    )


async def _maybe_await(v: Any) -> Any:
    return await v if inspect.isawaitable(v) else v


def _awaitable(v: Any) -> bool:
    # Plain values (str, float) are the common sync case; skip the slower generic check.
    return type(v) not in (str, float, int, Generation) and inspect.isawaitable(v)


def make_generate(generate: Any, *, offload_sync: bool = False) -> GenerateFn:
    """An async ``prompt -> Generation`` from any supported model object."""
    ainvoke = getattr(generate, "ainvoke", None)
    if callable(ainvoke):
        async def via_ainvoke(prompt: Any) -> Generation:
            return coerce_generation(await ainvoke(prompt))
        return via_ainvoke
    acomplete = getattr(generate, "acomplete", None)
    if callable(acomplete):
        async def via_acomplete(prompt: Any) -> Generation:
            return coerce_generation(await acomplete(prompt))
        return via_acomplete
    if not callable(generate):
        raise ConfigTypeError(
            "generate", generate,
            "must be a callable, or have an async ainvoke/acomplete method",
        )
    _not_a_generator("generate", generate, "its whole response (str or Generation)")
    if offload_sync and not _is_async_callable(generate):
        async def via_thread(prompt: Any) -> Generation:
            return coerce_generation(await _maybe_await(await call_in_thread(generate, prompt)))
        return via_thread

    async def via_call(prompt: Any) -> Generation:
        out = generate(prompt)
        if _awaitable(out):
            out = await out
        return out if type(out) is Generation else coerce_generation(out)
    return via_call


def _not_a_generator(name: str, fn: Any, returns: str, *, sync_ok: bool = False) -> None:
    """A generator function (``yield``, async or not) as ``fn`` is a ConfigTypeError: its call
    returns a generator, never an answer, so every sample would fail. ``sync_ok``: a plain
    generator is an answer (a batched scorer may yield its rewards one by one)."""
    inner = fn.fn if isinstance(fn, BatchScorer) else fn
    for f in (inner, getattr(inner, "__call__", None)):  # noqa: B004 - instances too
        if inspect.isasyncgenfunction(f) or (inspect.isgeneratorfunction(f) and not sync_ok):
            raise ConfigTypeError(
                name, fn,
                f"is a generator function (it yields): it must return {returns}; "
                "to stream, collect the chunks and return them joined",
            )


def is_inline_sync(fn: Any, *, offload_sync: bool = False) -> bool:
    """A synchronous callable the engine calls inline on the loop (not offloaded).

    Such a call cannot be interrupted by a timeout, and it never yields to the loop, so the
    engine skips the timeout and the concurrency slot for it (the rate limiter still applies);
    an awaitable it returns is awaited within both (:func:`make_score`'s ``late_slot``).
    """
    inner = fn.fn if isinstance(fn, BatchScorer) else fn
    return (
        not offload_sync
        and not _is_async_callable(inner)
        and not callable(getattr(fn, "ainvoke", None))
        and not callable(getattr(fn, "acomplete", None))
    )


def _is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - instances with an async __call__
    )


def as_reward(r: Any, position: Any) -> float:
    """A scorer's number as a finite float reward (``position``: the sample's, for errors).

    A real number (numpy's too, a 0-d array included; an int beyond the float range is
    infinite), or a bool -- ``numpy.bool_`` included -- as 1.0 / 0.0 (a verifier's verdict).
    An exception instance is raised as it is: a scorer's way to fail one sample of a batch
    with its own error (e.g. the HTTP scorer's ``RewardResponseError`` naming the field).
    Anything else (an array of more dimensions: a reward model's unsqueezed ``(n, 1)``
    output), and a non-finite value, is a :class:`beacon.RewardError` naming ``position``.
    """
    if type(r) is float:
        if math.isfinite(r):
            return r
        raise RewardError(position, r, "reward must be finite")
    # numpy booleans are not numbers.Real, but a verifier returning np.True_ means 1
    if not isinstance(r, numbers.Real | np.bool_):
        if isinstance(r, Exception):
            raise r
        if isinstance(r, np.ndarray):
            if r.ndim == 0:  # a 0-d array (``np.array(0.7)``, a tensor's ``.numpy()``): a scalar
                return as_reward(r[()], position)
            raise RewardError(
                position, r,
                f"scorer must return one real number per response, got an array of shape "
                f"{r.shape} (a reward model's (n, 1) output: squeeze it, or take .item())",
            )
        raise RewardError(position, r, "scorer must return a real number")
    x = real_as_float(r)
    if not math.isfinite(x):
        raise RewardError(position, r, "reward must be finite")
    return x


def reward_rule(score: Any) -> Callable[[Any, Any], float]:
    """``rule(value, position) -> float``: how the engine makes each output of ``score`` a reward.

    :func:`as_reward`, unless the scorer has its own ``as_reward(value, position)`` method
    (the LangChain and LlamaIndex adapters: numeric strings, messages, ``{"score": x}``), whose
    result is checked by :func:`as_reward` in turn. Whatever either raises fails that one
    sample -- in a batch too -- and is reported on it.
    """
    own = getattr(score, "as_reward", None)
    if own is None:
        return as_reward
    if not callable(own):
        raise ConfigTypeError(
            "score.as_reward", own, "must be a method (value, position) -> float, or absent"
        )

    def rule(value: Any, position: Any) -> float:
        return as_reward(own(value, position), position)

    return rule


def batch_rewards(out: Any, n: int) -> list[Any]:
    """A batched scorer's return value as a list of ``n`` values, one per response, in order.

    A list, tuple, numpy array or any other iterable (a generator) is accepted. A string, bytes,
    a mapping or a set is a ``TypeError`` (iterating would give characters, keys, or an
    arbitrary order), as is a non-iterable; a wrong count is a ``ValueError``. The values
    themselves are checked one by one by the engine (:func:`reward_rule`), so an invalid one
    fails only its own sample.
    """
    if isinstance(out, str | bytes | Mapping | Set) or not isinstance(out, Iterable):
        raise TypeError(
            f"batched scorer must return a sequence of {n} rewards, one per response "
            f"(list, tuple, numpy array or iterable); got {type(out).__name__}"
        )
    try:
        vals = list(out)
    except TypeError as exc:  # e.g. a 0-d numpy array
        raise TypeError(
            f"batched scorer must return a sequence of {n} rewards, one per response; "
            f"got {type(out).__name__} ({exc})"
        ) from exc
    if len(vals) != n:
        raise ValueError(f"batched scorer returned {len(vals)} rewards for {n} responses")
    return vals


async def _gather_rewards(vals: list[Any]) -> list[Any]:
    """A batched scorer's list holding awaitables (``[judge(p, t) for t in texts]`` with an
    async ``judge``), awaited together: the batch is one scorer call, so the first error of
    any of them fails it (retried as the call), after all have finished (none is left
    running or never awaited)."""
    at = [i for i, v in enumerate(vals) if _awaitable(v)]
    got = await asyncio.gather(*(vals[i] for i in at), return_exceptions=True)
    for v in got:
        if isinstance(v, BaseException):
            raise v
    out = list(vals)  # a plain value (an exception instance too) stays as the scorer gave it
    for i, v in zip(at, got, strict=True):
        out[i] = v
    return out


def make_score(
    score: Any, *, offload_sync: bool = False, late_timeout: float | None = None,
    late_slot: Callable[[], asyncio.Semaphore | None] | None = None,
) -> tuple[ScoreFn, bool]:
    """``(fn, batched)``: an async ``(prompt, texts) -> rewards`` and whether it batches.

    For a single scorer ``fn`` takes a one-element list (the engine scores samples one by one).
    Rewards are returned as given (the engine makes each one a reward, see
    :func:`reward_rule`). When a synchronous scorer (run inline, see :func:`is_inline_sync`)
    returns an awaitable (``lambda p, t: judge(p, t)``), or a batched one a list of them, the
    await is bounded by ``late_timeout`` and holds a slot of ``late_slot()`` (the current
    loop's scorer slots; ``None``: none). The synchronous part itself never waits for a slot:
    it may run a nested query of the same sampler, whose scorer would wait for slots that the
    frames below it hold.
    """
    if not callable(score):
        raise ConfigTypeError("score", score, "must be a callable (prompt, response) -> reward")
    batched = is_batched(score)
    _not_a_generator("score", score, "its reward(s)", sync_ok=batched)
    thread = offload_sync and not _is_async_callable(score) and not (
        isinstance(score, BatchScorer) and _is_async_callable(score.fn)
    )

    async def call(prompt: Any, texts: list[str]) -> Any:
        arg: Any = texts if batched else texts[0]
        if thread:
            out = await call_in_thread(score, prompt, arg)
        else:
            out = score(prompt, arg)
        if _awaitable(out):
            out = await late(out)
        return out

    async def late(aw: Awaitable[Any]) -> Any:
        sem = late_slot() if late_slot is not None else None
        if sem is None:
            return await within(late_timeout, aw, "scorer")
        async with sem:
            return await within(late_timeout, aw, "scorer")

    if batched:
        async def batch_fn(prompt: Any, texts: list[str]) -> list[float]:
            vals = batch_rewards(await call(prompt, texts), len(texts))
            if any(_awaitable(v) for v in vals):
                vals = await late(_gather_rewards(vals))
            return vals
        return batch_fn, True

    if thread:
        async def single_thread(prompt: Any, texts: list[str]) -> list[float]:
            return [await call(prompt, texts)]
        return single_thread, False

    async def single_fn(prompt: Any, texts: list[str]) -> list[float]:
        out = score(prompt, texts[0])
        if _awaitable(out):
            out = await late(out)
        return [out]
    return single_fn, False
