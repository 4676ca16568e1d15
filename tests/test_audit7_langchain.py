"""Audit 7 of the LangChain adapter beyond token counting: serialization of the spend controls,
``as_beacon_tool`` through a ``with_config`` binding, and the no-answer error across processes."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.load import dumpd, dumps, loads
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, HumanMessagePromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableLambda, RunnableSequence
from pydantic import ValidationError

from beacon import BeaconConfig, ConfigTypeError
from beacon.budget import Budget
from beacon.retry import RetryPolicy
from beacon_integrations.langchain import BeaconRunnable, BeaconSamplingError

ANSWERS = ["short", "a longer answer", "the longest answer of all", "mid answer"]
CFG = BeaconConfig(cost=0.5, horizon=8)


def length_reward(prompt: str, response: str) -> float:
    return float(len(response.split()))


class SerializableFake(FakeListChatModel):
    """A fake chat model LangChain can serialize, as a real provider's chat model is."""

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["tests", "test_audit7_langchain"]


def make(**kw: Any) -> BeaconRunnable:
    model = kw.pop("model", None) or FakeListChatModel(responses=ANSWERS)
    return BeaconRunnable(model=model, scorer=kw.pop("scorer", length_reward), config=CFG, **kw)


# -- serialization keeps the spend controls ---------------------------------------------------


def test_budget_and_retry_serialize_and_survive_a_round_trip() -> None:
    budget = Budget(
        max_tokens=1234, max_cost=0.5, price_per_input_token=1e-6, price_per_output_token=2e-6
    )
    retry = RetryPolicy.none()
    runnable = BeaconRunnable(
        model=SerializableFake(responses=ANSWERS),
        scorer=length_reward,
        config=CFG,
        budget=budget,
        retry=retry,
    )
    kwargs = dumpd(runnable)["kwargs"]
    assert kwargs["budget"] == budget.to_dict()
    assert kwargs["retry"] == retry.to_dict()
    # the scorer function has no serialized form: the loaded kwargs are rebuilt with it, as
    # the docs show for the config
    back = BeaconRunnable(
        model=runnable.model,
        scorer=length_reward,
        config=kwargs["config"],
        budget=kwargs["budget"],
        retry=kwargs["retry"],
    )
    assert back.budget == budget
    assert back.retry == retry


@pytest.mark.filterwarnings("ignore::langchain_core._api.beta_decorator.LangChainBetaWarning")
@pytest.mark.filterwarnings("ignore::beacon.budget.BudgetNotEnforcedWarning")
def test_loads_rebuilds_the_budget_and_retry_of_a_serializable_runnable() -> None:
    judge = (
        ChatPromptTemplate.from_template("Rate {response} for {prompt}")
        | SerializableFake(responses=["3"])
        | StrOutputParser()
    )
    budget = Budget(max_tokens=77, max_seconds=30.0)
    runnable = BeaconRunnable(
        model=SerializableFake(responses=ANSWERS),
        scorer=judge,
        config=CFG,
        budget=budget,
        retry=RetryPolicy(max_attempts=2),
    )
    allowed: list[type[Any]] = [
        BeaconRunnable,
        SerializableFake,
        ChatPromptTemplate,
        HumanMessagePromptTemplate,
        PromptTemplate,
        StrOutputParser,
        RunnableSequence,
    ]
    back = loads(
        dumps(runnable), valid_namespaces=["beacon_integrations", "tests"], allowed_objects=allowed
    )
    assert isinstance(back, BeaconRunnable)
    assert back.config == CFG
    assert back.budget == budget
    assert back.retry == RetryPolicy(max_attempts=2)
    assert back.invoke("q").response_metadata["beacon"]["n_samples"] >= 1


def test_a_retry_policy_with_a_predicate_is_left_out_and_bad_dicts_are_named() -> None:
    predicate = RetryPolicy(retry_on=lambda exc: True)
    assert "retry" not in dumpd(make(retry=predicate))["kwargs"]
    assert "budget" not in dumpd(make())["kwargs"]  # nothing set: nothing written
    with pytest.raises(ValidationError, match=r"budget\.max_tokenz"):
        make(budget={"max_tokenz": 10})
    with pytest.raises(ValidationError, match=r"retry\.attempts"):
        make(retry={"attempts": 2})
    with pytest.raises(ValidationError, match="max_attempts"):
        make(retry={"max_attempts": 0})


