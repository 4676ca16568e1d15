"""The Stopper: a pure state machine that turns rewards into Draw / Stop decisions.

It never awaits, sleeps, reads the clock or logs. Drive it as::

    s = Stopper(cfg)
    while isinstance(d := s.next_decision(), Draw):
        s.observe([score(generate()) for _ in range(d.count)])
    d.reason  # 'index' | 'horizon' | 'absorbed'

The first decision draws k0 samples at once (the prior's minimal sample size, at least 1); later
decisions draw 1 sample, or min(batch_size, n - k) in batch mode (paper §"Parallel Sampling":
the posterior is updated with the whole batch and the rule is applied at batch boundaries). The
Stopper always stops at the horizon n. Rewards of a pending draw may be observed one at a time;
a drawn sample that failed is released with :meth:`discard` and is never a reward.

Speed: the family's step functions are bound to the config once (:meth:`RewardFamily.bind`), one
float reward takes a short path through :meth:`Stopper.observe`, a built-in family's state is
held as a plain tuple and shown as its NamedTuple when read (:attr:`Stopper.state`), and trace
records are stored as raw tuples and turned into :class:`TraceRecord` objects only when
:attr:`Stopper.trace` is read (states are immutable, so the record holds the same values either
way).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from beacon._checks import is_integer
from beacon.config import BeaconConfig
from beacon.errors import ConfigError, ConfigTypeError, RewardError, StopperStateError
from beacon.families import get_family
from beacon.families.base import DecisionTuple, check_state, check_trace_fields

if TYPE_CHECKING:
    import numpy as np

__all__ = ["STOP_REASONS", "Draw", "Stop", "Stopper", "TraceRecord"]

# One reward as Stopper.observe takes it: a Python or numpy real number (stored as a float).
_Reward: TypeAlias = "float | np.floating[Any] | np.integer[Any]"

STOP_REASONS = ("index", "horizon", "absorbed", "budget", "error")


@dataclass(frozen=True, slots=True)
class Draw:
    """Draw ``count`` more samples, then observe their rewards."""

    count: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop sampling; ``reason`` is one of :data:`STOP_REASONS`."""

    reason: str


class TraceRecord(NamedTuple):
    """One decision: the state it was taken in and what was decided.

    ``zhat`` = (z - mu) / sigma, ``h`` the index h_{n,k}(zhat) (or h^B for ``bernoulli``),
    ``threshold`` what ``h`` was compared with (c / sigma, or c); NaN where not defined (before
    k0, or for quantities a family does not have). ``decision`` is ``draw`` or ``stop``;
    ``count`` the samples requested by a draw; ``reason`` the stop reason.
    """

    k: int
    z: float
    mu: float
    sigma: float
    zhat: float
    h: float
    threshold: float
    decision: str
    count: int = 0  # type: ignore[assignment]  # shadows tuple.count on purpose: the public name
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            key: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for key, v in self._asdict().items()
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceRecord:
        """Inverse of :meth:`to_dict`. ``z`` (the best reward so far) is finite once a reward
        was observed and ``-inf`` before, so its ``None`` is read back as ``-inf``; the other
        floats' ``None`` is NaN ("not defined")."""
        floats = ("mu", "sigma", "zhat", "h", "threshold")
        kw: dict[str, Any] = {
            k: (math.nan if k in floats and v is None else v) for k, v in data.items()
        }
        if kw.get("z", 0.0) is None:
            kw["z"] = -math.inf
        return cls(**kw)


# Draw objects are immutable: reuse the common ones instead of allocating one per decision.
_DRAWS = {n: Draw(n) for n in range(1, 65)}
_isfinite = math.isfinite

# A decision as stored until the trace is read: (state, zhat, h, threshold, decision, count, reason)
_RawRecord = tuple[Any, float, float, float, str, int, "str | None"]


def _draw_of(count: int) -> Draw:
    d = _DRAWS.get(count)
    return d if d is not None else Draw(count)


