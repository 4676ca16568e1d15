"""Reward transforms applied before the posterior update.

A transform is a strictly increasing map ``t`` of raw rewards: the Stopper learns the posterior
and decides on ``t(r)``, so the cost ``c`` is in transformed units, while the chosen response is
the one with the best *raw* reward (``t`` is increasing, so the argmax is the same).

Transforms serialize to JSON (``to_dict`` / :func:`transform_from_dict`) so fitted ones travel to
workers and chains. Third parties register new kinds with :func:`register_transform`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from beacon._checks import is_real, real_as_float
from beacon.errors import ConfigError, RewardError
from beacon.families.normal import MAX_ABS_REWARD

__all__ = [
    "IdentityTransform",
    "LogitTransform",
    "RewardTransform",
    "check_transformed_range",
    "is_pandas_na",
    "make_transform",
    "register_transform",
    "table_values",
    "transform_from_dict",
]


def _too_large(kind: str, transformed: float) -> str:
    """Why a reward whose transform exceeds the normal model's range is refused."""
    return (
        f"its {kind} transform {transformed:.4g} is beyond +-{MAX_ABS_REWARD:g}, where the normal "
        "model's statistics overflow"
    )


def check_transformed_range(raw: NDArray[np.float64], x: NDArray[np.float64], kind: str) -> None:
    """A 2-D log's transformed rewards ``x`` within the normal model's range; the first one
    beyond it is a :class:`RewardError` naming the user's reward ``raw[i, j]`` and why (as
    :meth:`RewardTransform.apply_scalar` does for one reward)."""
    with np.errstate(invalid="ignore"):
        big = np.abs(x) > MAX_ABS_REWARD
    if big.any():
        i, j = (int(v) for v in np.argwhere(big)[0])
        raise RewardError((i, j), float(raw[i, j]), _too_large(kind, float(x[i, j])))


def table_values(obj: Any) -> NDArray[Any] | None:
    """A table's values (a pandas DataFrame or Series, nullable dtypes included) as floats with
    its missing values (``pd.NA``) as NaN; None for anything else or a table that is not all
    real numbers (a column of dates, durations, complex numbers, strings or lists: the caller
    then treats it as the numpy array it is, and refuses it as it refuses such an array).

    ``np.asarray`` of a nullable ``Float64`` / ``Int64`` frame holding ``pd.NA`` is an object
    array that no float conversion accepts; ``to_numpy(dtype=..., na_value=nan)`` (pandas'
    own, found by duck typing so pandas is not imported) says what the missing values are.
    """
    to_numpy = getattr(obj, "to_numpy", None)
    if isinstance(obj, np.ndarray) or not callable(to_numpy) or not _all_real_dtypes(obj):
        return None
    try:
        out = to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError):  # strings, dates, lists in cells, another to_numpy
        return None
    return out if isinstance(out, np.ndarray) else None


def _all_real_dtypes(table: Any) -> bool:
    """Every column of ``table`` (its ``dtypes``; a Series' is its one dtype) holds real
    numbers: a dtype ``kind`` in ``biuf`` (pandas' nullable ``Float64`` / ``Int64`` /
    ``boolean`` report f / i / b).

    Was: ``to_numpy(dtype=float)`` converts dates and durations to nanoseconds and complex
    numbers to their real part without a word, so a date column was fitted as rewards.
    """
    dtypes = getattr(table, "dtypes", None)
    if dtypes is None:
        return False
    kinds = [dtypes.kind] if hasattr(dtypes, "kind") else [getattr(d, "kind", "") for d in dtypes]
    return all(isinstance(k, str) and len(k) == 1 and k in "biuf" for k in kinds)


def is_pandas_na(value: Any) -> bool:
    """``value`` is pandas' missing-value scalar ``pd.NA`` (found by its type, so pandas is not
    imported): a missing reward, like None and NaN. ``df.groupby(...)["reward"].agg(list)``
    of a nullable ``Float64`` column holds it in the per-prompt lists."""
    t = type(value)
    return t.__name__ == "NAType" and t.__module__.startswith("pandas")


