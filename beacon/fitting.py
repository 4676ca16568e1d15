"""Empirical-Bayes priors fitted on logged rewards, and the fitted Gaussianizing transform.

Users almost always have rewards logged by earlier runs: a 2-D array, prompts x samples, NaN for
a missing sample. Treating the prompts as exchangeable draws from a population, the population
is the right prior for a new prompt, and fitting it by empirical Bayes replaces Jeffreys' prior
(k0 = 3 rewards before the first decision, a scale learnt from three numbers) by a proper prior
(k0 <= 1, a scale learnt from the whole log).

Normal family — the hierarchy behind the paper's NIG prior (appendix "Priors and Minimal Sample
Size", eq. ``hyperamareters_update``)::

    1/sigma_p^2 ~ Gamma(alpha0, rate beta0),  mu_p | sigma_p ~ N(mu0, sigma_p^2 / nu0),
    r_pi | mu_p, sigma_p ~ N(mu_p, sigma_p^2)          (prompt p, sample i)

Default ``method="marginal"``: type-II maximum likelihood, maximising over (mu0, nu0, alpha0,
beta0) the sum over prompts of the closed-form NIG evidence of each prompt's k_p rewards
(mean rbar_p, within sum of squares S_p)::

    log m_p = lgamma(alpha_k) - lgamma(alpha0) + alpha0 log beta0 - alpha_k log beta_k
              + (1/2) log(nu0 / nu_k) - (k_p / 2) log(2 pi),
    alpha_k = alpha0 + k_p/2,  nu_k = nu0 + k_p,
    beta_k  = beta0 + S_p/2 + k_p nu0 (rbar_p - mu0)^2 / (2 nu_k)        (eq. hyperamareters_update)

Why marginal likelihood and not moments: it weights every prompt by what its k_p rewards say
(a prompt with one reward still informs mu0 and the predictive scale; moments need k_p >= 2),
it is efficient, and it exists for every alpha0 > 0, while the moment equations need the
fourth moment of sigma (alpha0 > 2) and break down exactly for the heavy-tailed scale
populations that real reward models produce. ``method="moments"`` (below) is kept as the
optimiser's starting point and as a cross-check, and is the fallback where the marginal
likelihood has no maximum: a prompt whose rewards are all identical has an evidence that grows
without bound at mu0 = its mean as beta0 -> 0, and where the other prompts do not outweigh
such prompts (one among a few, or many among many) the maximum is at beta0's bound
(``fitted_on["method"]`` then says ``moments`` and ``fitted_on["note"]`` why).

Bounds: alpha0 in [1/2, 100] (at 1/2 the predictive after one reward has 2 alpha0 + 1 = 2 degrees
of freedom, the same as Jeffreys' prior at its k0 = 3, so the h-tables never see heavier tails
than the default; at 100 the scale is known to +-5% a priori, i.e. the predictive is already
normal, and homogeneous logs push alpha0 to this bound), nu0 in [1e-3, 1e3]. alpha0 and nu0
are rounded to 4 significant digits: they select the h-table, and nothing statistical is lost
at that precision.

Small logs (:func:`_caps`): a prior is capped at the information in the log it was fitted on,
``nu0 <= N`` (N rewards used), ``alpha0 <= (N - P) / 2`` (P prompts: the log's within-prompt
degrees of freedom, halved as a Gamma shape) and ``a0 + b0 <= N``. On a few prompts the
maximum-likelihood between-prompt variation is often zero (sampling noise, not evidence), which
without the cap puts nu0, alpha0 or a0 + b0 at the bounds above: a prior worth 1000 rewards
from a log of 4. Where a cap binds, the NIG marginal likelihood is maximised again within the
caps (beta0 re-optimised with them); a NIG fit by moments (chosen, or the fallback) cuts
alpha0 to its cap keeping beta0 / alpha0, the typical within-prompt scale; a Beta fit is
scaled down to a0 + b0 = cap, keeping the fitted mean ``a0 / (a0 + b0)`` (not a maximum
within the cap). A cap that binds is recorded in ``fitted_on["capped"]`` (``{name: cap}``) and
``fitted_on["note"]`` names the counts (``beacon fit-prior`` prints it, :func:`fit_prior`
warns it). The caps only bind where the fit would exceed them (a fit they do not bind is the
same, bit for bit, as without them). A cap is its fixed bound from 1000 rewards on for nu0,
from 200 within-prompt degrees of freedom for alpha0, and from 20000 rewards for a0 + b0.

Bernoulli and judge families: Beta(a0, b0) by beta-binomial marginal likelihood (for ``judge``
on the win indicators 1{r > 1/2}),
``log m_p = log B(a0 + s_p, b0 + f_p) - log B(a0, b0)`` (s_p successes, f_p failures), bounded to
[1e-3, 1e4].

Robustness (``robust=True``): before fitting, a reward is dropped when it is beyond Tukey's
far-out fences [Q1 - 3 IQR, Q3 + 3 IQR] both of the pooled log and of the residuals from the
prompts' medians in units of their median absolute deviations (:func:`_drop_outliers`), so a
broken reward of 1e6 can no longer decide alpha0 while clean logs (and the rare high rewards
of bimodal judges) are kept. Prompts with few samples need no special
care: the evidence of a prompt with k_p rewards is exact for every k_p >= 1.

Gaussianizing transform (kind ``gaussianize``): the mid-rank empirical CDF of the pooled logged
rewards followed by the standard normal quantile, t(x_j) = Phi^{-1}((C_{j-1} + n_j / 2) / N) at
the distinct logged values x_j (n_j ties, C_j cumulative counts, N rewards), linear between them
and, beyond the logged range, linear with the secant slope of the outer tenth of each tail — so t
is continuous and strictly increasing on the whole real line, ties and plateaus included.
"""

from __future__ import annotations

import bisect
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from beacon._checks import is_integer, is_real, real_as_float
from beacon.errors import ConfigError, ConfigTypeError, RewardError
from beacon.families.judge import WIN_THRESHOLD  # importing registers the "judge" family
from beacon.families.normal import MAX_ABS_REWARD
from beacon.priors import BetaPrior, NIGPrior, Prior, prior_from_dict
from beacon.transforms import (
    LogitTransform,
    RewardTransform,
    _check_transform_fields,
    as_reward_array,
    check_transformed_range,
    is_pandas_na,
    make_transform,
    register_transform,
    table_values,
    transform_from_dict,
)

if TYPE_CHECKING:
    from beacon.config import BeaconConfig

__all__ = [
    "FitNoteWarning",
    "FitResult",
    "GaussianizeTransform",
    "fit_prior",
    "fit_reward_model",
    "load_fit",
    "nig_log_evidence",
    "reward_matrix",
]

FloatArray = NDArray[np.float64]


class FitNoteWarning(UserWarning):
    """:func:`fit_prior` fitted a prior other than the plain fit: capped at a small log's
    counts, or fitted by moments (``fitted_on["note"]`` of :func:`fit_reward_model` says why).
    """

ALPHA0_BOUNDS = (0.5, 100.0)
NU0_BOUNDS = (1e-3, 1000.0)
BETA_AB_BOUNDS = (1e-3, 1e4)
_BETA0_Z_BOUNDS = (1e-10, 1e10)  # beta0 in squared units of the pooled within-prompt sd
TUKEY_FAR_OUT = 3.0
METHODS = ("marginal", "moments")
FAMILIES = ("normal", "bernoulli", "judge")


