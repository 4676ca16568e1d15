"""Review findings on the engine and worker audits: a prompt with parts JSON cannot hold is
dropped whole by to_dict (as before), not kept as a list of nulls. (The job-id findings are
tested in tests/test_audit7_worker.py, under the worker tier's settings.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from beacon.result import BeaconResult, Usage


def _result(prompt: object) -> BeaconResult:
    return BeaconResult(prompt=prompt, candidates=[], stop_reason="error", usage=Usage(),
                        error="x", metadata={"row": np.int64(3)})


class Message:
    """A message object (as LangChain's): not JSON."""

    content = "hi"


@pytest.mark.parametrize("prompt", [
    [Message(), Message()],
    [{"role": "user", "content": [{"type": "image", "data": b"\x89PNG"}]}],
])
def test_a_prompt_with_parts_json_cannot_hold_is_dropped_whole(prompt: object) -> None:
    d = _result(prompt).to_dict()
    assert d["prompt"] is None
    assert json.loads(json.dumps(d))["metadata"] == {"row": 3}


@pytest.mark.parametrize(("prompt", "want"), [
    (("a", np.int64(1)), ["a", 1]),
    ([{"role": "user", "content": "q"}], [{"role": "user", "content": "q"}]),
    ({"x": np.float32(0.5), "y": float("nan")}, {"x": 0.5, "y": None}),
])
def test_a_prompt_made_json_ready_keeps_its_parts(prompt: object, want: object) -> None:
    assert json.loads(json.dumps(_result(prompt).to_dict()))["prompt"] == want
