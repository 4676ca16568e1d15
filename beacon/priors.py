"""Conjugate priors of the reward families and their minimal sample sizes.

Normal family: Normal–Inverse-Gamma NIG(mu0, nu0, alpha0, beta0); the precision 1/sigma^2 is
Gamma(alpha0, beta0) and, given it, the mean is Normal(mu0, sigma^2/nu0)
(paper, appendix "Priors and Minimal Sample Size", eq. hyperamareters_update). Jeffreys'
non-informative prior is (mu0, nu0, alpha0, beta0) = (0, 0, -1/2, 0) and needs k0 = 3 rewards
before the posterior predictive is proper; other priors need the k0 of the paper's Table
"table_k0" (see :func:`nig_k0`).

Bernoulli family: Beta(a0, b0) on the success probability (appendix "Binary-Reward Variant").

Priors are frozen dataclasses that round-trip through JSON (``to_dict``/``from_dict``) so a worker
or a LangChain chain can load one fitted elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from beacon._checks import is_integer, is_real, real_as_float
from beacon.errors import ConfigError

__all__ = [
    "BetaPrior",
    "NIGPrior",
    "Prior",
    "TransformNotLoadedWarning",
    "load_prior",
    "nig_k0",
    "prior_from_dict",
    "rewards_before_first_decision",
]


def _finite(field: str, value: float) -> float:
    # A string ("1") or a boolean in a prior file is a mistake, not a number to convert.
    if not is_real(value):
        raise ConfigError(field, value, "must be a real number")
    v = real_as_float(value)
    if not math.isfinite(v):
        raise ConfigError(field, value, "must be finite")
    return v


def nig_k0(nu0: float, alpha0: float, beta0: float) -> int:
    """Minimal number of rewards before the NIG posterior predictive is proper.

    Implements the paper's Table ``table_k0`` row by row (the first matching row wins):

    ============================================  ====
    prior configuration                            k0
    ============================================  ====
    2 alpha0 > 1,  nu0 > 0,  beta0 > 0               0
    2 alpha0 in (0, 1],  nu0 > 0,  beta0 >= 0        1
    2 alpha0 > 1,  nu0 > 0,  beta0 = 0               1
    alpha0 > 0,  beta0 > 0,  nu0 = 0                 1
    alpha0 > 0,  nu0 = beta0 = 0                     2
    2 alpha0 in (-1, 0],  nu0, beta0 >= 0            2
    2 alpha0 = -1,  nu0, beta0 >= 0                  3
    ============================================  ====
    """
    two_a = 2.0 * alpha0
    if two_a > 1 and nu0 > 0 and beta0 > 0:
        return 0
    if 0 < two_a <= 1 and nu0 > 0:
        return 1
    if two_a > 1 and nu0 > 0:
        return 1
    if alpha0 > 0 and beta0 > 0 and nu0 == 0:
        return 1
    if alpha0 > 0:
        return 2
    if -1 < two_a <= 0:
        return 2
    return 3


@dataclass(frozen=True, slots=True)
class NIGPrior:
    """Normal–Inverse-Gamma prior NIG(mu0, nu0, alpha0, beta0) of the ``normal`` family.

    ``mu0`` is in reward units, ``beta0`` in squared reward units; ``nu0`` and ``alpha0`` are
    pseudo-counts (``nu0`` prior observations of the mean, ``2 alpha0`` of the variance).
    """

    mu0: float = 0.0
    nu0: float = 0.0
    alpha0: float = -0.5
    beta0: float = 0.0

    def __post_init__(self) -> None:
        mu0 = _finite("prior.mu0", self.mu0)
        nu0 = _finite("prior.nu0", self.nu0)
        alpha0 = _finite("prior.alpha0", self.alpha0)
        beta0 = _finite("prior.beta0", self.beta0)
        if nu0 < 0:
            raise ConfigError("prior.nu0", self.nu0, "must be >= 0")
        if alpha0 < -0.5:
            raise ConfigError("prior.alpha0", self.alpha0, "must be >= -1/2 (Jeffreys)")
        if beta0 < 0:
            raise ConfigError("prior.beta0", self.beta0, "must be >= 0")
        object.__setattr__(self, "mu0", mu0)
        object.__setattr__(self, "nu0", nu0)
        object.__setattr__(self, "alpha0", alpha0)
        object.__setattr__(self, "beta0", beta0)

    @classmethod
    def jeffreys(cls) -> NIGPrior:
        """Jeffreys' non-informative prior (mu0, nu0, alpha0, beta0) = (0, 0, -1/2, 0)."""
        return cls()

    @property
    def family(self) -> str:
        return "normal"

    @property
    def is_jeffreys(self) -> bool:
        return self.nu0 == 0.0 and self.alpha0 == -0.5 and self.beta0 == 0.0

    @property
    def k0(self) -> int:
        """Minimal sample size of the paper's Table ``table_k0``."""
        return nig_k0(self.nu0, self.alpha0, self.beta0)

    @property
    def decision_k0(self) -> int:
        """Rewards before the first decision: :attr:`k0`, or more where the predictive dof
        ``2 alpha0 + k0`` is not above 1 in floating point.

        That happens within ~1e-16 above a row boundary of the table (``alpha0`` = 0 or -1/2):
        the h-index table has no such row (the predictive mean is infinite in floating point,
        the myopic gain ``G_d`` of order ``1 / (d - 1)`` astronomically large, so the decision
        there would be "continue" anyway), and it is skipped rather than taken on ``h = NaN``.
        """
        k = self.k0
        while k >= 1 and not 2.0 * self.alpha0 + k > 1.0:
            k += 1
        return k

    def predictive_scale(self) -> float:
        """Scale sigma_0 = sqrt((nu0 + 1) beta0 / (nu0 alpha0)) of the prior predictive.

        Defined only when k0 = 0 (proper predictive before any reward).
        """
        if self.k0 != 0:
            raise ConfigError("prior", self, "the prior predictive is improper (k0 > 0)")
        return math.sqrt((self.nu0 + 1.0) * self.beta0 / (self.nu0 * self.alpha0))

    def to_dict(self) -> dict[str, Any]:
        return {"family": "normal", **asdict(self)}


