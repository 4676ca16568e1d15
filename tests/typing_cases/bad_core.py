"""Wrong uses of the core API that a type checker must reject.

Each line expected to fail ends with ``# E: <mypy error code>``; tests/test_typing.py checks
that mypy reports exactly these errors (file, line, code) and no others.
"""

from __future__ import annotations

import numpy as np

import beacon
from beacon import BeaconConfig, Draw, NIGPrior, Stopper, replay

cfg = BeaconConfig(cost="0.1")  # E: arg-type
BeaconConfig(horizn=8)  # E: call-arg
BeaconConfig(prior=0.5)  # E: arg-type
cfg.cost = 0.2  # E: misc

s = Stopper({"cost": 0.1})  # E: arg-type
d = beacon.Stopper(BeaconConfig()).next_decision()
print(d.count)  # E: union-attr
if isinstance(d, Draw):
    print(d.reason)  # E: attr-defined
s.observe("0.5")  # E: arg-type

rr = replay(np.zeros((2, 3)), {"cost": 0.1})  # E: arg-type
mean: int = replay(np.zeros((2, 3)), BeaconConfig()).mean_samples  # E: assignment

h: float = beacon.h_index(32, 5, np.zeros(3))  # E: assignment
print(beacon.h_index(32, 5, 0.7).shape)  # E: attr-defined
beacon.h_index(32, 5, 0.7, prior=beacon.BetaPrior())  # E: call-overload
NIGPrior(mu0="0")  # E: arg-type
