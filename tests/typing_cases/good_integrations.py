"""BeaconRunnable / BeaconQueryEngine construction as docs/integrations/*.md show it."""

from __future__ import annotations

from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate
from llama_index.core.llms import MockLLM

import beacon
from beacon import BeaconResult, Budget, RetryPolicy
from beacon_integrations.langchain import BeaconChunk, BeaconRunnable, BeaconSamplingError
from beacon_integrations.llama_index import BeaconQueryEngine

chat_model = FakeListChatModel(responses=["a", "b"])


def reward(prompt: str, response: str) -> float:
    return float(len(response))


async def areward(prompt: str, response: str) -> float:
    return float(len(response))


best_of_n = BeaconRunnable(
    model=chat_model,
    scorer=reward,
    config=beacon.BeaconConfig(cost=0.5, horizon=16),
)
BeaconRunnable(
    model=FakeListLLM(responses=["4"]),
    scorer=lambda prompt, response: float(len(response)),
    config=beacon.BeaconConfig(cost=0.5, horizon=4),
    retry=RetryPolicy(max_attempts=2),
    budget=Budget(max_cost=1.0),
    timeout=None,
    max_concurrency=4,
    return_result=True,
)
BeaconRunnable(model=chat_model, scorer=areward, config={"cost": 0.5, "horizon": 16})
chain = ChatPromptTemplate.from_template("Answer: {q}") | best_of_n
msg = best_of_n.invoke("Why is the sky blue?")
print(msg, chain)
am: AIMessage | None = BeaconRunnable.best_message(BeaconResult(prompt="x"))
tool = best_of_n.as_beacon_tool("best_answer", "Answer a hard question carefully.")
print(tool.name, BeaconChunk, BeaconSamplingError)


async def stream() -> None:
    async for chunk in best_of_n.astream("Why is the sky blue?"):
        print(chunk)


engine = BeaconQueryEngine(
    lambda query, text: float(len(text)),
    beacon.BeaconConfig(cost=0.5, horizon=4),
    llm=MockLLM(max_tokens=8),
)
engine2 = BeaconQueryEngine(areward, beacon.BeaconConfig(cost=0.5, horizon=4), llm=MockLLM())
resp = engine.query("What is 2 + 2?")
print(resp, engine.config, engine.sampler, engine2)

# framework models given straight to the engine (duck-typed ainvoke / acomplete)
from beacon import BeaconSampler  # noqa: E402

BeaconSampler(chat_model, reward, beacon.BeaconConfig())
BeaconSampler(MockLLM(), areward, beacon.BeaconConfig())
BeaconSampler(ChatPromptTemplate.from_template("{q}") | chat_model, reward, beacon.BeaconConfig())
