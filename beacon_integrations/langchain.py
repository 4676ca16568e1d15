"""LangChain integration: :class:`BeaconRunnable`, BEACON best-of-N as a native runnable.

``BeaconRunnable(model=chat_model, scorer=score, config=BeaconConfig(...))`` samples responses
from ``model`` and scores them with ``scorer`` until the Stopper stops (paper, Theorem "Optimal
Stopping Rule": stop when h_{n,k}(zhat_k) <= c / sigma_k, or at the horizon n), then returns the
response with the highest raw reward z_k. It runs on :class:`beacon.engine.BeaconSampler` under
LangChain's own plumbing:

* ``ainvoke`` runs natively through ``_acall_with_config`` (no thread pool); ``invoke`` drives
  the same coroutine through :func:`beacon._sync.run_sync`, so it also works inside a running
  event loop. ``batch`` / ``abatch`` run all inputs through one sampler, so
  ``config["max_concurrency"]`` bounds the model calls in flight across the whole batch.
* The model and scorer are invoked with the child config of the BEACON run: they appear as child
  runs, callbacks (e.g. ``UsageMetadataCallbackHandler``), tags and metadata propagate.
* Every scored sample and every Stopper decision is a custom event (``beacon_sample``,
  ``beacon_decision``) visible in ``astream_events(version="v2")``; their data carry ``k``,
  ``reward`` (sample) and ``zhat``, ``h``, ``threshold``, ``decision``, ``reason`` (decision).
* ``astream`` / ``stream`` yield a :class:`BeaconChunk` per scored candidate, then one final
  chunk whose ``output`` is what ``invoke`` returns.
* ``as_beacon_tool(name, description)`` turns the runnable into a ``BaseTool`` for agents.

Rewards are in the scorer's units; the cost ``c`` of the config is in (transformed) reward units
per sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import queue
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    AsyncCallbackManagerForToolRun,
    CallbackManagerForChainRun,
    CallbackManagerForToolRun,
    adispatch_custom_event,
)
from langchain_core.language_models import BaseLanguageModel, LanguageModelInput
from langchain_core.messages import AIMessage
from langchain_core.prompts import BasePromptTemplate
from langchain_core.rate_limiters import BaseRateLimiter
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableLambda,
    RunnableSequence,
    RunnableSerializable,
)
from langchain_core.runnables.base import RunnableBindingBase, coerce_to_runnable
from langchain_core.runnables.config import patch_config
from langchain_core.runnables.retry import RunnableRetry
from langchain_core.runnables.utils import ConfigurableFieldSpec, get_unique_config_specs
from langchain_core.tools import BaseTool, ToolException
from langchain_core.utils.pydantic import TypeBaseModel, get_fields
from pydantic import BaseModel, ConfigDict, Field, InstanceOf, RootModel, field_validator
from typing_extensions import TypeVar

from beacon._checks import boolean, is_real, positive_int
from beacon._sync import _run_private, call_in_thread, run_sync
from beacon.budget import Budget
from beacon.config import BeaconConfig
from beacon.engine import BeaconSampler
from beacon.engine.protocol import is_batched, is_inline_sync
from beacon.errors import ConfigError, ConfigTypeError
from beacon.events import BeaconEvent, SampleEvent
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy
from beacon_integrations._adapt import (
    BeaconSamplingError,
    LCQuery,
    _head,
    lc_generate,
    lc_prompt_text,
    lc_score,
)

__all__ = ["BeaconChunk", "BeaconRunnable", "BeaconSamplingError"]

SAMPLE_EVENT = "beacon_sample"
# Tool names that OpenAI's and Anthropic's tool-calling APIs accept (^[a-zA-Z0-9_-]{1,64}$); an
# agent model bound to a tool with any other name is rejected by the provider at call time.
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
DECISION_EVENT = "beacon_decision"
# LangGraph's tag for a chat model run whose tokens stream_mode="messages" must not stream
# (langgraph.constants.TAG_NOSTREAM). A graph node calling BeaconRunnable would otherwise stream
# every candidate's tokens (and an LLM judge's verdicts) into a chat UI, several interleaved,
# rejected ones included, and never the choice: the chosen message has the id of a streamed
# candidate, so LangGraph took it as already streamed. Tagged so, that stream shows the node's
# output, the chosen message; the candidates remain in astream_events and the custom events.
_NOSTREAM = "nostream"

#: What ``invoke`` returns: the best ``AIMessage`` (``return_result=False``, the default) or the
#: full ``BeaconResult`` (``return_result=True``); type checkers infer it from the constructor.
OutputT = TypeVar("OutputT", bound="AIMessage | BeaconResult", default=AIMessage)


class BeaconChunk(BaseModel):
    """One item of :meth:`BeaconRunnable.astream`.

    ``kind="candidate"``: a sample was scored (or failed); ``k`` is the number of rewards the
    Stopper has after it, ``index`` its draw order, ``reward`` its raw reward. ``kind="final"``:
    the choice; ``index``/``text``/``reward`` are the chosen candidate's, ``n_samples`` the
    samples charged, ``stop_reason`` why sampling ended and ``output`` exactly what ``invoke``
    returns (an ``AIMessage``, or the ``BeaconResult`` with ``return_result=True``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    kind: Literal["candidate", "final"]
    k: int
    index: int | None = None
    text: str = ""
    reward: float | None = None
    failed: bool = False
    error: str | None = None
    n_samples: int | None = None
    stop_reason: str | None = None
    output: Any = None


def _summary(res: BeaconResult) -> dict[str, Any]:
    best = res.best
    return {
        "index": None if best is None else best.index,
        "reward": None if best is None else best.reward,
        "n_samples": res.n_samples,
        "stop_reason": res.stop_reason,
        "rewards": [c.reward for c in res.candidates],
    }


def _dispatcher(queries: Sequence[LCQuery]) -> Callable[[BeaconEvent], Any]:
    """Observer turning engine events into LangChain custom events of the right query's run."""

    async def observe(ev: BeaconEvent) -> None:
        q = queries[0 if ev.query_id is None else ev.query_id]
        name = SAMPLE_EVENT if isinstance(ev, SampleEvent) else DECISION_EVENT
        await adispatch_custom_event(name, ev.to_dict(), config=q.config)

    return observe


def _concat_inputs(chunks: list[Any]) -> Any:
    # Same rule as Runnable.transform: add streamed input chunks, else keep the last one.
    final: Any = None
    for ch in chunks:
        if final is None:
            final = ch
            continue
        try:
            final = final + ch
        except TypeError:
            final = ch
    return final


def _iterate_in_thread(make: Callable[[], AsyncIterator[Any]]) -> Iterator[Any]:
    """Iterate an async generator from sync code (even inside a running loop).

    The generator runs on a private event loop in a worker thread (with the caller's context
    variables); items cross over a queue. Closing the iterator early cancels the generator.
    The loop is shut down as ``run_sync``'s (``beacon._sync._run_private``): a call abandoned
    because its client swallows its cancellation does not hold the iterator up.
    """
    q: queue.Queue[tuple[str, Any]] = queue.Queue()
    holder: dict[str, Any] = {}
    lock = threading.Lock()
    closed = threading.Event()
    ctx = contextvars.copy_context()

    async def pump() -> None:
        with lock:
            if closed.is_set():  # the consumer left before the loop started
                return
            holder["loop"] = asyncio.get_running_loop()
            holder["task"] = asyncio.current_task()
        agen = make()
        try:
            async for item in agen:
                q.put(("item", item))
        finally:
            await agen.aclose()  # type: ignore[attr-defined]

    def target() -> None:
        try:
            ctx.run(_run_private, pump())
        except BaseException as exc:  # handed to the consumer thread
            q.put(("error", exc))
        else:
            q.put(("done", None))

    t = threading.Thread(target=target, name="beacon-stream", daemon=True)
    t.start()
    finished = False
    try:
        while True:
            kind, val = q.get()
            if kind == "item":
                yield val
            elif kind == "error":
                finished = True
                raise val
            else:
                finished = True
                return
    finally:
        if not finished:
            with lock:
                closed.set()
                if "loop" in holder:
                    # RuntimeError: the loop has closed since (the generator had finished
                    # and the consumer left before reading that): nothing left to cancel.
                    with contextlib.suppress(RuntimeError):
                        holder["loop"].call_soon_threadsafe(holder["task"].cancel)
        t.join()


def _retry_from_dict(data: dict[str, Any]) -> RetryPolicy:
    """A :class:`beacon.retry.RetryPolicy` from its ``to_dict()`` (what serialization writes);
    a key it does not have is a :class:`beacon.ConfigError` naming it."""
    known = RetryPolicy().to_dict()
    for key in data:
        if key not in known:
            raise ConfigError(
                f"retry.{key}", data[key], f"unknown field; known: {', '.join(known)}"
            )
    return RetryPolicy(**data)


def _retries_itself(model: Runnable[Any, Any]) -> bool:
    """Whether ``model`` is a ``with_retry`` runnable, also under bindings over it
    (``llm.with_retry(...).with_config(run_name=...)``, ``.bind(...)``), or a sequence with a
    ``with_retry`` chat model / LLM step (``prompt | llm.with_retry() | parser``): the engine's
    own retries would multiply its attempts (3 engine attempts of 5 with_retry ones: 15 paid
    calls). Another step's ``with_retry`` (a retriever's) leaves the model call to the engine.
    """
    seen: set[int] = set()
    todo: list[tuple[Any, bool]] = [(model, False)]  # (runnable, is it a step of a sequence)
    while todo:
        m, step = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if isinstance(m, RunnableRetry):
            if not step or isinstance(_unbound(m.bound), BaseLanguageModel):
                return True
        elif isinstance(m, RunnableBindingBase):
            todo.append((m.bound, step))
        elif isinstance(m, RunnableSequence):
            todo += [(st, True) for st in m.steps]
    return False


def _unbound(m: Any) -> Any:
    """``m`` under its bindings (``bind``, ``with_config``)."""
    seen: set[int] = set()
    while isinstance(m, RunnableBindingBase) and id(m) not in seen:
        seen.add(id(m))
        m = m.bound
    return m


# What LangChain passes a RunnableLambda's function by keyword when it declares them.
_LAMBDA_KEYWORDS = frozenset({"config", "run_manager"})


def _check_lambda_scorer(scorer: RunnableLambda[Any, Any]) -> None:
    """A ``RunnableLambda`` scorer's function must take the one dict ``{"prompt", "response"}``.

    A ``score(prompt, response)`` function wrapped in ``RunnableLambda`` is called with the
    dict alone and fails with a ``TypeError`` -- at every sample, each after a model call that
    is paid for. Caught here instead, as a :class:`beacon.ConfigError` saying to pass the
    function itself.
    """
    for func in (getattr(scorer, "func", None), getattr(scorer, "afunc", None)):
        if func is None:
            continue
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):  # a builtin or C callable: nothing to check
            continue
        required = [
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.default is p.empty
            and p.name not in _LAMBDA_KEYWORDS
        ]
        if len(required) > 1:
            raise ConfigError(
                "scorer",
                scorer,
                f"is a RunnableLambda over a function of {len(required)} arguments "
                f"({', '.join(required)}), but a runnable scorer is called with one dict "
                '{"prompt": ..., "response": ...}; pass the function itself for '
                "score(prompt, response)",
            )