# ----------------------------------------------------------------------------------------------
# input
# ----------------------------------------------------------------------------------------------
def reward_matrix(rewards: Any, field_name: str = "rewards") -> FloatArray:
    """Validate logged rewards and return them as a float (prompts x samples) array.

    Accepts a 2-D array, a pandas DataFrame (nullable dtypes too), or a list (or a pandas
    Series) of per-prompt sequences of possibly different lengths (padded with NaN). NaN (or
    None, ``pd.NA``, or a masked entry of a numpy masked array) marks a missing sample; +-inf
    is a :class:`RewardError` at ``(row, column)``; a 1-D or 3-D array, non-numbers (complex,
    strings, dates) or an all-missing log is a :class:`ConfigError` naming ``field_name``.
    """
    if not isinstance(rewards, np.ndarray | Sequence) and hasattr(rewards, "__array__"):
        rewards = _table_rows(rewards, field_name)
    if isinstance(rewards, np.ndarray):
        arr = _real_array(rewards, field_name)
    elif isinstance(rewards, Sequence) and not isinstance(rewards, str | bytes):
        rows = list(rewards)
        if rows and all(
            isinstance(r, Sequence | np.ndarray) and not isinstance(r, str | bytes) for r in rows
        ):
            width = max((len(r) for r in rows), default=0)
            arr = np.full((len(rows), width), np.nan)
            for i, r in enumerate(rows):
                if isinstance(r, np.ndarray):  # a masked row's mask, a complex row: as arrays
                    r = _real_array(r, f"{field_name}[{i}]").tolist()
                # an int beyond the floats is +-inf (reported below at its position, not an
                # OverflowError); a string is a mistake, not a number to parse
                vals = [real_as_float(v) if is_real(v) else np.nan if _missing(v) else v
                        for v in r]
                try:
                    if any(isinstance(v, str | bytes) for v in vals):
                        raise TypeError("a string is not a reward")
                    arr[i, : len(vals)] = np.asarray(vals, dtype=np.float64)
                except (TypeError, ValueError) as exc:
                    raise ConfigError(
                        f"{field_name}[{i}]", r, "must be a sequence of numbers (NaN = missing)"
                    ) from exc
        else:
            arr = np.asarray(rows, dtype=object)
    else:
        raise ConfigError(field_name, f"{type(rewards).__name__} object",
                          "must be a 2-D array (prompts x samples)")
    if arr.ndim != 2:
        raise ConfigError(
            field_name,
            f"array of shape {arr.shape}",
            "must be 2-D (prompts x samples); wrap a single prompt's rewards as [rewards]",
        )
    try:
        out = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(field_name, "array", "must contain only numbers (NaN = missing)") from exc
    inf = np.isinf(out)
    if inf.any():
        i, j = (int(v) for v in np.argwhere(inf)[0])
        raise RewardError((i, j), float(out[i, j]), "rewards must be finite (use NaN for missing)")
    if out.size == 0 or np.isnan(out).all():
        raise ConfigError(field_name, f"array of shape {out.shape}", "holds no reward (all NaN)")
    return out


def _missing(v: Any) -> bool:
    """A missing reward in a per-prompt list: None or pandas' ``pd.NA`` (NaN is a float)."""
    return v is None or is_pandas_na(v)


def _table_rows(table: Any, field_name: str) -> NDArray[Any] | list[Any]:
    """A pandas DataFrame (or another array-like that is no numpy array) as a numpy array, its
    missing values (``pd.NA``) as NaN; a Series of per-prompt lists as the list of its rows.

    Was: neither is a ``Sequence`` nor an ndarray, so a DataFrame, the first thing a notebook
    user passes, was refused with the repr of every reward in the message.
    """
    values = table_values(table)
    if values is not None:
        return values
    try:
        arr = np.asarray(table)
    except (TypeError, ValueError) as exc:
        raise ConfigError(field_name, f"{type(table).__name__} object",
                          "must be a 2-D array (prompts x samples)") from exc
    if arr.dtype == object and arr.ndim == 1:  # a column of per-prompt lists or arrays
        return list(arr)
    if arr.dtype == object and arr.ndim == 2:
        # object columns (numbers mixed with pd.NA, say) are read value by value as
        # per-prompt lists, where pd.NA is missing and a non-number an error naming its row
        return [list(row) for row in arr]
    return arr


def _real_array(arr: NDArray[Any], field_name: str) -> FloatArray:
    """A numpy array of real numbers as float64, masked entries as NaN (missing).

    ``np.asarray`` would drop a mask, so the hidden values would be fitted, and would discard
    the imaginary part of complex rewards with only a warning; as in replay, a masked entry is
    missing and a complex, string or date array is a ConfigError naming ``field_name``.
    """
    if isinstance(arr, np.ma.MaskedArray):
        if arr.dtype.kind not in "biuf":
            raise ConfigError(field_name, f"masked array of dtype {arr.dtype}",
                              "must contain only real numbers (masked = missing)")
        return np.ma.filled(arr.astype(np.float64), np.nan)
    if arr.dtype.kind not in "biufO":
        raise ConfigError(field_name, f"array of dtype {arr.dtype}",
                          "must contain only real numbers (NaN = missing)")
    try:
        return np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(field_name, "array", "must contain only numbers (NaN = missing)") from exc


def _fences(values: FloatArray) -> tuple[float, float]:
    q1, q3 = np.quantile(values, [0.25, 0.75])
    iqr = float(q3 - q1)
    return float(q1) - TUKEY_FAR_OUT * iqr, float(q3) + TUKEY_FAR_OUT * iqr


def _drop_outliers(x: FloatArray) -> tuple[FloatArray, int]:
    """Drop (set to NaN) rewards that are far out both in their prompt and in the whole log.

    A reward is dropped when (a) its residual from its prompt's median, in units of that
    prompt's median absolute deviation (prompts with >= 3 rewards; both statistics unmoved by
    one wild reward), lies beyond Tukey's far-out fences [Q1 - 3 IQR, Q3 + 3 IQR] of those
    residuals pooled over prompts, and (b) the reward itself lies beyond the far-out fences of
    all logged rewards. (a) alone would drop the rare good samples of a prompt whose rewards are
    mostly a spike (bimodal judges: 15% of the AlpacaEval log); (b) alone is widened by the
    spread of the prompt means. Dropping rather than moving to the fence: 1% of wild rewards
    moved to the fence still halve alpha0 on simulated hierarchies.
    """
    ok = ~np.isnan(x)
    use = ok.sum(axis=1) >= 3
    if not use.any():
        return x, 0
    lo_all, hi_all = _fences(x[ok])
    xs = x[use]
    med = np.nanmedian(xs, axis=1)
    mad = np.nanmedian(np.abs(xs - med[:, None]), axis=1)
    good = mad > 0
    if not good.any():
        return x, 0
    xs, med, mad = xs[good], med[good], mad[good]
    resid = (xs - med[:, None]) / mad[:, None]
    lo, hi = _fences(resid[~np.isnan(resid)])
    with np.errstate(invalid="ignore"):
        out_mask = ((resid < lo) | (resid > hi)) & ((xs < lo_all) | (xs > hi_all))
    n = int(out_mask.sum())
    if n == 0:
        return x, 0
    out = x.copy()
    out[np.flatnonzero(use)[good]] = np.where(out_mask, np.nan, xs)
    return out, n


