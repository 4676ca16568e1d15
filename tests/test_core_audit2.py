"""Second audit of the numerical core's public API: what a demanding user hits at its edges.

Typed errors crossing a process boundary, comparing replay results, reward-family plugins that
break their contract, and plugins loading while another thread asks for one.
"""

from __future__ import annotations

import copy
import math
import multiprocessing
import pickle
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import beacon
import beacon.families as families
from beacon import (
    BeaconConfig,
    ConfigError,
    ConfigTypeError,
    Draw,
    NIGPrior,
    Stop,
    Stopper,
    UnknownFamilyError,
    replay,
)
from beacon.families import RewardFamily, get_family, register_family
from beacon.families.base import Decision


@pytest.fixture(autouse=True)
def _clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test registers into a copy of the registry, so none leaks into another."""
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    monkeypatch.setattr(families, "_BROKEN", {})


# -- typed errors cross process boundaries --------------------------------------------------------
def _raised(call: Any) -> BaseException:
    try:
        call()
    except beacon.BeaconError as exc:
        return exc
    raise AssertionError("no error raised")


def _observe_nan() -> None:
    s = Stopper(BeaconConfig(horizon=8))
    s.next_decision()
    s.observe([0.1, math.nan])


ERRORS = {
    "config": lambda: BeaconConfig(cost=-1.0),
    "config type": lambda: Stopper({"cost": 0.1}),  # type: ignore[arg-type]
    "unknown family": lambda: BeaconConfig(family="no-such-family"),
    "stopper reward": _observe_nan,
    "replay reward": lambda: replay(np.array([[0.1, math.inf]]), BeaconConfig(horizon=8)),
    # a generator as the offending value: it does not pickle, the error still must
    "unpicklable value": lambda: beacon.h_index(8, 3, (z for z in [0.5])),  # type: ignore
}


def _fields(err: BaseException) -> dict[str, Any]:
    return {k: repr(v) for k, v in vars(err).items()}


@pytest.mark.parametrize("make", list(ERRORS.values()), ids=list(ERRORS))
def test_typed_errors_pickle_and_copy_with_their_fields(make: Any) -> None:
    err = _raised(make)
    protocols = range(pickle.HIGHEST_PROTOCOL + 1)
    copies = [pickle.loads(pickle.dumps(err, protocol=p)) for p in protocols]
    copies += [copy.copy(err), copy.deepcopy(err)]
    for other in copies:
        assert type(other) is type(err)
        assert str(other) == str(err)
        assert _fields(other) == _fields(err)
    if isinstance(err, UnknownFamilyError):
        assert copies[-1].known == err.known and "normal" in err.known


def _bad_config_in_a_worker(cost: float) -> BeaconConfig:
    return BeaconConfig(cost=cost)


def test_a_config_error_raised_in_a_worker_process_reaches_the_caller() -> None:
    ctx = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        future = pool.submit(_bad_config_in_a_worker, -2.0)
        with pytest.raises(ConfigError) as exc:
            future.result(timeout=60)
    assert (exc.value.field, exc.value.value) == ("cost", -2.0)


def test_an_error_subclass_with_its_own_constructor_pickles() -> None:
    class Located(ConfigTypeError):
        def __init__(self, where: str, field: str, value: Any, reason: str) -> None:
            super().__init__(field, value, reason)
            self.where = where

    err = Located("line 3", "cost", "x", "must be a number")
    again = copy.deepcopy(err)
    assert (again.where, again.field, again.value, str(again)) == (
        "line 3", "cost", "x", str(err)
    )


# -- replay results compare -----------------------------------------------------------------------
def test_replay_results_compare_by_their_arrays() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 10))
    x[2] = np.nan  # an empty row: NaN best reward
    x[3, 4:] = np.nan
    cfg = BeaconConfig(cost=0.05, horizon=10)
    first = replay(x, cfg)
    assert first == replay(x.copy(), cfg)
    assert pickle.loads(pickle.dumps(first)) == first
    assert first != replay(x[:5], cfg)
    assert first != replay(x, cfg.replace(cost=10.0))
    assert first != "not a result"
    with pytest.raises(TypeError, match="unhashable"):
        hash(first)


# -- reward-family plugins that break their contract ----------------------------------------------
class _State(NamedTuple):
    k: int
    z: float
    mu: float
    sigma: float


class _Counting(RewardFamily):
    """A well-behaved family: stops after 5 rewards."""

    def default_prior(self) -> NIGPrior:
        return NIGPrior()

    def check_prior(self, prior: Any) -> None:
        pass

    def initial_state(self, cfg: BeaconConfig) -> Any:
        return _State(0, -math.inf, 0.0, math.nan)

    def update(self, state: Any, reward: float, cfg: BeaconConfig) -> Any:
        return _State(state.k + 1, max(state.z, reward), 0.0, 1.0)

    def decide(self, state: Any, cfg: BeaconConfig) -> Any:
        cont = state.k < 5
        return Decision(cont, None if cont else "index", 0.0, 1.0, cfg.cost)


def _drive(cfg: BeaconConfig) -> Stop:
    """Run a Stopper to its stop; a bounded loop, so a Stopper that never stops fails."""
    s = Stopper(cfg)
    for _ in range(4 * cfg.horizon):
        d = s.next_decision()
        if isinstance(d, Stop):
            return d
        s.observe([0.5] * d.count)
    raise AssertionError(f"no stop within {4 * cfg.horizon} decisions at horizon {cfg.horizon}")


def _plugin(name: str, **methods: Any) -> BeaconConfig:
    register_family(name)(type(name, (_Counting,), methods))
    return BeaconConfig(cost=0.1, horizon=8, family=name)


def test_a_well_behaved_plugin_runs_and_replays() -> None:
    cfg = _plugin("counting")
    assert _drive(cfg) == Stop("index")
    assert list(replay(np.zeros((2, 8)), cfg).n_samples) == [5, 5]


BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "decide returns None": ({"decide": lambda self, s, c: None}, "decide"),
    "decide returns a bool": ({"decide": lambda self, s, c: False}, "decide"),
    "decide returns too few fields": ({"decide": lambda self, s, c: (True, None)}, "decide"),
    "decide stops for an unknown reason": (
        {"decide": lambda self, s, c: (False, "bored", 0.0, 1.0, 0.1)}, "decide"
    ),
    "update returns None": ({"update": lambda self, s, r, c: None}, "update"),
    "update returns a state without k": ({"update": lambda self, s, r, c: (1, r)}, "update"),
    # k that never advances: the Stopper would never reach the horizon
    "update does not count": ({"update": lambda self, s, r, c: s}, "update"),
    "initial state is None": ({"initial_state": lambda self, c: None}, "initial_state"),
    "initial state is not at k = 0": (
        {"initial_state": lambda self, c: _State(2, -math.inf, 0.0, math.nan)}, "initial_state"
    ),
}


@pytest.mark.parametrize(("methods", "method"), list(BROKEN.values()), ids=list(BROKEN))
def test_a_plugin_breaking_its_contract_is_a_config_error_naming_it(
    methods: dict[str, Any], method: str
) -> None:
    cfg = _plugin("broken", **methods)
    with pytest.raises(ConfigError) as exc:
        _drive(cfg)
    assert (exc.value.field, exc.value.value) == ("family", "broken")
    assert f"its {method}()" in str(exc.value)
    with pytest.raises(ConfigError, match="broken"):
        replay(np.zeros((1, 8)), cfg)


def test_a_plugin_state_counting_with_numpy_integers_is_accepted() -> None:
    cfg = _plugin(
        "numpy-count",
        initial_state=lambda self, c: _State(np.int64(0), -math.inf, 0.0, math.nan),  # type: ignore
        update=lambda self, s, r, c: _State(s.k + np.int64(1), max(s.z, r), 0.0, 1.0),
    )
    assert _drive(cfg) == Stop("index")


# -- plugins loading while another thread asks ----------------------------------------------------
SLOW_PLUGIN = '''
import threading
from beacon.families.normal import NormalFamily

started = threading.Event()
release = threading.Event()
started.set()
release.wait(30)


class SlowFamily(NormalFamily):
    pass
'''


def test_a_thread_asking_for_a_plugin_waits_for_the_plugins_to_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = "beacon_audit2_slow_plugin"
    (tmp_path / f"{module}.py").write_text(SLOW_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    eps = [EntryPoint(name="slow", value=f"{module}:SlowFamily", group="beacon.reward_families")]
    monkeypatch.setattr(families, "entry_points", lambda group: eps)
    monkeypatch.setattr(families, "_ENTRY_POINTS_LOADED", False)

    found: dict[str, Any] = {}

    def ask(who: str) -> None:
        try:
            found[who] = get_family("slow")
        except Exception as exc:
            found[who] = exc

    loader = threading.Thread(target=ask, args=("loader",))
    loader.start()
    # wait until the loader thread is inside the plugin's import
    while getattr(sys.modules.get(module), "started", None) is None and loader.is_alive():
        threading.Event().wait(0.01)
    sys.modules[module].started.wait(30)
    other = threading.Thread(target=ask, args=("other",))
    other.start()
    other.join(1.0)  # gives the second thread time to ask while the plugin is still loading
    sys.modules[module].release.set()
    loader.join(30)
    other.join(30)
    assert type(found["loader"]).__name__ == "SlowFamily"
    assert found["other"] is found["loader"]


# -- priors whose first decision would have no h-index row ---------------------------------------
@pytest.mark.parametrize(
    ("nu0", "alpha0", "beta0", "k0"),
    [
        (1.0, 1e-300, 1.0, 2),  # the table's k0 = 1, but 2 alpha0 + 1 == 1.0 in floating point
        (0.0, 1e-17, 2.0, 2),  # likewise (alpha0, beta0 > 0, nu0 = 0)
        (1.0, -0.49999999999999994, 0.0, 3),  # the table's k0 = 2, but 2 alpha0 + 2 == 1.0
    ],
)
def test_a_prior_whose_first_row_is_missing_in_floating_point_decides_one_reward_later(
    nu0: float, alpha0: float, beta0: float, k0: int
) -> None:
    prior = NIGPrior(mu0=0.0, nu0=nu0, alpha0=alpha0, beta0=beta0)
    assert prior.decision_k0 == k0 == prior.k0 + 1  # prior.k0 stays the paper's table
    cfg = BeaconConfig(cost=0.05, horizon=8, prior=prior)
    assert cfg.k0 == k0
    rng = np.random.default_rng(5)
    s = Stopper(cfg)
    first = s.next_decision()
    assert first == Draw(k0)
    s.observe(rng.normal(size=k0))
    while isinstance(d := s.next_decision(), Draw):
        s.observe(rng.normal(size=d.count))
    # every decision on a finite index: before, the first one was "stop (index)" on h = NaN
    decided = [r for r in s.trace if r.k >= k0 and r.reason != "horizon"]
    assert decided and all(math.isfinite(r.h) for r in decided)
    rows = rng.normal(size=(16, 8))
    res = beacon.replay(rows, cfg)
    for i, row in enumerate(rows):
        st = Stopper(cfg)
        while isinstance(d := st.next_decision(), Draw):
            st.observe(row[st.state.k : st.state.k + d.count])
        assert res.n_samples[i] == st.state.k


@pytest.mark.parametrize("alpha0", [1e-15, -0.5 + 1e-15, 0.0, 5e-324])
def test_priors_next_to_the_k0_boundaries_decide_on_finite_indices(alpha0: float) -> None:
    # 5e-324 with nu0 = beta0 = 0 is the "alpha0 > 0, nu0 = beta0 = 0" row: k0 = 2, a full row
    prior = NIGPrior(mu0=0.0, nu0=0.0 if alpha0 == 5e-324 else 1.0, alpha0=alpha0, beta0=0.0)
    cfg = BeaconConfig(cost=1e-9, horizon=8, prior=prior)
    rng = np.random.default_rng(11)
    s = Stopper(cfg)
    while isinstance(d := s.next_decision(), Draw):
        s.observe(rng.normal(size=d.count))
    decided = [r for r in s.trace if r.k >= cfg.k0 and r.reason != "horizon"]
    assert decided and all(math.isfinite(r.h) for r in decided)