# What a runnable scorer is invoked with (beacon_integrations._adapt.lc_scorer_runnable).
_SCORER_KEYS = frozenset({"prompt", "response"})


def _stock_input(model: BaseLanguageModel[Any]) -> bool:
    """Whether ``model`` takes LangChain's stock chat-model / LLM input (a string, messages or
    a prompt value, never a dict): its class overrides none of ``invoke``, ``ainvoke`` and
    ``_convert_input``. A subclass that does (a reward-model wrapper taking the scorer's dict)
    may well take ``{"prompt": ..., "response": ...}``."""
    from langchain_core.language_models import BaseChatModel, BaseLLM

    for base in (BaseChatModel, BaseLLM):
        if isinstance(model, base):
            cls = type(model)
            return all(
                getattr(cls, m) is getattr(base, m) for m in ("invoke", "ainvoke", "_convert_input")
            )
    return False


def _check_runnable_scorer(scorer: Runnable[Any, Any]) -> None:
    """A runnable scorer must take the dict ``{"prompt": ..., "response": ...}``.

    Two forms never can: a bare chat model or LLM (a judge without its prompt), which refuses a
    dict, and a chain starting with a prompt template that needs other variables (``Rate
    {answer}``). Either fails every sample, each after a model call that is paid for; caught
    here instead, as a :class:`beacon.ConfigError` saying what to write.
    """
    head = _head(scorer)
    if isinstance(head, BaseLanguageModel) and _stock_input(head):
        raise ConfigError(
            "scorer",
            scorer,
            f"starts with the chat model/LLM {type(head).__name__}, which cannot take the "
            'scorer\'s input {"prompt": ..., "response": ...}; put a prompt template in front '
            "of it: ChatPromptTemplate.from_template('... {prompt} ... {response}') | judge",
        )
    if isinstance(head, BasePromptTemplate):
        missing = sorted(set(head.input_variables) - _SCORER_KEYS)
        if missing:
            raise ConfigError(
                "scorer",
                scorer,
                f"starts with a prompt template needing the variables {missing}, but a "
                'runnable scorer is called with {"prompt": ..., "response": ...} only; name '
                "them {prompt} and {response}",
            )