@dataclass(frozen=True)
class _Stats:
    """Per-prompt sufficient statistics of the prompts with at least one reward."""

    k: FloatArray
    mean: FloatArray
    ss: FloatArray

    @classmethod
    def of(cls, x: FloatArray) -> _Stats:
        ok = ~np.isnan(x)
        k = ok.sum(axis=1).astype(np.float64)
        keep = k > 0
        x, ok, k = x[keep], ok[keep], k[keep]
        mean = np.where(ok, x, 0.0).sum(axis=1) / k
        ss = np.where(ok, (x - mean[:, None]) ** 2, 0.0).sum(axis=1)
        return cls(k, mean, ss)


def _check_normal_scale(x: FloatArray) -> float:
    """Rewards whose NIG prior is representable: ``beta0`` is in squared reward units.

    Beyond ``|r| = 1e140`` squared deviations and ``beta0`` overflow; within-prompt spreads
    below ``1e-140`` (but not zero) underflow to "no variation". Both are a ConfigError asking
    for a rescale rather than a NaN or a misleading message. Returns the widest within-prompt
    spread ``max - min`` (exact: 0 only where every prompt's rewards are identical).
    """
    ok = ~np.isnan(x)
    # per prompt; a prompt without rewards has hi = -inf, lo = inf and drops out of both maxima
    hi = np.where(ok, x, -np.inf).max(axis=1, initial=-np.inf)
    lo = np.where(ok, x, np.inf).min(axis=1, initial=np.inf)
    big = max(float(np.max(hi, initial=0.0)), -float(np.min(lo, initial=0.0)))
    if big > MAX_ABS_REWARD:
        raise ConfigError(
            "rewards", f"max |reward| {big:.3g}",
            f"too large for a normal prior (beta0 is in squared reward units; limit "
            f"{MAX_ABS_REWARD:g}): divide the rewards (and the cost) by a constant first",
        )
    widest = float(np.max(hi - lo, initial=0.0))
    if 0.0 < widest < 1.0 / MAX_ABS_REWARD:
        raise ConfigError(
            "rewards", f"largest within-prompt spread {widest:.3g}",
            f"too small for a normal prior (beta0 would underflow; limit "
            f"{1.0 / MAX_ABS_REWARD:g}): multiply the rewards (and the cost) by a constant "
            "first",
        )
    return widest


def _check_varies(widest: float, stats: _Stats) -> None:
    """Some prompt's rewards differ (``widest`` from :func:`_check_normal_scale`).

    Not ``sum(ss) > 0``: the mean of identical rewards is rounded (three rewards of 0.1 have
    mean 0.10000000000000002), so a log of constant prompts had a within sum of squares of
    ~1e-33 and got a prior of beta0 ~ 1e-22, a within-prompt scale of ~1e-11 from float noise.
    """
    if widest == 0.0:
        raise ConfigError(
            "rewards", "no within-prompt variation",
            f"every prompt's rewards are identical (all {int(np.sum(stats.k >= 2))} prompts "
            "with >= 2 rewards); a normal prior cannot be fitted",
        )


def _check_enough(stats: _Stats, field_name: str) -> None:
    n2 = int(np.sum(stats.k >= 2))
    if n2 < 2:
        raise ConfigError(
            field_name,
            f"{n2} prompt(s) with >= 2 rewards",
            "need at least 2 prompts with >= 2 non-missing rewards to fit a prior",
        )


def _caps(k: FloatArray) -> dict[str, float]:
    """Upper limits on the prior's pseudo-counts from the log's own counts (module docstring).

    A prior worth more rewards than the log holds would, on a new prompt, outweigh that many
    of its rewards with information the log never had. ``nu0`` (pseudo-rewards of a prompt's
    mean) and ``a0 + b0`` (pseudo-trials of its success rate) are at most the N rewards used,
    as if the whole log were one prompt; ``alpha0`` (half the pseudo degrees of freedom of its
    scale) at most half the log's within-prompt degrees of freedom ``N - P``. Never below the
    fixed lower bounds; :func:`_check_enough` guarantees ``N >= 4`` and ``N - P >= 2``.
    ``k``: the rewards of each prompt that has any.
    """
    n = float(k.sum())
    dof = float(np.sum(k - 1.0))
    return {
        "nu0": min(NU0_BOUNDS[1], n),
        "alpha0": min(ALPHA0_BOUNDS[1], max(ALPHA0_BOUNDS[0], 0.5 * dof)),
        "a0 + b0": min(2.0 * BETA_AB_BOUNDS[1], n),
    }


def _sig4(v: float) -> float:
    return float(f"{v:.4g}")


# ----------------------------------------------------------------------------------------------
# normal family: NIG
# ----------------------------------------------------------------------------------------------
def nig_log_evidence(
    rewards: ArrayLike, mu0: float, nu0: float, alpha0: float, beta0: float
) -> FloatArray:
    """log m_p, the NIG evidence of each prompt's non-missing rewards (module docstring).

    ``rewards`` is prompts x samples (NaN = missing); prompts without rewards give 0.
    Units: log density of the rewards (depends on the reward units through log beta).
    """
    x = np.atleast_2d(np.asarray(rewards, dtype=np.float64))
    ok = ~np.isnan(x)
    k = ok.sum(axis=1).astype(np.float64)
    safe_k = np.maximum(k, 1.0)
    mean = np.where(ok, x, 0.0).sum(axis=1) / safe_k
    ss = np.where(ok, (x - mean[:, None]) ** 2, 0.0).sum(axis=1)
    out = _nig_terms(np.array([mu0, math.log(nu0), math.log(alpha0), math.log(beta0)]),
                     _Stats(k, mean, ss), grad=False)[0]
    return np.where(k > 0, out, 0.0)


def _nig_terms(
    theta: FloatArray, st: _Stats, grad: bool
) -> tuple[FloatArray, FloatArray | None]:
    """Per-prompt log evidence and (optionally) its gradient w.r.t. theta, prompts x 4.

    theta = (mu0, log nu0, log alpha0, log beta0).
    """
    from scipy.special import digamma, gammaln

    mu0, lnu, la, lb = (float(v) for v in theta)
    nu, a, b = math.exp(lnu), math.exp(la), math.exp(lb)
    k, d = st.k, st.mean - mu0
    nuk = nu + k
    ak = a + 0.5 * k
    bk = b + 0.5 * st.ss + k * nu * d * d / (2.0 * nuk)
    ll = (
        gammaln(ak) - gammaln(a) + a * lb - ak * np.log(bk)
        + 0.5 * (lnu - np.log(nuk)) - 0.5 * k * math.log(2.0 * math.pi)
    )
    if not grad:
        return ll, None
    g = np.empty((k.size, 4))
    g[:, 0] = ak / bk * (k * nu * d / nuk)
    g[:, 1] = nu * (0.5 / nu - 0.5 / nuk - ak / bk * (k * k * d * d / (2.0 * nuk * nuk)))
    g[:, 2] = a * (digamma(ak) - digamma(a) + lb - np.log(bk))
    g[:, 3] = a - ak * b / bk
    return ll, g


