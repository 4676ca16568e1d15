"""The Stopper's fast path decides and records exactly what a straightforward Stopper does.

The fast path (bound family kernels, the pure-Python h lookup of
:func:`beacon.families.normal.h_index_function`, lazily built trace records) must not change a
single bit. If the table builder changes ``h_lookup``'s interpolation or tail formulas,
``test_python_h_lookup_is_bit_identical_to_the_numba_kernel`` fails: update
``h_index_function`` to the new formula.
"""

import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import t as student_t

from beacon import BeaconConfig, BetaPrior, Draw, NIGPrior, Stopper, reservation_cost
from beacon._kernels.tables import h_lookup
from beacon.families import get_family
from beacon.families.judge import WIN_THRESHOLD
from beacon.families.normal import SIGMA_FLOOR, NormalFamily, NormalState, h_index_function
from beacon.index import get_table

# (n, alpha0, nu0): shipped Jeffreys tables and the informative priors of tests/test_replay.py
TABLES = [(8, -0.5, 0.0), (32, -0.5, 0.0), (8, 3.0, 2.0), (8, 0.4, 1.0)]

NORMAL_CONFIGS = [
    BeaconConfig(cost=0.1, horizon=32),
    BeaconConfig(cost=0.02, horizon=16, robust=False),
    BeaconConfig(cost=0.05, horizon=16, batch_size=4),
    BeaconConfig(cost=0.3, horizon=12, batch_size=3, robust_quantile=0.2),
    BeaconConfig(cost=0.05, horizon=8, prior=NIGPrior(0.3, 2.0, 3.0, 0.1)),
    BeaconConfig(cost=0.05, horizon=8, prior=NIGPrior(0.5, 1.0, 0.4, 0.0), transform="logit"),
]


def _bits(x: float) -> bytes:
    """The float's IEEE-754 bytes (so -0.0 != 0.0 and NaN == NaN)."""
    return struct.pack("<d", x)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and _bits(a) == _bits(b)
    return type(a) is type(b) and a == b


def _z_samples(zlo: float, zhi: float) -> list[float]:
    rng = np.random.default_rng(20261122)
    inside = rng.uniform(zlo, zhi, 4000)
    near = np.concatenate([rng.normal(0.0, 2.0, 2000), rng.uniform(-5.0, 3.0 * zhi, 2000)])
    edges = [zlo, zhi, math.nextafter(zlo, -math.inf), math.nextafter(zlo, math.inf)]
    edges += [math.nextafter(zhi, -math.inf), math.nextafter(zhi, math.inf), 0.0, -0.0]
    far = [1e3, 1e6, 1e300, -1e3, -1e6, math.inf, -math.inf, math.nan]
    return [float(v) for v in (*inside, *near)] + edges + far


@pytest.mark.parametrize("key", TABLES, ids=lambda k: f"n{k[0]}-a{k[1]}-nu{k[2]}")
def test_python_h_lookup_is_bit_identical_to_the_numba_kernel(
    key: tuple[int, float, float],
) -> None:
    table = get_table(*key)
    args = table.lookup_arrays()
    h = h_index_function(table)
    zs = _z_samples(*table.z_range) + [float(v) for v in table.z]
    for k in range(table.k_min - 1, table.n + 1):  # one invalid row at each end (NaN)
        for z in zs:
            want = float(h_lookup(*args, k, z))
            got = h(k, z)
            assert _bits(got) == _bits(want) or (math.isnan(got) and math.isnan(want)), (k, z)