# -- as_beacon_tool through with_config --------------------------------------------------------


class ChainStarts(BaseCallbackHandler):
    """Records (name, tags, run_id, parent_run_id) of every chain run and the tool run id."""

    def __init__(self) -> None:
        self.chains: list[tuple[Any, Any, Any, Any]] = []
        self.tool_runs: list[Any] = []

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: Any, parent_run_id: Any = None, **kw: Any
    ) -> None:
        self.chains.append((kw.get("name"), kw.get("tags"), run_id, parent_run_id))

    def on_tool_start(self, serialized: Any, input_str: Any, *, run_id: Any, **kw: Any) -> None:
        self.tool_runs.append(run_id)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_with_config_binding_keeps_its_config_in_the_tool(mode: str) -> None:
    bound_handler = ChainStarts()
    # a RunnableBinding: as_beacon_tool reaches the runnable through its delegation
    bound: Any = make().with_config(
        run_name="best_of_n", tags=["bound-tag"], callbacks=[bound_handler]
    )
    tool = bound.as_beacon_tool("best_answer", "Answer carefully.")
    caller = ChainStarts()
    call = {"type": "tool_call", "id": "c1", "name": "best_answer", "args": {"question": "q"}}
    cfg: Any = {"callbacks": [caller]}
    msg = tool.invoke(call, cfg) if mode == "sync" else await tool.ainvoke(call, cfg)
    assert msg.content == max(ANSWERS[: msg.artifact["n_samples"]], key=len)
    # the bound callbacks see the BEACON run, under its bound name and tags
    runs = [c for c in bound_handler.chains if c[0] == "best_of_n"]
    assert len(runs) == 1, bound_handler.chains
    assert "bound-tag" in runs[0][1]
    # and it still nests under the tool run of the caller's call
    assert caller.tool_runs and runs[0][3] == caller.tool_runs[0]


def test_a_bound_max_concurrency_reaches_the_tools_sampling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []
    real = BeaconRunnable._sampler

    def spy(self: BeaconRunnable, config: Any) -> Any:
        seen.append(config.get("max_concurrency"))
        return real(self, config)

    bound: Any = make().with_config(max_concurrency=1)
    tool = bound.as_beacon_tool("t", "d")
    monkeypatch.setattr(BeaconRunnable, "_sampler", spy)
    tool.invoke({"question": "q"})
    assert seen == [1]


# -- the no-answer error crosses a process boundary --------------------------------------------


def test_beacon_sampling_error_pickles_and_copies_with_its_result() -> None:
    def broken(x: Any) -> str:
        raise ValueError("model down")

    with pytest.raises(BeaconSamplingError) as info:
        make(model=RunnableLambda(broken)).invoke("q")
    err = info.value
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is BeaconSamplingError
    assert str(back) == str(err)
    assert back.result.stop_reason == err.result.stop_reason == "error"
    assert back.result.n_failed == err.result.n_failed
    assert copy.copy(err).result is err.result


# -- LangGraph's messages stream shows the choice, not every candidate -------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_langgraph_messages_stream_shows_the_chosen_message_once(mode: str) -> None:
    graph_mod = pytest.importorskip("langgraph.graph")
    from langchain_core.messages import HumanMessage

    runnable = make()  # FakeListChatModel streams its answers character by character

    def node(state: Any) -> Any:
        return {"messages": [runnable.invoke(state["messages"])]}

    graph = graph_mod.StateGraph(graph_mod.MessagesState)
    graph.add_node("best_of_n", node)
    graph.add_edge(graph_mod.START, "best_of_n")
    graph.add_edge("best_of_n", graph_mod.END)
    app = graph.compile()
    inp = {"messages": [HumanMessage("Explain it")]}
    modes = ["messages", "updates"]
    if mode == "sync":
        parts = list(app.stream(inp, stream_mode=modes))
    else:
        parts = [part async for part in app.astream(inp, stream_mode=modes)]
    streamed = [item[0] for kind, item in parts if kind == "messages"]
    chosen = next(item["best_of_n"]["messages"][-1] for kind, item in parts if kind == "updates")
    # one message, the chosen one, whole: no candidate's tokens, no rejected answer
    assert chosen.response_metadata["beacon"]["n_samples"] >= 3
    assert [m.content for m in streamed] == [chosen.content]


