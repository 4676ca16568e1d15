"""Wrong uses of ``BeaconRunnable``'s output that a type checker must reject: ``invoke`` is not
``Any`` (see good_integrations_output.py)."""

from __future__ import annotations

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage

from beacon import BeaconResult
from beacon_integrations.langchain import BeaconRunnable


def reward(prompt: str, response: str) -> float:
    return 1.0


chat = FakeListChatModel(responses=["a"])
best_of_n = BeaconRunnable(model=chat, scorer=reward)
with_result = BeaconRunnable(model=chat, scorer=reward, return_result=True)
n: int = best_of_n.invoke("q")  # E: assignment
n_samples = best_of_n.invoke("q").n_samples  # E: attr-defined
res: BeaconResult = best_of_n.invoke("q")  # E: assignment
msg: AIMessage = with_result.invoke("q")  # E: assignment
content = with_result.invoke("q").content  # E: attr-defined
texts: list[str] = best_of_n.batch(["q"])  # E: assignment
flag = bool(len("q"))
either = BeaconRunnable(model=chat, scorer=reward, return_result=flag)
text = either.invoke("q").content  # E: union-attr