@dataclass(frozen=True, slots=True)
class BetaPrior:
    """Beta(a0, b0) prior on the success probability of the ``bernoulli`` family."""

    a0: float = 1.0
    b0: float = 1.0

    def __post_init__(self) -> None:
        a0 = _finite("prior.a0", self.a0)
        b0 = _finite("prior.b0", self.b0)
        if a0 <= 0:
            raise ConfigError("prior.a0", self.a0, "must be > 0")
        if b0 <= 0:
            raise ConfigError("prior.b0", self.b0, "must be > 0")
        object.__setattr__(self, "a0", a0)
        object.__setattr__(self, "b0", b0)

    @property
    def family(self) -> str:
        return "bernoulli"

    @property
    def k0(self) -> int:
        """A Beta prior with a0, b0 > 0 is proper: no reward is needed to decide."""
        return 0

    @property
    def decision_k0(self) -> int:
        """Rewards before the first decision: :attr:`k0`."""
        return self.k0

    def to_dict(self) -> dict[str, Any]:
        return {"family": "bernoulli", **asdict(self)}


Prior = NIGPrior | BetaPrior


def rewards_before_first_decision(prior: Any) -> int:
    """``BeaconConfig.k0`` for ``prior``: its ``decision_k0`` (a plugin family's prior may
    define ``k0`` alone), never fewer than 1.

    A prior with neither, or whose value is not an integer >= 0 (a plugin's ``default_prior``
    returning None, a float ``k0``), is a :class:`ConfigError` naming the prior: the Stopper
    needs the count before its first draw."""
    d: Any = getattr(prior, "decision_k0", None)
    if d is None:
        d = getattr(prior, "k0", None)
    if is_real(d) and not is_integer(d) and float(d).is_integer():
        d = int(d)  # 2.0, as a prior read back from JSON may hold it
    if not is_integer(d) or d < 0:
        raise ConfigError(
            "prior", prior,
            "a reward family's prior must define k0 (or decision_k0), the integer >= 0 number"
            f" of rewards needed before the first decision; got {d!r}",
        )  # fmt: skip
    return max(1, int(d))