@lru_cache(maxsize=256)
def _continue_draws(batch_size: int, horizon: int) -> tuple[Draw, ...]:
    """Per k < n, the draw after a decision to continue: min(batch_size, n - k) samples."""
    return tuple(_draw_of(min(batch_size, horizon - k)) for k in range(horizon))


def _to_record(raw: _RawRecord, view: Callable[[Any], Any] | None) -> TraceRecord:
    st, zhat, h, threshold, decision, count, reason = raw
    if view is not None:
        st = view(st)
    return TraceRecord(
        int(st.k), float(st.z), float(st.mu), float(st.sigma), zhat, h, threshold,
        decision, count, reason,
    )  # fmt: skip


def _as_reward_list(reward: object, pos: int) -> list[Any]:
    """One reward or an iterable of them, as a list (checked one by one by the caller).

    A string is not an iterable of rewards (``"12"`` would be two), and a non-iterable that is
    not a number reaches the caller's ``float()`` check, which names its position.
    """
    if isinstance(reward, int | float):
        return [reward]
    if isinstance(reward, str | bytes):
        raise RewardError(pos, reward, "rewards must be real numbers, not text")
    if isinstance(reward, Mapping | Set):
        # a dict would give its keys, a set an arbitrary order: neither is "in drawn order"
        raise RewardError(
            pos, reward, f"rewards must be a number or a sequence, not a {type(reward).__name__}"
        )
    if getattr(reward, "ndim", None) == 0:  # numpy scalar or 0-d array
        return [reward.item()]  # type: ignore[attr-defined]
    if isinstance(reward, Iterable):
        return list(reward)
    return [reward]


def _reward_as_float(r: Any, pos: int) -> float:
    """One element of :meth:`Stopper.observe`'s input as a float (the family checks it next).

    Text (``"0.5"`` would parse) and complex numbers (numpy's would lose their imaginary part)
    are refused, as :func:`beacon.replay` refuses arrays of them.
    """
    if isinstance(r, float):  # also numpy's float64 (a float subclass): the common case
        return float(r)
    if isinstance(r, str | bytes):
        raise RewardError(pos, r, "rewards must be real numbers, not text")
    kind = getattr(getattr(r, "dtype", None), "kind", "f")
    if isinstance(r, complex) or (isinstance(kind, str) and kind not in "biuf"):
        raise RewardError(pos, r, "rewards must be real numbers")
    try:
        return float(r)
    except OverflowError as exc:  # an int beyond the float range
        raise RewardError(pos, r, "rewards must be finite") from exc
    except (TypeError, ValueError) as exc:
        raise RewardError(pos, r, "rewards must be real numbers") from exc


# Slots holding what Stopper.__init__ derives from the config (closures of the bound family):
# rebuilt from the config when a pickled Stopper is loaded, never pickled themselves.
_DERIVED = frozenset(
    ("_decide", "_direct", "_draws", "_family", "_transform", "_update", "_validate", "_view")
)


