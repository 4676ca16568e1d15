"""Online warm start: refit the population prior as a bulk job progresses.

A job of many prompts is its own history. After the first ``min_prompts`` prompts are done, the
rewards they drew are pooled and an empirical-Bayes prior is fitted to them
(:func:`beacon.fitting.fit_prior`, NIG by marginal likelihood for ``normal``, Beta by
beta-binomial likelihood for ``bernoulli``/``judge``); later prompts start from that prior
instead of the configured one (Jeffreys by default), which is what makes BEACON beat fixed
best-of-N on real rewards (docs/priors.md). The fit is repeated each time the count of finished
prompts grows by the factor ``growth`` (20, 40, 80, ... prompts by default), so a job of N
prompts refits about ``log2(N / min_prompts)`` times and builds as many h-tables (one per fitted
``(alpha0, nu0)``, cached on disk).

Why fitting on adaptively stopped samples is sound: the stopping rule looks only at rewards
already observed, so the likelihood of the observed rewards does not depend on it (optional
stopping is ignorable for likelihood-based inference); the marginal-likelihood fit of the
hierarchy is the same whether a prompt stopped after 2 samples or ran to the horizon.

By default the configured transform stays fixed (the prior is fitted in its units). With
``transform="gaussianize"`` (``normal`` family, no configured transform) each refit also fits
the Gaussianizing transform (empirical CDF then normal quantile) on the pooled rewards, the
configuration that beats best-of-N on real judge scores (docs/priors.md). The cost keeps its
meaning relative to a prompt's spread: ``c_model = c * s_model / s_raw``, with ``s_raw`` the
pooled within-prompt standard deviation of the raw rewards (ddof 1) and ``s_model`` the fitted
prior's typical within-prompt sd in transformed units, ``sqrt(beta0 / alpha0)``; so ``c`` stays
in raw reward units per sample, as in the configuration the job started with.

A fit that fails (all rewards equal, too few prompts with two samples) keeps the current
configuration and is recorded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from beacon.config import BeaconConfig
from beacon.errors import ConfigError, RewardError

__all__ = ["WarmStart", "WarmStarter"]

log = logging.getLogger(__name__)

_FITTABLE = ("normal", "bernoulli", "judge")


@dataclass(frozen=True)
class WarmStart:
    """When to refit: first after ``min_prompts`` finished prompts, then whenever that count
    has grown by ``growth`` (``min_prompts * growth**j``); ``transform="gaussianize"`` refits
    the Gaussianizing transform too (module docstring). ``wait``: start no prompt while a refit
    is pending (slower; with one prompt in flight the output no longer depends on timing)."""

    min_prompts: int = 20
    growth: float = 2.0
    transform: str | None = None
    wait: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.min_prompts, bool) or not isinstance(self.min_prompts, int) \
                or self.min_prompts < 2:
            raise ConfigError("warm_start.min_prompts", self.min_prompts,
                              "must be an integer >= 2")
        if isinstance(self.growth, bool) or not isinstance(self.growth, int | float) \
                or not math.isfinite(self.growth) or self.growth <= 1.0:
            raise ConfigError("warm_start.growth", self.growth, "must be a number > 1")
        if not isinstance(self.wait, bool):
            raise ConfigError("warm_start.wait", self.wait, "must be True or False")
        if self.transform not in (None, "gaussianize"):
            raise ConfigError("warm_start.transform", self.transform,
                              "must be None (keep the configured transform) or 'gaussianize'")

    def to_dict(self) -> dict[str, Any]:
        return {"min_prompts": self.min_prompts, "growth": float(self.growth),
                "transform": self.transform, "wait": self.wait}

    @classmethod
    def from_dict(cls, data: Any) -> WarmStart:
        keys = {"min_prompts", "growth", "transform", "wait"}
        if not isinstance(data, dict) or set(data) - keys:
            raise ConfigError("warm_start", data,
                              f"must be an object with keys among {sorted(keys)}")
        return cls(**data)


@dataclass
class _Refit:
    prompts: int
    prior: dict[str, Any] | None
    error: str | None = None
    cost: float | None = None
    transform: str | None = None


def pooled_within_sd(rows: Sequence[Sequence[float]]) -> float:
    """Pooled within-prompt standard deviation (ddof 1 per prompt) of ragged reward rows; NaN
    when no prompt has two rewards."""
    ss = 0.0
    dof = 0
    for r in rows:
        if len(r) >= 2:
            m = math.fsum(r) / len(r)
            ss += math.fsum((v - m) ** 2 for v in r)
            dof += len(r) - 1
    return math.sqrt(ss / dof) if dof else float("nan")


@dataclass
class WarmStarter:
    """The evolving config of one job: feed it each finished prompt's rewards (raw, in draw
    order) with :meth:`add`; :meth:`refit` when :meth:`due`; :attr:`config` is what the next
    prompt should use."""

    policy: WarmStart
    base: BeaconConfig
    config: BeaconConfig = field(init=False)
    rewards: list[list[float]] = field(default_factory=list, init=False)
    refits: list[_Refit] = field(default_factory=list, init=False)
    _next_at: float = field(init=False)

    def __post_init__(self) -> None:
        if self.base.family not in _FITTABLE:
            raise ConfigError("family", self.base.family,
                              f"warm start fits priors for {', '.join(_FITTABLE)} only")
        if self.policy.transform is not None:
            if self.base.family != "normal":
                raise ConfigError("warm_start.transform", self.policy.transform,
                                  "a fitted transform needs the normal family")
            if self.base.transform is not None:
                raise ConfigError("warm_start.transform", self.policy.transform,
                                  f"the config already has the transform "
                                  f"{self.base.transform.kind!r}; drop one of the two")
        self.config = self.base
        self._next_at = float(self.policy.min_prompts)

    def add(self, rewards: Iterable[float | None]) -> None:
        """Record a finished prompt's rewards (failed samples as None are dropped)."""
        row = [float(r) for r in rewards if r is not None and math.isfinite(float(r))]
        if row:
            self.rewards.append(row)

    def due(self) -> bool:
        return len(self.rewards) >= self._next_at

    @property
    def next_refit_at(self) -> int:
        """Finished prompts (with a reward) at which the next refit is due."""
        return math.ceil(self._next_at)

    def snapshot(self) -> list[list[float]]:
        """The rewards recorded so far (take it where :meth:`add` is called, then fit anywhere)."""
        return self.rewards[:]

    def refit(self, rows: list[list[float]] | None = None, *,
              adopt: bool = True) -> BeaconConfig:
        """Fit on ``rows`` (default: every prompt recorded so far) and make the result the
        current config; returns the (possibly unchanged) config. ``adopt=False`` records the
        refit but leaves :attr:`config` as it is, for the caller to :meth:`adopt` the result
        once it is ready to run (its h-table built)."""
        rows = self.snapshot() if rows is None else rows
        n = len(rows)
        while self._next_at <= n:
            self._next_at *= self.policy.growth
        try:
            cfg = self._fit(rows)
        except (ConfigError, RewardError, ValueError, FloatingPointError) as exc:
            # Degenerate history (e.g. every reward equal): keep sampling with what we have.
            log.warning("warm start: refit on %d prompts failed (%s); keeping the prior", n, exc)
            self.refits.append(_Refit(n, None, f"{type(exc).__name__}: {exc}"))
            return self.config
        if adopt:
            self.config = cfg
        self.refits.append(_Refit(n, cfg.resolved_prior.to_dict(), cost=cfg.cost,
                                  transform=None if cfg.transform is None else cfg.transform.kind))
        return cfg

    def adopt(self, cfg: BeaconConfig) -> None:
        """Make ``cfg``, the result of ``refit(adopt=False)``, what the next prompt uses."""
        self.config = cfg

    def revert(self, previous: BeaconConfig, exc: BaseException) -> None:
        """Undo the last refit (its config could not be prepared, e.g. its h-table could not
        be built): go back to ``previous`` and record why."""
        self.config = previous
        self.refits[-1].error = f"{type(exc).__name__}: {exc}"

    def _fit(self, rows: list[list[float]]) -> BeaconConfig:
        from beacon.fitting import fit_reward_model

        if self.policy.transform is None:
            # fit_reward_model, not fit_prior: a refit on the first few prompts is capped at
            # what they hold (fitting's small-log caps), which fit_prior would warn about at
            # every early refit of a running job
            fit = fit_reward_model(rows, self.base.family, transform=self.base.transform)
            return replace(self.config, prior=fit.prior)
        s_raw = pooled_within_sd(rows)
        if not (math.isfinite(s_raw) and s_raw > 0.0):
            raise ValueError("no prompt has two different rewards yet: the raw spread that "
                             "converts the cost is unknown")
        fit = fit_reward_model(rows, "normal", transform=self.policy.transform)
        cost = self.base.cost * fit.within_scale / s_raw
        return replace(self.config, prior=fit.prior, transform=fit.transform, cost=cost)

    def history(self) -> list[dict[str, Any]]:
        """One entry per refit: prompts it used, the fitted prior, cost and transform kind (or
        the error)."""
        return [{"prompts": r.prompts, "prior": r.prior, "cost": r.cost,
                 "transform": r.transform, "error": r.error} for r in self.refits]


def seed_rewards(records: Sequence[dict[str, Any]]) -> list[list[float | None]]:
    """Rewards of finished output records (``ok`` lines with a ``rewards`` list), for resuming."""
    out: list[list[float | None]] = []
    for rec in records:
        rw = rec.get("rewards")
        if rec.get("ok") and isinstance(rw, list):
            out.append([None if v is None else float(v) for v in rw])
    return out
