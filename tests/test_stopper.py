"""The Stopper state machine (family-independent behaviour; bernoulli keeps it table-free)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beacon import BeaconConfig, Draw, NIGPrior, RewardError, Stop, Stopper, StopperStateError
from beacon.index import get_table


def _bern(**kw: object) -> BeaconConfig:
    return BeaconConfig(family="bernoulli", **kw)  # type: ignore[arg-type]


def test_first_draw_is_k0_then_one() -> None:
    cfg = BeaconConfig(horizon=8)
    s = Stopper(cfg)
    assert s.next_decision() == Draw(3)
    assert s.next_decision() == Draw(3)  # idempotent while pending
    assert s.pending == 3


def test_observe_before_draw_and_after_stop_are_errors() -> None:
    s = Stopper(_bern(horizon=4))
    with pytest.raises(StopperStateError):
        s.observe(0)
    s.next_decision()
    with pytest.raises(StopperStateError):
        s.observe([0, 0])  # more than pending
    s.observe(1)
    assert s.next_decision() == Stop("absorbed")
    with pytest.raises(StopperStateError):
        s.observe(0)


def test_always_stops_at_the_horizon() -> None:
    s = Stopper(_bern(horizon=5, cost=1e-9))
    n = 0
    while isinstance(d := s.next_decision(), Draw):
        s.observe([0] * d.count)
        n += d.count
    assert n == 5 and d == Stop("horizon")
    assert s.trace[-1].decision == "stop" and s.trace[-1].reason == "horizon"


def test_batch_mode_draws_min_b_and_remaining() -> None:
    s = Stopper(_bern(horizon=7, cost=1e-9, batch_size=3))
    counts = []
    while isinstance(d := s.next_decision(), Draw):
        counts.append(d.count)
        s.observe([0] * d.count)
    assert counts == [1, 3, 3]


def test_rewards_of_a_batch_may_arrive_one_at_a_time_and_failures_are_discarded() -> None:
    s = Stopper(_bern(horizon=10, cost=1e-9, batch_size=4))
    s.next_decision()
    s.observe(0)
    assert s.next_decision() == Draw(4)
    s.observe(0)
    s.discard(1)
    assert s.next_decision() == Draw(2)
    s.observe([0, 0])
    assert s.k == 4
    assert s.next_decision() == Draw(4)


def test_external_stop_and_reasons() -> None:
    s = Stopper(_bern())
    s.next_decision()
    assert s.stop("budget") == Stop("budget")
    assert s.pending == 0
    with pytest.raises(ValueError):
        Stopper(_bern()).stop("tired")


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, "x", "12", b"1", None, 1 + 2j, object(), [[0.1]]]
)
def test_non_finite_reward_names_its_position(bad: object) -> None:
    s = Stopper(BeaconConfig(horizon=8))
    s.next_decision()
    s.observe(0.5)
    with pytest.raises(RewardError) as exc:
        s.observe(bad)  # type: ignore[arg-type]
    assert exc.value.position == 1
    assert s.k == 1 and s.pending == 2  # nothing of a rejected call is kept


@pytest.mark.parametrize(
    ("cfg", "good", "bad"),
    [
        (BeaconConfig(horizon=8), [0.5, 0.9], math.nan),
        (BeaconConfig(horizon=8, transform="logit"), [0.5, 0.9], 1.5),
        (BeaconConfig(horizon=8, family="bernoulli", cost=0.01, batch_size=3), [0.0, 0.0], 0.5),
    ],
)
def test_a_batch_rejected_half_way_keeps_nothing(
    cfg: BeaconConfig, good: list[float], bad: float
) -> None:
    def started() -> Stopper:
        s = Stopper(cfg)
        while s.next_decision().count < 3:  # bernoulli draws k0 = 1 first
            s.observe(good[0])
        return s

    s, fresh = started(), started()
    k, pending, best = s.k, s.pending, s.best_index
    with pytest.raises(RewardError) as exc:
        s.observe([*good, bad])
    assert exc.value.position == k + len(good)
    assert (s.k, s.pending, s.best_index) == (k, pending, best)
    assert s.state == fresh.state
    # the Stopper goes on exactly as if the rejected call never happened
    retry = [*good, good[0]]
    s.observe(retry)
    fresh.observe(retry)
    assert s.state == fresh.state and s.best_index == fresh.best_index
    assert s.next_decision() == fresh.next_decision()


@pytest.mark.parametrize(
    "bad", [{0: 0.5}, {0.5, 0.25}, 10**400, [0.5, 10**400]], ids=["dict", "set", "int", "list"]
)
def test_dicts_sets_and_huge_ints_are_reward_errors(bad: object) -> None:
    s = Stopper(BeaconConfig(horizon=8))
    s.next_decision()
    with pytest.raises(RewardError):
        s.observe(bad)  # type: ignore[arg-type]
    assert s.k == 0 and s.pending == 3


@pytest.mark.parametrize("big", [1e308, -1e308, 2e140])
def test_rewards_beyond_the_normal_range_are_reward_errors_not_nan(big: float) -> None:
    s = Stopper(BeaconConfig(horizon=8))
    s.next_decision()
    with pytest.raises(RewardError, match="rescale") as exc:
        s.observe([1.0, big, 1.0])
    assert exc.value.position == 1 and s.k == 0
    s.observe([1e139, -1e139, 5e138])  # the largest scale that is fine
    d = s.next_decision()
    assert all(math.isfinite(v) for v in (s.state.mu, s.state.sigma, s.trace[-1].h))
    assert d in (Draw(1), Stop("index"))


def test_numpy_scalars_and_iterables_are_rewards() -> None:
    s = Stopper(BeaconConfig(horizon=8))
    s.next_decision()
    s.observe(np.float32(0.25))
    s.observe(np.array(0.5))
    s.observe(x for x in [0.75])
    assert s.k == 3 and s.best_reward == 0.75 and s.best_index == 2


def test_trace_round_trip() -> None:
    s = Stopper(_bern(horizon=4))
    s.next_decision()
    s.observe(0)
    s.next_decision()
    for rec in s.trace:
        again = type(rec).from_dict(rec.to_dict())
        assert again.to_dict() == rec.to_dict()


def test_best_index_is_first_maximum() -> None:
    s = Stopper(BeaconConfig(horizon=8, cost=1e-9))
    s.next_decision()
    s.observe([0.3, 0.9, 0.9])
    assert s.best_index == 1 and s.best_reward == 0.9


@pytest.mark.parametrize("cfg", [{"horizon": 8}, None, "normal"])
def test_a_config_of_the_wrong_type_is_one_error_in_the_stopper_replay_and_sampler(
    cfg: object,
) -> None:
    # the same mistake is a TypeError and a ConfigError naming the field in all three entries
    from beacon import ConfigError, ConfigTypeError, replay
    from beacon.engine import BeaconSampler

    def gen(prompt: str) -> str:
        return prompt

    def score(prompt: str, response: str) -> float:
        return 0.0

    for call in (
        lambda: Stopper(cfg),  # type: ignore[arg-type]
        lambda: replay([[0.0] * 8], cfg),  # type: ignore[arg-type]
        lambda: BeaconSampler(gen, score, cfg),  # type: ignore[arg-type]
    ):
        with pytest.raises(
            ConfigTypeError, match=f"must be a beacon.BeaconConfig, got {type(cfg).__name__}"
        ) as e:
            call()
        assert isinstance(e.value, TypeError) and isinstance(e.value, ConfigError)
        assert e.value.field == "cfg" and e.value.value is cfg


@pytest.mark.parametrize(
    "bad",
    [
        ["0.5"],
        [b"1"],
        np.array(["0.5"]),
        [np.array("0.5")],
        [0.5, np.complex128(0.5)],
        np.array([0.5 + 0j]),
        [np.complex64(0.5)],
    ],
    ids=["str", "bytes", "str-array", "str-0d", "complex128", "complex-array", "complex64"],
)
def test_text_and_complex_elements_are_reward_errors_as_in_replay(bad: object) -> None:
    # float("0.5") parses and numpy complex drops its imaginary part: replay refuses both
    s = Stopper(BeaconConfig(horizon=8))
    s.next_decision()
    with pytest.raises(RewardError, match="real numbers"):
        s.observe(bad)  # type: ignore[arg-type]
    assert s.k == 0 and s.pending == 3


@pytest.mark.parametrize("bad", [1.5, "1", True, None])
def test_discard_needs_an_integer_count(bad: object) -> None:
    from beacon import ConfigTypeError

    s = Stopper(BeaconConfig(horizon=8))
    s.next_decision()
    with pytest.raises(ConfigTypeError) as exc:
        s.discard(bad)  # type: ignore[arg-type]
    assert exc.value.field == "count" and s.pending == 3
    s.discard(np.int64(2))
    assert s.pending == 1


@pytest.mark.parametrize("bad", ["nope", ["index"], None])
def test_stop_with_an_unknown_reason_is_a_config_error(bad: object) -> None:
    from beacon import ConfigError

    s = Stopper(BeaconConfig(horizon=8))
    with pytest.raises(ConfigError) as exc:
        s.stop(bad)  # type: ignore[arg-type]
    assert exc.value.field == "reason" and isinstance(exc.value, ValueError)
    assert s.stopped is None


def _drive(s: Stopper, rewards: list[float]) -> Draw | Stop:
    it = iter(rewards)
    while isinstance(d := s.next_decision(), Draw):
        s.observe([next(it) for _ in range(d.count)])
    return d


_COPY_CONFIGS = [
    BeaconConfig(horizon=8, cost=0.01),
    BeaconConfig(horizon=8, cost=0.01, transform="logit", batch_size=2),
    _bern(horizon=8, cost=0.05),
    BeaconConfig(family="judge", horizon=8, cost=0.05),
]


@pytest.mark.parametrize("cfg", _COPY_CONFIGS, ids=["normal", "logit", "bernoulli", "judge"])
def test_copies_and_pickles_are_independent_stoppers_in_the_same_state(
    cfg: BeaconConfig,
) -> None:
    import copy
    import pickle

    rewards = [0.0, 0.3, 0.2, 0.4, 0.1, 0.0, 0.3, 0.2]
    if cfg.family == "bernoulli":
        rewards = [0.0] * 8
    s = Stopper(cfg)
    d = s.next_decision()
    s.observe(rewards[: d.count])
    s.next_decision()  # a draw pending, one decision not yet turned into a trace record
    for clone in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        before = (s.k, s.pending, repr(s.trace))
        end = _drive(clone, rewards[s.k :])
        assert (s.k, s.pending, repr(s.trace)) == before  # the original did not move
        ref = copy.deepcopy(s)
        assert _drive(ref, rewards[s.k :]) == end
        assert repr(ref.trace) == repr(clone.trace) and repr(ref.state) == repr(clone.state)
        assert (ref.best_index, ref.best_reward) == (clone.best_index, clone.best_reward)


# --- the whole protocol and the trace, by hypothesis, against an independent recomputation ------


# (prior, horizon): Jeffreys (k0 = 3, shipped tables) and two proper priors sharing the
# on-demand table (alpha0, nu0) = (1.5, 2.0): beta0 > 0 gives k0 = 0, beta0 = 0 gives k0 = 1.
_PRIORS = [
    (NIGPrior(), 8),
    (NIGPrior(), 12),
    (NIGPrior(0.2, 2.0, 1.5, 0.5), 6),
    (NIGPrior(-0.3, 2.0, 1.5, 0.0), 6),
]


def _same(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


@settings(max_examples=60, deadline=None)
@given(
    case=st.sampled_from(_PRIORS),
    cost=st.one_of(st.just(1e-9), st.floats(1e-4, 1.0)),  # 1e-9: on to the horizon
    batch=st.integers(1, 4),
    robust=st.booleans(),
    rewards=st.lists(
        st.one_of(st.floats(-3, 3), st.sampled_from([0.0, 1.0])), min_size=12, max_size=12
    ),
)
def test_protocol_and_trace_by_hypothesis(
    case: tuple[NIGPrior, int], cost: float, batch: int, robust: bool, rewards: list[float]
) -> None:
    prior, n = case
    cfg = BeaconConfig(prior=prior, horizon=n, cost=cost, batch_size=batch, robust=robust)
    table = get_table(n, prior.alpha0, prior.nu0)
    s = Stopper(cfg)
    with pytest.raises(StopperStateError):
        s.observe(0.0)  # before any Draw
    seen = []  # (state, decision) per decision, recorded here independently of the trace
    while True:
        st_ = s.state
        d = s.next_decision()
        assert s.next_decision() == d  # asking again changes nothing
        seen.append((st_, d))
        if isinstance(d, Stop):
            break
        if len(seen) == 1:
            assert d == Draw(max(prior.k0, 1))  # k0 first
        else:
            assert d == Draw(min(batch, n - s.k))
        s.observe(rewards[s.k : s.k + d.count])
    assert s.k <= n and (s.k == n) == (d == Stop("horizon"))
    assert d.reason in ("index", "horizon")
    with pytest.raises(StopperStateError):
        s.observe(0.0)  # after Stop
    assert s.next_decision() == d
    used = rewards[: s.k]
    assert s.best_index == used.index(max(used)) and s.best_reward == max(used)
    trace = s.trace
    assert len(trace) == len(seen)
    for rec, (st_, dec) in zip(trace, seen, strict=True):
        assert (rec.k, rec.z) == (st_.k, st_.z)
        assert _same(rec.mu, st_.mu) and _same(rec.sigma, st_.sigma)
        assert rec.decision == ("draw" if isinstance(dec, Draw) else "stop")
        assert rec.count == (dec.count if isinstance(dec, Draw) else 0)
        assert rec.reason == (dec.reason if isinstance(dec, Stop) else None)
        if st_.k < max(prior.k0, 1) or st_.k == n:
            assert math.isnan(rec.h) and math.isnan(rec.threshold) and math.isnan(rec.zhat)
            continue
        assert st_.sigma >= 1e-6
        zhat = (st_.z - st_.mu) / st_.sigma
        assert rec.zhat == pytest.approx(zhat, rel=1e-12, abs=1e-12)
        assert rec.h == pytest.approx(table.h(st_.k, zhat), rel=1e-12)
        assert rec.threshold == pytest.approx(cost / st_.sigma, rel=1e-12)
        assert rec.decision == ("draw" if rec.h > rec.threshold else "stop")
        if rec.decision == "stop":
            assert rec.reason == "index"


def test_a_stopper_subclass_is_copied_and_pickled_as_itself() -> None:
    import copy
    import pickle

    s = _TaggedStopper(BeaconConfig(cost=0.1, horizon=8))
    s.tag = "user-data"
    s.next_decision()
    s.observe([0.1, 0.5, 0.3])
    for twin in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert type(twin) is _TaggedStopper and twin.tag == "user-data"
        assert twin.state == s.state and twin.next_decision() == s.next_decision()


class _TaggedStopper(Stopper):
    """A user's subclass with an attribute of its own (module level: picklable)."""

    tag: str = ""