def _nig_moments(st: _Stats) -> tuple[float, float, float, float]:
    """Method-of-moments NIG hyper-parameters (unclipped alpha0/nu0 may be inf).

    E[s_p^2] = E[sigma^2] = beta0 / (alpha0 - 1);
    E[s_p^4 (k_p - 1) / (k_p + 1)] = E[sigma^4] = beta0^2 / ((alpha0 - 1)(alpha0 - 2));
    Var(rbar_p) = E[sigma^2] (1/nu0 + mean(1/k_p)).
    """
    m2 = st.k >= 2
    k2 = st.k[m2]
    s2 = st.ss[m2] / (k2 - 1.0)
    m1 = float(np.mean(s2))
    e4 = float(np.mean(s2 * s2 * (k2 - 1.0) / (k2 + 1.0)))
    rho = e4 / (m1 * m1) if m1 > 0 else math.inf
    alpha0 = (2.0 * rho - 1.0) / (rho - 1.0) if rho > 1.0 else math.inf
    mu0 = float(np.mean(st.mean))
    var_means = float(np.var(st.mean, ddof=1)) if st.mean.size > 1 else 0.0
    inv_nu = var_means / m1 - float(np.mean(1.0 / st.k)) if m1 > 0 else 0.0
    nu0 = 1.0 / inv_nu if inv_nu > 0 else math.inf
    a_eff = min(max(alpha0, ALPHA0_BOUNDS[0] + 1.0), ALPHA0_BOUNDS[1])
    beta0 = m1 * (a_eff - 1.0)
    return mu0, nu0, alpha0, beta0


def _max_evidence(
    z: _Stats, first: FloatArray, bounds: tuple[tuple[float, float], tuple[float, float]]
) -> FloatArray:
    """theta = (mu0, log nu0, log alpha0, log beta0) maximising the NIG evidence of ``z`` by
    L-BFGS-B from ``first`` and two fixed starts; ``bounds``: (nu0, alpha0) ranges."""
    from scipy.optimize import minimize

    lb = [(None, None), *(tuple(math.log(v) for v in b) for b in bounds),
          tuple(math.log(v) for v in _BETA0_Z_BOUNDS)]

    def nll(th: FloatArray) -> tuple[float, FloatArray]:
        ll, g = _nig_terms(th, z, grad=True)
        assert g is not None
        return -float(ll.sum()), -g.sum(axis=0)

    starts = [
        first,
        np.array([0.0, 0.0, math.log(2.0), 0.0]),
        np.array([0.0, math.log(0.1), math.log(1.0), math.log(0.5)]),
    ]
    best: Any = None
    for th0 in starts:
        th0 = np.array([np.clip(v, lo if lo is not None else -np.inf,
                                hi if hi is not None else np.inf)
                        for v, (lo, hi) in zip(th0, lb, strict=True)])
        res = minimize(nll, th0, jac=True, method="L-BFGS-B", bounds=lb)
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    assert best is not None
    return np.asarray(best.x, dtype=np.float64)


def _fit_nig(st: _Stats, method: str) -> tuple[NIGPrior, float, str, dict[str, float]]:
    """Fit NIG hyper-parameters: the prior, the mean log evidence per reward, the method used
    and the small-log caps (:func:`_caps`) the fit ended at, by name.

    ``marginal`` falls back to ``moments`` where the marginal likelihood has no maximum (below).
    """
    # sum(ss) > 0 here: _check_varies saw a prompt with two different rewards, whose squared
    # deviations from its mean cannot both be 0, nor underflow (_check_normal_scale).
    # Fit in standardized units (centre, within-prompt scale) for conditioning; map back after.
    centre = float(np.median(st.mean))
    scale = math.sqrt(float(np.sum(st.ss)) / float(np.sum(np.maximum(st.k - 1.0, 0.0))))
    z = _Stats(st.k, (st.mean - centre) / scale, st.ss / scale**2)
    caps = _caps(st.k)
    nu_hi, a_hi = caps["nu0"], caps["alpha0"]
    mu_m, nu_m, a_m, b_m = _nig_moments(z)
    nu_m = min(max(nu_m, NU0_BOUNDS[0]), NU0_BOUNDS[1])
    a_m = min(max(a_m, ALPHA0_BOUNDS[0]), ALPHA0_BOUNDS[1])
    b_m = max(b_m, 1e-8)
    # Moments within the small-log caps. A capped alpha0 keeps beta0 / alpha0, the typical
    # within-prompt scale: only how sure the prior is of it is capped.
    a_c = min(a_m, a_hi)
    moments = np.array([mu_m, math.log(min(nu_m, nu_hi)), math.log(a_c),
                        math.log(b_m * (a_c / a_m))])
    if method == "moments":
        theta = moments
    else:
        theta = _max_evidence(z, np.array([mu_m, math.log(nu_m), math.log(a_m), math.log(b_m)]),
                              (NU0_BOUNDS, ALPHA0_BOUNDS))
        if _beyond(theta[1], nu_hi, NU0_BOUNDS[1]) or _beyond(theta[2], a_hi, ALPHA0_BOUNDS[1]):
            # Refitted within the caps only where they bind, so that a fit they do not bind
            # is the same, bit for bit, as without them.
            theta = _max_evidence(z, moments, ((NU0_BOUNDS[0], nu_hi), (ALPHA0_BOUNDS[0], a_hi)))
        if theta[3] < math.log(_BETA0_Z_BOUNDS[0]) + 1e-3:
            # A prompt whose rewards are all identical (or equal up to float noise) has an
            # unbounded evidence at mu0 = its mean as beta0 -> 0; when the other prompts
            # cannot outweigh them the maximum is that spike at beta0's bound, a
            # prior that says rewards do not vary. The moment estimates have no such spike.
            theta = moments
            method = "moments"
    nu0 = _sig4(math.exp(theta[1]))
    alpha0 = _sig4(math.exp(theta[2]))
    mu0_z = float(theta[0])
    # beta0 re-optimised in closed form is not available; keep the fitted value (rounding of
    # nu0/alpha0 to 4 digits moves the optimum by far less than its standard error).
    beta0_z = math.exp(theta[3])
    prior = NIGPrior(mu0=centre + scale * mu0_z, nu0=nu0, alpha0=alpha0,
                     beta0=beta0_z * scale**2)
    ll = _nig_terms(np.array([prior.mu0, math.log(nu0), math.log(alpha0),
                              math.log(prior.beta0)]), st, grad=False)[0]
    # the fitted values before their 4-digit rounding, which can move one within 5e-4 of a
    # cap onto it (or a cap of 5 digits, the log's reward count, below itself)
    capped = _at_caps({"nu0": (math.exp(theta[1]), nu_hi, NU0_BOUNDS[1]),
                       "alpha0": (math.exp(theta[2]), a_hi, ALPHA0_BOUNDS[1])})
    return prior, float(ll.sum() / st.k.sum()), method, capped


def _beyond(log_value: float, cap: float, bound: float) -> bool:
    """A fitted parameter (its log) above its small-log cap, where the cap is below the fixed
    bound: at the bound itself ``exp(log(100)) > 100`` by rounding, and a refit there
    would be needless work."""
    return cap < bound and math.exp(log_value) > cap


