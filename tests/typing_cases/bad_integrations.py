"""Wrong uses of the framework adapters that a type checker must reject (see bad_core.py)."""

from __future__ import annotations

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from llama_index.core.llms import MockLLM

import beacon
from beacon_integrations.langchain import BeaconRunnable
from beacon_integrations.llama_index import BeaconQueryEngine


def reward(prompt: str, response: str) -> float:
    return 1.0


chat = FakeListChatModel(responses=["a"])
BeaconRunnable(model=chat, scorer=reward, config="cost=0.5")  # E: call-overload
BeaconRunnable(model=chat, scorer=reward, retry=3)  # E: call-overload
BeaconRunnable(scorer=reward)  # E: call-overload
BeaconQueryEngine(reward, beacon.BeaconConfig(), llm=MockLLM(), max_concurrency="4")  # E: arg-type
BeaconQueryEngine(reward, "cfg", llm=MockLLM())  # E: arg-type
