"""The interface every reward family implements."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from beacon._checks import is_integer, is_real
from beacon.errors import ConfigError, RewardError

if TYPE_CHECKING:
    from beacon.config import BeaconConfig
    from beacon.priors import Prior

__all__ = [
    "FAMILY_STOP_REASONS",
    "TRACE_FIELDS",
    "BoundFamily",
    "Decision",
    "DecisionTuple",
    "RewardFamily",
    "check_state",
    "check_trace_fields",
]

_isfinite = math.isfinite


class Decision(NamedTuple):
    """A family's answer for one state (k >= k0, k < n).

    ``cont`` is the decision; ``reason`` is the stop reason when it stops (``index`` or
    ``absorbed``); the remaining fields go to the trace (NaN where a family has no such notion):
    ``zhat`` the standardized best reward, ``h`` the index value, ``threshold`` what ``h`` is
    compared with (``c / sigma`` for ``normal``, ``c`` for ``bernoulli``).
    """

    cont: bool
    reason: str | None
    zhat: float
    h: float
    threshold: float


DecisionTuple = tuple[bool, str | None, float, float, float]
"""The fields of a :class:`Decision` as a plain tuple (what ``BoundFamily.decide`` may return)."""

FAMILY_STOP_REASONS = ("index", "absorbed")
"""The stop reasons a family's decision may give (``None`` when stopping reads as ``index``);
``horizon`` is the Stopper's own, ``budget`` and ``error`` come from outside."""


def _misbehaved(family: RewardFamily, method: str, got: Any, needed: str) -> ConfigError:
    """The error for a family (a plugin) whose ``method`` broke its contract: it names the
    family, since the Stopper could otherwise only fail later, far from the cause (an
    ``AttributeError`` on the state, an unpacking error, or no stop at the horizon)."""
    name = family.name or type(family).__name__
    return ConfigError(
        "family", name, f"its {method}() returned {got!r}; {method}() must return {needed}"
    )


def check_state(family: RewardFamily, method: str, state: Any, k: int) -> Any:
    """``state`` if it carries an integer ``k`` equal to the rewards observed (``k``), else the
    :func:`_misbehaved` error: the Stopper reads ``k`` to decide, and stops at the horizon
    only if ``k`` counts the rewards."""
    sk = getattr(state, "k", None)
    if not (is_integer(sk) and sk == k):
        raise _misbehaved(family, method, state, f"a state whose integer field k is {k}")
    return state


TRACE_FIELDS = ("z", "mu", "sigma")
"""The state fields besides ``k`` that a trace record reads (real numbers, NaN where undefined)."""


def check_trace_fields(family: RewardFamily, method: str, state: Any) -> Any:
    """``state`` if its :data:`TRACE_FIELDS` are real numbers, else the :func:`_misbehaved`
    error. Checked when a Stopper starts (and when an update changes the state's type): the
    trace is read only once the query has stopped, so a state without them would otherwise
    fail after every sample had been drawn and paid for."""
    bad = [f for f in TRACE_FIELDS if not is_real(getattr(state, f, None))]
    if bad:
        raise _misbehaved(
            family, method, state,
            "a state whose fields z, mu and sigma are real numbers (NaN where undefined);"
            f" missing or not a number: {', '.join(bad)}",
        )  # fmt: skip
    return state


class BoundFamily(NamedTuple):
    """A family's step functions for one config, everything that depends only on it resolved once.

    The Stopper calls these on every reward and decision, so they take no ``cfg`` argument:
    ``validate(reward, position)`` is :meth:`RewardFamily.validate_reward`, ``update(state,
    reward)`` and ``decide(state)`` equal ``family.update(state, reward, cfg)`` and
    ``family.decide(state, cfg)`` value for value (``decide`` may return a plain tuple with the
    fields of :class:`Decision`). ``finite_only`` declares that ``validate`` accepts every finite
    float unchanged (the base rule), so the Stopper may test ``math.isfinite`` itself and call
    ``validate`` only to raise. With ``view`` set, ``update`` returns (and ``update`` and
    ``decide`` accept) the state as a plain tuple of the public state's fields, ``k`` first, and
    ``view(t)`` is that public state (building a NamedTuple costs more than the update itself).
    """

    validate: Callable[[float, int], float]
    update: Callable[[Any, float], Any]
    decide: Callable[[Any], DecisionTuple]
    finite_only: bool = False
    view: Callable[[Any], Any] | None = None