# --------------------------------------------------------------------------- references
def _reference_normal(cfg: BeaconConfig, rewards: list[float]) -> tuple[list[tuple[Any, ...]], Any]:
    """A straightforward Stopper for the normal family (the pre-fast-path algorithm).

    O(1) NIG update with the robust rule (quantile from scipy, uncached), h from the numba
    kernel, one record per decision; the rewards are fed as the decisions ask for them.
    """
    p = cfg.resolved_prior
    assert isinstance(p, NIGPrior)
    n, tr = cfg.horizon, cfg.transform
    k, z, mu, nu, alpha, beta = 0, -math.inf, p.mu0, p.nu0, p.alpha0, p.beta0

    def scale() -> float:
        if k < p.k0 or nu <= 0 or alpha <= 0:
            return math.nan
        return max(SIGMA_FLOOR, math.sqrt((nu + 1.0) * beta / (nu * alpha)))

    sigma = scale()
    records: list[tuple[Any, ...]] = []
    nan = math.nan
    i = 0
    while True:
        if k < cfg.k0:
            count = cfg.k0 - k
            records.append((k, z, mu, sigma, nan, nan, nan, "draw", count, None))
        elif k >= n:
            records.append((k, z, mu, sigma, nan, nan, nan, "stop", 0, "horizon"))
            break
        else:
            zhat = (z - mu) / sigma
            table = get_table(n, p.alpha0, p.nu0)
            h = float(h_lookup(*table.lookup_arrays(), k, zhat))
            thr = cfg.cost / sigma
            if not h > thr:
                records.append((k, z, mu, sigma, zhat, h, thr, "stop", 0, "index"))
                break
            count = min(cfg.batch_size, n - k)
            records.append((k, z, mu, sigma, zhat, h, thr, "draw", count, None))
        if i + count > len(rewards):
            break
        for raw in rewards[i : i + count]:
            x = raw if tr is None else tr.apply_scalar(raw)
            r_model = x
            if cfg.robust and k >= p.k0 and alpha > 0 and nu > 0:
                q = mu + sigma * float(student_t.ppf(cfg.robust_quantile, 2.0 * alpha))
                if x < q:
                    r_model = mu
            d = r_model - mu
            nu1 = nu + 1.0
            beta = beta + nu * d * d / (2.0 * nu1)
            mu, nu, alpha, k, z = mu + d / nu1, nu1, alpha + 0.5, k + 1, max(z, x)
            sigma = scale()
        i += count
    return records, NormalState(k, z, mu, nu, alpha, beta, p.k0, sigma)


def _reference_bernoulli(
    cfg: BeaconConfig, rewards: list[float]
) -> tuple[list[tuple[Any, ...]], Any]:
    """A straightforward Stopper for ``bernoulli`` / ``judge`` (wins w = r, or 1{r > 1/2})."""
    p = cfg.resolved_prior
    assert isinstance(p, BetaPrior)
    judge = cfg.family == "judge"
    n, c, nan = cfg.horizon, cfg.cost, math.nan
    k, z, a, b = 0, -math.inf, p.a0, p.b0
    records: list[tuple[Any, ...]] = []
    i = 0
    while True:
        mu = a / (a + b)
        if k < cfg.k0:
            count = cfg.k0 - k
            records.append((k, z, mu, nan, nan, nan, nan, "draw", count, None))
        elif k >= n:
            records.append((k, z, mu, nan, nan, nan, nan, "stop", 0, "horizon"))
            break
        elif (z > WIN_THRESHOLD) if judge else (z >= 1.0):
            records.append((k, z, mu, nan, nan, 0.0, c, "stop", 0, "absorbed"))
            break
        else:
            h = reservation_cost(n, k, a, b)
            if not c < h:
                records.append((k, z, mu, nan, nan, h, c, "stop", 0, "index"))
                break
            count = min(cfg.batch_size, n - k)
            records.append((k, z, mu, nan, nan, h, c, "draw", count, None))
        if i + count > len(rewards):
            break
        for r in rewards[i : i + count]:
            w = (1.0 if r > WIN_THRESHOLD else 0.0) if judge else r
            k, z, a, b = k + 1, max(z, r), a + w, b + 1.0 - w
        i += count
    return records, (k, z, a, b)


def _drive(cfg: BeaconConfig, rewards: list[float], mode: str) -> Stopper:
    """Feed ``rewards`` as asked: one float at a time, a list per draw, or numpy scalars."""
    s = Stopper(cfg)
    i = 0
    while isinstance(d := s.next_decision(), Draw) and i + d.count <= len(rewards):
        chunk = rewards[i : i + d.count]
        if mode == "scalars":
            for r in chunk:
                s.observe(r)
        elif mode == "list":
            s.observe(chunk)
        else:
            s.observe(np.asarray(chunk))
        i += d.count
        if mode == "scalars":
            assert s.trace == s.trace  # reading the (lazy) trace mid-run changes nothing
    return s


def _assert_same_run(s: Stopper, ref: tuple[list[tuple[Any, ...]], Any]) -> None:
    records, state = ref
    got = [tuple(rec) for rec in s.trace]
    assert len(got) == len(records)
    for g, w in zip(got, records, strict=True):
        assert all(_same(a, b) for a, b in zip(g, w, strict=True)), (g, w)
    assert all(_same(a, b) for a, b in zip(tuple(s.state), tuple(state), strict=True))


