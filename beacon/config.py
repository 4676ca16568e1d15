"""Validated, frozen configuration of one BEACON stopping problem."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from beacon._checks import boolean, is_integer, is_real, real_as_float
from beacon.errors import ConfigError, ConfigTypeError
from beacon.priors import (
    BetaPrior,
    NIGPrior,
    Prior,
    prior_from_dict,
    rewards_before_first_decision,
)
from beacon.transforms import RewardTransform, make_transform

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BeaconConfig"]


@dataclass(frozen=True)
class BeaconConfig:
    """Everything the Stopper needs to decide for one query.

    Attributes:
        cost: sampling cost ``c`` per sample, in (transformed) reward units; > 0.
        horizon: maximum number of samples ``n``; >= k0 + 1.
        family: registered reward family name (``normal``, ``bernoulli``, or a plugin).
        batch_size: samples drawn per decision after the first k0 (``b`` of the paper's
            batch mode); decisions happen at batch boundaries.
        robust: one-sided winsorization of low rewards (appendix "Robust Updating Formula").
        robust_quantile: predictive quantile below which a reward updates as if it were mu;
            in (0, 0.5).
        prior: the family's conjugate prior; ``None`` means the family default (Jeffreys
            for ``normal``, Beta(1, 1) for ``bernoulli``).
        transform: strictly increasing reward transform applied before the update
            (``None``: identity). Accepts a kind name or dict, e.g. ``"logit"``.
        max_failures: failed samples tolerated by the engine before stopping with ``error``.
    """

    cost: float = 0.1
    horizon: int = 32
    family: str = "normal"
    batch_size: int = 1
    robust: bool = True
    robust_quantile: float = 0.01
    prior: Prior | None = None
    transform: RewardTransform | None = field(default=None)
    max_failures: int = 3

    if TYPE_CHECKING:
        # Derived once at construction (the Stopper reads them on every decision). Plain
        # attributes, not dataclass fields, so that what serializes a dataclass by its fields
        # (``dataclasses.asdict``, pydantic encoding a default) sees the config's fields only.
        _prior: Prior = field(init=False, repr=False, compare=False)
        _k0: int = field(init=False, repr=False, compare=False)

        # What the constructor accepts, for type checkers: wider than the stored field types
        # (``__post_init__`` normalises a numpy scalar to int/float/bool, a prior dict to a
        # prior and a transform name or dict to a transform). At runtime the dataclass
        # ``__init__`` is generated as usual; tests/test_typing.py checks the two agree.
        def __init__(
            self,
            cost: float | np.floating[Any] = 0.1,
            horizon: int | np.integer[Any] = 32,
            family: str = "normal",
            batch_size: int | np.integer[Any] = 1,
            robust: bool | np.bool_ = True,
            robust_quantile: float | np.floating[Any] = 0.01,
            prior: Prior | dict[str, Any] | None = None,
            transform: RewardTransform | str | dict[str, Any] | None = None,
            max_failures: int | np.integer[Any] = 3,
        ) -> None: ...

    def __post_init__(self) -> None:
        from beacon.families import get_family

        cost = self.cost
        if not is_real(cost):
            raise ConfigError("cost", cost, "must be a positive real number")
        cost_f = real_as_float(cost)  # an int beyond the float range is inf, not OverflowError
        if not math.isfinite(cost_f) or cost_f <= 0:
            raise ConfigError("cost", cost, "must be finite and > 0")
        object.__setattr__(self, "cost", cost_f)
        for name in ("horizon", "batch_size", "max_failures"):
            v = getattr(self, name)
            if not is_integer(v):
                raise ConfigError(name, v, "must be an integer")
            object.__setattr__(self, name, int(v))  # numpy integers stored as int
        if self.batch_size < 1:
            raise ConfigError("batch_size", self.batch_size, "must be >= 1")
        if self.max_failures < 0:
            raise ConfigError("max_failures", self.max_failures, "must be >= 0")
        # numpy booleans are accepted (as numpy integers are for the integer fields)
        object.__setattr__(self, "robust", boolean("robust", self.robust))
        q = self.robust_quantile
        if not is_real(q) or not (0.0 < q < 0.5):
            raise ConfigError("robust_quantile", q, "must be in (0, 0.5)")
        object.__setattr__(self, "robust_quantile", float(q))
        if isinstance(self.prior, dict):
            object.__setattr__(self, "prior", prior_from_dict(self.prior))
        object.__setattr__(self, "transform", make_transform(self.transform))
        fam = get_family(self.family)  # raises UnknownFamilyError listing the registered ones
        prior = fam.default_prior() if self.prior is None else self.prior
        fam.check_prior(prior)
        object.__setattr__(self, "_prior", prior)
        object.__setattr__(self, "_k0", rewards_before_first_decision(prior))
        if self.horizon < self.k0 + 1:
            raise ConfigError(
                "horizon", self.horizon, f"must be >= k0 + 1 = {self.k0 + 1} for this prior"
            )
        fam.check_config(self)

    # -- derived -------------------------------------------------------------------------------
    @property
    def resolved_prior(self) -> Prior:
        """The prior in force (the family default when ``prior`` is None)."""
        return self._prior

    @property
    def k0(self) -> int:
        """Samples drawn before the first decision: the prior's k0, never fewer than 1 (for a
        normal prior within ~1e-16 above a k0 boundary, :attr:`NIGPrior.decision_k0`)."""
        return self._k0

    def replace(self, **changes: Any) -> BeaconConfig:
        """A validated copy with ``changes`` applied; an unknown field is a
        :class:`beacon.ConfigTypeError` naming it (as in :meth:`from_dict`)."""
        known = {f.name for f in fields(self) if f.init}
        for name in changes:
            if name not in known:
                raise ConfigTypeError(
                    name, changes[name], f"unknown config field; known: {sorted(known)}"
                )
        return replace(self, **changes)

    # -- pydantic --------------------------------------------------------------------------------
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Let a pydantic model hold a config (a FastAPI request body, a LangChain runnable's
        field, its ``config_schema()``): validated from a :class:`BeaconConfig` or its
        :meth:`to_dict` form (errors are this class's :class:`~beacon.ConfigError` messages,
        which name the field and the value), dumped to JSON as that dict."""
        from pydantic_core import core_schema as cs  # pydantic is a core dependency

        return cs.no_info_plain_validator_function(
            _config_from_pydantic,
            serialization=cs.plain_serializer_function_ser_schema(
                BeaconConfig.to_dict, when_used="json"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        """JSON schema of the :meth:`to_dict` form (bounds as ``__post_init__`` checks them;
        ``horizon >= k0 + 1`` depends on the prior, so only ``>= 2`` is stated)."""
        defaults = {f.name: f.default for f in fields(cls) if f.init}
        props: dict[str, Any] = {
            "cost": {"type": "number", "exclusiveMinimum": 0,
                     "description": "sampling cost c per sample, in reward units"},
            "horizon": {"type": "integer", "minimum": 2,
                        "description": "maximum number of samples n (>= k0 + 1)"},
            "family": {"type": "string", "description": "registered reward family"},
            "batch_size": {"type": "integer", "minimum": 1},
            "robust": {"type": "boolean"},
            "robust_quantile": {"type": "number", "exclusiveMinimum": 0,
                                "exclusiveMaximum": 0.5},
            "prior": {"anyOf": [{"type": "object"}, {"type": "null"}],
                      "description": "the family's conjugate prior as a dict; null: default"},
            "transform": {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}],
                          "description": "reward transform kind or dict; null: identity"},
            "max_failures": {"type": "integer", "minimum": 0},
        }
        for name, prop in props.items():
            prop["default"] = defaults[name]
        return {"title": "BeaconConfig", "type": "object", "properties": props,
                "additionalProperties": False}

    # -- serialization -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :meth:`from_dict` inverts it."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if not f.init:
                continue
            v = getattr(self, f.name)
            if isinstance(v, NIGPrior | BetaPrior | RewardTransform):
                v = v.to_dict()
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BeaconConfig:
        if not isinstance(data, dict):
            raise ConfigError("config", data, "must be a JSON object")
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                unknown[0], data[unknown[0]], f"unknown config field; known: {sorted(known)}"
            )
        kwargs = dict(data)
        if isinstance(kwargs.get("prior"), dict):
            kwargs["prior"] = prior_from_dict(kwargs["prior"])
        return cls(**kwargs)


def _config_from_pydantic(value: Any) -> BeaconConfig:
    """Pydantic's validator: an instance as is, a mapping through :meth:`BeaconConfig.from_dict`
    (a ConfigError is a ValueError, which pydantic reports with its message)."""
    if isinstance(value, BeaconConfig):
        return value
    if isinstance(value, Mapping):
        return BeaconConfig.from_dict(dict(value))
    raise ConfigError("config", value, "must be a BeaconConfig or its to_dict() form (an object)")