# A fit bound by a cap ends on it: L-BFGS-B returns the bound log(cap) itself, the moments
# min(value, cap); exp(log(cap)) is within a few ulps of cap. Only a free optimum within this
# of the cap (the cap for every purpose) is reported with it.
_CAP_RTOL = 1e-12


def _at_caps(fitted: dict[str, tuple[float, float, float]]) -> dict[str, float]:
    """``{name: cap}`` of the parameters ``(value, cap, bound)`` that ended at a small-log cap
    below their fixed bound; ``value`` is the fitted value before rounding (``exp`` of the
    fitted log), on the cap up to the rounding of ``exp(log(cap))`` (:data:`_CAP_RTOL`)."""
    return {name: cap for name, (value, cap, bound) in fitted.items()
            if cap < bound and value >= cap * (1.0 - _CAP_RTOL)}


# ----------------------------------------------------------------------------------------------
# bernoulli family: Beta
# ----------------------------------------------------------------------------------------------
def _check_binary(x: FloatArray) -> None:
    bad = ~np.isnan(x) & (x != 0.0) & (x != 1.0)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise RewardError((i, j), float(x[i, j]), "the bernoulli family needs rewards 0 or 1")


def _fit_beta(
    x: FloatArray, method: str, successes: str = "successes", failures: str = "failures"
) -> tuple[BetaPrior, float, dict[str, float]]:
    """Beta(a0, b0) of 0/1 outcomes ``x`` (NaN = missing); ``successes`` / ``failures`` name
    them in the error (for the judge family: wins r > 1/2 and losses r <= 1/2). Also returns
    ``{"a0 + b0": cap}`` when the small-log cap (:func:`_caps`) bound the fit, else ``{}``."""
    from scipy.optimize import minimize
    from scipy.special import betaln, digamma

    ok = ~np.isnan(x)
    k = ok.sum(axis=1).astype(np.float64)
    s = np.where(ok, x, 0.0).sum(axis=1)
    keep = k > 0
    k, s = k[keep], s[keep]
    f = k - s
    if s.sum() == 0 or f.sum() == 0:
        raise ConfigError(
            "rewards", f"{int(s.sum())} {successes} in {int(k.sum())} rewards",
            f"need both {successes} and {failures} to fit a Beta prior",
        )
    # Moments: p = mean success rate; between-prompt variance of p_hat = p(1-p)(1/k + (1-1/k) rho)
    # with rho = 1 / (a0 + b0 + 1), averaged over prompts.
    p_hat = s / k
    p = float(s.sum() / k.sum())
    v = float(np.var(p_hat, ddof=1)) if p_hat.size > 1 else 0.0
    inv_k = float(np.mean(1.0 / k))
    rho = (v / (p * (1.0 - p)) - inv_k) / (1.0 - inv_k) if inv_k < 1.0 else 0.0
    tot = 1.0 / rho - 1.0 if rho > 0 else BETA_AB_BOUNDS[1]
    tot = min(max(tot, 2 * BETA_AB_BOUNDS[0]), BETA_AB_BOUNDS[1])
    a_m = min(max(p * tot, BETA_AB_BOUNDS[0]), BETA_AB_BOUNDS[1])
    b_m = min(max((1.0 - p) * tot, BETA_AB_BOUNDS[0]), BETA_AB_BOUNDS[1])

    def ll_of(la: float, lb: float) -> FloatArray:
        a, b = math.exp(la), math.exp(lb)
        out: FloatArray = betaln(a + s, b + f) - betaln(a, b)
        return out

    if method == "moments":
        la, lb = math.log(a_m), math.log(b_m)
    else:
        def nll(th: FloatArray) -> tuple[float, FloatArray]:
            a, b = math.exp(th[0]), math.exp(th[1])
            common = digamma(a + b) - digamma(a + b + k)
            ga = a * (digamma(a + s) - digamma(a) + common)
            gb = b * (digamma(b + f) - digamma(b) + common)
            return -float(ll_of(th[0], th[1]).sum()), -np.array([ga.sum(), gb.sum()])

        bnd = [tuple(math.log(v) for v in BETA_AB_BOUNDS)] * 2
        best: Any = None
        for th0 in ([math.log(a_m), math.log(b_m)], [0.0, 0.0]):
            res = minimize(nll, np.array(th0), jac=True, method="L-BFGS-B", bounds=bnd)
            if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
                best = res
        assert best is not None
        la, lb = float(best.x[0]), float(best.x[1])
    tot_hi = _caps(k)["a0 + b0"]
    a0, b0 = math.exp(la), math.exp(lb)
    capped: dict[str, float] = {}
    if a0 + b0 > tot_hi:
        # The fitted mean a0 / (a0 + b0) is kept; only its strength is cut to the log's size.
        shrink = tot_hi / (a0 + b0)
        a0 = max(a0 * shrink, BETA_AB_BOUNDS[0])
        b0 = max(b0 * shrink, BETA_AB_BOUNDS[0])
        capped["a0 + b0"] = tot_hi
    prior = BetaPrior(_sig4(a0), _sig4(b0))
    ll = ll_of(math.log(prior.a0), math.log(prior.b0))
    return prior, float(ll.sum() / k.sum()), capped


# ----------------------------------------------------------------------------------------------
# Gaussianizing transform
# ----------------------------------------------------------------------------------------------
#: Logged values closer than this fraction of their range *and* of their magnitude are one knot
#: of the gaussianize fit.
_TIE_RESOLUTION = 1e-12
#: ... and so are values closer than this (absolute): below it a slope would overflow.
_TIE_FLOOR = 1e-290


def _tie_tolerance(a: FloatArray | float, b: FloatArray | float, span: float) -> FloatArray:
    """``max(1e-12 min(range, max(|a|, |b|)), 1e-290)``: the gap below which a and b are ties."""
    mag = np.maximum(np.abs(a), np.abs(b))
    return np.maximum(_TIE_RESOLUTION * np.minimum(span, mag), _TIE_FLOOR)


def _merge_near_ties(
    xs: FloatArray, counts: NDArray[np.int64]
) -> tuple[FloatArray, NDArray[np.int64]]:
    """Merge sorted distinct values within :func:`_tie_tolerance` of a group's first value.

    Two knots a few ulps apart would give a secant slope near 1e308 (or an infinite one for
    subnormal gaps), and the linear tails of :class:`GaussianizeTransform` would then overflow
    to -inf/inf a few ranges outside the log. With the gaps bounded below by 1e-12 of the range,
    every slope is below ~1e13 / range. The tolerance is also capped at 1e-12 of the values'
    own magnitude: one wild reward (1e13 among scores 1..10) widens the range, and a tolerance
    of 1e-12 of that range would merge every ordinary score into one knot and flatten the
    transform where the rewards actually are. A merged knot sits at the group's smallest value
    and carries the group's count (the values are ties).
    """
    span = float(xs[-1] - xs[0])
    if bool(np.all(np.diff(xs) > _tie_tolerance(xs[:-1], xs[1:], span))):
        return xs, counts
    # a group reaches up to its tolerance (<= max(1e-12 range, 1e-290)) above its first value,
    # so a range above 1e-290 always leaves >= 2 knots (only degenerate logs take this loop)
    starts = np.zeros(xs.size, dtype=bool)
    values = xs.tolist()
    first = values[0]
    starts[0] = True
    # _tie_tolerance in plain floats (the same IEEE operations, so the same groups): a numpy
    # call per value made this loop ~8 s on a log of 1.6M distinct rewards
    for i in range(1, len(values)):
        v = values[i]
        tol = max(_TIE_RESOLUTION * min(span, max(abs(first), abs(v))), _TIE_FLOOR)
        if v - first > tol:
            starts[i] = True
            first = v
    group = np.cumsum(starts) - 1
    return xs[starts], np.bincount(group, weights=counts).astype(np.int64)


