"""BeaconQueryEngine / BeaconQueryTransform against LlamaIndex's real classes (mock models)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import PydanticResponse, Response
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.evaluation import (
    BaseEvaluator,
    EvaluationResult,
    FaithfulnessEvaluator,
)
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine, TransformQueryEngine
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import BaseModel, Field, PrivateAttr

import beacon
from beacon import BeaconConfig, Draw, NIGPrior, Stopper
from beacon.engine import BatchScorer
from beacon.retry import RetryPolicy
from beacon_integrations.llama_index import (
    BeaconDecisionEvent,
    BeaconQueryEngine,
    BeaconQueryTransform,
    BeaconSampleEvent,
    BeaconSamplingError,
    RetrieveNotSupportedError,
)

# -- fakes ----------------------------------------------------------------------------------------


class ScriptedLLM(CustomLLM):
    """Completion LLM answering from a script in call order; records the prompts it got."""

    script: list[str] = Field(default_factory=list)
    _i: int = PrivateAttr(default=0)
    _prompts: list[str] = PrivateAttr(default_factory=list)
    _threads: set[int] = PrivateAttr(default_factory=set)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._threads.add(threading.get_ident())
        self._prompts.append(prompt)
        text = self.script[self._i % len(self.script)]
        self._i += 1
        return CompletionResponse(text=text)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> Iterator[CompletionResponse]:
        text = self.complete(prompt, formatted=formatted).text
        yield CompletionResponse(text=text, delta=text)  # streaming synthesizers read deltas


class Collector(BaseEventHandler):
    """Instrumentation handler collecting every event."""

    events: list[BaseEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Collector"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)


@pytest.fixture
def collector() -> Iterator[Collector]:
    root = get_dispatcher()
    c = Collector()
    root.add_event_handler(c)
    try:
        yield c
    finally:
        root.event_handlers.remove(c)


REWARDS = {"a": 0.10, "b": 0.35, "c": 0.20, "d": 0.90, "e": 0.15, "f": 0.30, "g": 0.05}
SCRIPT = list("abcdefg")
CFG = BeaconConfig(cost=0.02, horizon=7, family="normal")


def table_scorer(query: str, response: str) -> float:
    return REWARDS[response.strip()[-1]]


def expected(rewards: list[float], cfg: BeaconConfig) -> tuple[int, str]:
    """Independent replay: samples BEACON uses on this reward stream, and its stop reason."""
    s = Stopper(cfg)
    it = iter(rewards)
    while isinstance(d := s.next_decision(), Draw):
        for _ in range(d.count):
            s.observe(next(it))
    assert s.stopped is not None
    return s.k, s.stopped.reason


def best_of(script: list[str], cfg: BeaconConfig) -> tuple[str, int, str]:
    n, reason = expected([REWARDS[t] for t in script], cfg)
    return max(script[:n], key=lambda t: REWARDS[t]), n, reason


def check_best_response(resp: Any) -> dict[str, Any]:
    """Assert ``resp`` is the best of SCRIPT under CFG with its evidence; its metadata."""
    best, n, reason = best_of(SCRIPT, CFG)
    assert isinstance(resp, Response)
    assert resp.response == best
    md = resp.metadata or {}
    assert md["n_samples"] == n and md["stop_reason"] == reason
    assert md["candidates"] == SCRIPT[:n]
    return md


DOCS = [
    Document(text="Paris is the capital of France.", doc_id="fr"),
    Document(text="Berlin is the capital of Germany.", doc_id="de"),
    Document(text="Madrid is the capital of Spain.", doc_id="es"),
]


def make_index() -> VectorStoreIndex:
    return VectorStoreIndex.from_documents(DOCS, embed_model=MockEmbedding(embed_dim=8))


# -- BeaconQueryEngine over an LLM --------------------------------------------------------------


def test_llm_mode_returns_best_answer_with_evidence(collector: Collector) -> None:
    llm = ScriptedLLM(script=SCRIPT)
    qe = BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template="Q: {query_str}\nA:")
    resp = qe.query("What is best?")
    best, n, reason = best_of(SCRIPT, CFG)
    md = check_best_response(resp)
    assert md["rewards"] == [REWARDS[t] for t in SCRIPT[:n]]
    assert md["trace"][-1]["decision"] == "stop" and md["trace"][-1]["reason"] == reason
    assert md["best_reward"] == REWARDS[best]
    assert md["candidates"][md["chosen_index"]] == best
    assert set(llm._prompts) == {"Q: What is best?\nA:"}
    names = [e.class_name() for e in collector.events]
    assert names[0] == "QueryStartEvent" and names[-1] == "QueryEndEvent"
    samples = [e for e in collector.events if isinstance(e, BeaconSampleEvent)]
    decisions = [e for e in collector.events if isinstance(e, BeaconDecisionEvent)]
    assert [s.k for s in samples] == list(range(1, n + 1))
    assert all(s.reward == REWARDS[s.text] and s.query_str == "What is best?" for s in samples)
    assert len(decisions) == len(md["trace"])
    assert decisions[-1].decision == "stop" and decisions[-1].reason == reason
    # BEACON's events belong to the span of this engine's _aquery (inside the query's span).
    spans = {e.span_id for e in samples + decisions}
    assert len(spans) == 1 and str(spans.pop()).startswith("BeaconQueryEngine._aquery")


async def test_aquery_is_native_async(collector: Collector) -> None:
    llm = ScriptedLLM(script=SCRIPT)
    resp = await BeaconQueryEngine(table_scorer, CFG, llm=llm).aquery("q")
    assert resp.response == best_of(SCRIPT, CFG)[0]
    assert llm._threads == {threading.get_ident()}
    names = [e.class_name() for e in collector.events]
    assert "QueryStartEvent" in names and "QueryEndEvent" in names


async def test_sync_query_inside_a_running_loop_and_async_scorer() -> None:
    async def scorer(q: str, r: str) -> float:
        await asyncio.sleep(0)
        return table_scorer(q, r)

    resp = BeaconQueryEngine(scorer, CFG, llm=ScriptedLLM(script=SCRIPT)).query("q")
    assert resp.response == best_of(SCRIPT, CFG)[0]


class TableEvaluator(BaseEvaluator):
    """Scores by the reward table; ``grounded``: needs the answer's contexts, as LlamaIndex's
    Faithfulness/Relevancy evaluators do."""

    def __init__(self, grounded: bool = False) -> None:
        self.grounded = grounded
        self.seen: list[tuple[str, list[str]]] = []

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        return None

    async def aevaluate(self, query: str | None = None, response: str | None = None,
                        contexts: Any = None, **kwargs: Any) -> EvaluationResult:
        if response is None or (self.grounded and contexts is None):
            raise ValueError("contexts and response must be provided")
        if contexts is not None:
            self.seen.append((response, list(contexts)))
        return EvaluationResult(query=query, response=response, contexts=contexts,
                                score=REWARDS[response])


def test_evaluator_scorer() -> None:
    resp = BeaconQueryEngine(TableEvaluator(), CFG, llm=ScriptedLLM(script=SCRIPT)).query("q")
    assert resp.response == best_of(SCRIPT, CFG)[0]


def test_no_scored_sample_raises_typed_error() -> None:
    qe = BeaconQueryEngine(lambda q, r: float("nan"), CFG.replace(max_failures=1),
                           llm=ScriptedLLM(script=SCRIPT))
    with pytest.raises(BeaconSamplingError) as ei:
        qe.query("q")
    assert ei.value.result.stop_reason == "error"


async def test_arun_takes_a_query_string_or_bundle_and_types_other_queries() -> None:
    qe = BeaconQueryEngine(table_scorer, CFG, llm=ScriptedLLM(script=SCRIPT))
    best, n, reason = best_of(SCRIPT, CFG)
    res = await qe.arun("What is best?")  # was AttributeError: 'str' has no 'query_str'
    assert (res.prompt, res.n_samples, res.stop_reason) == ("What is best?", n, reason)
    assert res.best is not None and res.best.text == best
    res = await qe.arun(QueryBundle("What is best?"))
    assert res.prompt == "What is best?"
    with pytest.raises(TypeError, match=r"query_bundle must be a str or a .*QueryBundle; got int"):
        await qe.arun(3)  # type: ignore[arg-type]


def test_bad_arguments_are_typed_errors() -> None:
    with pytest.raises(ValueError, match="llm/query_engine"):
        BeaconQueryEngine(table_scorer, CFG)
    with pytest.raises(ValueError, match="config"):
        BeaconQueryEngine(table_scorer, "cfg", llm=ScriptedLLM(script=SCRIPT))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost"):
        BeaconQueryEngine(table_scorer, {"cost": 0}, llm=ScriptedLLM(script=SCRIPT))
    with pytest.raises(ValueError, match="mode"):
        BeaconQueryTransform(ScriptedLLM(script=SCRIPT), table_scorer, CFG, mode="nope")  # type: ignore[arg-type]


# -- BeaconQueryEngine over an inner query engine (RAG) ------------------------------------------


class ScriptedRAG(BaseQueryEngine):
    """Inner query engine: scripted answers, each citing a different source document."""

    def __init__(self, script: list[str]) -> None:
        super().__init__(callback_manager=None)
        self.script = script
        self.i = 0
        self.sources: list[Any] = []
        self.index = make_index()
        self.retriever = self.index.as_retriever(similarity_top_k=3)

    def _get_prompt_modules(self) -> dict[str, Any]:
        return {}

    async def _aquery(self, query_bundle: QueryBundle) -> Response:
        nodes = await self.retriever.aretrieve(query_bundle)
        i = self.i
        self.i += 1
        text = self.script[i % len(self.script)]
        chosen = [nodes[i % len(nodes)]]
        self.sources.append(chosen[0])
        return Response(response=text, source_nodes=chosen, metadata={"sample": i})

    def _query(self, query_bundle: QueryBundle) -> Response:
        raise AssertionError("BeaconQueryEngine must use the async path")


async def test_inner_engine_mode_keeps_the_chosen_responses_sources(collector: Collector) -> None:
    inner = ScriptedRAG(SCRIPT)
    qe = BeaconQueryEngine(table_scorer, CFG, query_engine=inner)
    resp = await qe.aquery("capital?")
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best
    i = SCRIPT.index(best)
    md = resp.metadata or {}
    assert md["sample"] == i  # the chosen response's own metadata survives
    assert [s.node.node_id for s in resp.source_nodes] == [inner.sources[i].node.node_id]
    assert len({s.node.node_id for s in inner.sources}) == 3  # samples cited different sources
    assert md["n_samples"] == n
    # inner queries fire their own Query events inside ours
    assert [e.class_name() for e in collector.events].count("QueryStartEvent") == n + 1



def test_evaluator_gets_each_samples_own_sources_as_contexts_in_inner_engine_mode() -> None:
    # was: every sample failed with "contexts and response must be provided", so a RAG
    # evaluator (FaithfulnessEvaluator, RelevancyEvaluator) could never score a sample
    inner = ScriptedRAG(SCRIPT)
    ev = TableEvaluator(grounded=True)
    resp = BeaconQueryEngine(ev, CFG, query_engine=inner).query("capital?")
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best
    assert sorted(ev.seen) == sorted(
        (SCRIPT[i], [inner.sources[i].node.get_content()]) for i in range(n)
    )


def test_faithfulness_evaluator_scores_inner_engine_samples() -> None:
    judge = ScriptedLLM(script=["YES"])  # the judge finds every answer supported
    inner = ScriptedRAG(SCRIPT)
    cfg = BeaconConfig(cost=0.02, horizon=7, family="bernoulli")
    resp = BeaconQueryEngine(FaithfulnessEvaluator(llm=judge), cfg, query_engine=inner).query(
        "capital?"
    )
    md = resp.metadata or {}
    assert md["errors"] == [None] and md["rewards"] == [1.0]
    assert md["stop_reason"] == "absorbed" and resp.response == SCRIPT[0]


def test_inner_engine_is_a_real_retriever_query_engine() -> None:
    index = make_index()
    inner = index.as_query_engine(llm=ScriptedLLM(script=SCRIPT), similarity_top_k=2)
    resp = BeaconQueryEngine(table_scorer, CFG, query_engine=inner).query("capital of France?")
    assert resp.response == best_of(SCRIPT, CFG)[0]
    assert len(resp.source_nodes) == 2
    assert {s.node.ref_doc_id for s in resp.source_nodes} <= {"fr", "de", "es"}


@pytest.mark.parametrize("run", ["query", "aquery"])
def test_streaming_inner_engine_samples_are_read_to_the_end(run: str) -> None:
    index = make_index()
    inner = index.as_query_engine(
        llm=ScriptedLLM(script=SCRIPT), similarity_top_k=2, streaming=True
    )
    qe = BeaconQueryEngine(table_scorer, CFG, query_engine=inner)
    q = "capital of France?"
    resp = qe.query(q) if run == "query" else asyncio.run(qe.aquery(q))
    md = check_best_response(resp)
    assert md["usage"]["failed_calls"] == 0
    assert len(resp.source_nodes) == 2


class Answer(BaseModel):
    answer: str


@pytest.mark.parametrize("run", ["query", "aquery"])
def test_structured_output_inner_engine_keeps_its_pydantic_response(run: str) -> None:
    script = [json.dumps({"answer": t}) for t in SCRIPT]
    inner = make_index().as_query_engine(
        llm=ScriptedLLM(script=script), output_cls=Answer, similarity_top_k=2
    )
    seen: list[str] = []

    def score(query: str, text: str) -> float:
        seen.append(text)
        return REWARDS[json.loads(text)["answer"]]  # the scorer sees the answer's JSON

    qe = BeaconQueryEngine(score, CFG, query_engine=inner)
    resp = qe.query("capital?") if run == "query" else asyncio.run(qe.aquery("capital?"))
    best, n, reason = best_of(SCRIPT, CFG)
    assert seen == [json.dumps({"answer": t}, separators=(",", ":")) for t in SCRIPT[:n]]
    assert isinstance(resp, PydanticResponse)
    assert resp.response == Answer(answer=best)  # the typed object, not its text
    assert len(resp.source_nodes) == 2  # the chosen response's own sources
    md = resp.metadata or {}
    assert (md["n_samples"], md["stop_reason"]) == (n, reason)
    assert md["candidates"] == seen


# -- retrieve / aretrieve: delegated to the inner query engine ----------------------------------


class RecordingRetriever(BaseRetriever):
    """LlamaIndex retriever over the test index that records which path (sync/async) ran."""

    def __init__(self, inner: BaseRetriever) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.calls.append(("sync", query_bundle.query_str))
        return self.inner.retrieve(query_bundle)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.calls.append(("async", query_bundle.query_str))
        return await self.inner.aretrieve(query_bundle)


def _rag_engine() -> tuple[RetrieverQueryEngine, RecordingRetriever]:
    retriever = RecordingRetriever(make_index().as_retriever(similarity_top_k=3))
    inner = RetrieverQueryEngine.from_args(
        retriever, llm=ScriptedLLM(script=SCRIPT),
        node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=-1.0)],
    )
    return inner, retriever


def _ids(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.node_id for n in nodes]


@pytest.mark.parametrize("query", ["capital of France?", QueryBundle("capital of France?")])
async def test_retrieve_and_aretrieve_reach_the_inner_engines_retriever(query: Any) -> None:
    inner, retriever = _rag_engine()
    qe = BeaconQueryEngine(table_scorer, CFG, query_engine=inner)
    want = _ids(inner.retrieve(QueryBundle("capital of France?")))
    assert len(want) == 3
    retriever.calls.clear()
    assert _ids(qe.retrieve(query)) == want
    assert retriever.calls == [("sync", "capital of France?")]
    assert _ids(await qe.aretrieve(query)) == want
    assert retriever.calls[1:] == [("async", "capital of France?")]  # natively async
    assert _ids(qe.retrieve(query)) == want  # sync retrieve inside a running loop
    assert inner._response_synthesizer._llm._i == 0  # retrieval only: no sample was drawn


def test_retrieve_delegates_through_a_transform_query_engine_with_sync_retrieve_only() -> None:
    inner, retriever = _rag_engine()
    rewrites = [f"capital city {t}" for t in SCRIPT]
    transform = BeaconQueryTransform(ScriptedLLM(script=rewrites), table_scorer, CFG)
    tqe = TransformQueryEngine(inner, transform)
    qe = BeaconQueryEngine(table_scorer, CFG, query_engine=tqe)
    best, _, _ = best_of(SCRIPT, CFG)
    assert len(qe.retrieve("capital?")) == 3
    assert len(asyncio.run(qe.aretrieve("capital?"))) == 3
    # both retrieved with the best rewrite of the query
    assert retriever.calls == [("sync", f"capital city {best}")] * 2


def test_retrieve_without_a_retrieving_inner_engine_is_a_typed_error() -> None:
    llm = ScriptedLLM(script=SCRIPT)
    qe = BeaconQueryEngine(table_scorer, CFG, llm=llm)
    for call in (lambda: qe.retrieve("q"), lambda: asyncio.run(qe.aretrieve("q"))):
        with pytest.raises(RetrieveNotSupportedError, match="ScriptedLLM") as info:
            call()
        assert isinstance(info.value, NotImplementedError)
        assert isinstance(info.value, beacon.BeaconError) and info.value.source is llm
    rag = ScriptedRAG(SCRIPT)  # a BaseQueryEngine that answers but does not support retrieve
    qe = BeaconQueryEngine(table_scorer, CFG, query_engine=rag)
    with pytest.raises(RetrieveNotSupportedError, match="ScriptedRAG"):
        qe.retrieve("q")
    with pytest.raises(RetrieveNotSupportedError, match="ScriptedRAG"):
        asyncio.run(qe.aretrieve("q"))
    inner, _ = _rag_engine()
    with pytest.raises(TypeError, match="query_bundle"):
        BeaconQueryEngine(table_scorer, CFG, query_engine=inner).retrieve(None)  # type: ignore[arg-type]


# -- BeaconQueryTransform -------------------------------------------------------------------------


def test_rewrite_transform_keeps_the_preferred_rewrite() -> None:
    rewrites = [f"capital city {t}" for t in SCRIPT]
    t = BeaconQueryTransform(ScriptedLLM(script=rewrites), table_scorer, CFG)
    out = t.run("capital?")
    best, n, reason = best_of(SCRIPT, CFG)
    assert out.query_str == f"capital city {best}"
    assert out.embedding_strs == [f"capital city {best}", "capital?"]
    assert t.last_result is not None
    assert (t.last_result.n_samples, t.last_result.stop_reason) == (n, reason)


def test_hyde_transform_keeps_query_and_uses_best_hypothetical_document() -> None:
    docs = [f"Hypothetical passage {t}" for t in SCRIPT]
    llm = ScriptedLLM(script=docs)
    t = BeaconQueryTransform(llm, table_scorer, CFG, mode="hyde", include_original=False)
    out = t.run(QueryBundle("capital?"))
    best, _, _ = best_of(SCRIPT, CFG)
    assert out.query_str == "capital?"
    assert out.embedding_strs == [f"Hypothetical passage {best}"]
    assert all("capital?" in p for p in llm._prompts)  # LlamaIndex's HyDE prompt was filled


async def test_transform_inside_transform_query_engine(collector: Collector) -> None:
    rewrites = [f"capital city {t}" for t in SCRIPT]
    transform = BeaconQueryTransform(
        ScriptedLLM(script=rewrites), table_scorer, CFG,
        prompt=PromptTemplate("Rewrite: {query_str}"),
    )
    answering = ScriptedLLM(script=["Paris."])
    tqe = TransformQueryEngine(make_index().as_query_engine(llm=answering), transform)
    resp = await tqe.aquery("capital?")  # TransformQueryEngine calls the transform synchronously
    assert str(resp) == "Paris."
    best, _, _ = best_of(SCRIPT, CFG)
    assert any(f"capital city {best}" in p for p in answering._prompts)
    assert any(isinstance(e, BeaconSampleEvent) for e in collector.events)
    assert transform.get_prompts()["beacon_prompt"].get_template() == "Rewrite: {query_str}"



async def test_beacon_engine_over_a_transform_query_engine_nests() -> None:
    # outer BEACON engine (aquery, on this loop) -> TransformQueryEngine._aquery -> the
    # transform's sync run (a private loop in a worker thread) -> its scorer querying another
    # BEACON engine synchronously (one more level): no deadlock, each level picks its best
    rewrites = [f"capital city {t}" for t in SCRIPT]
    judge = BeaconQueryEngine(table_scorer, CFG, llm=ScriptedLLM(script=SCRIPT))
    judged: list[str] = []

    def judged_scorer(query: str, rewrite: str) -> float:
        judged.append(judge.query(rewrite).response)  # a sync query, inside a running loop
        return table_scorer(query, rewrite)

    transform = BeaconQueryTransform(ScriptedLLM(script=rewrites), judged_scorer, CFG)
    tqe = TransformQueryEngine(make_index().as_query_engine(llm=ScriptedLLM(script=SCRIPT)),
                               transform)
    resp = await BeaconQueryEngine(table_scorer, CFG, query_engine=tqe).aquery("capital?")
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best and (resp.metadata or {})["n_samples"] == n
    last = transform.last_result
    assert last is not None and last.best is not None
    texts = [c.text for c in last.candidates]
    assert last.best.text == max(texts, key=lambda t: table_scorer("", t))
    assert len(judged) >= n and set(judged) <= set(SCRIPT)  # every outer sample was judged

# -- priors, transforms, families ---------------------------------------------------------------


def test_prior_and_transform_flow_through() -> None:
    prior = NIGPrior(mu0=0.0, nu0=1.0, alpha0=2.0, beta0=0.5)
    cfg = BeaconConfig(cost=0.05, horizon=7, family="normal", prior=prior, transform="logit")
    resp = BeaconQueryEngine(table_scorer, cfg.to_dict(), llm=ScriptedLLM(script=SCRIPT)).query("q")
    best, n, reason = best_of(SCRIPT, cfg)
    md = resp.metadata or {}
    assert resp.response == best
    assert (md["n_samples"], md["stop_reason"]) == (n, reason)
    assert any(t["mu"] is not None and t["mu"] < 0 for t in md["trace"])  # logit units


def test_bernoulli_family_absorbs_at_first_success() -> None:
    cfg = BeaconConfig(cost=0.05, horizon=8, family="bernoulli")
    qe = BeaconQueryEngine(lambda q, r: float(r == "d"), cfg, llm=ScriptedLLM(script=SCRIPT))
    resp = qe.query("q")
    md = resp.metadata or {}
    assert resp.response == "d" and md["stop_reason"] == "absorbed" and md["n_samples"] == 4


@pytest.mark.parametrize("kind", ["bool", "np.bool_", "batched np.bool_"])
def test_bool_checker_drives_the_bernoulli_family(kind: str) -> None:
    # As in the engine, True/False (numpy's too) are the rewards 1.0/0.0.
    scorers = {
        "bool": lambda q, r: r == "d",
        "np.bool_": lambda q, r: np.bool_(r == "d"),
        "batched np.bool_": BatchScorer(lambda q, rs: np.array([r == "d" for r in rs])),
    }
    cfg = BeaconConfig(cost=0.05, horizon=8, family="bernoulli")
    qe = BeaconQueryEngine(scorers[kind], cfg, llm=ScriptedLLM(script=SCRIPT))
    resp = qe.query("q")
    md = resp.metadata or {}
    assert md["error"] is None and md["stop_reason"] == "absorbed"
    assert resp.response == "d" and md["n_samples"] == 4
    assert md["rewards"] == [0.0, 0.0, 0.0, 1.0] and md["best_reward"] == 1.0


def test_invalid_reward_error_names_the_sample_position() -> None:
    qe = BeaconQueryEngine(lambda q, r: "high", CFG.replace(max_failures=0),
                           llm=ScriptedLLM(script=SCRIPT))
    with pytest.raises(BeaconSamplingError) as ei:
        qe.query("q")
    res = ei.value.result
    assert [c.error for c in res.candidates] == [
        f"RewardError: invalid reward at position {i}: 'high' "
        "(scorer returned a non-numeric string)"
        for i in range(len(res.candidates))
    ]


# -- template, scorer-output and query validation --------------------------------------------------


@pytest.mark.parametrize("template", ["Question: {question}", "Q: fixed", "Q: {query_str} {foo}"])
def test_engine_template_must_use_query_str_and_nothing_unfilled(template: str) -> None:
    llm = ScriptedLLM(script=SCRIPT)
    with pytest.raises(beacon.ConfigError, match=r"\{query_str\}|\{foo\}") as ei:
        BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template=template)
    assert ei.value.field == "prompt_template" and ei.value.value == template
    qe = BeaconQueryEngine(table_scorer, CFG, llm=llm)
    with pytest.raises(beacon.ConfigError, match="beacon_prompt"):
        qe.update_prompts({"beacon_prompt": PromptTemplate(template)})
    assert llm._prompts == []


def test_engine_template_variable_mappings_and_partials_count_as_filled() -> None:
    mapped = PromptTemplate("Q: {question}", template_var_mappings={"query_str": "question"})
    partial = PromptTemplate("{lang} Q: {query_str}").partial_format(lang="EN")
    for template in (mapped, partial):
        llm = ScriptedLLM(script=SCRIPT)
        BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template=template).query("What?")
        assert set(llm._prompts) == {template.format(query_str="What?")}
        assert "What?" in llm._prompts[0] and "{" not in llm._prompts[0]


def test_transform_prompt_must_use_the_query() -> None:
    llm = ScriptedLLM(script=SCRIPT)
    for bad in ("{foo}", "Rewrite: {query_str} {foo}", "no variable"):
        with pytest.raises(beacon.ConfigError, match=r"prompt.*(\{query_str\}|\{foo\})"):
            BeaconQueryTransform(llm, table_scorer, CFG, prompt=bad)
    # {context_str} (LlamaIndex's HyDE prompt names the query so) is formatted too.
    t = BeaconQueryTransform(llm, table_scorer, CFG, mode="hyde", prompt="Doc for {context_str}")
    t.run("hello")
    assert set(llm._prompts) == {"Doc for hello"}


@pytest.mark.parametrize("bad", [None, 5, ["q"]])
def test_transform_query_must_be_str_or_bundle(bad: Any) -> None:
    llm = ScriptedLLM(script=SCRIPT)
    t = BeaconQueryTransform(llm, table_scorer, CFG)
    with pytest.raises(TypeError, match=r"query_bundle_or_str.*" + type(bad).__name__):
        t.run(bad)
    with pytest.raises(TypeError, match="query_bundle_or_str"):
        asyncio.run(t.arun(bad))
    assert llm._prompts == []


@pytest.mark.parametrize("out", [lambda ts: {i: 9.0 for i in range(len(ts))}, lambda ts: None,
                                 lambda ts: "0.5"])
def test_batched_scorer_must_return_one_reward_per_response(out: Any) -> None:
    scorer = BatchScorer(lambda q, ts: out(ts))
    qe = BeaconQueryEngine(scorer, CFG.replace(max_failures=1), llm=ScriptedLLM(script=SCRIPT),
                           retry=RetryPolicy.none())
    with pytest.raises(BeaconSamplingError) as ei:
        qe.query("q")
    res = ei.value.result
    assert res.stop_reason == "error" and res.n_failed == len(res.candidates) > 0
    assert res.error is not None and "sequence of" in res.error and "one per response" in res.error


@pytest.mark.parametrize("shape", [np.array, lambda v: (x for x in v)])
def test_batched_scorer_may_return_an_array_or_iterable(shape: Any) -> None:
    scorer = BatchScorer(lambda q, ts: shape([table_scorer(q, t) for t in ts]))
    resp = BeaconQueryEngine(scorer, CFG, llm=ScriptedLLM(script=SCRIPT)).query("q")
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best
    assert (resp.metadata or {})["rewards"] == [REWARDS[t] for t in SCRIPT[:n]]


def test_one_invalid_reward_in_a_batch_fails_only_its_sample() -> None:
    # As in the engine: b (NaN) and c (a non-numeric string) fail, each on its own sample and
    # named by its position; the others (numeric string, dict, float, bool) are rewards.
    out: dict[str, Any] = {"a": "0.1", "b": float("nan"), "c": "high", "d": {"score": 0.9},
                           "e": 0.15, "f": 0.3, "g": True}
    calls: list[list[str]] = []

    def score_many(q: str, ts: list[str]) -> list[Any]:
        calls.append(list(ts))
        return [out[t] for t in ts]

    cfg = BeaconConfig(cost=0.001, horizon=7, batch_size=3, max_failures=10)
    qe = BeaconQueryEngine(BatchScorer(score_many), cfg, llm=ScriptedLLM(script=SCRIPT))
    res = asyncio.run(qe.arun(QueryBundle("q")))
    assert calls[0] == ["a", "b", "c"]
    assert res.stop_reason in ("index", "horizon") and len(res.scored) == res.n_samples
    values = {"a": 0.1, "d": 0.9, "e": 0.15, "f": 0.3, "g": 1.0}
    for c in res.candidates:
        if c.text in ("b", "c"):
            assert c.failed and c.reward is None and c.error is not None
            assert c.error.startswith(f"RewardError: invalid reward at position {c.index}: ")
        else:
            assert not c.failed and c.reward == values[c.text]
    assert {c.text for c in res.candidates if c.failed} == {"b", "c"}


def test_a_scorer_failing_one_candidate_is_reported_in_the_response() -> None:
    def scorer(query: str, response: str) -> float:
        if response == "c":
            raise ValueError("judge refused c")
        return table_scorer(query, response)

    qe = BeaconQueryEngine(scorer, CFG, llm=ScriptedLLM(script=SCRIPT))
    resp = qe.query("q")
    md = resp.metadata or {}
    assert resp.response == "d" and md["stop_reason"] != "error"
    i = md["candidates"].index("c")
    assert md["rewards"][i] is None and md["errors"][i] == "ValueError: judge refused c"
    assert [e for j, e in enumerate(md["errors"]) if j != i] == [None] * (len(md["errors"]) - 1)
    assert md["usage"]["failed_calls"] == 1  # a ValueError is not retried
    json.dumps(md)


def test_a_streaming_chat_engine_streams_the_chosen_answer_over_beacon() -> None:
    # CondenseQuestionChatEngine.stream_chat / astream_chat need a streaming response from their
    # query engine; BeaconQueryEngine always returned a plain Response ("Streaming is not
    # enabled. Please use chat() instead.").
    from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
    from llama_index.core.chat_engine import CondenseQuestionChatEngine
    from llama_index.core.memory import ChatMemoryBuffer

    best, n, _ = best_of(SCRIPT, CFG)
    i = SCRIPT.index(best)
    inner = ScriptedRAG(SCRIPT)
    qe = BeaconQueryEngine(table_scorer, CFG, query_engine=inner, streaming=True)
    def memory() -> ChatMemoryBuffer:  # a word tokenizer: the default one downloads tiktoken's
        return ChatMemoryBuffer.from_defaults(tokenizer_fn=str.split)

    chat = CondenseQuestionChatEngine.from_defaults(
        query_engine=qe, llm=ScriptedLLM(script=["q"]), memory=memory()
    )
    streamed = chat.stream_chat("capital?")
    assert "".join(streamed.response_gen) == best
    assert [s.node.node_id for s in streamed.source_nodes] == [inner.sources[i].node.node_id]

    resp = qe.query("capital?")  # sync: a StreamingResponse with the chosen sample's evidence
    assert isinstance(resp, StreamingResponse)
    assert resp.metadata is not None and resp.metadata["n_samples"] == n
    assert str(resp) == best

    async def astream() -> tuple[str, Any]:
        chat2 = CondenseQuestionChatEngine.from_defaults(
            query_engine=BeaconQueryEngine(table_scorer, CFG, llm=ScriptedLLM(script=SCRIPT),
                                           streaming=True),
            llm=ScriptedLLM(script=["q"]),
            memory=memory(),
        )
        r = await chat2.astream_chat("capital?")
        text = "".join([t async for t in r.async_response_gen()])
        aresp = await BeaconQueryEngine(
            table_scorer, CFG, llm=ScriptedLLM(script=SCRIPT), streaming=True
        ).aquery("q")
        return text, aresp

    text, aresp = asyncio.run(astream())
    assert text == best
    assert isinstance(aresp, AsyncStreamingResponse)
    assert (aresp.metadata or {})["n_samples"] == n
    with pytest.raises(beacon.ConfigError, match="streaming"):
        BeaconQueryEngine(table_scorer, CFG, llm=ScriptedLLM(script=SCRIPT),
                          streaming="yes")  # type: ignore[arg-type]