_PRIOR_CLASSES: dict[str, type[NIGPrior] | type[BetaPrior]] = {
    "normal": NIGPrior,
    "bernoulli": BetaPrior,
}


def prior_from_dict(data: dict[str, Any]) -> Prior:
    """Rebuild a prior from :meth:`NIGPrior.to_dict` / :meth:`BetaPrior.to_dict` output.

    ``family`` may be left out (``a0`` means bernoulli, otherwise normal); every parameter of
    the family is required (a missing ``beta0`` silently taken as 0 would be another prior)
    and an unknown one is an error naming it.
    """
    if not isinstance(data, dict):
        raise ConfigError("prior", data, "must be a JSON object")
    fields = {k: v for k, v in data.items() if k != "family"}
    family = data.get("family")
    if family is None:
        family = "bernoulli" if "a0" in fields else "normal"
    if not isinstance(family, str) or family not in _PRIOR_CLASSES:
        raise ConfigError("prior.family", family, "must be 'normal' or 'bernoulli'")
    cls = _PRIOR_CLASSES[family]
    names = list(cls.__dataclass_fields__)
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ConfigError(
            f"prior.{unknown[0]}",
            fields[unknown[0]],
            f"unknown field of a {family} prior (its fields: {', '.join(names)})",
        )
    missing = [k for k in names if k not in fields]
    if missing:
        cls(**fields)  # a bad value among the given fields is reported first
        raise ConfigError(
            f"prior.{missing[0]}",
            None,
            f"missing; a {family} prior needs {', '.join(names)}",
        )
    return cls(**fields)


class TransformNotLoadedWarning(UserWarning):
    """:func:`load_prior` read a prior fitted on transformed rewards: the prior alone, in the
    transform's units, is what it returns."""


def load_prior(path: str | os.PathLike[str]) -> Prior:
    """Load a prior saved as JSON (e.g. by ``beacon fit-prior``).

    A file fitted with a reward transform (``beacon fit-prior --transform gaussianize``) holds a
    prior in the transformed units; the prior alone, used on raw rewards, would misjudge every
    stop, so loading it issues a :class:`TransformNotLoadedWarning` pointing to
    ``beacon.fitting.load_fit(path).config(cost=...)``, which keeps the two together.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))
    except FileNotFoundError as exc:
        raise ConfigError("prior", str(p), "file not found") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError("prior", str(p), f"not valid JSON ({exc.msg})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("prior", str(p), "not a UTF-8 text file") from exc
    except OSError as exc:  # a directory, no permission, ...
        raise ConfigError("prior", str(p), f"cannot read it ({exc.strerror or exc})") from exc
    if isinstance(data, dict) and "prior" in data:
        if not isinstance(data["prior"], dict):  # not a bare prior with a field "prior"
            raise ConfigError(
                "prior",
                data["prior"],
                'must be a JSON object (the prior\'s parameters) in a {"prior": {...}} file',
            )
        tr = data.get("transform")
        if tr is not None:
            kind = tr.get("kind") if isinstance(tr, dict) else tr
            warnings.warn(
                TransformNotLoadedWarning(
                    f"{p} holds a prior fitted on {kind!r}-transformed rewards: load_prior returns "
                    "the prior alone, in the transformed units, which BeaconConfig(prior=...) "
                    "without that transform would apply to raw rewards; use "
                    "beacon.fitting.load_fit(path).config(cost=...) to keep the two together"
                ),
                stacklevel=2,
            )
        data = data["prior"]
    return prior_from_dict(data)
