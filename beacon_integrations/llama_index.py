"""LlamaIndex integration: BEACON best-of-N as a query engine and as a query transform.

* :class:`BeaconQueryEngine` (a ``BaseQueryEngine``) samples answers from a LlamaIndex ``LLM``,
  or full RAG responses from an inner query engine, scores each with the reward scorer and stops
  by the BEACON rule (paper, Theorem "Optimal Stopping Rule": stop when
  h_{n,k}(zhat_k) <= c / sigma_k, or at the horizon n). It returns the ``Response`` with the
  highest raw reward -- with that response's own source nodes; a structured-output inner
  engine's ``PydanticResponse`` stays one, its object intact -- and puts the evidence in
  ``Response.metadata``: ``candidates``, ``rewards``, ``errors`` (each failed sample's
  ``"Type: message"``, else ``None``), ``n_samples``, ``stop_reason``, ``trace``
  (one dict per Stopper decision), ``chosen_index``, ``best_reward``, ``usage`` and ``error``.
* :class:`BeaconQueryTransform` (a ``BaseQueryTransform``, for ``TransformQueryEngine``) does
  best-of-N query rewriting: it samples rewrites of the query (``mode="rewrite"``) or HyDE
  hypothetical answers (``mode="hyde"``) and keeps the one the scorer prefers.

Both run natively async (``_aquery`` / :meth:`BeaconQueryTransform.arun`); the sync entry
points drive the same coroutine with :func:`beacon._sync.run_sync`, which also works inside a
running event loop (``TransformQueryEngine._aquery`` calls the transform synchronously).
``QueryStartEvent``/``QueryEndEvent`` fire through ``BaseQueryEngine.query``/``aquery``, and BEACON
dispatches :class:`BeaconSampleEvent` (one per sample) and :class:`BeaconDecisionEvent` (one per
Stopper decision) on LlamaIndex's instrumentation dispatcher, inside the query's span.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Generator
from typing import Any, Literal

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    PydanticResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.prompts.default_prompts import DEFAULT_HYDE_PROMPT
from llama_index.core.prompts.mixin import PromptDictType, PromptMixinType
from llama_index.core.schema import NodeWithScore, QueryBundle, QueryType

from beacon._sync import call_in_thread, run_sync
from beacon.budget import Budget
from beacon.config import BeaconConfig
from beacon.engine import BeaconSampler
from beacon.errors import BeaconError, ConfigError, ConfigTypeError
from beacon.events import BeaconEvent, SampleEvent
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy
from beacon_integrations._adapt import (
    BeaconSamplingError,
    LIQuery,
    li_format,
    li_generate_engine,
    li_generate_llm,
    li_score,
)

__all__ = [
    "DEFAULT_REWRITE_PROMPT",
    "BeaconDecisionEvent",
    "BeaconQueryEngine",
    "BeaconQueryTransform",
    "BeaconSampleEvent",
    "BeaconSamplingError",
    "RetrieveNotSupportedError",
]

dispatcher = get_dispatcher(__name__)

DEFAULT_REWRITE_PROMPT = PromptTemplate(
    "Rewrite the search query below so that it retrieves the most relevant documents.\n"
    "Answer with the rewritten query only.\n"
    "Query: {query_str}\n"
    "Rewritten query: "
)


class RetrieveNotSupportedError(BeaconError, NotImplementedError):
    """:meth:`BeaconQueryEngine.retrieve` / ``aretrieve`` on an engine with nothing to retrieve
    from: it samples from an LLM (``llm=``), or its inner query engine does not retrieve.

    A ``NotImplementedError`` (what LlamaIndex's ``BaseQueryEngine.retrieve`` raises), so code
    that probes for retrieval support with ``except NotImplementedError`` keeps working.
    ``source`` is the LLM or the inner query engine.
    """

    def __init__(self, source: Any, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(reason)


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


class BeaconSampleEvent(BaseEvent):
    """A BEACON sample was scored (``reward``) or failed (``failed``, ``error``).

    ``k`` is the number of rewards the Stopper has after it; ``index`` its draw order.
    """

    query_str: str
    k: int
    index: int
    reward: float | None
    text: str
    failed: bool
    error: str | None = None

    @classmethod
    def class_name(cls) -> str:
        return "BeaconSampleEvent"


class BeaconDecisionEvent(BaseEvent):
    """A Stopper decision: ``draw`` (``count`` more samples) or ``stop`` (``reason``).

    ``zhat`` = (z - mu) / sigma is the standardized best reward, ``h`` = h_{n,k}(zhat) the
    index compared with ``threshold`` = c / sigma (``bernoulli``: h^B compared with c); ``None``
    where undefined (before k0 rewards).
    """

    query_str: str
    k: int
    z: float | None
    mu: float | None
    sigma: float | None
    zhat: float | None
    h: float | None
    threshold: float | None
    decision: str
    count: int = 0
    reason: str | None = None

    @classmethod
    def class_name(cls) -> str:
        return "BeaconDecisionEvent"


def _observer(query_str: str) -> Any:
    def observe(ev: BeaconEvent) -> None:
        if isinstance(ev, SampleEvent):
            dispatcher.event(
                BeaconSampleEvent(
                    query_str=query_str, k=ev.k, index=ev.index, reward=ev.reward, text=ev.text,
                    failed=ev.failed, error=ev.error,
                )
            )
        else:
            dispatcher.event(
                BeaconDecisionEvent(
                    query_str=query_str, k=ev.k, z=_finite(ev.z), mu=_finite(ev.mu),
                    sigma=_finite(ev.sigma), zhat=_finite(ev.zhat), h=_finite(ev.h),
                    threshold=_finite(ev.threshold), decision=ev.decision, count=ev.count,
                    reason=ev.reason,
                )
            )

    return observe


def _as_template(
    name: str, value: Any, default: BasePromptTemplate, formats: tuple[str, ...]
) -> BasePromptTemplate:
    """The template to format with the variables ``formats`` (the first one is required).

    LlamaIndex leaves a variable it is not given in the text (``"{question}"`` would reach the
    LLM literally), so the template must use one of ``formats`` and no variable that nothing
    fills (its partial ``kwargs``, ``function_mappings`` and ``template_var_mappings`` count).
    """
    if value is None:
        return default
    if isinstance(value, str):
        value = PromptTemplate(value)
    if not isinstance(value, BasePromptTemplate):
        raise ConfigError(name, value, "must be a prompt template, a template string or None")
    shown = getattr(value, "template", value)
    mappings = dict(getattr(value, "template_var_mappings", None) or {})
    given = {*formats, *(value.kwargs or {}), *(value.function_mappings or {})}
    filled = {mappings.get(v, v) for v in given}
    used = set(value.template_vars or [])
    wanted = " or ".join(f"{{{v}}}" for v in formats)
    if not used & {mappings.get(v, v) for v in formats}:
        raise ConfigError(name, shown, f"must contain the variable {wanted} (the query)")
    unknown = sorted(used - filled)
    if unknown:
        names = ", ".join(f"{{{v}}}" for v in unknown)
        raise ConfigError(
            name, shown, f"uses {names}, which nothing fills (it is formatted with {wanted})"
        )
    return value


# What the templates are formatted with (see BeaconQueryEngine.arun and
# BeaconQueryTransform.arun_with_result); the first name is the one documented.
_ENGINE_VARS = ("query_str",)
_TRANSFORM_VARS = ("query_str", "context_str")


def _as_bundle(name: str, value: Any) -> QueryBundle:
    """``value`` as a ``QueryBundle`` (a string becomes one, with itself as embedding string);
    anything else is a ``TypeError`` naming ``name``."""
    if isinstance(value, str):
        return QueryBundle(query_str=value, custom_embedding_strs=[value])
    if isinstance(value, QueryBundle):
        return value
    raise TypeError(
        f"{name} must be a str or a llama_index QueryBundle; got {type(value).__name__}"
    )


def _check_config(config: Any) -> BeaconConfig:
    if config is None:
        return BeaconConfig()
    if isinstance(config, dict):
        return BeaconConfig.from_dict(config)
    if not isinstance(config, BeaconConfig):
        raise ConfigError("config", config, "must be a beacon.BeaconConfig, its to_dict() or None")
    return config


def _make_sampler(
    generate: Any,
    scorer: Any,
    config: BeaconConfig,
    max_concurrency: int,
    retry: RetryPolicy | None,
    timeout: float | None,
    budget: Budget | None,
) -> BeaconSampler:
    return BeaconSampler(
        generate,
        li_score(scorer),
        config,
        max_concurrency=max_concurrency,
        retry=RetryPolicy() if retry is None else retry,
        timeout=timeout,
        budget=budget,
    )


def result_metadata(res: BeaconResult) -> dict[str, Any]:
    """The BEACON part of ``Response.metadata``: JSON-ready evidence for the choice."""
    best = res.best
    return {
        "candidates": [c.text for c in res.candidates],
        "rewards": [c.reward for c in res.candidates],
        "errors": [c.error for c in res.candidates],
        "n_samples": res.n_samples,
        "stop_reason": res.stop_reason,
        "trace": [t.to_dict() for t in res.trace],
        "chosen_index": None if best is None else best.index,
        "best_reward": None if best is None else best.reward,
        "usage": res.usage.to_dict(),
        "error": res.error,
    }


def _text(text: str) -> Generator[str, None, None]:
    """A finished answer as a token stream: the whole text, once."""
    yield text


async def _atext(text: str) -> AsyncGenerator[str, None]:
    """:func:`_text` for ``AsyncStreamingResponse``."""
    yield text


class BeaconQueryEngine(BaseQueryEngine):
    """Best-of-N with BEACON stopping over an LLM or an inner query engine.

    Args:
        scorer: reward ``score(query_str, response_text) -> float`` (sync or async;
            ``batched = True`` for ``(query_str, [texts]) -> [floats]``; any
            ``beacon_integrations.scorers`` scorer), or a LlamaIndex evaluator whose
            ``aevaluate(query=..., response=...)`` returns a result with a ``score`` (an
            evaluator-like object with only a blocking ``evaluate`` runs in a worker thread).
        config: :class:`beacon.BeaconConfig` (cost c in reward units per sample, horizon n,
            family, batch size, prior, transform); its ``to_dict()`` is accepted too.
        llm: sample answers from this LlamaIndex ``LLM`` (``prompt_template`` formats the query,
            variable ``{query_str}``, required; the prompt is sent as ``LLM.predict`` sends a
            template: a ``ChatPromptTemplate`` keeps its roles for a chat model, and the LLM's
            ``system_prompt``, ``query_wrapper_prompt`` and ``completion_to_prompt`` apply) ...
        query_engine: ... or sample full responses from this query engine (exactly one of the
            two). The chosen response keeps its source nodes and metadata.
        prompt_template: LLM mode only; default: the query string itself.
        max_concurrency: model calls in flight at once.
        retry: engine retry policy per call (default: 3 attempts with jittered backoff).
        timeout: seconds per model/scorer attempt (``None``: no limit).
        budget: per-query caps on tokens, money or wall time. The tokens are those of every
            LlamaIndex LLM call made for a sample (an inner engine's synthesizer and refine
            calls included) and for its scoring (an evaluator's), read from LlamaIndex's
            instrumentation ("Token accounting" in docs/integrations/llama_index.md).
        callback_manager: LlamaIndex callback manager (legacy callbacks).
        streaming: return the chosen answer as a ``StreamingResponse`` (``query``) or an
            ``AsyncStreamingResponse`` (``aquery``), what a streaming chat engine
            (``CondenseQuestionChatEngine.stream_chat`` / ``astream_chat``) requires of its
            query engine. Best-of-N chooses among complete answers, so the stream starts once
            BEACON has stopped and yields the chosen text whole, with its source nodes and
            metadata; a structured-output (``PydanticResponse``) answer is returned as is.

    Raises :class:`BeaconSamplingError` when no sample could be scored.
    """

    def __init__(
        self,
        scorer: Any,
        config: BeaconConfig | dict[str, Any] | None = None,
        *,
        llm: Any = None,
        query_engine: BaseQueryEngine | None = None,
        prompt_template: BasePromptTemplate | str | None = None,
        max_concurrency: int = 16,
        retry: RetryPolicy | None = None,
        timeout: float | None = 60.0,
        budget: Budget | None = None,
        callback_manager: CallbackManager | None = None,
        streaming: bool = False,
    ) -> None:
        if not isinstance(streaming, bool):
            raise ConfigError("streaming", streaming, "must be True or False")
        # LlamaIndex stores any value and fails only at the first query (AttributeError)
        if callback_manager is not None and not isinstance(callback_manager, CallbackManager):
            raise ConfigTypeError(
                "callback_manager", callback_manager, "must be a LlamaIndex CallbackManager or None"
            )
        if (llm is None) == (query_engine is None):
            raise ConfigError(
                "llm/query_engine", (llm, query_engine), "give exactly one of llm or query_engine"
            )
        if query_engine is not None and not isinstance(query_engine, BaseQueryEngine):
            raise ConfigError("query_engine", query_engine, "must be a LlamaIndex BaseQueryEngine")
        if llm is not None and not callable(getattr(llm, "acomplete", None)):
            raise ConfigError("llm", llm, "must be a LlamaIndex LLM (with acomplete)")
        if query_engine is not None and prompt_template is not None:
            raise ConfigError("prompt_template", prompt_template, "applies to llm mode only")
        self._llm = llm
        self._query_engine = query_engine
        self._streaming = streaming
        self._prompt = _as_template(
            "prompt_template", prompt_template, PromptTemplate("{query_str}"), _ENGINE_VARS
        )
        self._config = _check_config(config)
        generate = li_generate_llm(llm) if llm is not None else li_generate_engine(query_engine)
        self._sampler = _make_sampler(
            generate, scorer, self._config, max_concurrency, retry, timeout, budget
        )
        super().__init__(callback_manager)

    @property
    def config(self) -> BeaconConfig:
        return self._config

    @property
    def sampler(self) -> BeaconSampler:
        return self._sampler

    def _get_prompts(self) -> PromptDictType:
        return {"beacon_prompt": self._prompt} if self._llm is not None else {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if "beacon_prompt" in prompts:
            self._prompt = _as_template(
                "beacon_prompt", prompts["beacon_prompt"], self._prompt, _ENGINE_VARS
            )

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"query_engine": self._query_engine} if self._query_engine is not None else {}

    async def arun(self, query_bundle: QueryType) -> BeaconResult:
        """The full :class:`~beacon.result.BeaconResult` for one query (no Response built).

        ``query_bundle`` is a ``QueryBundle`` or a query string, as for :meth:`aquery`;
        anything else is a ``TypeError``.
        """
        query_bundle = _as_bundle("query_bundle", query_bundle)
        q = query_bundle.query_str
        if self._llm is not None:
            query = LIQuery(q, query_bundle, template=self._prompt, variables={"query_str": q})
            li_format(self._llm, query)  # once for every sample; a bad template fails here
        else:
            query = LIQuery(q, query_bundle)
        res = await self._sampler.arun(query, observers=[_observer(q)])
        res.prompt = q
        return res

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        resp = await self._abest(query_bundle)
        if self._streaming and isinstance(resp, Response):
            text = resp.response or ""
            # a finished stream: its text is known (response_txt), its generator yields it
            return AsyncStreamingResponse(
                _atext(text), list(resp.source_nodes), resp.metadata, response_txt=text
            )
        return resp

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        resp = run_sync(self._aquery(query_bundle))
        if isinstance(resp, AsyncStreamingResponse):  # streaming: the sync kind of stream
            return StreamingResponse(
                _text(resp.response_txt or ""), list(resp.source_nodes), resp.metadata
            )
        return resp

    async def _abest(self, query_bundle: QueryBundle) -> Response | PydanticResponse:
        """The chosen sample as a complete response (its own sources, BEACON's metadata)."""
        res = await self.arun(query_bundle)
        best = res.best
        if best is None:
            raise BeaconSamplingError(res)
        meta = result_metadata(res)
        chosen = best.raw
        if isinstance(chosen, Response):
            return Response(
                response=chosen.response,
                source_nodes=list(chosen.source_nodes),
                metadata={**(chosen.metadata or {}), **meta},
            )
        if isinstance(chosen, PydanticResponse):  # a structured-output inner engine's
            return PydanticResponse(
                response=chosen.response,
                source_nodes=list(chosen.source_nodes),
                metadata={**(chosen.metadata or {}), **meta},
            )
        return Response(response=best.text, source_nodes=[], metadata=meta)

    # -- retrieval: the inner query engine's --------------------------------------------------
    def _retrieving_engine(self, method: str) -> BaseQueryEngine:
        """The inner query engine, when it retrieves; else :class:`RetrieveNotSupportedError`."""
        inner = self._query_engine
        if inner is None:
            raise RetrieveNotSupportedError(
                self._llm,
                f"{method}() needs an inner query engine with a retriever "
                f"(BeaconQueryEngine(..., query_engine=index.as_query_engine(...))); this one "
                f"samples from the LLM {type(self._llm).__name__} and retrieves nothing",
            )
        if type(inner).retrieve is BaseQueryEngine.retrieve:
            raise RetrieveNotSupportedError(
                inner,
                f"{method}() is delegated to the inner query engine, and "
                f"{type(inner).__name__} does not support retrieve",
            )
        return inner

    def retrieve(self, query_bundle: QueryType) -> list[NodeWithScore]:
        """The nodes the inner query engine retrieves for ``query_bundle`` (a ``QueryBundle``
        or a query string), with its node postprocessors applied: what each BEACON sample is
        grounded on. No sampling happens.

        Raises :class:`RetrieveNotSupportedError` (a ``NotImplementedError``) when built with
        ``llm=``, or when the inner query engine does not support ``retrieve``.
        """
        inner = self._retrieving_engine("retrieve")
        return inner.retrieve(_as_bundle("query_bundle", query_bundle))

    async def aretrieve(self, query_bundle: QueryType) -> list[NodeWithScore]:
        """Async :meth:`retrieve`: the inner engine's ``aretrieve`` (``RetrieverQueryEngine``
        and its kin have one); an inner engine with a sync ``retrieve`` only is run in a
        worker thread so the event loop is not blocked."""
        inner = self._retrieving_engine("aretrieve")
        bundle = _as_bundle("query_bundle", query_bundle)
        aretrieve = getattr(inner, "aretrieve", None)
        if callable(aretrieve):
            nodes: list[NodeWithScore] = await aretrieve(bundle)
            return nodes
        return await call_in_thread(inner.retrieve, bundle)


class BeaconQueryTransform(BaseQueryTransform):
    """Best-of-N query rewriting: keep the rewrite the scorer prefers.

    Args:
        llm: LlamaIndex ``LLM`` that writes the rewrites.
        scorer: ``score(query_str, rewrite) -> float`` (sync or async, or batched, or a
            LlamaIndex evaluator), e.g. the best retrieval similarity the rewrite reaches.
        config: :class:`beacon.BeaconConfig`.
        mode: ``"rewrite"``: the best rewrite becomes the query string (and its first
            embedding string); ``"hyde"``: the query string is kept and the best hypothetical
            answer becomes its first embedding string (HyDE).
        prompt: template with ``{query_str}`` (or ``{context_str}``, as LlamaIndex's HyDE
            prompt names the query); any other variable is a :class:`beacon.ConfigError`;
            defaults: :data:`DEFAULT_REWRITE_PROMPT` and LlamaIndex's ``DEFAULT_HYDE_PROMPT``.
            It is sent as ``LLM.predict`` sends a template (the LLM's ``system_prompt`` and
            prompt wrappers apply).
        include_original: keep the original query's embedding strings after the chosen one.

    ``last_result`` holds the :class:`~beacon.result.BeaconResult` of the latest run (for
    inspection in single-threaded use; :meth:`arun_with_result` returns it race-free).
    """

    def __init__(
        self,
        llm: Any,
        scorer: Any,
        config: BeaconConfig | dict[str, Any] | None = None,
        *,
        mode: Literal["rewrite", "hyde"] = "rewrite",
        prompt: BasePromptTemplate | str | None = None,
        include_original: bool = True,
        max_concurrency: int = 16,
        retry: RetryPolicy | None = None,
        timeout: float | None = 60.0,
        budget: Budget | None = None,
    ) -> None:
        super().__init__()
        if mode not in ("rewrite", "hyde"):
            raise ConfigError("mode", mode, "must be 'rewrite' or 'hyde'")
        if not callable(getattr(llm, "acomplete", None)):
            raise ConfigError("llm", llm, "must be a LlamaIndex LLM (with acomplete)")
        self._llm = llm
        self._mode = mode
        default = DEFAULT_HYDE_PROMPT if mode == "hyde" else DEFAULT_REWRITE_PROMPT
        self._prompt = _as_template("prompt", prompt, default, _TRANSFORM_VARS)
        if not isinstance(include_original, bool):  # bool("no") would be True
            raise ConfigError("include_original", include_original, "must be True or False")
        self._include_original = include_original
        self._config = _check_config(config)
        self._sampler = _make_sampler(
            li_generate_llm(llm), scorer, self._config, max_concurrency, retry, timeout, budget
        )
        self.last_result: BeaconResult | None = None

    @property
    def config(self) -> BeaconConfig:
        return self._config

    def _get_prompts(self) -> PromptDictType:
        return {"beacon_prompt": self._prompt}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if "beacon_prompt" in prompts:
            self._prompt = _as_template(
                "beacon_prompt", prompts["beacon_prompt"], self._prompt, _TRANSFORM_VARS
            )

    async def arun_with_result(
        self, query_bundle_or_str: QueryType, metadata: dict[str, Any] | None = None
    ) -> tuple[QueryBundle, BeaconResult]:
        """The transformed bundle and the :class:`~beacon.result.BeaconResult` behind it."""
        bundle = _as_bundle("query_bundle_or_str", query_bundle_or_str)
        q = bundle.query_str
        # HyDE templates name the query {context_str}; formatting ignores the unused name.
        query = LIQuery(
            q, bundle, template=self._prompt, variables={"query_str": q, "context_str": q}
        )
        li_format(self._llm, query)  # once for every sample; a bad template fails here
        res = await self._sampler.arun(query, observers=[_observer(q)])
        res.prompt = q
        self.last_result = res
        best = res.best
        if best is None:
            raise BeaconSamplingError(res)
        original = list(bundle.embedding_strs) if self._include_original else []
        text = best.text.strip()
        if self._mode == "hyde":
            out = QueryBundle(query_str=q, custom_embedding_strs=[text, *original])
        else:
            out = QueryBundle(query_str=text, custom_embedding_strs=[text, *original])
        return out, res

    async def arun(
        self, query_bundle_or_str: QueryType, metadata: dict[str, Any] | None = None
    ) -> QueryBundle:
        """Async :meth:`run`."""
        out, _ = await self.arun_with_result(query_bundle_or_str, metadata)
        return out

    def _run(self, query_bundle: QueryBundle, metadata: dict[str, Any]) -> QueryBundle:
        return run_sync(self.arun(query_bundle, metadata))