def _normal_rewards(seed: int, cfg: BeaconConfig) -> list[float]:
    rng = np.random.default_rng(seed)
    x = rng.normal(rng.normal(), rng.uniform(0.2, 3.0), size=cfg.horizon)
    x[rng.random(x.size) < 0.1] -= 50.0  # low outliers for the robust rule
    x[rng.random(x.size) < 0.1] = x[0]  # ties
    if cfg.transform is not None:  # logit: rewards in (0, 1)
        x = 1.0 / (1.0 + np.exp(-x))
    return [float(v) for v in x]


@pytest.mark.parametrize("mode", ["scalars", "list", "numpy"])
@pytest.mark.parametrize("cfg", NORMAL_CONFIGS, ids=lambda c: f"n{c.horizon}-b{c.batch_size}")
def test_normal_stopper_equals_the_reference(cfg: BeaconConfig, mode: str) -> None:
    stops = set()
    for seed in range(25):
        rewards = _normal_rewards(seed, cfg)
        s = _drive(cfg, rewards, mode)
        _assert_same_run(s, _reference_normal(cfg, rewards))
        stops.add(s.k)
    assert len(stops) > 1 or cfg.horizon == 8  # the index decided something


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.floats(-1e6, 1e6), min_size=3, max_size=32),
    cost=st.floats(1e-6, 2.0),
    robust=st.booleans(),
)
def test_normal_stopper_equals_the_reference_property(
    rewards: list[float], cost: float, robust: bool
) -> None:
    cfg = BeaconConfig(cost=cost, horizon=32, robust=robust)
    _assert_same_run(_drive(cfg, rewards, "scalars"), _reference_normal(cfg, rewards))


@pytest.mark.parametrize(
    "cfg",
    [
        BeaconConfig(family="bernoulli", cost=0.05, horizon=30),
        BeaconConfig(
            family="bernoulli", cost=0.01, horizon=20, batch_size=4, prior=BetaPrior(0.5, 3)
        ),
        BeaconConfig(family="judge", cost=0.02, horizon=11),
        BeaconConfig(family="judge", cost=0.2, horizon=11, batch_size=2, prior=BetaPrior(2, 5)),
    ],
    ids=lambda c: f"{c.family}-n{c.horizon}-b{c.batch_size}",
)
def test_bernoulli_stopper_equals_the_reference(cfg: BeaconConfig) -> None:
    rng = np.random.default_rng(5)
    for _ in range(40):
        p = rng.uniform(0.0, 0.2)
        if cfg.family == "judge":
            x = np.where(rng.random(cfg.horizon) < p, rng.uniform(0.5, 1.0), rng.uniform(0, 0.5))
            x[rng.random(cfg.horizon) < 0.05] = 0.5  # on the boundary: not a win
        else:
            x = (rng.random(cfg.horizon) < p).astype(float)
        rewards = [float(v) for v in x]
        for mode in ("scalars", "list"):
            _assert_same_run(_drive(cfg, rewards, mode), _reference_bernoulli(cfg, rewards))


def test_bound_kernels_equal_the_public_methods() -> None:
    cfg = BeaconConfig(cost=0.05, horizon=16, prior=NIGPrior(0.3, 2.0, 3.0, 0.1))
    fam = get_family("normal")
    bound = fam.bind(cfg)
    s = fam.initial_state(cfg)
    for r in _normal_rewards(3, cfg):
        if s.k >= cfg.k0:
            assert tuple(fam.decide(s, cfg)) == bound.decide(s)
        s1, s2 = fam.update(s, r, cfg), bound.update(s, r)
        assert bound.view is not None and type(bound.view(s2)) is type(s1) is NormalState
        assert all(_same(a, b) for a, b in zip(s1, s2, strict=True))
        s = s1


def test_a_subclass_overriding_the_update_is_honoured() -> None:
    class Clipped(NormalFamily):
        def update(self, state: NormalState, reward: float, cfg: BeaconConfig) -> NormalState:
            return super().update(state, min(reward, 1.0), cfg)

    cfg = BeaconConfig(horizon=8)
    bound = Clipped().bind(cfg)
    s = bound.update(Clipped().initial_state(cfg), 5.0)
    assert s.z == 1.0


def test_trace_is_a_copy_and_grows_with_decisions() -> None:
    s = Stopper(BeaconConfig(horizon=8, cost=1e-9))
    s.next_decision()
    first = s.trace
    first.clear()
    s.observe([0.1, 0.4, 0.2])
    s.next_decision()
    assert [t.k for t in s.trace] == [0, 3]
    assert s.trace[1].decision == "draw" and math.isfinite(s.trace[1].h)