def _knots(name: str, values: Any) -> FloatArray:
    """A flat sequence of real numbers (not booleans or None) as a float array."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        arr = values.astype(np.float64)
    elif isinstance(values, Sequence | np.ndarray) and not isinstance(values, str | bytes):
        if not all(is_real(v) for v in values):  # [[0, 1]], [true, 2], [null, 1], ["1"]
            raise ConfigError(name, values, "must be a flat list of numbers")
        arr = np.array([real_as_float(v) for v in values], dtype=np.float64)
    else:
        raise ConfigError(name, values, "must be a flat list of numbers")
    if arr.ndim != 1:  # a 2-D numpy array
        raise ConfigError(name, arr.tolist(), "must be a flat list of numbers")
    return arr


class GaussianizeTransform(RewardTransform):
    """t = Phi^{-1}(mid-rank empirical CDF of logged rewards), strictly increasing on all of R.

    Stored as knots (x_j, q_j), both strictly increasing, with linear interpolation between them
    and linear extrapolation beyond them with slopes ``slope_left`` / ``slope_right`` (> 0).
    Output units: standard-normal quantiles (the pooled log maps to roughly N(0, 1)).
    Build one with :meth:`fit`; ``to_dict()`` is plain JSON.
    """

    kind: ClassVar[str] = "gaussianize"

    def __init__(
        self,
        x: Sequence[float],
        q: Sequence[float],
        slope_left: float,
        slope_right: float,
    ) -> None:
        xa = _knots("transform.x", x)
        qa = _knots("transform.q", q)
        if xa.size < 2 or xa.size != qa.size:
            raise ConfigError("transform.x", f"{xa.size} knots / {qa.size} quantiles",
                              "need >= 2 knots and as many quantiles")
        for name, arr in (("transform.x", xa), ("transform.q", qa)):
            if not np.all(np.isfinite(arr)) or not np.all(np.diff(arr) > 0):
                raise ConfigError(name, arr.tolist()[:8], "must be finite and strictly increasing")
        for name, v in (("transform.slope_left", slope_left),
                        ("transform.slope_right", slope_right)):
            if not is_real(v) or not (math.isfinite(real_as_float(v)) and v > 0):
                raise ConfigError(name, v, "must be a finite number > 0")
        self.x = xa
        self.q = qa
        self.slope_left = float(slope_left)
        self.slope_right = float(slope_right)
        self._xs: list[float] = xa.tolist()  # for _scalar's bisection
        self._qs: list[float] = qa.tolist()

    @classmethod
    def fit(cls, rewards: ArrayLike, max_knots: int = 1024) -> GaussianizeTransform:
        """Fit on the pooled finite values of ``rewards`` (any rectangular shape; NaN and the
        masked entries of a numpy masked array ignored).

        ``max_knots`` bounds the JSON size: beyond it, knots are kept at evenly spaced normal
        quantiles (ends always kept), t being linear between them.
        """
        if not is_integer(max_knots) or max_knots < 2:
            raise ConfigError("max_knots", max_knots, "must be an integer >= 2")
        max_knots = int(max_knots)
        table = table_values(rewards)  # a pandas table: its pd.NA are NaN
        if table is not None:
            r = table.reshape(-1)
        elif isinstance(rewards, np.ndarray):
            r = _real_array(rewards, "rewards").reshape(-1)
        else:
            try:
                r = np.asarray(rewards, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    "rewards", rewards,
                    "must be numbers (NaN = missing) of a rectangular shape; pad per-prompt "
                    "lists of different lengths with beacon.fitting.reward_matrix(rewards)",
                ) from exc
        if np.isinf(r).any():
            j = int(np.argwhere(np.isinf(r))[0][0])
            raise RewardError(j, float(r[j]), "rewards must be finite (use NaN for missing)")
        r = r[~np.isnan(r)]
        xs, counts = np.unique(r, return_counts=True)
        with np.errstate(over="ignore"):
            span = float(xs[-1] - xs[0]) if xs.size else 0.0
        if not math.isfinite(span):
            # every gap and secant below is at most the span: finite from here on
            raise ConfigError("rewards", f"range {xs[0]:.3g} .. {xs[-1]:.3g}",
                              "too wide for the gaussianize transform (the range overflows a "
                              "float): divide the rewards by a constant first")
        if xs.size >= 2:
            xs, counts = _merge_near_ties(xs, counts)
        if xs.size < 2:
            raise ConfigError("rewards", f"{xs.size} distinct value(s)",
                              "the gaussianize transform needs >= 2 distinct rewards (values "
                              "closer than 1e-290, or than 1e-12 of both their range and their "
                              "magnitude, count as ties)")
        from scipy.special import ndtri

        n = float(counts.sum())
        cum = np.cumsum(counts).astype(np.float64)
        p = (cum - 0.5 * counts) / n
        qs = ndtri(p)
        if xs.size > max_knots:
            # Evenly spaced in the normal-quantile scale, so the tails keep their resolution.
            targets = np.linspace(qs[0], qs[-1], max_knots)
            idx = np.unique(np.clip(np.searchsorted(qs, targets), 0, xs.size - 1))
            idx = np.unique(np.concatenate([[0], idx, [xs.size - 1]]))
            xs, qs, p = xs[idx], qs[idx], p[idx]
        # Tail slopes: secant over the outer tenth of probability of each side (at least one
        # segment), so extrapolation follows the shape of the logged tail.
        lo_j = max(1, int(np.searchsorted(p, p[0] + 0.1)))
        hi_j = min(xs.size - 2, int(np.searchsorted(p, p[-1] - 0.1)) - 1)
        hi_j = max(hi_j, 0)
        lo_j = min(lo_j, xs.size - 1)
        sl = float((qs[lo_j] - qs[0]) / (xs[lo_j] - xs[0]))
        sr = float((qs[-1] - qs[hi_j]) / (xs[-1] - xs[hi_j]))
        if not (sl > 0.0 and sr > 0.0):  # a secant over ~1e308 underflows to 0
            raise ConfigError("rewards", f"range {xs[0]:.3g} .. {xs[-1]:.3g}",
                              "too wide for the gaussianize transform (its tail slopes "
                              "underflow): divide the rewards by a constant first")
        return cls(xs.tolist(), qs.tolist(), sl, sr)

    def apply(self, rewards: ArrayLike) -> FloatArray:
        r = as_reward_array(rewards)
        out = np.interp(r, self.x, self.q)
        # np.interp's affine pieces can round an ulp past their end knot's q (a reward just
        # below a knot then maps above the knot's own value); keeping each piece within its
        # knots' [q_j, q_j+1] makes t monotone in floating point too.
        j = np.clip(np.searchsorted(self.x, r, side="right") - 1, 0, self.x.size - 2)
        out = np.clip(out, self.q[j], self.q[j + 1])
        # a reward far outside the log can overflow to +-inf; callers report it as a RewardError
        with np.errstate(invalid="ignore", over="ignore"):
            left = r < self.x[0]
            right = r > self.x[-1]
            out = np.where(left, self.q[0] + self.slope_left * (r - self.x[0]), out)
            out = np.where(right, self.q[-1] + self.slope_right * (r - self.x[-1]), out)
        out = np.where(np.isnan(r), np.nan, out)
        return np.asarray(out, dtype=np.float64)

    def _scalar(self, reward: float) -> float:
        # apply()'s steps for one float, without its half-dozen array calls (per Stopper
        # reward: about 29 us -> a few us); the same operations in the same order, so the same
        # bits (tests/test_fitting_audit4.py compares them).
        r = float(reward)
        xs, qs = self._xs, self._qs
        if r != r:
            return math.nan
        if r < xs[0]:
            return qs[0] + self.slope_left * (r - xs[0])
        if r > xs[-1]:
            return qs[-1] + self.slope_right * (r - xs[-1])
        out = float(np.interp(r, self.x, self.q))
        j = min(max(bisect.bisect_right(xs, r) - 1, 0), len(xs) - 2)
        return min(max(out, qs[j]), qs[j + 1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "x": [float(v) for v in self.x],
            "q": [float(v) for v in self.q],
            "slope_left": self.slope_left,
            "slope_right": self.slope_right,
        }

    def __repr__(self) -> str:
        """The knots' count and range, not every knot.

        The base class prints ``to_dict()``: up to 1024 knots each of ``x`` and ``q``, so an
        error naming the transform as its value (``BeaconConfig(family="judge",
        transform=fit.transform)``) or a config's repr ran to some 40,000 characters.
        """
        return (
            f"GaussianizeTransform({self.x.size} knots, x in [{self.x[0]:.6g}, "
            f"{self.x[-1]:.6g}], q in [{self.q[0]:.6g}, {self.q[-1]:.6g}], "
            f"slope_left={self.slope_left:.6g}, slope_right={self.slope_right:.6g})"
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GaussianizeTransform:
        names = ("x", "q", "slope_left", "slope_right")
        _check_transform_fields(data, names)
        missing = [k for k in names if k not in data]
        if len(missing) == len(names):
            # the kind name alone (BeaconConfig(transform="gaussianize")): nothing to load, and
            # "transform.x missing" would name a field the user never wrote
            raise ConfigError(
                "transform", data.get("kind"),
                "is fitted from logged rewards: pass the fitted transform, e.g. "
                "beacon.fitting.fit_reward_model(rewards, transform='gaussianize').transform "
                "(or its to_dict()), or use FitResult.config(...)",
            )
        if missing:
            raise ConfigError(f"transform.{missing[0]}", None, "missing from gaussianize transform")
        return cls(data["x"], data["q"], data["slope_left"], data["slope_right"])


register_transform("gaussianize", GaussianizeTransform.from_dict)


def check_fit_keys(data: dict[str, Any]) -> None:
    """A fitted prior's keys are ``prior``, ``transform`` and ``fitted_on`` (what
    :meth:`FitResult.to_dict` writes): another one is a ConfigError naming it, since a misspelt
    ``"transform"`` would silently drop the transform the prior was fitted with."""
    unknown = [k for k in data if k not in ("prior", "transform", "fitted_on")]
    if unknown:
        raise ConfigError(
            unknown[0], data[unknown[0]],
            "unknown key of a fitted prior (its keys: prior, transform, fitted_on; put "
            "notes of your own in fitted_on)",
        )


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitResult:
    """A fitted prior together with the transform it lives on (``None``: raw rewards).

    ``prior`` and ``transform`` go straight into :class:`beacon.BeaconConfig`
    (see :meth:`config`). ``fitted_on`` records what was fitted (family, method, counts, mean
    log evidence per reward in transformed units, rewards dropped by the robust fences, and,
    where a small log capped the prior, ``capped``: ``{name: cap}`` with a ``note``).
    """

    prior: Prior
    transform: RewardTransform | None = None
    fitted_on: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """The family fitted (``fitted_on["family"]``; else the prior's own family)."""
        fam = self.fitted_on.get("family")
        return fam if isinstance(fam, str) else self.prior.family

    @property
    def within_scale(self) -> float:
        """Typical within-prompt standard deviation in (transformed) reward units.

        sqrt(beta0 / alpha0) = 1 / sqrt(E[1/sigma^2]) under the fitted NIG prior; ``cost =
        c_std * within_scale`` turns a cost in per-prompt standardized units into the units the
        Stopper uses. 1.0 for the bernoulli family (rewards are 0/1 already).
        """
        p = self.prior
        if isinstance(p, NIGPrior):
            if not (p.alpha0 > 0 and p.beta0 > 0):  # Jeffreys' prior, or an edited file
                raise ConfigError(
                    "prior", p, "has no typical within-prompt scale sqrt(beta0 / alpha0): "
                    "within_scale needs alpha0 > 0 and beta0 > 0 (a fitted prior)",
                )
            return math.sqrt(p.beta0 / p.alpha0)
        return 1.0

    def config(self, **kwargs: Any) -> BeaconConfig:
        """``BeaconConfig(family=..., prior=..., transform=..., **kwargs)``."""
        from dataclasses import fields

        from beacon.config import BeaconConfig

        known = [f.name for f in fields(BeaconConfig) if f.init]
        for key in kwargs:
            if key not in known:  # was Python's bare "unexpected keyword argument"
                raise ConfigTypeError(
                    key, kwargs[key], f"is no BeaconConfig field (fields: {', '.join(known)})"
                )
        for key in ("family", "prior", "transform"):
            if key in kwargs:  # was a bare "got multiple values for keyword argument"
                raise ConfigTypeError(
                    key, kwargs[key], "comes from the fit (its units are the fit's); build "
                    "beacon.BeaconConfig(...) yourself to use another",
                )
        return BeaconConfig(family=self.family, prior=self.prior, transform=self.transform,
                            **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """``{"prior": {...}, "transform": {...} | None, "fitted_on": {...}}`` (plain JSON)."""
        return {
            "prior": self.prior.to_dict(),
            "transform": None if self.transform is None else self.transform.to_dict(),
            "fitted_on": dict(self.fitted_on),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitResult:
        if isinstance(data, dict) and "prior" in data and not isinstance(data["prior"], dict):
            raise ConfigError("prior", data["prior"], "must be a JSON object (the prior's "
                              "parameters)")
        if not isinstance(data, dict) or not isinstance(data.get("prior"), dict):
            raise ConfigError("prior", data, "must be a JSON object with a 'prior' object")
        check_fit_keys(data)
        tr = data.get("transform")
        fitted = data.get("fitted_on")
        fitted = {} if fitted is None else fitted  # [] or "" is not an empty object
        if not isinstance(fitted, dict):
            raise ConfigError("fitted_on", fitted, "must be a JSON object")
        return cls(
            prior_from_dict(data["prior"]),
            None if tr is None else transform_from_dict(tr),
            fitted,
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def load_fit(path: str | Path) -> FitResult:
    """Load a file written by :meth:`FitResult.save` / ``beacon fit-prior``.

    A bare prior object (``{"family": ..., "mu0": ...}``) loads with ``transform=None``.
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
    if isinstance(data, dict) and "prior" not in data:
        data = {"prior": data}
    return FitResult.from_dict(data)


def _resolve_transform(
    transform: str | dict[str, Any] | RewardTransform | None, x: FloatArray, family: str
) -> RewardTransform | None:
    if transform is None or (isinstance(transform, str) and transform in ("", "none", "identity")):
        return None
    if family != "normal":
        raise ConfigError("transform", transform, f"the {family} family takes raw rewards")
    if isinstance(transform, str) and transform == "gaussianize":
        return GaussianizeTransform.fit(x)
    if isinstance(transform, str) and transform == "logit":
        return LogitTransform()
    return make_transform(transform)


def fit_reward_model(
    rewards: Any,
    family: str = "normal",
    *,
    transform: str | dict[str, Any] | RewardTransform | None = None,
    method: str = "marginal",
    robust: bool = True,
) -> FitResult:
    """Fit the population prior (and, for ``transform="gaussianize"``, the transform) by EB.

    Args:
        rewards: logged rewards, prompts x samples (NaN = missing), raw units.
        family: ``normal`` (NIG prior), ``bernoulli`` (Beta prior; rewards 0/1) or ``judge``
            (Beta prior on the win indicators r > 1/2 of probability rewards in [0, 1]; see
            :mod:`beacon.families.judge`).
        transform: ``None``, ``"logit"``, ``"gaussianize"`` (fitted here on the pooled log), a
            transform dict, or a :class:`RewardTransform`; the prior is fitted on transformed
            rewards, i.e. in the units the Stopper will see.
        method: ``marginal`` (type-II maximum likelihood, default) or ``moments``.
        robust: clip rewards beyond Tukey's far-out fences before fitting (module docstring).
    """
    if family not in FAMILIES:
        raise ConfigError("family", family, f"fit_prior supports {', '.join(FAMILIES)}")
    if method not in METHODS:
        raise ConfigError("method", method, f"must be one of {', '.join(METHODS)}")
    if not isinstance(robust, bool):
        raise ConfigError("robust", robust, "must be True or False")
    x = reward_matrix(rewards)
    tr = _resolve_transform(transform, x, family)
    if tr is not None:
        raw = x
        x = tr.apply(x)
        if np.isinf(x).any():
            i, j = (int(v) for v in np.argwhere(np.isinf(x))[0])
            raise RewardError((i, j), float(raw[i, j]), f"outside the domain of {tr.kind}")
        check_transformed_range(raw, x, tr.kind)  # (a transform is for the normal family)
    # the families' own range checks come first: the statistics of a reward of 1e200 overflow
    dropped = 0
    if family == "normal":
        if robust:
            # before the scale check: a broken reward of 1e200 is dropped like one of 1e6,
            # not a reason to rescale the whole log
            with np.errstate(over="ignore", invalid="ignore"):
                x, dropped = _drop_outliers(x)
        widest = _check_normal_scale(x)
    elif family == "judge":
        bad = ~np.isnan(x) & ((x < 0.0) | (x > 1.0))
        if bad.any():
            i, j = (int(v) for v in np.argwhere(bad)[0])
            raise RewardError((i, j), float(x[i, j]), "the judge family needs rewards in [0, 1]")
    else:
        _check_binary(x)
    st = _Stats.of(x)
    _check_enough(st, "rewards")
    if family == "normal":
        _check_varies(widest, st)
    used, notes = method, []
    if family == "normal":
        prior: Prior
        prior, ll, used, capped = _fit_nig(st, method)
        if used != method:
            notes.append("a prompt whose rewards are all (nearly) identical makes the marginal "
                         "likelihood unbounded on this log (the population's scale would go to "
                         "0); fitted by moments instead")
    elif family == "judge":
        ok = ~np.isnan(x)
        wins = np.where(ok, (x > WIN_THRESHOLD).astype(np.float64), np.nan)
        prior, ll, capped = _fit_beta(wins, method, f"wins (r > {WIN_THRESHOLD:g})",
                                      f"losses (r <= {WIN_THRESHOLD:g})")
    else:
        prior, ll, capped = _fit_beta(x, method)
    if capped:
        notes.append(_small_log_note(st, capped))
    fitted_on: dict[str, Any] = {
        "family": family,
        "method": used,
        "robust": robust,
        "prompts": int(st.k.size),
        "rewards": int(st.k.sum()),
        "dropped": dropped,
        "mean_log_evidence": ll,
    }
    if capped:
        fitted_on["capped"] = capped
    if notes:
        fitted_on["note"] = "; ".join(notes)
    return FitResult(prior, tr, fitted_on)


def _small_log_note(st: _Stats, capped: dict[str, float]) -> str:
    """What was capped for a small log (:func:`_caps`), with the log's counts."""
    n, p = int(st.k.sum()), int(st.k.size)
    why = {
        "nu0": f"nu0 <= {capped.get('nu0', 0):g}, the log's {n} rewards",
        "alpha0": f"alpha0 <= {capped.get('alpha0', 0):g}, half its {n - p} within-prompt "
                  "degrees of freedom",
        "a0 + b0": f"a0 + b0 <= {capped.get('a0 + b0', 0):g}, the log's {n} rewards (mean "
                   "a0 / (a0 + b0) kept)",
    }
    return (
        f"fitted on {p} prompts ({n} rewards): the best fit was a prior surer than this log "
        f"can make it, so it was capped at {'; '.join(why[name] for name in capped)}; the prior "
        "is only as strong as the log, and the caps grow with more logged prompts"
    )


def fit_prior(
    rewards: Any,
    family: str = "normal",
    *,
    transform: str | dict[str, Any] | RewardTransform | None = None,
    method: str = "marginal",
    robust: bool = True,
) -> Prior:
    """The empirical-Bayes prior of :func:`fit_reward_model`, ready for ``BeaconConfig(prior=)``.

    With ``transform`` the prior is in transformed units, so the config needs the same
    transform. ``transform="gaussianize"`` is fitted from the data, so use
    :func:`fit_reward_model` (which returns the transform too) or pass an already fitted
    :class:`GaussianizeTransform`; the kind name alone is refused here rather than silently
    dropping the fitted transform.

    Only the prior is returned, so the fit's note (``fitted_on["note"]``: a prior capped at a
    small log's counts, or fitted by moments) is a :class:`FitNoteWarning`; without it a
    notebook user would not learn that the prior is weaker than the fit asked for.
    (``beacon fit-prior`` prints the note; :func:`fit_reward_model` records it, no warning.)
    """
    if isinstance(transform, str) and transform == "gaussianize":
        raise ConfigError(
            "transform", transform,
            "is fitted from the data: use beacon.fitting.fit_reward_model(...) to get both the "
            "prior and the transform, or pass a fitted GaussianizeTransform",
        )
    fit = fit_reward_model(rewards, family, transform=transform, method=method, robust=robust)
    note = fit.fitted_on.get("note")
    if note:
        warnings.warn(note, FitNoteWarning, stacklevel=2)
    return fit.prior
