"""Review findings on the engine and worker audits: a prompt with parts JSON cannot hold is
dropped whole by to_dict (as before), not kept as a list of nulls; job ids with format
characters (a Persian word's zero-width non-joiner, an emoji sequence's joiner) are accepted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beacon import BeaconConfig
from beacon.jobs import FactorySpec, JobSpec
from beacon.jobs.spec import JobInputError
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


@pytest.mark.parametrize("job_id", [
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian, with a ZWNJ
    "run-\U0001f468\u200d\U0001f469\u200d\U0001f467",  # an emoji family (ZWJ)
    "night\xadrun",  # a soft hyphen
])
def test_job_ids_with_format_characters_are_accepted(job_id: str) -> None:
    from worker.tasks import _check_submit_args  # not at collection: it reads BEACON_* once

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   BeaconConfig(cost=0.1, horizon=4))
    _check_submit_args([], spec, job_id, None, "", False, 500, None, None)  # raises if refused


@pytest.mark.parametrize("job_id", ["a b", "a\tb", "a\nb", "a\x07b"])
def test_job_ids_with_spaces_or_control_characters_are_still_refused(job_id: str) -> None:
    from worker.tasks import _check_submit_args

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   BeaconConfig(cost=0.1, horizon=4))
    with pytest.raises(JobInputError, match="job_id"):
        _check_submit_args([], spec, job_id, None, "", False, 500, None, None)
