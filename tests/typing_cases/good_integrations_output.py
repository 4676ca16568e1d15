"""What ``BeaconRunnable.invoke`` returns, as a type checker sees it: the best ``AIMessage`` by
default, the ``BeaconResult`` with ``return_result=True`` (docs/integrations/langchain.md)."""

from __future__ import annotations

import asyncio

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

import beacon
from beacon import BeaconResult
from beacon_integrations.langchain import BeaconChunk, BeaconRunnable

chat_model = FakeListChatModel(responses=["a", "bb"])
cfg = beacon.BeaconConfig(cost=0.5, horizon=4)


def reward(prompt: str, response: str) -> float:
    return float(len(response))


best_of_n = BeaconRunnable(model=chat_model, scorer=reward, config=cfg)
msg: AIMessage = best_of_n.invoke("Why is the sky blue?")
print(msg.content, msg.response_metadata["beacon"])
msgs: list[AIMessage] = best_of_n.batch(["a", "b"])

with_result = BeaconRunnable(model=chat_model, scorer=reward, config=cfg, return_result=True)
res: BeaconResult = with_result.invoke("Why is the sky blue?")
print(res.n_samples, res.stop_reason, res.best)
results: list[BeaconResult] = with_result.batch(["a", "b"])

annotated: BeaconRunnable = BeaconRunnable(model=chat_model, scorer=reward)  # default: AIMessage
print(annotated.invoke("q").content)
typed: BeaconRunnable[BeaconResult] = with_result
flag = len(results) > 1
either: BeaconRunnable[AIMessage | BeaconResult] = BeaconRunnable(
    model=chat_model, scorer=reward, return_result=flag
)
out = either.invoke("q")
print(out.content if isinstance(out, AIMessage) else out.n_samples)

chain = ChatPromptTemplate.from_template("Answer: {q}") | best_of_n
chained: AIMessage = chain.invoke({"q": "Why is the sky blue?"})
text: str = (best_of_n | StrOutputParser()).invoke("Why is the sky blue?")
retried: AIMessage = best_of_n.with_retry().invoke("q")
configured: BeaconResult = with_result.with_config(run_name="best").invoke("q")


async def main() -> None:
    amsg: AIMessage = await best_of_n.ainvoke("q")
    ares: BeaconResult = await with_result.ainvoke("q")
    print(amsg.content, ares.n_samples)
    async for chunk in best_of_n.astream("q"):
        c: BeaconChunk = chunk
        print(c.kind, c.reward)
    for chunk in best_of_n.stream("q"):
        print(chunk.kind, chunk.k)


asyncio.run(main())
print(typed, chained, text, retried, configured)
