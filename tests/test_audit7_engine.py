"""Audit 7 of the engine as a Python user drives it: the defects found, each pinned by a test."""

from __future__ import annotations

import json
import math

import numpy as np

import beacon
from beacon.engine import BeaconSampler
from beacon.result import BeaconResult


def test_to_dict_dumps_numpy_metadata_and_prompt() -> None:
    # run_many over a DataFrame's rows: ids are numpy integers. to_dict() promises JSON-ready
    # output; json.dumps failed on the metadata ("int64 is not JSON serializable") and the
    # whole prompt was dropped for one numpy value in it.
    cfg = beacon.BeaconConfig(cost=0.1, horizon=8)
    sampler = BeaconSampler(lambda p: "1.5", lambda p, t: float(t), cfg)
    prompt = {"q": "2+2?", "id": np.int64(3), "tags": ("a", "b")}
    res = sampler.run(
        prompt,
        metadata={"row": np.int64(7), "w": np.float32(0.5), "ok": np.bool_(True), "nan": math.nan},
    )
    d = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert d["metadata"] == {"row": 7, "w": 0.5, "ok": True, "nan": None}
    assert d["prompt"] == {"q": "2+2?", "id": 3, "tags": ["a", "b"]}
    back = BeaconResult.from_dict(d)
    assert back.metadata["row"] == 7 and back.best is not None
    # what JSON cannot hold at all is dropped (null), as raw objects are: in metadata value by
    # value, a prompt whole (a prompt missing parts would read as another prompt); a
    # container that holds itself does not recurse for ever
    loop: dict[str, object] = {"a": 1}
    loop["self"] = loop
    odd = BeaconResult(
        prompt=loop, stop_reason="index", metadata={"obj": object(), np.int64(4): "k", (1, 2): "t"}
    )
    d = json.loads(json.dumps(odd.to_dict(), allow_nan=False))
    assert d["prompt"] is None
    assert d["metadata"] == {"obj": None, "4": "k", "(1, 2)": "t"}
    # JSON-able metadata is passed through as it is
    plain = BeaconResult(prompt="p", stop_reason="index", metadata={"a": [1, {"b": 2}]})
    assert plain.to_dict()["metadata"] == {"a": [1, {"b": 2}]}
