"""A structured-output judge (``with_structured_output(Grade)``: a pydantic model, or a
dataclass, with a ``score`` / ``reward`` field) is read as a reward by the adapters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel

import beacon
from beacon.retry import RetryPolicy
from beacon_integrations._adapt import to_reward
from beacon_integrations.langchain import BeaconRunnable


class Grade(BaseModel):
    reasoning: str
    score: float


class Verdict(BaseModel):
    reward: int


@dataclass
class Rating:
    score: float
    note: str = ""


@pytest.mark.parametrize(("value", "want"), [
    (Grade(reasoning="fine", score=0.75), 0.75),
    (Verdict(reward=1), 1.0),
    (Rating(0.25), 0.25),
])
def test_structured_outputs_are_rewards(value: Any, want: float) -> None:
    assert to_reward(value) == want


def test_a_structured_output_without_a_number_is_a_named_reward_error() -> None:
    class Bad(BaseModel):
        score: str

    with pytest.raises(beacon.RewardError, match="non-numeric"):
        to_reward(Bad(score="great"), 3)


def test_a_langchain_structured_judge_scores_the_samples() -> None:
    judge = RunnableLambda(lambda d: Grade(reasoning="r", score=len(d["response"]) / 10))
    r = BeaconRunnable(
        model=RunnableLambda(lambda q: "abcdef"), scorer=judge,
        config=beacon.BeaconConfig(cost=0.5, horizon=4), return_result=True,
        retry=RetryPolicy.none(),
    )
    res = r.invoke("q")
    assert res.n_failed == 0 and res.best is not None and res.best.reward == pytest.approx(0.6)
