"""BeaconResult: best, preference pairs (the paper's DPO rule), JSON round trip."""

from __future__ import annotations

import json
import math

import pytest

import beacon
from beacon.result import BeaconResult, Candidate, Usage
from beacon.stopper import TraceRecord


def make(rewards: list[float | None], **kw: object) -> BeaconResult:
    cands = [
        Candidate(i, f"t{i}", r, failed=r is None, error=None if r is not None else "X: y")
        for i, r in enumerate(rewards)
    ]
    return BeaconResult(prompt="p", candidates=cands,
                        n_samples=sum(r is not None for r in rewards), stop_reason="index",
                        **kw)  # type: ignore[arg-type]


def test_best_is_highest_reward_first_on_ties_and_skips_failures() -> None:
    res = make([0.5, None, 2.0, 2.0, -1.0])
    assert res.best is not None and (res.best.index, res.best.reward) == (2, 2.0)
    assert res.best_text == "t2" and res.best_reward == 2.0
    assert res.n_failed == 1 and len(res.scored) == 4
    assert make([None, None]).best is None


def test_preference_pair_best_and_worst() -> None:
    pair = make([0.5, None, 2.0, -1.0, -1.0, 1.0]).preference_pair()
    assert pair is not None
    chosen, rejected = pair
    assert (chosen.index, chosen.reward) == (2, 2.0)
    assert (rejected.index, rejected.reward) == (3, -1.0)


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0], [0.0], [], [None, 3.0], [None, None]])
def test_preference_pair_none_when_all_equal_or_too_few(rewards: list[float | None]) -> None:
    assert make(rewards).preference_pair() is None


def test_json_round_trip() -> None:
    trace = [
        TraceRecord(0, -math.inf, 0.0, math.nan, math.nan, math.nan, math.nan, "draw", 3),
        TraceRecord(3, 2.0, 1.0, 0.5, 2.0, 0.01, 0.2, "stop", 0, "index"),
    ]
    usage = Usage(model_calls=5, score_calls=4, failed_calls=1, retries=1, cancelled=2,
                  input_tokens=10, output_tokens=30, cost=0.25, wall_seconds=1.5)
    res = make([0.5, None, 2.0, 1.0], trace=trace, usage=usage, metadata={"id": 7},
               config=beacon.BeaconConfig(cost=0.1, horizon=8, family="bernoulli").to_dict())
    res.candidates[0].raw = object()  # in-memory only
    res.candidates[0].usage = Usage(model_calls=1, input_tokens=3, wall_seconds=0.2)
    d = res.to_dict()
    text = json.dumps(d, allow_nan=False)
    back = BeaconResult.from_dict(json.loads(text))
    assert back.to_dict() == d
    # the records themselves come back: z before any reward is -inf, undefined floats NaN
    assert back.trace[0].z == -math.inf and math.isnan(back.trace[0].sigma)
    assert back.trace[1] == trace[1]
    assert back.best is not None and back.best.index == 2
    assert back.trace[0].k == 0 and math.isnan(back.trace[0].sigma)
    assert back.trace[1].reason == "index" and back.usage.cost == 0.25
    assert back.candidates[1].failed and back.candidates[1].reward is None
    assert back.candidates[0].latency == 0.2 and back.candidates[0].raw is None
    assert back.usage.calls == 9 and back.metadata == {"id": 7}
    assert d["best_index"] == 2 and d["best_text"] == "t2"


def test_non_json_prompt_is_dropped_from_dict() -> None:
    res = make([1.0])
    res.prompt = object()
    assert res.to_dict()["prompt"] is None
    json.dumps(res.to_dict())


def test_from_dict_validates_stop_reason() -> None:
    d = make([1.0]).to_dict()
    d["stop_reason"] = "bored"
    with pytest.raises(beacon.ConfigError, match="stop_reason"):
        BeaconResult.from_dict(d)
    with pytest.raises(beacon.ConfigError, match="result"):
        BeaconResult.from_dict([])  # type: ignore[arg-type]


def _good() -> dict[str, object]:
    res = make([0.5, None, 2.0])
    res.trace = [TraceRecord(3, 2.0, 1.0, 0.5, 2.0, 0.01, 0.2, "stop", 0, "index")]
    return json.loads(json.dumps(res.to_dict()))


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("candidates", 0, "index"), None, "candidates[0].index"),
        (("candidates", 1, "index"), 1.5, "candidates[1].index"),
        (("candidates", 0, "reward"), "0.5", "candidates[0].reward"),
        (("candidates", 0, "reward"), math.nan, "candidates[0].reward"),
        (("candidates", 2, "failed"), "false", "candidates[2].failed"),
        (("candidates", 0, "text"), None, "candidates[0].text"),
        (("candidates", 0, "usage", "model_calls"), -1, "candidates[0].usage.model_calls"),
        (("candidates", 1), 7, "candidates[1]"),
        (("candidates",), "abc", "candidates"),
        (("usage", "cost"), math.inf, "usage.cost"),
        (("usage", "input_tokens"), "10", "usage.input_tokens"),
        (("usage",), [1, 2], "usage"),
        (("n_samples",), "3", "n_samples"),
        (("trace", 0, "z"), None, None),  # z=None is valid: -inf before any reward
        (("trace", 0), {"k": 1}, "trace[0]"),
        (("metadata",), [("a", 1)], "metadata"),
        (("error",), 3, "error"),
    ],
)
def test_from_dict_names_the_malformed_field(
    path: tuple[object, ...], value: object, field: str | None
) -> None:
    # Malformed data raised KeyError / AttributeError / TypeError from deep inside, or was
    # silently coerced ("false" -> True, None -> "None", 1.5 -> 1, a NaN reward kept).
    d = _good()
    target: object = d
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    if value is None and path[-1] == "index":
        del target[path[-1]]  # type: ignore[attr-defined]
    else:
        target[path[-1]] = value  # type: ignore[index]
    if field is None:
        assert BeaconResult.from_dict(d).trace[0].z == -math.inf
        return
    with pytest.raises(beacon.ConfigError) as ei:
        BeaconResult.from_dict(d)
    assert ei.value.field == field


def test_candidate_and_usage_from_dict_check_their_own_fields() -> None:
    with pytest.raises(beacon.ConfigError, match=r"candidate\.index"):
        Candidate.from_dict({"text": "x"})
    with pytest.raises(beacon.ConfigError, match=r"usage\.wall_seconds"):
        Usage.from_dict({"wall_seconds": -1.0})
    assert Usage.from_dict({"calls": 9, "model_calls": 4}).calls == 4  # calls is derived


def test_budget_unenforced_round_trips_and_is_checked() -> None:
    res = make([1.0], budget_unenforced=["max_cost"])
    d = json.loads(json.dumps(res.to_dict()))
    assert d["budget_unenforced"] == ["max_cost"]
    assert BeaconResult.from_dict(d) == res
    del d["budget_unenforced"]  # older JSON, without the key
    assert BeaconResult.from_dict(d).budget_unenforced == []
    with pytest.raises(beacon.ConfigError, match="budget_unenforced") as ei:
        BeaconResult.from_dict({**d, "budget_unenforced": ["max_seconds"]})
    assert ei.value.field == "budget_unenforced[0]" and ei.value.value == "max_seconds"