def _in_threads(scorer: Any) -> Any:
    """``scorer`` as an async callable running it in a worker thread per call, when it is a
    plain synchronous callable (``offload_sync``); anything else as it is.

    Keeps the name (the scorer's child run is named after it) and a ``batched`` declaration.
    An awaitable the sync callable returns is awaited on the loop, as without offloading.
    """
    if isinstance(scorer, Runnable) or not is_inline_sync(scorer):
        return scorer

    async def offloaded(prompt: Any, response: Any) -> Any:
        return await call_in_thread(scorer, prompt, response)

    offloaded.__name__ = getattr(scorer, "__name__", None) or type(scorer).__name__
    if is_batched(scorer):
        setattr(offloaded, "batched", True)  # noqa: B010 -- a function has no such attribute
    return offloaded


class BeaconRunnable(RunnableSerializable[LanguageModelInput, OutputT]):
    """BEACON adaptive best-of-N over a chat model (or any runnable producing a message/str).

    Attributes:
        model: chat model or runnable; input is passed to it unchanged (str, messages or a
            ``PromptValue``); a plain callable is wrapped with ``RunnableLambda``.
        scorer: the reward ``r(prompt, response)``: a callable (sync/async; ``batched = True``
            for ``(prompt, [responses]) -> [rewards]``), a ``beacon_integrations.scorers``
            scorer, or a runnable taking ``{"prompt": str, "response": str}`` and returning a
            number (a numeric string or a message with numeric content also works). The prompt
            it sees is the text of the last human message of the input (the input itself if a
            string); when ``model`` starts with a prompt template (``prompt | chat``), of the
            prompt that template renders from the input; a dict input to any other model is
            shown as JSON with sorted keys. Other inputs (``None``, numbers) are a
            ``TypeError``.
        config: the :class:`beacon.BeaconConfig` (cost c, horizon n, family, batch size,
            prior, transform); a dict from ``BeaconConfig.to_dict()`` is accepted, and
            LangChain serialization (``dumpd``) writes it as that dict.
        return_result: return the full :class:`~beacon.result.BeaconResult` instead of the
            best ``AIMessage``.
        rate_limiter: LangChain rate limiter acquired before every model call (each retry
            included), in addition to the model's own ``rate_limiter``. Scorer calls are not
            throttled by it; the wait for it holds none of the ``max_concurrency`` slots and
            does not count toward ``timeout``, and ``usage.model_calls`` counts a call only
            once it has its token.
        max_concurrency: model calls in flight at once for one invoke/batch (default 16; numpy
            integers accepted); ``config["max_concurrency"]`` of a call (an integer >= 1)
            overrides it, ``None`` there keeps this field.
        retry: the engine's per-call retry policy. ``None``: no engine retries when the model
            is already a ``with_retry`` runnable, also under ``with_config`` / ``bind`` or as a
            step of a sequence (``prompt | llm.with_retry() | parser``; so retries never
            multiply), else the engine default (3 attempts, exponential backoff
            with jitter, retryable errors only).
            Serialized as its ``to_dict()`` (a dict is accepted back) unless it has a
            ``retry_on`` predicate, which has no JSON form.
        timeout: seconds allowed per model or scorer attempt (a number > 0, checked at
            construction), not counting the wait for ``rate_limiter``; ``None`` for no limit.
            A synchronous scorer callable runs on the event loop, where nothing interrupts it
            (one that overruns is failed once it returns), unless ``offload_sync``: make a
            slow scorer async, set ``offload_sync=True``, or wrap a blocking one in
            ``RunnableLambda`` (LangChain runs it in a worker thread).
        budget: per-query caps on tokens, money or wall time (stop reason ``budget``);
            serialized as its ``to_dict()``, and a dict is accepted back.
        offload_sync: run a plain *synchronous* scorer callable in worker threads (one daemon
            thread per call, :func:`beacon._sync.call_in_thread`, as
            ``BeaconSampler(offload_sync=True)``), so that a blocking scorer does not stall the
            other calls and ``timeout`` interrupts it: a call still blocked at the limit fails
            its sample with a ``TimeoutError`` (retried as the policy says) and is abandoned,
            its thread finishing on its own. Default ``False``: it is called on the event
            loop's thread, as a thread-unsafe client or a main-thread-only scorer needs.
            Async scorers and runnables are unaffected.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: Runnable[Any, Any]
    scorer: Any
    config: InstanceOf[BeaconConfig] = Field(default_factory=BeaconConfig)
    return_result: bool = False
    rate_limiter: InstanceOf[BaseRateLimiter] | None = Field(default=None, exclude=True)
    max_concurrency: int = 16
    retry: InstanceOf[RetryPolicy] | None = Field(default=None, exclude=True)
    timeout: float | None = 60.0
    budget: InstanceOf[Budget] | None = Field(default=None, exclude=True)
    offload_sync: bool = False

    if TYPE_CHECKING:
        # What the constructor accepts, for type checkers: the validators below also take a
        # plain callable as ``model`` (wrapped in ``RunnableLambda``) and a ``to_dict()`` dict
        # as ``config``, ``budget`` or ``retry``, which the field types (what the attributes
        # hold) do not say. The overloads tell what ``invoke`` returns from ``return_result``:
        # an ``AIMessage`` (default), a ``BeaconResult`` (``True``), either for a ``bool`` known
        # only at run time.
        @overload
        def __init__(
            self: BeaconRunnable[AIMessage],
            *,
            model: Runnable[Any, Any] | Callable[..., Any],
            scorer: Any,
            config: BeaconConfig | dict[str, Any] = ...,
            return_result: Literal[False] = False,
            rate_limiter: BaseRateLimiter | None = None,
            max_concurrency: int = 16,
            retry: RetryPolicy | dict[str, Any] | None = None,
            timeout: float | None = 60.0,
            budget: Budget | dict[str, Any] | None = None,
            offload_sync: bool = False,
            name: str | None = None,
        ) -> None: ...

        @overload
        def __init__(
            self: BeaconRunnable[BeaconResult],
            *,
            model: Runnable[Any, Any] | Callable[..., Any],
            scorer: Any,
            config: BeaconConfig | dict[str, Any] = ...,
            return_result: Literal[True],
            rate_limiter: BaseRateLimiter | None = None,
            max_concurrency: int = 16,
            retry: RetryPolicy | dict[str, Any] | None = None,
            timeout: float | None = 60.0,
            budget: Budget | dict[str, Any] | None = None,
            offload_sync: bool = False,
            name: str | None = None,
        ) -> None: ...

        @overload
        def __init__(
            self: BeaconRunnable[AIMessage | BeaconResult],
            *,
            model: Runnable[Any, Any] | Callable[..., Any],
            scorer: Any,
            config: BeaconConfig | dict[str, Any] = ...,
            return_result: bool,
            rate_limiter: BaseRateLimiter | None = None,
            max_concurrency: int = 16,
            retry: RetryPolicy | dict[str, Any] | None = None,
            timeout: float | None = 60.0,
            budget: Budget | dict[str, Any] | None = None,
            offload_sync: bool = False,
            name: str | None = None,
        ) -> None: ...

        def __init__(self, **kwargs: Any) -> None: ...

    # -- validation ------------------------------------------------------------------------------
    @field_validator("model", mode="before")
    @classmethod
    def _coerce_model(cls, v: Any) -> Any:
        if isinstance(v, Runnable):
            return v
        if callable(v):
            return coerce_to_runnable(v)
        raise ConfigError("model", v, "must be a chat model, a runnable or a callable")

    @field_validator("scorer", mode="before")
    @classmethod
    def _check_scorer(cls, v: Any) -> Any:
        if isinstance(v, RunnableLambda):
            _check_lambda_scorer(v)
        if isinstance(v, Runnable):
            _check_runnable_scorer(v)
        if isinstance(v, Runnable) or callable(v):
            return v
        raise ConfigError("scorer", v, "must be a callable, a runnable or a beacon scorer")

    @field_validator("config", mode="before")
    @classmethod
    def _coerce_config(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return BeaconConfig.from_dict(v)
        if not isinstance(v, BeaconConfig):
            raise ConfigError("config", v, "must be a beacon.BeaconConfig or its to_dict()")
        return v

    @field_validator("max_concurrency", mode="before")
    @classmethod
    def _check_max_concurrency(cls, v: Any) -> Any:
        return positive_int("max_concurrency", v)

    @field_validator("timeout", mode="before")
    @classmethod
    def _check_timeout(cls, v: Any) -> Any:
        # As the engine: a real number > 0 (numpy scalars too; NaN is not > 0), or None.
        if v is None:
            return None
        if not is_real(v) or not v > 0:
            raise ConfigError("timeout", v, "must be a positive number of seconds or None")
        return float(v)

    @field_validator("offload_sync", mode="before")
    @classmethod
    def _check_offload_sync(cls, v: Any) -> Any:
        # strict: pydantic would take "yes" or 1 as True
        return boolean("offload_sync", v)

    @field_validator("budget", mode="before")
    @classmethod
    def _coerce_budget(cls, v: Any) -> Any:
        # a Budget.to_dict() (what serialization writes) is taken back; anything else that is
        # not a Budget fails on the field's own type check
        return Budget.from_dict(v) if isinstance(v, dict) else v

    @field_validator("retry", mode="before")
    @classmethod
    def _coerce_retry(cls, v: Any) -> Any:
        return _retry_from_dict(v) if isinstance(v, dict) else v

    # -- serialization ---------------------------------------------------------------------------
    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["beacon_integrations", "langchain"]

    @property
    def lc_attributes(self) -> dict[str, Any]:
        # BeaconConfig, Budget and RetryPolicy are frozen dataclasses: serialize them as their
        # JSON-ready dicts, which the validators accept back. A reloaded runnable without its
        # budget would spend past the caps it was built with, and one without its retry policy
        # would pay for the default retries. A retry_on predicate has no JSON form: such a
        # policy, like a rate limiter, is left out and must be passed again.
        attrs: dict[str, Any] = {"config": self.config.to_dict()}
        if self.budget is not None:
            attrs["budget"] = self.budget.to_dict()
        if self.retry is not None and self.retry.retry_on is None:
            attrs["retry"] = self.retry.to_dict()
        return attrs

    # -- types -----------------------------------------------------------------------------------
    @property
    def config_specs(self) -> list[ConfigurableFieldSpec]:
        """The configurable fields of the model (and of a runnable scorer): a call's
        ``config["configurable"]`` reaches them, so ``config_schema()`` lists them, as a
        ``RunnableSequence`` lists its steps'."""
        specs = list(self.model.config_specs)
        if isinstance(self.scorer, Runnable):
            specs.extend(self.scorer.config_specs)
        return get_unique_config_specs(specs)

    def _named_input_schema(self, config: RunnableConfig | None = None) -> TypeBaseModel | None:
        """The model's input schema when its input is a dict of named variables, else ``None``.

        Named: the model starts with a prompt template (``prompt | chat``; its variables), or
        with another runnable that declares named fields, e.g. a retrieval step
        ``{"context": itemgetter("question") | retriever, "question": itemgetter("question")}
        | prompt | chat`` or ``RunnablePassthrough.assign(...) | prompt | chat``. A chat model,
        or a runnable taking one value (a root schema), is not.
        """
        schema = self.model.get_input_schema(config)
        if isinstance(_head(self.model), BasePromptTemplate):
            return schema
        if (
            isinstance(schema, type)
            and issubclass(schema, BaseModel)
            and not issubclass(schema, RootModel)
            and schema.model_fields
        ):
            return schema
        return None

    @property
    def InputType(self) -> Any:
        named = self._named_input_schema() is not None
        return self.model.InputType if named else LanguageModelInput

    def get_input_schema(self, config: RunnableConfig | None = None) -> TypeBaseModel:
        """The model's own input schema when its input is a dict of named variables (a prompt
        template's, or a retrieval step's: see :meth:`_named_input_schema`; the input goes to
        the model unchanged), else ``LanguageModelInput``'s."""
        named = self._named_input_schema(config)
        return named if named is not None else super().get_input_schema(config)

    @property
    def OutputType(self) -> Any:
        return BeaconResult if self.return_result else AIMessage

    # -- engine ----------------------------------------------------------------------------------
    def _retry_policy(self) -> RetryPolicy:
        if self.retry is not None:
            return self.retry
        if _retries_itself(self.model):
            return RetryPolicy.none()
        return RetryPolicy()

    def _sampler(self, config: RunnableConfig) -> BeaconSampler:
        # LangChain's max_concurrency: None (or absent) = no per-call limit, so the runnable's
        # own field applies; 0 is invalid there too (a thread pool of 0 workers).
        mc = config.get("max_concurrency")
        mc = self.max_concurrency if mc is None else positive_int(
            'config["max_concurrency"]', mc
        )
        # The rate limiter's token is taken by the engine's model-only hook, before the call
        # has a concurrency slot: the wait holds no slot, does not count toward ``timeout``,
        # and the call is counted once it starts. Scorer calls are not throttled by it.
        lim = self.rate_limiter
        return BeaconSampler(
            lc_generate(self.model),
            lc_score(_in_threads(self.scorer) if self.offload_sync else self.scorer),
            self.config,
            max_concurrency=mc,
            before_model_call=None if lim is None else lim.aacquire,
            retry=self._retry_policy(),
            timeout=self.timeout,
            budget=self.budget,
        )

    def _query(self, value: Any, config: RunnableConfig) -> LCQuery:
        # The model and scorer calls run under the query's config, tagged "nostream" (see
        # _NOSTREAM); the caller's config is not changed.
        tags = config.get("tags") or []
        if _NOSTREAM not in tags:
            config = {**config, "tags": [*tags, _NOSTREAM]}
        return LCQuery(lc_prompt_text(value, self.model), value, config)

    def _output(self, res: BeaconResult) -> OutputT:
        # OutputT follows return_result (the constructor's overloads say so to type checkers)
        if self.return_result:
            return cast(OutputT, res)
        best = self.best_message(res)
        if best is None:
            raise BeaconSamplingError(res)
        return cast(OutputT, best)

    @staticmethod
    def best_message(res: BeaconResult) -> AIMessage | None:
        """The chosen candidate as an ``AIMessage`` (its own message when the model returned
        one), with ``response_metadata["beacon"]`` = index, reward, n_samples, stop_reason and
        every candidate's reward; ``None`` when no candidate was scored."""
        best = res.best
        if best is None:
            return None
        meta = {"beacon": _summary(res)}
        if isinstance(best.raw, AIMessage):
            return best.raw.model_copy(
                update={"response_metadata": {**best.raw.response_metadata, **meta}}
            )
        return AIMessage(content=best.text, response_metadata=meta)

    @staticmethod
    def _check_call(config: Any, kwargs: dict[str, Any]) -> None:
        """Refuse, naming it, what LangChain would fail on deep inside: a call ``config`` (or
        one of a batch's) that is no ``RunnableConfig`` dict, and keyword arguments.

        A ``BeaconConfig`` passed as the call's ``config``, mistaken for the runnable's own,
        failed with an ``AttributeError`` from LangChain's config handling."""
        # LangChain's batch takes any sequence of configs, one per input
        many = isinstance(config, Sequence) and not isinstance(config, str | bytes)
        for c in config if many else (config,):
            if c is not None and not isinstance(c, Mapping):
                hint = (
                    "; a BeaconConfig is the runnable's own: BeaconRunnable(config=...), or "
                    "runnable.model_copy(update={'config': ...}) for another one"
                    if isinstance(c, BeaconConfig)
                    else ""
                )
                raise ConfigTypeError(
                    "config",
                    c,
                    "must be a LangChain RunnableConfig, a dict (callbacks, tags, metadata, "
                    f"max_concurrency, configurable...){hint}",
                )
        if kwargs:
            raise TypeError(
                f"unexpected keyword arguments {sorted(kwargs)}; bind model options on the "
                "model itself (model.bind(...))"
            )

    # -- invoke ----------------------------------------------------------------------------------
    async def _ainvoke_inner(
        self, value: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
    ) -> OutputT:
        sampler = self._sampler(config)
        query = self._query(value, config)
        res = await sampler.arun(query, observers=[_dispatcher([query])])
        res.prompt = query.text
        return self._output(res)

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> OutputT:
        """Sample, score and stop for one input; returns the best ``AIMessage`` (or result)."""
        self._check_call(config, kwargs)
        return await self._acall_with_config(self._ainvoke_inner, input, config)

    def invoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> OutputT:
        """Synchronous :meth:`ainvoke`; safe inside a running event loop (``beacon._sync``)."""
        self._check_call(config, kwargs)
        return run_sync(self.ainvoke(input, config))

    # -- batch -----------------------------------------------------------------------------------
    async def _abatch_inner(
        self,
        inputs: list[Any],
        run_manager: list[AsyncCallbackManagerForChainRun],
        config: list[RunnableConfig],
        return_exceptions: bool = False,
    ) -> list[Any]:
        sampler = self._sampler(config[0])
        # A bad input fails before any model call; with return_exceptions it fails alone.
        slots: list[LCQuery | Exception] = []
        for v, c in zip(inputs, config, strict=True):
            try:
                slots.append(self._query(v, c))
            except (TypeError, ValueError) as exc:
                if not return_exceptions:
                    raise
                slots.append(exc)
        queries = [q for q in slots if isinstance(q, LCQuery)]
        results = iter(
            await sampler.arun_many(queries, observers=[_dispatcher(queries)]) if queries else []
        )
        out: list[Any] = []
        for q in slots:
            if not isinstance(q, LCQuery):
                out.append(q)
                continue
            res = next(results)
            res.prompt = q.text
            try:
                out.append(self._output(res))
            except BeaconSamplingError as exc:
                out.append(exc)
        return out

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any | None,
    ) -> list[OutputT]:
        """All inputs through one sampler: ``max_concurrency`` bounds model calls in flight
        across the batch, and one input's failure never loses the others' results."""
        self._check_call(config, kwargs)

        async def inner(
            inputs: list[Any],
            run_manager: list[AsyncCallbackManagerForChainRun],
            config: list[RunnableConfig],
        ) -> list[Any]:
            return await self._abatch_inner(inputs, run_manager, config, return_exceptions)

        return await self._abatch_with_config(
            inner, inputs, config, return_exceptions=return_exceptions
        )

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any | None,
    ) -> list[OutputT]:
        """Synchronous :meth:`abatch` (one event loop, not a thread per input)."""
        self._check_call(config, kwargs)
        return run_sync(self.abatch(inputs, config, return_exceptions=return_exceptions))

    # -- streaming -------------------------------------------------------------------------------
    async def _chunks(self, value: Any, config: RunnableConfig) -> AsyncIterator[BeaconChunk]:
        sampler = self._sampler(config)
        query = self._query(value, config)
        events: asyncio.Queue[SampleEvent | None] = asyncio.Queue()

        def tap(ev: BeaconEvent) -> None:
            if isinstance(ev, SampleEvent):
                events.put_nowait(ev)

        task = asyncio.ensure_future(
            sampler.arun(query, observers=[_dispatcher([query]), tap])
        )
        task.add_done_callback(lambda _t: events.put_nowait(None))
        try:
            while (ev := await events.get()) is not None:
                yield BeaconChunk(
                    kind="candidate", k=ev.k, index=ev.index, text=ev.text, reward=ev.reward,
                    failed=ev.failed, error=ev.error,
                )
            res = task.result()
            res.prompt = query.text
            output = self._output(res)
            best = res.best
            yield BeaconChunk(
                kind="final", k=res.n_samples, index=None if best is None else best.index,
                text="" if best is None else best.text,
                reward=None if best is None else best.reward, n_samples=res.n_samples,
                stop_reason=res.stop_reason, output=output,
            )
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _atransform(
        self,
        inputs: AsyncIterator[Any],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> AsyncIterator[BeaconChunk]:
        value = _concat_inputs([ch async for ch in inputs])
        async for chunk in self._chunks(value, config):
            yield chunk

    def _transform(
        self, inputs: Iterator[Any], run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> Iterator[BeaconChunk]:
        value = _concat_inputs(list(inputs))
        yield from _iterate_in_thread(lambda: self._chunks(value, config))

    async def _atransform_output(
        self,
        inputs: AsyncIterator[Any],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
    ) -> AsyncIterator[Any]:
        async for chunk in self._atransform(inputs, run_manager, config):
            if chunk.kind == "final":
                yield chunk.output

    def _transform_output(
        self, inputs: Iterator[Any], run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> Iterator[Any]:
        for chunk in self._transform(inputs, run_manager, config):
            if chunk.kind == "final":
                yield chunk.output

    async def atransform(
        self,
        input: AsyncIterator[LanguageModelInput],
        config: RunnableConfig | None = None,
        **kwargs: Any | None,
    ) -> AsyncIterator[OutputT]:
        """The composition protocol (a chain streams through it): yields what ``ainvoke``
        returns, once, so the next step (``StrOutputParser``, ...) gets a message as from
        ``invoke``. Progress is in the custom events; :meth:`astream` yields chunks."""
        self._check_call(config, kwargs)
        async for out in self._atransform_stream_with_config(
            input, self._atransform_output, config
        ):
            yield out

    def transform(
        self,
        input: Iterator[LanguageModelInput],
        config: RunnableConfig | None = None,
        **kwargs: Any | None,
    ) -> Iterator[OutputT]:
        """Synchronous :meth:`atransform` (yields what ``invoke`` returns, once)."""
        self._check_call(config, kwargs)
        yield from self._transform_stream_with_config(input, self._transform_output, config)

    # astream / stream yield BeaconChunks, not the Output type invoke returns (a deliberate
    # departure from Runnable's contract: the candidates are the progress worth streaming;
    # inside a chain, transform / atransform keep the contract).
    async def astream(  # type: ignore[override]
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        **kwargs: Any | None,
    ) -> AsyncIterator[BeaconChunk]:
        """One :class:`BeaconChunk` per scored candidate, then the final choice."""
        self._check_call(config, kwargs)

        async def one() -> AsyncIterator[Any]:
            yield input

        chunks: Runnable[Any, Any] = self  # chunks, not OutputT (see above)
        async for chunk in chunks._atransform_stream_with_config(one(), self._atransform, config):
            yield chunk

    def stream(  # type: ignore[override]
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        **kwargs: Any | None,
    ) -> Iterator[BeaconChunk]:
        """Synchronous :meth:`astream` (works inside a running event loop)."""
        self._check_call(config, kwargs)
        chunks: Runnable[Any, Any] = self  # chunks, not OutputT (see astream)
        yield from chunks._transform_stream_with_config(iter([input]), self._transform, config)

    # -- agent tool ------------------------------------------------------------------------------
    def as_beacon_tool(
        self,
        name: str,
        description: str,
        *,
        return_direct: bool = False,
        config: RunnableConfig | None = None,
    ) -> BaseTool:
        """A ``BaseTool`` answering with the best response text.

        Its arguments follow the runnable's input: when that is a dict of named variables (the
        model starts with a prompt template, e.g. ``ChatPromptTemplate.from_messages([("system",
        "You are a {role}"), ("human", "{question}")]) | chat``, or with a retrieval step: see
        :meth:`get_input_schema`), the tool takes exactly those variables, with the model's
        own schema (required and optional ones, types), so an agent fills every one; a call
        missing one is rejected by that schema (a pydantic ``ValidationError``) before any
        sample is drawn. Otherwise (a chat model, a runnable taking one value) it takes
        ``question: str``, which becomes the runnable's input.

        The tool's artifact (``response_format="content_and_artifact"``) is the
        ``BeaconResult.to_dict()``: every candidate, reward and the stop reason. The BEACON run
        nests under the tool run. When no candidate can be scored the tool reports a
        ``ToolException`` message to the agent instead of raising.

        ``config`` is merged into the config of every BEACON run of the tool (tags, metadata,
        callbacks, ``run_name``, ``max_concurrency``, ``configurable``). A binding passes its
        own: ``best_of_n.with_config(run_name="best_of_n", tags=[...]).as_beacon_tool(...)``
        reaches this method through ``RunnableBinding``'s delegation, which hands over the bound
        config only to a method taking ``config``; without it the tool ran without that config.

        ``name`` must match ``^[a-zA-Z0-9_-]{1,64}$`` (what OpenAI and Anthropic accept) and
        ``description`` be a non-empty string; otherwise :class:`beacon.ConfigError` names the
        field and the value.
        """
        if not isinstance(name, str) or _TOOL_NAME.fullmatch(name) is None:
            raise ConfigError(
                "name", name,
                "must be 1 to 64 characters from a-z, A-Z, 0-9, '_' and '-' (the tool names "
                "OpenAI and Anthropic accept)",
            )
        if not isinstance(description, str) or not description:
            raise ConfigError("description", description, "must be a non-empty string")
        self._check_call(config, {})  # a BeaconConfig here is the runnable's own, not this
        runner = self.model_copy(update={"return_result": True})
        named = runner._named_input_schema(config)
        return _BeaconTool(
            name=name,
            description=description,
            args_schema=_Question if named is None else named,
            return_direct=return_direct,
            response_format="content_and_artifact",
            handle_tool_error=True,
            runner=runner if config is None else runner.with_config(config),
            single=None if named is not None else "question",
        )


class _Question(BaseModel):
    question: str = Field(description="The question to answer.")


class _BeaconTool(BaseTool):
    """The agent tool of :meth:`BeaconRunnable.as_beacon_tool`.

    ``runner`` is the ``BeaconRunnable`` (with ``return_result=True``; bound to the config
    ``as_beacon_tool`` was given, if any, which a call's own config is merged into); ``single``
    names the argument that is its whole input (``"question"``), or is ``None`` when the
    validated arguments, a dict of the model's variables, are the input.
    """

    runner: Any = Field(exclude=True)
    single: str | None = None

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The validated arguments travel as one dict, not as keyword arguments: a prompt
        # variable named ``config``, ``callbacks`` or ``run_manager`` would otherwise be
        # overwritten by what LangChain injects under those names.
        fields = list(get_fields(self.args_schema)) if isinstance(self.args_schema, type) else []
        if not fields:  # a template without variables: nothing to validate
            return ({},), {}
        parsed = self._parse_input(tool_input, tool_call_id)
        if isinstance(parsed, str):  # a bare string is the first argument, as LangChain reads it
            return ({fields[0]: parsed},), {}
        # Only the arguments the call gave: the default LangChain's parsing fills in for one it
        # left out (``None`` for an optional ``MessagesPlaceholder``) is no value the prompt
        # template accepts, whereas a variable left out gets the template's own default.
        given = tool_input if isinstance(tool_input, dict) else {}
        return ({k: v for k, v in parsed.items() if k in given},), {}

    def _input(self, args: dict[str, Any]) -> Any:
        return args[self.single] if self.single is not None else args

    def _run(
        self,
        args: dict[str, Any],
        *,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
    ) -> tuple[str, dict[str, Any]]:
        res = self.runner.invoke(self._input(args), _tool_child(config, run_manager))
        return _tool_content(res)

    async def _arun(
        self,
        args: dict[str, Any],
        *,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
    ) -> tuple[str, dict[str, Any]]:
        res = await self.runner.ainvoke(self._input(args), _tool_child(config, run_manager))
        return _tool_content(res)


def _tool_child(config: RunnableConfig, run_manager: Any) -> RunnableConfig:
    """The config a tool's BEACON run is invoked with: the tool's own config with the tool
    run's child callbacks, so that the run nests under the tool run (as LangChain's own
    child_config does); LangChain hands a tool the two separately."""
    if run_manager is None:
        return config
    return patch_config(config, callbacks=run_manager.get_child())


def _tool_content(res: BeaconResult) -> tuple[str, dict[str, Any]]:
    best = res.best
    if best is None:
        raise ToolException(str(BeaconSamplingError(res)))
    return best.text, res.to_dict()
