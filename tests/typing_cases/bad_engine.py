"""Wrong uses of the engine API that a type checker must reject (see bad_core.py)."""

from __future__ import annotations

import beacon
from beacon import BeaconEvent, BeaconSampler, Budget, Generation, RetryPolicy


def generate(prompt: str) -> str:
    return prompt


def score(prompt: str, response: str) -> float:
    return 1.0


def observer(ev: BeaconEvent) -> None:
    pass


cfg = beacon.BeaconConfig()
BeaconSampler(generate, score)  # E: call-arg
BeaconSampler(generate, 0.5, cfg)  # E: arg-type
BeaconSampler("gpt-4o", score, cfg)  # E: arg-type
BeaconSampler(generate, lambda text: 1.0, cfg)  # E: arg-type, misc
BeaconSampler(generate, score, cfg, retry=3)  # E: arg-type
BeaconSampler(generate, score, cfg, observers=observer)  # E: arg-type
BeaconSampler(generate, score, cfg, observers=[lambda: None])  # E: list-item, misc
RetryPolicy(retry_on=lambda: True)  # E: arg-type, misc
Budget(max_tokens="10k")  # E: arg-type
Generation(text=1)  # E: arg-type

res = BeaconSampler(generate, score, cfg).run("q")
print(res.best.text)  # E: union-attr
n: str = res.n_samples  # E: assignment
many: list[str] = BeaconSampler(generate, score, cfg).run_many(["a"])  # E: assignment
