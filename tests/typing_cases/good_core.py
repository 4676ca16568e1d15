"""Core API as README.md / docs/concepts.md use it: config, Stopper, replay, priors, h_index."""

from __future__ import annotations

from typing import assert_type

import numpy as np
import numpy.typing as npt

import beacon
from beacon import (
    BeaconConfig,
    BetaPrior,
    Draw,
    NIGPrior,
    ReplayResult,
    Stop,
    Stopper,
    TraceRecord,
    replay,
)

cfg = beacon.BeaconConfig(cost=0.1, horizon=8)
cfg2 = BeaconConfig(cost=0.02, horizon=16, family="bernoulli", prior=BetaPrior(1.0, 1.0))
cfg3 = BeaconConfig(prior=NIGPrior(mu0=0.0, nu0=1.0, alpha0=1.0, beta0=1.0), transform="logit")
cfg4 = cfg.replace(cost=0.2)
assert_type(cfg4, BeaconConfig)
assert_type(cfg.k0, int)
assert_type(cfg.cost, float)
d_cfg = cfg.to_dict()
assert_type(BeaconConfig.from_dict(d_cfg), BeaconConfig)

s = beacon.Stopper(cfg)
rewards = iter([0.2, 0.9, 0.4, 0.5, 0.3, 0.6, 0.45, 0.5])
while isinstance(d := s.next_decision(), beacon.Draw):
    s.observe([next(rewards) for _ in range(d.count)])
assert_type(d, Stop)
reason: str = d.reason
best_index: int = s.best_index
best_reward: float = s.best_reward
k: int = s.k
for rec in s.trace:
    assert_type(rec, TraceRecord)
    zhat: float = rec.zhat
    h: float = rec.h
    decision: str = rec.decision

s2 = Stopper(cfg2)
dec = s2.next_decision()
if isinstance(dec, Draw):
    s2.observe(1.0)
    s2.observe(np.array([1.0]))  # a numpy array of rewards
    s2.observe((0.0, 1.0))
elif isinstance(dec, Stop):
    print(dec.reason)
s2.discard(1)
stopped: Stop | None = s2.stopped
print(s2.state, s2.pending, s2.config, beacon.STOP_REASONS)

# replay on a numpy array and on a list of lists
arr = np.random.default_rng(0).normal(size=(10, 8))
rr = replay(arr, cfg)
assert_type(rr, ReplayResult)
n_used: npt.NDArray[np.int64] = rr.n_samples
best: npt.NDArray[np.float64] = rr.best_reward
mean: float = rr.mean_samples
rr2 = beacon.replay([[0.1, 0.5, 0.3], [0.2, 0.4, float("nan")]], cfg)
print(len(rr2), rr2.stop_reason, rr2.truncated, rr2.chosen)

# priors
p = NIGPrior.jeffreys()
assert_type(p, NIGPrior)
k0: int = p.k0
bp = BetaPrior(a0=2, b0=3)
prior: NIGPrior | BetaPrior = beacon.load_prior("prior.json") if False else bp
pd = p.to_dict()
print(pd, bp.to_dict(), prior)

# h_index: float in, float out; array in, array out
hf = beacon.h_index(32, 5, 0.7)
assert_type(hf, float)
hf2: float = beacon.h_index(32, 5, 1)
ha = beacon.h_index(32, 5, np.linspace(0.0, 3.0, 7))
assert_type(ha, npt.NDArray[np.float64])
print(ha.shape, hf + 1.0, hf2)
hp = beacon.h_index(16, 4, 0.5, prior=NIGPrior(nu0=1.0, alpha0=1.0, beta0=1.0))
print(hp + 1.0)

# beacon.index
from beacon.index import get_table, h_index  # noqa: E402

t = get_table(32)
assert_type(t.h(5, 0.7), float)
assert_type(t.h(5, np.linspace(0, 3, 7)), npt.NDArray[np.float64])
assert_type(h_index(32, 5, 0.7), float)
assert_type(h_index(32, 5, np.zeros(3)), npt.NDArray[np.float64])
lo, hi = t.z_range

# reservation cost (bernoulli index)
rc: float = beacon.reservation_cost(16, 2, 1.0, 3.0)
fams: list[str] = beacon.available_families()
fam = beacon.get_family("normal")
assert_type(fam, beacon.RewardFamily)
tr = beacon.LogitTransform(eps=1e-3)
tra: npt.NDArray[np.float64] = tr.apply([0.2, 0.3])
print(rc, fams, tra, beacon.__version__)

# numpy scalars as rewards, a PathLike prior file
s3 = Stopper(BeaconConfig(horizon=np.int64(8), cost=np.float64(0.1), robust=np.bool_(True)))
if isinstance(s3.next_decision(), Draw):
    s3.observe(np.float32(0.5))
    s3.observe([np.float32(0.5), 1])
from pathlib import Path  # noqa: E402

if False:
    beacon.load_prior(Path("prior.json"))
