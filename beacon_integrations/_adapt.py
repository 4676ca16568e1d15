"""Adapters from LangChain and LlamaIndex objects to the engine's generate/score protocol.

The engine (:mod:`beacon.engine.protocol`) already duck-types ``ainvoke`` / ``acomplete`` models
and plain scorer callables. What it cannot do on its own is *run them under the framework's
plumbing*: a LangChain model must be invoked with the caller's child ``RunnableConfig`` (so its
run nests under the BEACON run, callbacks such as ``UsageMetadataCallbackHandler`` see it, and
tags/metadata propagate), and a scorer given as a runnable needs an input convention. This module
supplies those adapters; it imports no framework at module level, so the LlamaIndex adapter
works without LangChain installed and vice versa.

Prompt convention. The engine's prompt is opaque; the adapters pass it a :class:`LCQuery` or
:class:`LIQuery` that carries the scorer's view of the question (``text``), what the model is
called with, and the framework context of this one query. ``BeaconResult.prompt`` is reset to
``text`` by the callers so results stay JSON-ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Set
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from beacon._sync import call_in_thread
from beacon.engine.calls import attach_spend
from beacon.engine.protocol import (
    Generation,
    Score,
    _consistent,
    _Counts,
    _int_or_none,
    _usage_counts,
    as_reward,
    coerce_generation,
    is_batched,
)
from beacon.errors import BeaconError, ConfigError, RewardError, _reduce
from beacon.result import BeaconResult

__all__ = [
    "BeaconSamplingError",
    "LCQuery",
    "LIQuery",
    "lc_generate",
    "lc_prompt_text",
    "lc_score",
    "lc_scorer_runnable",
    "li_format",
    "li_generate_engine",
    "li_generate_llm",
    "li_score",
    "to_reward",
]


class BeaconSamplingError(BeaconError, RuntimeError):
    """No sample could be scored, so there is no best response to return.

    ``result`` is the full :class:`~beacon.result.BeaconResult` (failed candidates, stop reason
    ``error`` or ``budget``, and the last error).
    """

    def __init__(self, result: BeaconResult) -> None:
        self.result = result
        super().__init__(
            f"no scored candidate: stop_reason={result.stop_reason!r}, "
            f"failed={result.n_failed}, error={result.error!r}"
        )

    # Python rebuilds an exception as cls(*args), and args holds the message, not the result:
    # without this one raised in a worker process (a multiprocessing pool, a Celery task)
    # failed to unpickle in the caller, and copy.copy failed the same way.
    __reduce__ = _reduce


# -- rewards ----------------------------------------------------------------------------------
def _reward_error(value: Any, reason: str, position: Any = None) -> RewardError:
    """A :class:`beacon.RewardError` whose message names a position only when there is one
    (``position``: a sample's position, the engine's meaning)."""
    err = RewardError(position, value, reason)
    if position is None:
        err.args = (f"invalid reward: {value!r} ({reason})",)
    return err


def to_reward(value: Any, position: Any = None) -> float:
    """A scorer's output as a finite float reward.

    Accepts a real number, a bool (``True``/``False``, numpy's too: 1.0/0.0, as the engine
    does, for verifiers on the bernoulli family), a numeric string (an LLM judge piped into
    ``StrOutputParser``), a message whose text content is numeric (a judge chat model), a
    mapping with a numeric (or bool) ``"score"`` or ``"reward"`` entry, or a pydantic model or
    dataclass with such a ``score`` or ``reward`` field (a structured-output judge:
    ``judge.with_structured_output(Grade)``). A message whose content
    is a list of blocks (a reasoning judge's) is read from its text blocks. An exception instance
    (a scorer failing this one value) is raised as it is. Anything else is a
    :class:`beacon.RewardError`; its message names ``position`` (a sample's position) only
    when one is given.

    The adapters' scorers hand it to the engine as their ``as_reward`` method
    (:func:`beacon.engine.protocol.reward_rule`): the engine applies it to each value a scorer
    returns -- each element of a batch -- so an invalid one fails only its own sample.
    """
    raw = value
    if isinstance(value, Mapping):
        for key in ("score", "reward"):
            if key in value:
                value = value[key]
                break
    elif _is_structured(value):
        # a judge's structured output (with_structured_output(Grade), LlamaIndex's
        # output_cls): a pydantic model or dataclass with a score / reward field
        for key in ("score", "reward"):
            if hasattr(value, key):
                value = getattr(value, key)
                break
    content = getattr(value, "content", None)
    if isinstance(content, str):
        value = content
    elif isinstance(content, list):  # a judge's content blocks (reasoning, then its text)
        value = _blocks_text(content)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError as exc:
            raise _reward_error(raw, "scorer returned a non-numeric string", position) from exc
    try:  # the engine's rule: a real number, or a bool as 1.0 / 0.0 (a verifier's verdict)
        return as_reward(value, position)
    except RewardError as exc:
        if exc is value:  # a scorer's own error for this value (an HTTP scorer's, say)
            raise
        raise _reward_error(raw, exc.reason, position) from None


def _is_structured(value: Any) -> bool:
    """``value`` is a pydantic model or dataclass instance (a structured-output record)."""
    return hasattr(type(value), "model_fields") or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


def _blocks_text(blocks: list[Any]) -> str:
    """The text of a message's content blocks: its strings and ``"text"`` blocks (dicts, as
    LangChain gives them, or block objects, as vendor SDKs do), joined. A reasoning model's
    reply (Anthropic's with thinking, OpenAI's Responses API) puts its reasoning in blocks
    of other types before the answer, which are not the judge's verdict."""
    parts: list[str] = []
    for b in blocks:
        if isinstance(b, str):
            parts.append(b)
            continue
        kind = b.get("type") if isinstance(b, Mapping) else getattr(b, "type", None)
        text = b.get("text") if isinstance(b, Mapping) else getattr(b, "text", None)
        if kind == "text" and isinstance(text, str):
            parts.append(text)
    return "".join(parts)


async def _maybe_await(v: Any) -> Any:
    return await v if inspect.isawaitable(v) else v


# -- LangChain ----------------------------------------------------------------------------------
@dataclass(slots=True)
class LCQuery:
    """One LangChain query as the engine's opaque prompt.

    Attributes:
        text: what the scorer sees as the prompt (see :func:`lc_prompt_text`).
        model_input: what the model is invoked with (the runnable's input, unchanged).
        config: the child ``RunnableConfig`` of the BEACON run for this query; model and
            scorer calls run under it, so they nest as child runs.
    """

    text: str
    model_input: Any
    config: Any = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.text


_INPUT_KINDS = (
    "a string, a PromptValue, a list of messages, or a dict of prompt variables "
    "(for a model that starts with a prompt template)"
)


def _head(model: Any) -> Any:
    """The runnable a model's input goes to first.

    Looks through ``RunnableSequence`` heads (``prompt | chat`` starts with ``prompt``) and
    bindings (``bind``, ``with_retry``, ``with_config``...).
    """
    from langchain_core.runnables import RunnableSequence
    from langchain_core.runnables.base import RunnableBindingBase

    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        if isinstance(model, RunnableSequence):
            model = model.first
        elif isinstance(model, RunnableBindingBase):
            model = model.bound
        else:
            break
    return model


def _message_text(messages: Sequence[Any]) -> str:
    from langchain_core.messages import HumanMessage, get_buffer_string

    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            return m.text
    return get_buffer_string(list(messages))


def lc_prompt_text(value: Any, model: Any = None) -> str:
    """The scorer's view of a LangChain input: the question as plain text.

    When ``model`` starts with a prompt template (``prompt | chat``), the input is rendered by
    that template first (a dict of its variables, or a single value for a one-variable
    template) and the scorer sees the last human message of the rendered prompt -- what the
    chat model is asked. Otherwise: a string is itself; a ``PromptValue`` or a message list
    yields the text of its last human message (what a reward model compares the answer with),
    or without any human message the whole conversation as ``get_buffer_string`` renders it; a
    dict is rendered as JSON with sorted keys.

    Raises ``TypeError`` naming ``input`` for any other input (``None``, a number...), and
    :class:`beacon.ConfigError` when a dict does not fill the model's prompt template.
    """
    from langchain_core.language_models import BaseLanguageModel
    from langchain_core.messages import convert_to_messages
    from langchain_core.prompt_values import PromptValue
    from langchain_core.prompts import BasePromptTemplate

    head = _head(model)
    template = head if isinstance(head, BasePromptTemplate) else None
    if template is not None and not isinstance(value, PromptValue):
        variables = list(template.input_variables)
        if isinstance(value, Mapping):
            kwargs = dict(value)
        elif len(variables) == 1:
            kwargs = {variables[0]: value}
        else:
            raise TypeError(
                f"input must be a dict of the prompt variables {sorted(variables)} of the "
                f"model's prompt template; got {type(value).__name__}"
            )
        try:
            rendered = template.format_prompt(**kwargs)
        except Exception as exc:
            raise ConfigError(
                "input", value, f"does not fill the model's prompt template: {exc}"
            ) from exc
        return _message_text(rendered.to_messages())
    if isinstance(value, str):
        return value
    if isinstance(value, PromptValue):
        return _message_text(value.to_messages())
    if isinstance(value, Mapping):
        if isinstance(head, BaseLanguageModel):
            raise TypeError(
                f"input must be a string, a PromptValue or a list of messages for the chat "
                f"model/LLM {type(head).__name__}; got a {type(value).__name__} (put a prompt "
                "template in front of the model to fill its variables: prompt | model)"
            )
        try:
            return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
        except (TypeError, ValueError) as exc:  # keys of mixed types cannot be sorted
            raise ConfigError("input", value, f"cannot be rendered as JSON: {exc}") from exc
    if isinstance(value, bytes) or not isinstance(value, Sequence):
        raise TypeError(f"input must be {_INPUT_KINDS}; got {type(value).__name__}")
    try:
        messages = convert_to_messages(value)
    except Exception as exc:  # NotImplementedError / ValueError for a non-message item
        raise TypeError(
            f"input must be {_INPUT_KINDS}; got a {type(value).__name__} that is not a list "
            f"of messages ({exc})"
        ) from exc
    return _message_text(messages)


def _json_default(obj: Any) -> Any:
    """``json.dumps``'s fallback for a parsed output: a pydantic model as its JSON-mode dump
    (a ``PydanticToolsParser`` list holds them), anything else as its text."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return str(obj)


def _structured_generation(out: Any) -> Generation | None:
    """A parsed output -- a dict (``JsonOutputParser``, ``with_structured_output`` of a JSON
    schema), a list (``JsonOutputToolsParser``) or a pydantic model (``PydanticOutputParser``,
    ``with_structured_output(Model)``) -- as a sample: its JSON text, the object itself as
    ``raw``. ``None`` for anything else."""
    from pydantic import BaseModel

    if isinstance(out, BaseModel):
        return Generation(out.model_dump_json(), raw=out)
    if isinstance(out, Mapping | list | tuple):
        try:
            text = json.dumps(out, ensure_ascii=False, default=_json_default)
        except (TypeError, ValueError):  # keys that are no JSON keys, a circular reference
            return None
        return Generation(text, raw=out)
    return None


def lc_generate(model: Any) -> Callable[[LCQuery], Awaitable[Generation]]:
    """``generate(query)``: one sample from a LangChain chat model or runnable.

    The model is invoked with the query's child config (a child run; callbacks see its
    ``on_llm_end``, hence its usage metadata). A string output becomes the text of the sample;
    a message its text. A chain ending in an output parser that parses (a dict, a list or a
    pydantic model: ``JsonOutputParser``, ``PydanticOutputParser``,
    ``with_structured_output``) gives a sample whose text is the output as JSON (what the
    scorer sees) and whose ``raw`` is the parsed object. Rate limiting, the timeout and retries
    are the engine's (``before_model_call`` takes a LangChain rate limiter's token before the
    call has a slot).

    The sample's tokens are those of every LLM call the runnable made (:func:`_tapped`): a
    chain ending in a parser (``prompt | chat | StrOutputParser()``) has dropped the message
    and its ``usage_metadata``, and a chain of several LLM calls returns only the last one's.
    A chat model wrapping another counts the inner call once (the tap's rule).
    Where no call reported usage to the callbacks, the output's own usage counts (a runnable
    returning a message or a :class:`beacon.Generation` with tokens); a ``Generation`` the
    runnable returns with tokens or a cost of its own is taken as it is.
    """

    async def generate(query: LCQuery) -> Generation:
        tap = _usage_tap()
        try:
            out = await model.ainvoke(query.model_input, config=_tapped(query.config, tap))
        except BaseException as exc:  # a timeout's cancellation too
            _attach_spend(exc, tap.counts())
            raise
        gen = _lc_generation(out)
        counts = tap.unseen_added(out)
        if counts is None or (gen is out and _reports(gen)):
            return gen
        return _counted(gen, counts)

    return generate


class _TokenSums:
    """Token counts ``(input, output, cache_read, cache_write, cache_write_1h)`` summed over
    the LLM calls of one model or scorer call (the LangChain and LlamaIndex taps); thread-safe,
    as sync framework code may run its LLM calls in threads."""

    __slots__ = ("_lock", "_sums")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: list[int | None] | None = None

    def add(self, counts: _Counts) -> None:
        """Add one call's counts (``None``: not reported); a call reporting neither input nor
        output tokens adds nothing."""
        if counts[0] is None and counts[1] is None:
            return
        with self._lock:
            sums = self._sums
            if sums is None:
                self._sums = list(counts)
                return
            for i, v in enumerate(counts):
                if v is not None:
                    old = sums[i]
                    sums[i] = v if old is None else old + v

    def counts(self) -> _Counts | None:
        """The sums (``None`` in a place no call reported), or ``None`` when no call reported
        input or output tokens."""
        with self._lock:
            sums = self._sums
            if sums is None:
                return None
            return sums[0], sums[1], sums[2], sums[3], sums[4]


def _attach_spend(exc: BaseException, counts: _Counts | None) -> None:
    """Put the tokens a failed call's LLM calls reported on its exception, as a spend-only
    :class:`beacon.Score` under ``SPEND_ATTR``: the engine counts them for that attempt, and
    still retries it (a judge chain whose parser failed after its LLM answered was paid). Also
    on the ``CancelledError`` of a call cut by its timeout: the engine carries it over to the
    ``TimeoutError`` it raises (:func:`beacon.engine.calls.within`)."""
    if counts is None:
        return
    it, ot, read, write, h1 = counts
    # First wins for an error (a scorer's own spend on it must survive), but a cancellation
    # travels up through every nested BEACON adapter (a BeaconRunnable as another's model,
    # its sample run inline), and each outer tap has seen all that an inner one saw and more
    attach_spend(
        exc, Score(None, it, ot, None, read, write, h1),
        replace=isinstance(exc, asyncio.CancelledError),
    )


def _counted(gen: Generation, counts: _Counts) -> Generation:
    """``gen`` (a copy) with the token counts ``counts`` of the LLM calls that made it in place
    of those it reports itself (the last call's, already in them)."""
    it, ot, read, write, h1 = counts
    return dataclasses.replace(gen, input_tokens=it, output_tokens=ot, cache_read_tokens=read,
                               cache_write_tokens=write, cache_write_1h_tokens=h1)


def _reports(gen: Generation) -> bool:
    """Whether ``gen`` reports any token count or a cost."""
    return gen.input_tokens is not None or gen.output_tokens is not None or gen.cost is not None


def _tapped(config: Any, tap: Any) -> Any:
    """The child ``RunnableConfig`` ``config`` with ``tap`` added to its callbacks, as
    ``merge_configs`` adds a list of handlers (an inheritable handler on a copy of the run's
    callback manager): the call still nests under the BEACON run, the caller's own callbacks
    still see it, and ``tap`` sees every LLM call made under it, however deep in a chain.
    Only the ``callbacks`` entry is new; the caller's config is not changed."""
    if config is None:
        return {"callbacks": [tap]}
    callbacks = config.get("callbacks")
    if callbacks is None:
        callbacks = [tap]
    elif isinstance(callbacks, list):
        callbacks = [*callbacks, tap]
    else:  # a callback manager (the child of the BEACON run's)
        callbacks = callbacks.copy()
        callbacks.add_handler(tap, inherit=True)
    return {**config, "callbacks": callbacks}


# The innermost LLM run in progress in this execution context (a thread, or an asyncio task:
# LangChain copies the context into the tasks and threads it starts), set by the LangChain
# tap's start callbacks: an LLM run starting under it was called from inside it.
_LC_OPEN_LLM: ContextVar[Any] = ContextVar("beacon_lc_open_llm", default=None)


@functools.cache
def _usage_tap_type() -> type[Any]:
    """The class of :func:`_usage_tap` (built at the first use: LangChain is imported only
    when a LangChain adapter is)."""

    from langchain_core.callbacks import BaseCallbackHandler

    class _UsageTap(BaseCallbackHandler):
        """Sums the tokens of the LLM calls it sees end (``on_llm_end``) under one model or
        scorer call: ``UsageMetadataCallbackHandler``'s reading (the first generation's
        ``usage_metadata``; an LLM's ``llm_output["token_usage"]`` too), kept without a model
        name (which that handler needs, and not every chat model gives) and with the
        prompt-cache split (``input_token_details``: ``cache_read``, ``cache_creation``,
        ``ephemeral_1h_input_tokens``) read as the engine reads a message's
        (:func:`beacon.engine.protocol._usage_counts`).

        Each provider call counts once. A chat model wrapping another (a router, a fallback
        or retry wrapper written as a chat model) makes two LLM runs for one provider call:
        the inner one, which spent the tokens, and its own, which reports the inner's usage
        again (or nothing, or a total of several inner calls). So an LLM run's usage counts
        only when no LLM run nested in it has counted: the innermost calls are where tokens
        were spent, and a wrapper adding its own figure would count them twice. A run with
        nothing counted beneath it (a plain model, or a wrapper whose inner calls report
        nothing) counts its own. A failed call's usage (a stream cut after its usage arrived)
        counts the same way: it was paid.

        "Nested" is read two ways, as a wrapper can call its inner model two ways: a run
        whose ``parent_run_id`` chain (through any chains, tools or retrievers between, all
        tracked from their start events) leads to the LLM run, and a run started while the
        LLM run was in progress in the same execution context (:data:`_LC_OPEN_LLM`): a
        wrapper calling ``inner.invoke(messages)`` with no config gives the inner run the
        caller's parent, not its own, as an LLM run manager has no child manager. An LLM
        call that starts several runs at once (``batch_size`` > 1: ``generate`` over several
        inputs) encloses nothing that way, as those runs cannot be told apart; nor does a
        run once it has streamed a token to its consumer (a model the consumer calls between
        chunks is not the stream's inner call).

        Safe with concurrent runs (a batch of judge calls under one tap): each run writes
        its own keys, a nested run ends before the run around it, and the sums are locked.
        """

        # on the caller's thread: an async run would otherwise hand each event to a thread
        # pool and wait for it (and the context of its start would not be the caller's)
        run_inline = True

        def __init__(self) -> None:
            super().__init__()
            self.tokens = _TokenSums()
            self.messages: list[Any] = []  # the messages of the calls seen (kept: ids unique)
            self._parents: dict[Any, Any] = {}  # run id -> parent run id, every run seen
            self._within: dict[Any, Any] = {}  # LLM run id -> the LLM run it started inside
            # LLM run -> the LLM run in progress here when it started (kept after it ends)
            self._before: dict[Any, Any] = {}
            self._open: set[Any] = set()  # LLM runs that may still call an inner model
            self._covered: set[Any] = set()  # runs with a counted LLM run beneath them

        # the run tree needs the chain, tool (ignore_agent) and retriever start events: only
        # the retry and custom events skip this handler
        ignore_retry = ignore_custom_event = True

        # the start events (run_id and parent_run_id come as keyword arguments)
        def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
            self._parents[kwargs["run_id"]] = kwargs.get("parent_run_id")

        def on_tool_start(self, serialized: Any, input_str: Any, **kwargs: Any) -> None:
            self._parents[kwargs["run_id"]] = kwargs.get("parent_run_id")

        def on_retriever_start(self, serialized: Any, query: Any, **kwargs: Any) -> None:
            self._parents[kwargs["run_id"]] = kwargs.get("parent_run_id")

        def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
            # defined so that LangChain does not fall back to on_llm_start, with the
            # messages rendered as text for it
            self._llm_started(kwargs)

        def on_llm_start(self, serialized: Any, prompts: Any, **kwargs: Any) -> None:
            self._llm_started(kwargs)

        def on_llm_end(self, response: Any, *, run_id: Any, **kwargs: Any) -> None:
            counts, message = _llm_result_counts(response)
            if message is not None:
                self.messages.append(message)
            self._llm_done(run_id)
            self._spend(run_id, counts)

        def on_llm_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
            response = kwargs.get("response")
            self._llm_done(run_id)
            if response is not None:  # what a failed stream had received: usage, if any
                self._spend(run_id, _llm_result_counts(response)[0])

        def on_llm_new_token(self, token: Any, *, run_id: Any, **kwargs: Any) -> None:
            # a run that has handed a token to its consumer is a stream being read, not a
            # wrapper still making its inner call: a model the consumer calls between chunks
            # (a guard, a translator) is not nested in it
            self._open.discard(run_id)

        def _llm_started(self, event: Mapping[str, Any]) -> None:
            """Record an LLM run from its start event: its parent, and (one run at a time)
            the open LLM run of this call in progress here, if any, then itself as the one in
            progress here.

            The context may still name a run that has ended: LangChain's async chat models
            send ``on_llm_end`` from a gathered task, whose context is a copy, so the end
            cannot put the context back. Such a run is passed over for the run that was in
            progress when it started (kept in ``_before``)."""
            run_id = event["run_id"]
            self._parents[run_id] = event.get("parent_run_id")
            if event.get("batch_size", 1) != 1:
                return
            outer = _LC_OPEN_LLM.get()
            before, open_runs = self._before, self._open
            while outer is not None and outer not in open_runs and outer in before:
                outer = before[outer]
            if outer is not None and outer in open_runs:
                self._within[run_id] = outer
            before[run_id] = outer
            open_runs.add(run_id)
            _LC_OPEN_LLM.set(run_id)

        def _llm_done(self, run_id: Any) -> None:
            """Close ``run_id``, and put back the LLM run in progress before it started where
            its start set it and nothing later has replaced it (a synchronous end)."""
            self._open.discard(run_id)
            if _LC_OPEN_LLM.get() == run_id:
                _LC_OPEN_LLM.set(self._before.get(run_id))

        def _spend(self, run_id: Any, counts: _Counts) -> None:
            """Count one LLM run's usage unless a run nested in it has counted, and mark the
            runs it is nested in as covered (see the class docstring)."""
            if (counts[0] is None and counts[1] is None) or run_id in self._covered:
                return
            self.tokens.add(counts)
            parents, within, covered = self._parents, self._within, self._covered
            todo = [parents.get(run_id), within.get(run_id)]
            while todo:
                run = todo.pop()
                # a covered run's own ancestors were covered with it
                if run is not None and run not in covered:
                    covered.add(run)
                    todo += (parents.get(run), within.get(run))

        def counts(self) -> _Counts | None:
            """The tokens of the calls seen (:meth:`_TokenSums.counts`)."""
            return self.tokens.counts()

        def unseen_added(self, out: Any) -> _Counts | None:
            """:meth:`counts`, plus the usage of ``out`` when it is a message reporting its
            own (``usage_metadata``) that no call seen returned (a chain's last step calling a
            provider SDK itself, after an LLM call the callbacks saw); None when neither
            reports any."""
            counts = self.tokens.counts()
            if counts is None or not isinstance(getattr(out, "usage_metadata", None), Mapping):
                return counts
            if any(m is out for m in self.messages):
                return counts  # the same call: in the counts already
            self.tokens.add(_consistent(_usage_counts(out)))
            return self.tokens.counts()

    return _UsageTap


def _usage_tap() -> Any:
    """A fresh token counter for one model or scorer call (see :func:`_tapped`)."""
    return _usage_tap_type()()


def _llm_result_counts(response: Any) -> tuple[_Counts, Any]:
    """The tokens one LLM call's ``LLMResult`` reports, and its first generation's message
    (``None`` for a completion LLM's): that message's ``usage_metadata`` (a chat model's; the
    other generations of an ``n > 1`` call carry the same call's usage), else the
    ``token_usage`` of its ``llm_output`` (a completion LLM's, OpenAI's names), each with a
    cache split that does not fit dropped (:func:`_consistent`)."""
    try:
        first = response.generations[0][0]
    except (IndexError, TypeError, AttributeError):
        first = None
    message = getattr(first, "message", None)
    if isinstance(getattr(message, "usage_metadata", None), Mapping):
        return _consistent(_usage_counts(message)), message
    extra = getattr(response, "llm_output", None)
    usage = extra.get("token_usage") if isinstance(extra, Mapping) else None
    if isinstance(usage, Mapping) and usage:
        return _consistent(_usage_counts(_UsageView(usage))), message
    return (None, None, None, None, None), message


def _lc_generation(out: Any) -> Generation:
    """A LangChain runnable's output as a sample: a text or a message first, then a parsed
    output as its JSON (:func:`_structured_generation`), then the other shapes
    :func:`coerce_generation` reads.

    The parsed output comes before those shapes because they are found by attribute: a
    pydantic model (or a dict-like object) with a ``text`` or ``content`` field would be read
    as that field alone, and the scorer would never see the rest of the object. A provider
    SDK's own response (OpenAI, Anthropic: pydantic models too) is still read as a response.
    """
    if isinstance(out, str | Generation):  # the common chat-model-to-text chain: no import
        return coerce_generation(out)
    from langchain_core.messages import BaseMessage

    if isinstance(out, BaseMessage) or _sdk_response(out):
        return coerce_generation(out)
    parsed = _structured_generation(out)
    return parsed if parsed is not None else coerce_generation(out)


def _sdk_response(out: Any) -> bool:
    """Whether ``out`` is an OpenAI or Anthropic SDK object (a response, not parsed output)."""
    return type(out).__module__.partition(".")[0] in ("openai", "anthropic")


def lc_scorer_runnable(scorer: Any) -> tuple[Any, bool]:
    """``(runnable, batched)``: the scorer as a LangChain runnable, so each call is a child run.

    A runnable is used as is: its input is ``{"prompt": text, "response": text}``. A callable
    ``score(prompt, response)`` (sync or async, e.g. a ``beacon_integrations.scorers`` scorer)
    is wrapped in a ``RunnableLambda`` named after it; a batched callable (``batched = True``)
    gets ``{"prompt": text, "responses": [texts]}`` and keeps its batching.
    """
    from langchain_core.runnables import Runnable, RunnableLambda

    if isinstance(scorer, Runnable):
        return scorer, False
    if not callable(scorer):
        raise TypeError(
            f"scorer must be a callable, a LangChain runnable or a beacon scorer; "
            f"got {type(scorer).__name__}"
        )
    batched = is_batched(scorer)
    name = getattr(scorer, "__name__", None) or type(scorer).__name__

    if batched:
        async def score_many(inp: dict[str, Any]) -> Any:
            return await _maybe_await(scorer(inp["prompt"], inp["responses"]))

        return RunnableLambda(score_many, name=name), True

    async def score_one(inp: dict[str, Any]) -> Any:
        return await _maybe_await(scorer(inp["prompt"], inp["response"]))

    return RunnableLambda(score_one, name=name), False


class _LCScore:
    """Engine scorer calling a LangChain runnable under the query's config.

    Returns the runnable's outputs as they are (batched: one per response, counted by the
    engine); the engine makes each one a reward with :meth:`as_reward`. The tokens of the LLM
    calls the runnable made (an LLM judge's, seen by the callbacks as a model's are:
    :func:`_tapped`) come with it as a :class:`beacon.Score`, so that they count in the
    query's usage and budget even when the judge's message is gone (``judge_prompt | llm |
    StrOutputParser()``); a batched call's go on its first value. Where no call reported
    usage to the callbacks, a message that reports its own (an ``AIMessage`` with
    ``usage_metadata``) counts (:func:`_judged`). A ``Score`` the scorer returns with tokens or
    a cost of its own is taken as it is.
    """

    as_reward = staticmethod(to_reward)

    def __init__(self, runnable: Any, batched: bool) -> None:
        self.runnable = runnable
        self.batched = batched

    async def __call__(self, query: LCQuery, response: Any) -> Any:
        key = "responses" if self.batched else "response"
        value = list(response) if self.batched else response
        tap = _usage_tap()
        try:
            out = await self.runnable.ainvoke(
                {"prompt": query.text, key: value}, config=_tapped(query.config, tap)
            )
        except BaseException as exc:  # a timeout's cancellation too
            _attach_spend(exc, tap.counts())
            raise
        counts = tap.unseen_added(out)
        if self.batched:
            if counts is not None:
                return _spent_on_first(out, counts)
            # each value a judge's message reporting its own tokens (no LLM call under the
            # callbacks): counted as one at a time would be
            return [_judged(v) for v in out] if isinstance(out, list | tuple) else out
        if counts is None:
            return _judged(out)
        return _with_spend(out, counts)


def _with_spend(value: Any, counts: _Counts) -> Any:
    """``value`` as a :class:`beacon.Score` carrying ``counts`` (the tokens its call's LLMs
    reported); a ``Score`` that reports a spend of its own as it is (the scorer's accounting;
    the same calls must not count twice)."""
    if isinstance(value, Score):
        if value.reports:
            return value
        value = value.reward
    it, ot, read, write, h1 = counts
    return Score(value, it, ot, None, read, write, h1)


def _spent_on_first(out: Any, counts: _Counts) -> Any:
    """A batched scorer's values with the call's tokens on the first one (as
    :class:`beacon.Score` allows a judge of a whole batch); as they are when one is a ``Score``
    reporting a spend already (the scorer counts its own), or when ``out`` is no sequence or
    other iterable of values (the engine refuses it and the batch fails)."""
    if isinstance(out, list | tuple):
        values = list(out)
    elif type(out).__module__ == "numpy" and getattr(out, "ndim", None) == 1:
        values = list(out)  # numpy scalars, each read by the engine's reward rule
    elif isinstance(out, Iterable) and not isinstance(out, str | bytes | Mapping | Set):
        values = list(out)  # a generator or map: read once, here, as the engine would
    else:
        return out
    if not values or any(isinstance(v, Score) and v.reports for v in values):
        return out
    values[0] = _with_spend(values[0], counts)
    return values


def _judged(out: Any) -> Any:
    """A judge's message that reports its tokens (``usage_metadata``, as LangChain chat models
    give it; read as the engine reads a model's, prompt-cache split included) as a
    :class:`beacon.Score` holding the message, whose reward :func:`to_reward` then reads from
    its text. Anything else as it is. Used where no LLM call under the scorer reported usage
    to the callbacks (a runnable that builds the message itself)."""
    if not isinstance(getattr(out, "usage_metadata", None), Mapping):
        return out
    counts = _consistent(_usage_counts(out))
    if counts[0] is None and counts[1] is None:
        return out
    return _with_spend(out, counts)


def lc_score(scorer: Any) -> _LCScore:
    """The engine scorer for ``scorer`` (see :func:`lc_scorer_runnable`)."""
    runnable, batched = lc_scorer_runnable(scorer)
    return _LCScore(runnable, batched)


# -- LlamaIndex ---------------------------------------------------------------------------------
@dataclass(slots=True)
class LIQuery:
    """One LlamaIndex query as the engine's opaque prompt.

    ``text`` is the query string (what the scorer sees); ``bundle`` the ``QueryBundle`` an
    inner query engine is queried with; ``template`` and ``variables`` the LLM prompt and what
    it is formatted with (LLM mode), so that a LlamaIndex ``LLM`` can format it its own way
    (see :func:`li_generate_llm`); ``prompt`` a prompt string already formatted, sent as is
    when there is no ``template``; ``contexts`` maps each inner-engine sample's text to its
    source nodes' contents (what a LlamaIndex evaluator is given as ``contexts``, as
    ``aevaluate_response`` gives them). ``formatted`` caches what the LLM is sent (a prompt
    string or a message list, made by :func:`li_format`): every sample of a query gets the
    same prompt, so it is formatted once per query, not once per sample.
    """

    text: str
    bundle: Any = field(default=None, repr=False)
    prompt: str = ""
    contexts: dict[str, list[str]] = field(default_factory=dict, repr=False)
    template: Any = field(default=None, repr=False)
    variables: dict[str, str] = field(default_factory=dict, repr=False)
    formatted: Any = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.text


def li_generate_llm(llm: Any) -> Callable[[LIQuery], Awaitable[Generation]]:
    """``generate(query)``: one completion of the query's prompt from a LlamaIndex ``LLM``.

    The prompt reaches the model as LlamaIndex's own ``LLM.predict`` sends a template: a chat
    model gets ``achat`` with the template's messages (a ``ChatPromptTemplate`` keeps its system
    and user roles) after the LLM's ``system_prompt``; a completion model gets ``acomplete``
    (``formatted=True``) with the template rendered through the LLM's ``messages_to_prompt`` /
    ``completion_to_prompt`` and extended by its ``system_prompt`` and
    ``query_wrapper_prompt``. An object with ``acomplete`` but without the ``LLM`` base class's
    formatting gets the template formatted plainly (or ``query.prompt``). The prompt is
    formatted once per query (:func:`li_format`; at its first sample if the caller has not)
    and reused by every sample; each sample gets its own copy of a message list. An LLM with
    an ``output_parser`` has its reply parsed by it, as ``predict`` does (the format
    instructions it added to the prompt ask for that form): the sample's text is
    ``str(output_parser.parse(reply))``, and a reply it cannot parse fails its sample.
    LlamaIndex's own LLM instrumentation events fire for every sample.

    The sample's tokens, so that a budget's token and money caps hold, are those of the LLM
    calls the instrumentation saw end during the call (:func:`_li_tapped`; an LLM whose
    ``achat`` runs ``complete`` is one call, counted once), which replace what the response
    itself reports; where no call reported any, the response's own (:func:`_li_counts`: an
    LLM outside LlamaIndex's instrumentation). A :class:`beacon.Generation` the LLM returns
    with tokens or a cost of its own is taken as it is.
    """
    _li_instrument()
    parse_output = getattr(llm, "_parse_output", None)

    async def generate(query: LIQuery) -> Generation:
        chat = li_format(llm, query)
        if chat:
            # a list of its own: an LLM that edits the list it is given (appends, trims)
            # must not change what the query's other samples are sent
            messages = list(query.formatted)
            resp, counts = await _li_tapped(lambda: llm.achat(messages))
        else:
            resp, counts = await _li_tapped(lambda: llm.acomplete(query.formatted, formatted=True))
        gen = coerce_generation(resp)
        own = gen is resp
        if own:  # the LLM's own Generation: edit a copy, never its object
            gen = dataclasses.replace(gen)
        if callable(parse_output) and getattr(llm, "output_parser", None) is not None:
            # as LLM.predict: the parser's format instructions went out with the prompt
            gen.text = parse_output(gen.text)
        if own and _reports(gen):  # the LLM's own accounting: the same call, not again
            return gen
        if counts is None:  # no call reported: the response's own usage, if any
            if gen.input_tokens is not None or gen.output_tokens is not None:
                return gen
            counts = _li_counts(resp)
        return _counted(gen, counts)

    return generate


def li_format(llm: Any, query: LIQuery) -> bool:
    """Format ``query``'s prompt for ``llm`` into ``query.formatted``, unless it already is
    (once per query: see :attr:`LIQuery.formatted`); whether ``llm`` is a chat model.

    A chat model's prompt is the template's messages as ``LLM._get_messages`` makes them, a
    completion model's the string ``LLM._get_prompt`` renders (what ``predict`` sends); an
    object without the ``LLM`` base class's formatting gets the template formatted plainly, or
    ``query.prompt``. The callers format a query before sampling it, so that a template that
    cannot be formatted fails the query at once, with its own error.
    """
    chat = bool(getattr(llm.metadata, "is_chat_model", False))
    if query.formatted is not None:
        return chat
    template = query.template
    if template is not None:
        method = getattr(llm, "_get_messages" if chat else "_get_prompt", None)
        if callable(method):
            formatted = method(template, **query.variables)
            query.formatted = list(formatted) if chat else formatted
            return chat
        text = str(template.format(**query.variables))
    else:
        text = query.prompt
    if chat:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        query.formatted = [ChatMessage(role=MessageRole.USER, content=text)]
    else:
        query.formatted = text
    return chat


def _kwargs_tokens(extra: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``(input, output)`` tokens LlamaIndex's own integrations put in a response's
    ``additional_kwargs`` (``prompt_tokens`` / ``completion_tokens``)."""
    return _int_or_none(extra.get("prompt_tokens")), _int_or_none(extra.get("completion_tokens"))


def _li_counts(resp: Any) -> _Counts:
    """``(input, output, cache_read, cache_write, cache_write_1h)`` tokens a LlamaIndex
    ``CompletionResponse`` / ``ChatResponse`` reports (``None``: not reported).

    The provider's own response, ``raw`` (an SDK object or a dict), is read first: its
    ``usage``, read as the engine reads a provider's usage
    (:func:`beacon.engine.protocol._usage_counts`), holds the prompt-cache split (an
    Anthropic usage's cache reads and writes, which count as input, its 1-hour writes too;
    an OpenAI usage's ``prompt_tokens_details.cached_tokens``), kept apart for their prices;
    a split that does not fit in the total is dropped. Where ``raw`` reports no usage, the
    counts LlamaIndex's integrations (Ollama's, the OpenAI-like ones') put in
    ``additional_kwargs`` as ``prompt_tokens`` / ``completion_tokens``. LlamaIndex's OpenAI
    LLM puts the totals in both; reading ``additional_kwargs`` first would lose the cached
    part and price it as uncached input. Without them a :class:`beacon.Budget` token or
    money cap could not bound the query.
    """
    raw = getattr(resp, "raw", None)
    usage = raw.get("usage") if isinstance(raw, Mapping) else getattr(raw, "usage", None)
    # a view holding only ``usage``: a raw dict has no attribute to read, and another
    # attribute of an SDK object (LangChain's usage_metadata) is not what LlamaIndex returned
    counts = _consistent(_usage_counts(_UsageView(usage)))
    if counts[0] is not None or counts[1] is not None:
        return counts
    extra = getattr(resp, "additional_kwargs", None)
    if isinstance(extra, Mapping):
        it, ot = _kwargs_tokens(extra)
        if it is not None or ot is not None:
            return it, ot, None, None, None
    return counts


@dataclass(frozen=True)
class _UsageView:
    """A provider usage (a dict or an SDK object) where :func:`_usage_counts` looks for it."""

    usage: Any


# -- LlamaIndex: the LLM calls made under one model or scorer call ------------------------------
class _LITap:
    """Sums the tokens of the LlamaIndex LLM calls made under one model or scorer call.

    Fed by the instrumentation handlers of :func:`_li_instrument`, which route each event to
    the tap in the context it fires in (:data:`_LI_TAP`, set by :func:`_li_tapped`) and to the
    taps of the calls around that one (``outer``: a BEACON engine inside another's sample).

    An LLM call made inside another LLM call (LlamaIndex's ``CustomLLM.acomplete`` runs
    ``complete``, its ``achat`` runs ``chat`` then ``complete``: an end event for each, the
    same usage in each) is one provider call: the innermost call that reports usage counts,
    and the calls around it (found by the instrumentation spans' parents) do not; nor does
    an end event whose response is one counted already (a streamed call passed through by
    another, ``CustomLLM.astream_complete``'s, whose inner call starts after the outer span
    has closed). Two calls side by side both count.
    """

    __slots__ = ("_covered", "_lock", "_seen", "outer", "parents", "tokens")

    def __init__(self, outer: _LITap | None) -> None:
        self.outer = outer
        self.parents: dict[str, str | None] = {}  # span id -> its parent's, spans entered here
        self._covered: set[str] = set()  # spans holding an LLM call already counted
        # responses counted, by id; the value holds each alive so that its id is not reused
        self._seen: dict[int, Any] = {}
        self._lock = threading.Lock()  # sync LlamaIndex code may call LLMs in threads
        self.tokens = _TokenSums()

    def end(self, span_id: str | None, response: Any, counts: _Counts) -> None:
        """An LLM call in span ``span_id`` ended with ``response``, reporting ``counts``: add
        them, unless a call inside it, or this response, was counted already. The spans
        around it are covered either way."""
        with self._lock:
            skip = id(response) in self._seen
            if span_id is not None:
                skip = skip or span_id in self._covered
                parent = self.parents.get(span_id)
                # once a span is covered, so are the spans around it: stop there
                while parent is not None and parent not in self._covered:
                    self._covered.add(parent)
                    parent = self.parents.get(parent)
            # skipped or not, this response is a counted call's: an outer call returning it
            # again (a stream passed through) is that call
            self._seen[id(response)] = response
        if not skip:
            self.tokens.add(counts)

    def counts(self) -> _Counts | None:
        """The tokens of the calls counted (:meth:`_TokenSums.counts`)."""
        return self.tokens.counts()


#: The tap of the model or scorer call running in this context (asyncio tasks, and the
#: threads LlamaIndex and :func:`beacon._sync.call_in_thread` start, copy it).
_LI_TAP: ContextVar[_LITap | None] = ContextVar("beacon_li_tap", default=None)


async def _li_tapped(call: Callable[[], Awaitable[Any]]) -> tuple[Any, _Counts | None]:
    """``call()``'s result, and the tokens of the LlamaIndex LLM calls made while it ran (see
    :class:`_LITap`; ``None``: none reported any)."""
    tap = _LITap(_LI_TAP.get())
    token = _LI_TAP.set(tap)
    try:
        out = await call()
    except BaseException as exc:  # a timeout's cancellation too
        _attach_spend(exc, tap.counts())
        raise
    finally:
        _LI_TAP.reset(token)
    return out, tap.counts()


@functools.cache
def _li_handlers() -> tuple[Any, Any]:
    """The instrumentation handlers feeding :class:`_LITap` (one pair per process; built at
    the first use: LlamaIndex is imported only when a LlamaIndex adapter is)."""
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.llm import (
        LLMChatEndEvent,
        LLMCompletionEndEvent,
    )
    from llama_index.core.instrumentation.span_handlers import BaseSpanHandler

    ends = (LLMChatEndEvent, LLMCompletionEndEvent)

    class _BeaconTokenEvents(BaseEventHandler):
        """Hands each LLM call's end (a streamed call's: its last chunk) to the taps of the
        context it fires in, with the tokens its response reports (:func:`_li_counts`)."""

        @classmethod
        def class_name(cls) -> str:
            return "BeaconTokenEvents"

        def handle(self, event: Any, **kwargs: Any) -> None:
            tap = _LI_TAP.get()
            if tap is None or not isinstance(event, ends) or event.response is None:
                return  # every event of the process comes here: leave the others at once
            counts = _li_counts(event.response)
            if counts[0] is None and counts[1] is None:
                return
            while tap is not None:
                tap.end(event.span_id, event.response, counts)
                tap = tap.outer

    class _BeaconTokenSpans(BaseSpanHandler[Any]):
        """Records, in the taps of the context a span starts in, its parent span (what tells
        an LLM call made inside another apart from two side by side). Keeps no spans."""

        @classmethod
        def class_name(cls) -> str:
            return "BeaconTokenSpans"

        def span_enter(self, id_: str, bound_args: Any, instance: Any = None,
                       parent_id: str | None = None, tags: Any = None, **kwargs: Any) -> None:
            tap = _LI_TAP.get()
            while tap is not None:
                tap.parents[id_] = parent_id
                tap = tap.outer

        def span_exit(self, id_: str, bound_args: Any, instance: Any = None,
                      result: Any = None, **kwargs: Any) -> None:
            return None

        def span_drop(self, id_: str, bound_args: Any, instance: Any = None,
                      err: BaseException | None = None, **kwargs: Any) -> None:
            return None

        def new_span(self, id_: str, bound_args: Any, instance: Any = None,
                     parent_span_id: str | None = None, tags: Any = None,
                     **kwargs: Any) -> None:
            return None

        def prepare_to_exit_span(self, id_: str, bound_args: Any, instance: Any = None,
                                 result: Any = None, **kwargs: Any) -> None:
            return None

        def prepare_to_drop_span(self, id_: str, bound_args: Any, instance: Any = None,
                                 err: BaseException | None = None, **kwargs: Any) -> None:
            return None

    return _BeaconTokenEvents(), _BeaconTokenSpans()


_LI_INSTRUMENT_LOCK = threading.Lock()


def _li_instrument() -> None:
    """Put :func:`_li_handlers` on LlamaIndex's root dispatcher, unless they are there (the
    handlers of every dispatcher that propagates reach it). Called when a LlamaIndex adapter
    is built, never at import; checked each time, as code may have reset the root's lists."""
    from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]

    events, spans = _li_handlers()
    root = get_dispatcher()
    with _LI_INSTRUMENT_LOCK:  # two threads building adapters must not add them twice
        if not any(h is events for h in root.event_handlers):
            root.add_event_handler(events)
        if not any(h is spans for h in root.span_handlers):
            root.add_span_handler(spans)


def li_generate_engine(engine: Any) -> Callable[[LIQuery], Awaitable[Generation]]:
    """``generate(query)``: one full response of an inner LlamaIndex query engine.

    The whole ``Response`` (answer text and source nodes) is kept as the sample's raw object so
    the chosen one can be returned with its sources. A streaming engine's response
    (``StreamingResponse`` / ``AsyncStreamingResponse``) is read to its end first, through its
    own ``get_response()``: a sample must be complete to be scored. A structured-output
    engine's ``PydanticResponse`` (``output_cls=...``) is kept whole; its text is the model's
    JSON, as LlamaIndex renders it (``str(response)``, ``get_response()``).

    The sample's source node contents are recorded in ``query.contexts`` under its text, for a
    LlamaIndex evaluator scorer (Faithfulness, Relevancy... need them as ``contexts``).

    The sample's tokens are those of every LLM call the engine made for it (its synthesizer's,
    each refine step's, a query transform's, a streamed answer's once read), as LlamaIndex's
    instrumentation reports them (:func:`_li_tapped`), so that a budget's token and money caps
    hold; ``None`` where no call reported usage.
    """
    _li_instrument()

    async def generate(query: LIQuery) -> Generation:
        (text, resp), counts = await _li_tapped(lambda: _engine_answer(engine, query))
        gen = Generation(text, raw=resp)
        return gen if counts is None else _counted(gen, counts)

    return generate


async def _engine_answer(engine: Any, query: LIQuery) -> tuple[str, Any]:
    """``(text, response)``: one complete response of ``engine`` to ``query`` (a stream read
    to its end, which is when its LLM call ends), its sources noted in ``query.contexts``."""
    from llama_index.core.base.response.schema import PydanticResponse

    resp = await engine.aquery(query.bundle)
    if isinstance(resp, PydanticResponse):
        obj = resp.response
        text = "" if obj is None else obj.model_dump_json()
    else:
        answer = getattr(resp, "response", None)
        if answer is None and hasattr(resp, "response_gen"):
            resp = await _maybe_await(resp.get_response())
            answer = resp.response
        text = "" if answer is None else str(answer)
    nodes = getattr(resp, "source_nodes", None)
    if nodes is not None:
        query.contexts[text] = [n.get_content() for n in nodes]
    return text, resp


def _evaluator_kind(scorer: Any) -> str | None:
    """``"async"`` for an evaluator with ``aevaluate`` (every ``BaseEvaluator``), ``"sync"``
    for an evaluator-like object with only ``evaluate``, ``None`` for a plain callable."""
    if callable(scorer):
        return None
    if callable(getattr(scorer, "aevaluate", None)):
        return "async"
    if callable(getattr(scorer, "evaluate", None)):
        return "sync"
    return None


class _LIScore:
    """Engine scorer: ``score(query_str, text)`` (sync or async), or a LlamaIndex evaluator
    (given the sample's source node contents as ``contexts`` in inner-engine mode).

    Returns the scorer's outputs as they are; the engine makes each one a reward with
    :meth:`as_reward` (so one invalid value in a batch fails only its own sample). The tokens
    of the LlamaIndex LLM calls the scorer made (an evaluator's or an LLM judge's, seen by
    LlamaIndex's instrumentation: :func:`_li_tapped`) come with it as a :class:`beacon.Score`,
    so that they count in the query's usage and budget; a batched call's go on its first
    value. A ``Score`` the scorer returns with tokens or a cost of its own is taken as it is.
    """

    as_reward = staticmethod(to_reward)

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer
        self.batched = is_batched(scorer)
        self._evaluator = _evaluator_kind(scorer)

    async def __call__(self, query: LIQuery, response: Any) -> Any:
        out, counts = await _li_tapped(lambda: self._score(query, response))
        if counts is None:
            return out
        if self.batched:
            return _spent_on_first(out, counts)
        return _with_spend(out, counts)

    async def _score(self, query: LIQuery, response: Any) -> Any:
        if self._evaluator is not None:
            # as the evaluator's own aevaluate_response(query, Response) calls it
            contexts = query.contexts.get(response)
            kwargs: dict[str, Any] = {"query": query.text, "response": response}
            if contexts is not None:
                kwargs["contexts"] = contexts
            if self._evaluator == "async":
                res = await _maybe_await(self.scorer.aevaluate(**kwargs))
            else:
                # a sync evaluator is an LLM judge's blocking call: off the event loop, so
                # the other samples and the engine's timeout keep running
                res = await call_in_thread(lambda: self.scorer.evaluate(**kwargs))
            if not hasattr(res, "score"):
                raise _reward_error(
                    type(res).__name__,
                    "the evaluator returned no EvaluationResult (an object with a score)",
                )
            if res.score is None:
                raise _no_score(res)
            return res.score
        return await _maybe_await(self.scorer(query.text, response))


def _no_score(res: Any) -> RewardError:
    """The error of an evaluator result without a score: it says why (the evaluator's
    ``invalid_reason``, or that it gave only ``passing``) without the result's repr, which
    holds the query, the response and every context. ``value`` is the result itself."""
    reason = "evaluator returned no score"
    invalid = getattr(res, "invalid_reason", None)
    passing = getattr(res, "passing", None)
    if getattr(res, "invalid_result", False):
        reason += f"; it marked its result invalid: {invalid or 'no reason given'}"
    elif passing is not None:
        reason += f", only passing={passing}"
    err = _reward_error(None, reason)
    err.value = res
    return err


def li_score(scorer: Any) -> _LIScore:
    """The engine scorer for a LlamaIndex-side ``scorer``.

    ``scorer`` is a callable ``score(query_str, response_text) -> float`` (sync or async;
    ``batched = True`` for ``score(query_str, [texts]) -> [floats]``, e.g. a
    ``beacon_integrations.scorers`` HTTP scorer), or a LlamaIndex ``BaseEvaluator`` whose
    ``aevaluate(query=..., response=...)`` result ``.score`` is the reward (over an inner query
    engine also ``contexts=``: the sample's source node contents); an evaluator-like object
    with a synchronous ``evaluate(query=..., response=...)`` only is called in a worker thread.
    """
    if not callable(scorer) and _evaluator_kind(scorer) is None:
        raise TypeError(
            f"scorer must be a callable or a LlamaIndex evaluator (with aevaluate or evaluate), "
            f"got {type(scorer).__name__}"
        )
    _li_instrument()
    return _LIScore(scorer)