def as_reward_array(rewards: ArrayLike) -> NDArray[np.float64]:
    """``rewards`` as a float array for :meth:`RewardTransform.apply`: strings, ragged lists
    and other non-numbers are a :class:`ConfigError` naming ``rewards`` (not numpy's bare
    ValueError); a pandas table's missing values (``pd.NA``) and the masked entries of a numpy
    masked array are NaN, missing, as in fitting and replay (``np.asarray`` would hand over a
    masked entry's hidden value: a logit error about it, a gaussianized number for it)."""
    try:
        if isinstance(rewards, np.ma.MaskedArray):
            return np.ma.filled(rewards.astype(np.float64), np.nan)
        return np.asarray(rewards, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        table = table_values(rewards)  # only after the plain conversion failed: no extra work
        if table is not None:
            return table
        raise ConfigError(
            "rewards", _shown(rewards), "must be numbers or an array of numbers (NaN = missing)"
        ) from exc


def _shown(value: Any) -> Any:
    """``value`` for an error message: a table or an array by its type and shape, not by a
    repr of every reward (a DataFrame's runs to many lines)."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, np.ndarray | np.generic):
        return f"{type(value).__name__} of shape {tuple(shape)}"
    return value


class RewardTransform:
    """Base class: a strictly increasing map of raw rewards to the model's scale."""

    kind: ClassVar[str] = "base"

    def apply(self, rewards: ArrayLike) -> NDArray[np.float64]:
        """Transform an array of raw rewards (any shape); NaN stays NaN."""
        raise NotImplementedError

    def apply_scalar(self, reward: float, position: int | None = None) -> float:
        """Transform one raw reward; raises :class:`RewardError` if it is outside the domain."""
        try:
            out = self._scalar(reward)
        except RewardError as exc:
            if position is None:
                raise
            # apply() saw a one-element array: the position it names is 0, not the caller's
            raise RewardError(position, reward, exc.reason) from None
        if not math.isfinite(out):
            raise RewardError(position, reward, f"outside the domain of the {self.kind} transform")
        if not -MAX_ABS_REWARD <= out <= MAX_ABS_REWARD:
            # The model would reject t(r) and name it as if the user had sent it; name r instead.
            raise RewardError(position, reward, _too_large(self.kind, out))
        return out

    def _scalar(self, reward: float) -> float:
        """:meth:`apply` of one reward, as a float: a subclass may compute it without the
        array machinery (the Stopper calls this once per reward), bit for bit the same."""
        return float(self.apply(np.asarray([reward], dtype=np.float64))[0])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RewardTransform) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(repr(self.to_dict()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


class IdentityTransform(RewardTransform):
    """t(r) = r."""

    kind: ClassVar[str] = "identity"

    def apply(self, rewards: ArrayLike) -> NDArray[np.float64]:
        return as_reward_array(rewards)


class LogitTransform(RewardTransform):
    """t(r) = log(r / (1 - r)) for probability-valued judges, r clipped to [eps, 1 - eps].

    Rewards outside [0, 1] are an error (the judge is not probability-valued).
    """

    kind: ClassVar[str] = "logit"

    def __init__(self, eps: float = 1e-4) -> None:
        # real_as_float: a JSON integer of hundreds of digits is inf here, not an OverflowError
        if not (is_real(eps) and 0.0 < real_as_float(eps) < 0.5):
            raise ConfigError("transform.eps", eps, "must be in (0, 0.5)")
        self.eps = float(eps)

    def apply(self, rewards: ArrayLike) -> NDArray[np.float64]:
        r = as_reward_array(rewards)
        bad = (r < 0.0) | (r > 1.0)
        if np.any(bad):
            if r.ndim == 0:  # one reward: np.argwhere of a 0-d array has no index to give
                raise RewardError(0, float(r), "logit transform needs rewards in [0, 1]")
            idx = np.argwhere(bad)[0]
            pos = tuple(int(i) for i in idx) if r.ndim > 1 else int(idx[0])
            raise RewardError(pos, float(r[tuple(idx)]), "logit transform needs rewards in [0, 1]")
        p = np.clip(r, self.eps, 1.0 - self.eps)
        with np.errstate(invalid="ignore"):
            return np.log(p) - np.log1p(-p)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "eps": self.eps}


def _check_transform_fields(data: dict[str, Any], names: tuple[str, ...]) -> None:
    """A key of a transform dict other than ``kind`` and ``names`` is an error naming it.

    A misspelt parameter (``"epsilon"`` for ``"eps"``) would otherwise be ignored and the
    default used, a different transform than the file says.
    """
    unknown = [k for k in data if k != "kind" and k not in names]
    if unknown:
        known = ", ".join(names) if names else "none"
        raise ConfigError(
            f"transform.{unknown[0]}", data[unknown[0]],
            f"unknown field of the {data.get('kind')} transform (its fields: {known})",
        )


def _load_identity(data: dict[str, Any]) -> RewardTransform:
    _check_transform_fields(data, ())
    return IdentityTransform()


def _load_logit(data: dict[str, Any]) -> RewardTransform:
    _check_transform_fields(data, ("eps",))
    return LogitTransform(eps=data.get("eps", 1e-4))


_REGISTRY: dict[str, Callable[[dict[str, Any]], RewardTransform]] = {
    "identity": _load_identity,
    "logit": _load_logit,
}


def register_transform(kind: str, loader: Callable[[dict[str, Any]], RewardTransform]) -> None:
    """Register ``loader`` to rebuild transforms whose ``to_dict()['kind'] == kind``."""
    _REGISTRY[kind] = loader


def transform_from_dict(data: dict[str, Any]) -> RewardTransform:
    """Rebuild a transform from its ``to_dict()`` output."""
    if not isinstance(data, dict) or "kind" not in data:
        raise ConfigError("transform", data, "must be a JSON object with a 'kind'")
    kind = data["kind"]
    if not isinstance(kind, str):  # a list or an object as kind is not hashable
        raise ConfigError("transform.kind", kind, "must be a string")
    _ensure_builtin_kinds()
    if kind not in _REGISTRY:
        raise ConfigError(
            "transform.kind", kind, f"unknown; known kinds: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[kind](data)


def make_transform(spec: str | dict[str, Any] | RewardTransform | None) -> RewardTransform | None:
    """Accept a transform, its dict form, a kind name (unfitted kinds only), or None."""
    if spec is None or isinstance(spec, RewardTransform):
        return spec
    if isinstance(spec, str):
        if spec in ("", "none", "identity"):
            return None
        return transform_from_dict({"kind": spec})
    if isinstance(spec, dict):
        return transform_from_dict(spec)
    raise ConfigError("transform", spec, "must be a RewardTransform, a dict, a kind name or None")


def _ensure_builtin_kinds() -> None:
    # Fitted transforms live in their own module; importing it registers their loaders.
    import beacon.fitting  # noqa: F401