class Stopper:
    """Sequential (or batched) optimal stopping for one query under ``cfg``."""

    __slots__ = (
        "_best_index",
        "_best_raw",
        "_cfg",
        "_decide",
        "_direct",
        "_draws",
        "_family",
        "_horizon",
        "_k0",
        "_n_obs",
        "_pending",
        "_raw_trace",
        "_state",
        "_stop",
        "_trace",
        "_transform",
        "_update",
        "_validate",
        "_view",
    )

    def __init__(self, cfg: BeaconConfig) -> None:
        if not isinstance(cfg, BeaconConfig):
            raise ConfigTypeError(
                "cfg", cfg, f"must be a beacon.BeaconConfig, got {type(cfg).__name__}"
            )
        self._cfg = cfg
        self._bind(cfg)
        self._state: Any = self._family.initial_state(cfg)  # the working state
        if self._view is None:  # a plugin's state (a built-in's is a plain tuple, trusted)
            check_state(self._family, "initial_state", self._state, 0)
            check_trace_fields(self._family, "initial_state", self._state)
        self._pending = 0
        self._stop: Stop | None = None
        self._trace: list[TraceRecord] = []  # records built so far
        self._raw_trace: list[_RawRecord] = []  # decisions not yet turned into records
        self._n_obs = 0
        self._best_index = -1
        self._best_raw = -math.inf

    def _bind(self, cfg: BeaconConfig) -> None:
        """Set the slots derived from ``cfg`` (:data:`_DERIVED`)."""
        self._family = get_family(cfg.family)
        bound = self._family.bind(cfg)
        self._validate, self._update, self._decide = bound.validate, bound.update, bound.decide
        self._view = bound.view  # working state (plain tuple, k first) -> public state
        # a finite float reward goes to update as is (no family check, no transform)
        self._direct = bound.finite_only and cfg.transform is None
        self._k0, self._horizon = cfg.k0, cfg.horizon
        # the draw after a "continue" at k: min(batch_size, n - k) samples
        self._draws = _continue_draws(cfg.batch_size, cfg.horizon)
        self._transform = cfg.transform

    # -- copying and pickling ------------------------------------------------------------------
    def __copy__(self) -> Stopper:
        """An independent Stopper in the same state (the trace lists are not shared)."""
        new = type(self).__new__(type(self))  # a subclass stays one
        for name in Stopper.__slots__:
            object.__setattr__(new, name, getattr(self, name))
        if hasattr(self, "__dict__"):  # a subclass's own attributes
            new.__dict__.update(self.__dict__)
        new._trace = list(self._trace)
        new._raw_trace = list(self._raw_trace)
        return new

    def __getstate__(self) -> dict[str, Any]:
        """The Stopper's own data (and a subclass's attributes); the family's step functions
        are bound again on load."""
        data = {name: getattr(self, name) for name in Stopper.__slots__ if name not in _DERIVED}
        data.update(getattr(self, "__dict__", {}))
        return data

    def __setstate__(self, data: dict[str, Any]) -> None:
        for name, value in data.items():
            object.__setattr__(self, name, value)
        self._bind(self._cfg)

    # -- read-only views -----------------------------------------------------------------------
    @property
    def config(self) -> BeaconConfig:
        return self._cfg

    @property
    def state(self) -> Any:
        """The family's sufficient statistics (a NamedTuple with k, z, mu, sigma, ...)."""
        return self._state if self._view is None else self._view(self._state)

    @property
    def trace(self) -> list[TraceRecord]:
        """One record per decision, in order (a copy)."""
        if self._raw_trace:
            self._trace.extend(_to_record(raw, self._view) for raw in self._raw_trace)
            self._raw_trace.clear()
        return list(self._trace)

    @property
    def k(self) -> int:
        """Rewards observed so far."""
        return int(self.state.k)

    @property
    def pending(self) -> int:
        """Samples requested by the last Draw and not yet observed or discarded."""
        return self._pending

    @property
    def stopped(self) -> Stop | None:
        return self._stop

    @property
    def best_index(self) -> int:
        """0-based position (in observation order) of the best raw reward; -1 before any."""
        return self._best_index

    @property
    def best_reward(self) -> float:
        return self._best_raw

    # -- the state machine ---------------------------------------------------------------------
    def next_decision(self) -> Draw | Stop:
        """Decide. While a draw is pending it returns that same Draw (the outstanding count)."""
        if self._stop is not None:
            return self._stop
        if self._pending:
            return _draw_of(self._pending)
        st = self._state
        k = st.k if self._view is None else st[0]
        if type(k) is not int:  # a plugin state may count with a numpy integer
            k = int(k)
        if k < self._k0:
            return self._draw(self._k0 - k, st)
        if k >= self._horizon:
            return self._halt("horizon", st)
        d: DecisionTuple = self._decide(st)
        cont, reason, zhat, h, threshold = d
        if not cont:
            return self._halt(reason or "index", st, zhat, h, threshold)
        draw = self._draws[k]  # Draw(min(batch_size, n - k)); self._draw(...) inlined
        self._pending = count = draw.count
        self._raw_trace.append((st, zhat, h, threshold, "draw", count, None))
        return draw

    def observe(self, reward: _Reward | Iterable[_Reward]) -> None:
        """Feed the reward(s) of pending samples, in the order they were drawn: one number
        (numpy scalars too) or an iterable of them (a list, a numpy array)."""
        if type(reward) is float and self._pending:  # one reward of a pending draw: short path
            pos = self._n_obs
            if self._direct and _isfinite(reward):
                x = raw = reward  # what validate_reward returns; no transform
            else:
                raw = self._validate(reward, pos)
                tr = self._transform
                x = raw if tr is None else tr.apply_scalar(raw, pos)
            self._state = self._update(self._state, x)
            if raw > self._best_raw:
                self._best_raw, self._best_index = raw, pos
            self._n_obs = pos + 1
            self._pending -= 1
            return
        self._observe_many(reward)

    def discard(self, count: int = 1) -> None:
        """Release ``count`` pending samples that failed (they are not rewards)."""
        if not is_integer(count):
            raise ConfigTypeError("count", count, "must be an integer number of samples")
        count = int(count)
        if count < 0 or count > self._pending:
            raise StopperStateError(f"discard({count}) with {self._pending} pending")
        self._pending -= count

    def stop(self, reason: str) -> Stop:
        """Stop from outside (``budget`` or ``error``); pending samples are abandoned."""
        if not isinstance(reason, str) or reason not in STOP_REASONS:
            raise ConfigError("reason", reason, f"must be one of {STOP_REASONS}")
        if self._stop is None:
            self._pending = 0
            self._halt(reason, self._state)
        assert self._stop is not None
        return self._stop

    # -- internals -----------------------------------------------------------------------------
    def _observe_many(self, reward: _Reward | Iterable[_Reward]) -> None:
        """:meth:`observe` for any input: checks, then updates in order (state stored last)."""
        if self._stop is not None:
            raise StopperStateError(f"observe after Stop({self._stop.reason!r})")
        rewards = _as_reward_list(reward, self._n_obs)
        if not rewards:
            return
        if len(rewards) > self._pending:
            raise StopperStateError(
                f"observe of {len(rewards)} reward(s) but only {self._pending} drawn and pending"
                " (call next_decision() first)"
            )
        validate, update, tr, direct = self._validate, self._update, self._transform, self._direct
        # Everything is computed on locals and stored at the end: a reward rejected half-way
        # through a batch (by the family or the transform) leaves the Stopper as it was.
        st, best, best_pos, pos0 = self._state, self._best_raw, self._best_index, self._n_obs
        for pos, r in enumerate(rewards, pos0):
            if direct and type(r) is float and _isfinite(r):
                st = update(st, r)  # what the checks below give for a finite float
                raw = r
            else:
                raw = validate(_reward_as_float(r, pos), pos)
                st = update(st, raw if tr is None else tr.apply_scalar(raw, pos))
            if raw > best:
                best, best_pos = raw, pos
        self._state, self._best_raw, self._best_index = st, best, best_pos
        self._n_obs = pos0 + len(rewards)
        self._pending -= len(rewards)

    def _draw(
        self,
        count: int,
        st: Any,
        zhat: float = math.nan,
        h: float = math.nan,
        threshold: float = math.nan,
    ) -> Draw:
        self._pending = count
        self._raw_trace.append((st, zhat, h, threshold, "draw", count, None))
        return _draw_of(count)

    def _halt(
        self,
        reason: str,
        st: Any,
        zhat: float = math.nan,
        h: float = math.nan,
        threshold: float = math.nan,
    ) -> Stop:
        self._stop = Stop(reason)
        self._raw_trace.append((st, zhat, h, threshold, "stop", 0, reason))
        return self._stop