# -- a runnable scorer that can never take {"prompt", "response"} is refused up front ----------


def _judge_forms() -> dict[str, Any]:
    judge = FakeListChatModel(responses=["4"])
    return {
        "bare chat model": judge,
        "bound chat model": judge.bind(stop=["\n"]),
        "chat model then parser": judge | StrOutputParser(),
        "template of other variables": ChatPromptTemplate.from_template("Rate {answer}")
        | judge
        | StrOutputParser(),
    }


@pytest.mark.parametrize("form", list(_judge_forms()))
def test_a_scorer_that_cannot_take_the_scorer_input_is_refused_before_any_call(form: str) -> None:
    model = FakeListChatModel(responses=ANSWERS)
    with pytest.raises(ValidationError, match="invalid scorer=") as info:
        BeaconRunnable(model=model, scorer=_judge_forms()[form], config=CFG)
    assert "{prompt}" in str(info.value) or "prompt template" in str(info.value)
    assert model.i == 0  # no model call was made, let alone paid


def test_judges_with_the_scorer_variables_are_accepted_and_score() -> None:
    judge = FakeListChatModel(responses=["4"])
    partial = ChatPromptTemplate.from_template("Q {prompt} A {response} {scale}").partial(
        scale="1-5"
    )
    for scorer in (
        ChatPromptTemplate.from_template("Q {prompt} A {response}") | judge | StrOutputParser(),
        PromptTemplate.from_template("Q {prompt}") | judge | StrOutputParser(),
        partial | judge,
    ):
        msg = make(scorer=scorer).invoke("q")
        assert set(msg.response_metadata["beacon"]["rewards"]) == {4.0}


# -- a BeaconConfig passed as the call's config is named ---------------------------------------


@pytest.mark.parametrize("call", ["invoke", "ainvoke", "batch", "abatch", "stream", "astream"])
async def test_a_beacon_config_given_as_the_call_config_is_a_typed_error(call: str) -> None:
    runnable = make()
    wrong: Any = BeaconConfig(cost=0.1, horizon=4)
    with pytest.raises(ConfigTypeError, match=r"invalid config=BeaconConfig\(.*BeaconRunnable\("):
        if call == "invoke":
            runnable.invoke("q", wrong)
        elif call == "ainvoke":
            await runnable.ainvoke("q", wrong)
        elif call == "batch":
            runnable.batch(["q", "r"], [{}, wrong])
        elif call == "abatch":
            await runnable.abatch(["q"], wrong)
        elif call == "stream":
            list(runnable.stream("q", wrong))
        else:
            [chunk async for chunk in runnable.astream("q", wrong)]
    with pytest.raises(ConfigTypeError, match="invalid config='tags'"):
        runnable.invoke("q", "tags")  # type: ignore[arg-type]


# -- a with_retry model under a binding is not retried again by the engine ---------------------


@pytest.mark.parametrize("wrap", ["bare", "with_config", "bind"])
def test_engine_retries_stay_off_for_a_bound_with_retry_model(wrap: str) -> None:
    calls: list[int] = []

    def down(x: Any) -> str:
        calls.append(1)
        raise ConnectionError("provider down")  # retryable for the engine too

    model: Any = RunnableLambda(down).with_retry(
        stop_after_attempt=2,
        wait_exponential_jitter=False,
        retry_if_exception_type=(ConnectionError,),
    )
    if wrap == "with_config":
        model = model.with_config(run_name="generate")
    elif wrap == "bind":
        model = model.bind()
    runnable = BeaconRunnable(
        model=model,
        scorer=length_reward,
        config=BeaconConfig(cost=0.5, horizon=4, max_failures=0),
        max_concurrency=1,
        return_result=True,
    )
    res = runnable.invoke("q")
    assert res.stop_reason == "error" and res.n_failed == 1
    assert len(calls) == 2  # with_retry's two attempts, not three engine attempts of two