class RewardFamily(ABC):
    """A conjugate reward model plus its optimal stopping index.

    States are immutable (``NamedTuple``) and carry at least ``k`` (rewards observed), ``z``
    (best reward so far, ``-inf`` before any), ``mu`` and ``sigma`` (location and scale for the
    trace; NaN where undefined). Rewards reaching :meth:`update` are finite and already validated
    by :meth:`validate_reward` and transformed by the config's transform.
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def default_prior(self) -> Prior: ...

    @abstractmethod
    def check_prior(self, prior: Any) -> None:
        """Raise :class:`beacon.ConfigError` if ``prior`` is not a prior of this family."""

    def check_config(self, cfg: BeaconConfig) -> None:  # noqa: B027 - optional hook
        """Family-specific validation of the whole config (optional)."""

    def prepare(self, cfg: BeaconConfig) -> None:  # noqa: B027 - optional hook
        """Load what decisions under ``cfg`` need, so that no decision waits for it (optional).

        May block (for ``normal``: reading or building the h-table of ``cfg``, seconds for a
        large horizon, and on a fresh machine compiling its kernels); must be idempotent and
        safe to call from several threads at once. The engine runs it in a worker thread before
        a sampler's first query decides, so that an event loop never stalls on it; a
        :class:`~beacon.stopper.Stopper` used on its own loads the same lazily, at its first
        decision. Default: nothing to load.
        """

    def needs_prepare(self, cfg: BeaconConfig) -> bool:
        """Whether :meth:`prepare` still has something to load for ``cfg``: cheap, asked on the
        event loop before a sampler's first query (the engine skips the thread hop when not).
        Default: whether this family overrides :meth:`prepare` (a family that does should
        override this too, or every new sampler pays one hop)."""
        return type(self).prepare is not RewardFamily.prepare

    @abstractmethod
    def initial_state(self, cfg: BeaconConfig) -> Any: ...

    def validate_reward(self, reward: float, position: int) -> float:
        """Return the reward as a float or raise :class:`beacon.RewardError`."""
        if not _isfinite(reward):
            raise RewardError(position, reward, "rewards must be finite numbers")
        return reward

    @abstractmethod
    def update(self, state: Any, reward: float, cfg: BeaconConfig) -> Any:
        """O(1) posterior update with one (transformed) reward."""

    @abstractmethod
    def decide(self, state: Any, cfg: BeaconConfig) -> Decision:
        """Continue or stop at ``state`` (called only for k0 <= k < n)."""

    def bind(self, cfg: BeaconConfig) -> BoundFamily:
        """The step functions of this family for ``cfg`` (what the Stopper calls).

        The default wraps :meth:`validate_reward`, :meth:`update` and :meth:`decide` and checks
        what the last two return (a state whose ``k`` counts the rewards, a five-field decision
        whose stop reason is one of :data:`FAMILY_STOP_REASONS` or ``None``): a broken plugin
        is a :class:`beacon.ConfigError` naming the family. Built-in families return
        precomputed kernels with the same values, and fall back to this when a subclass
        overrides their ``update`` or ``decide``.
        """

        # These wrappers serve plugins and built-ins with an overridden step, so they check
        # what the override returns (the built-ins' own kernels are trusted and unchecked).
        def update(state: Any, reward: float) -> Any:
            new = check_state(self, "update", self.update(state, reward, cfg), state.k + 1)
            if type(new) is not type(state):  # the fields were checked for the old type only
                check_trace_fields(self, "update", new)
            return new

        def decide(state: Any) -> DecisionTuple:
            d = self.decide(state, cfg)
            if not (isinstance(d, tuple) and len(d) == 5):
                raise _misbehaved(self, "decide", d, "a Decision(cont, reason, zhat, h, threshold)")
            if not d[0] and d[1] is not None and d[1] not in FAMILY_STOP_REASONS:
                raise _misbehaved(
                    self, "decide", d, f"a stop reason among {FAMILY_STOP_REASONS} (or None)"
                )
            return d

        return BoundFamily(self.validate_reward, update, decide, self._finite_only())

    def _finite_only(self) -> bool:
        """Whether :meth:`validate_reward` is the base rule (every finite float, unchanged)."""
        return not self._overrides(RewardFamily, "validate_reward")

    def _overrides(self, base: type, *names: str) -> bool:
        """Whether this object's class replaces any of ``names`` defined on ``base``."""
        cls = type(self)
        return any(getattr(cls, n) is not getattr(base, n) for n in names)
