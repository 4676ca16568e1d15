"""Per-query resource caps (tokens, money, wall time) and the money -> ``c`` conversion.

BEACON's own cost ``c`` prices each sample in reward units (the objective is
``E[z_K - c K]``). A :class:`Budget` adds hard caps on top: when a query's spend reaches a cap,
sampling ends with ``stop_reason="budget"`` and samples still in flight are cancelled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from beacon._checks import is_integer, is_real
from beacon.errors import ConfigError, ConfigTypeError

__all__ = ["Budget", "BudgetNotEnforcedWarning", "cost_from_price"]


class BudgetNotEnforcedWarning(UserWarning):
    """A :class:`Budget` cap met a model response that reports nothing it can count.

    ``max_tokens`` needs token counts (``Generation.input_tokens`` / ``output_tokens``, or a
    scorer's ``Score.input_tokens`` / ``output_tokens``);
    ``max_cost`` needs a reported ``Generation.cost`` or, for a response that reports tokens,
    the budget's per-token prices. Issued once per sampler and cap; each result lists the caps
    it could not enforce in ``BeaconResult.budget_unenforced``.
    """


def _check_nonneg(name: str, v: Any, *, positive: bool = False) -> float | None:
    if v is None:
        return None
    if not is_real(v) or not math.isfinite(v):
        raise ConfigError(name, v, "must be a finite number")
    if v < 0 or (positive and v == 0):
        raise ConfigError(name, v, "must be > 0" if positive else "must be >= 0")
    return float(v)


@dataclass(frozen=True)
class Budget:
    """Hard per-query caps; ``None`` means uncapped.

    Attributes:
        max_tokens: input + output tokens reported by the model, summed over the query's calls
            (input tokens read from or written to a prompt cache included: they are processed),
            plus those a scorer reports for its own model calls (an LLM judge returning
            :class:`~beacon.engine.protocol.Score`).
        max_cost: money (currency of the prices) spent on the query, the scorer's reported (or
            priced) money included.
        max_seconds: wall-clock seconds from the query's start (queueing included; a
            sampler's one-off load of the decision data before its first query excluded).
        price_per_input_token / price_per_output_token: money per token, used to price a
            generation (or a scorer's ``Score``) that reports tokens but no cost of its own.
        price_per_cache_read_token / price_per_cache_write_token: money per input token read
            from / written to the provider's prompt cache (Anthropic bills them at about 0.1x
            and 1.25x the input price); ``None``: priced as input tokens. Used where a
            response reports its cache tokens (``Generation.cache_read_tokens`` /
            ``cache_write_tokens``, which are part of its ``input_tokens``).
        price_per_cache_write_1h_token: money per input token written to the cache with a
            1-hour lifetime (Anthropic bills them at 2x the input price, the 5-minute writes
            at 1.25x); used for the part of the writes a response reports as such
            (``Generation.cache_write_1h_tokens``). ``None``: priced as the other writes
            (``price_per_cache_write_token``, else as input tokens).

    The token and money caps are checked whenever a sample finishes: the sample that crosses a
    cap is kept (it was paid for), the others in flight are cancelled. The time cap is a
    deadline: at it, every sample in flight is cancelled.

    The token and money caps count what the model reports. A response that reports no tokens
    escapes ``max_tokens``; one with no cost of its own escapes ``max_cost`` unless it reports
    tokens and a per-token price is set (and one that leaves out the tokens of a priced side,
    input or output, is counted only in part). Such a cap cannot bound the query: the result names
    it in ``budget_unenforced`` and the sampler issues a :class:`BudgetNotEnforcedWarning`
    (once per sampler and cap), rather than letting the cap look enforced.
    """

    max_tokens: int | None = None
    max_cost: float | None = None
    max_seconds: float | None = None
    price_per_input_token: float = 0.0
    price_per_output_token: float = 0.0
    price_per_cache_read_token: float | None = None
    price_per_cache_write_token: float | None = None
    price_per_cache_write_1h_token: float | None = None

    def __post_init__(self) -> None:
        mt = self.max_tokens
        if mt is not None and (not is_integer(mt) or mt <= 0):
            raise ConfigError("max_tokens", mt, "must be a positive integer or None")
        # stored as plain int / float (JSON-ready for the worker tier)
        object.__setattr__(self, "max_tokens", None if mt is None else int(mt))
        for name, positive in (("max_cost", True), ("max_seconds", True),
                               ("price_per_input_token", False),
                               ("price_per_output_token", False),
                               ("price_per_cache_read_token", False),
                               ("price_per_cache_write_token", False),
                               ("price_per_cache_write_1h_token", False)):
            object.__setattr__(
                self, name, _check_nonneg(name, getattr(self, name), positive=positive)
            )

    def price(
        self, input_tokens: int | None, output_tokens: int | None,
        cache_read_tokens: int | None = None, cache_write_tokens: int | None = None,
        cache_write_1h_tokens: int | None = None,
    ) -> float | None:
        """Money for a call reporting these tokens; ``None`` when no price or no tokens.

        ``cache_read_tokens`` / ``cache_write_tokens`` are part of ``input_tokens``, and
        ``cache_write_1h_tokens`` part of ``cache_write_tokens``: each is priced at its own
        price where one is set (1-hour writes otherwise as the other writes), and otherwise as
        an input token.
        """
        pr, pw = self.price_per_cache_read_token, self.price_per_cache_write_token
        p1h = self.price_per_cache_write_1h_token
        if not (self.price_per_input_token or self.price_per_output_token or pr or pw or p1h):
            return None
        if input_tokens is None and output_tokens is None:
            return None
        uncached = input_tokens or 0
        money = 0.0
        if pr is not None and cache_read_tokens:
            money += cache_read_tokens * pr
            uncached -= cache_read_tokens
        writes = cache_write_tokens or 0
        if p1h is not None and cache_write_1h_tokens:
            money += cache_write_1h_tokens * p1h
            uncached -= cache_write_1h_tokens
            writes -= cache_write_1h_tokens
        if pw is not None and writes:
            money += writes * pw
            uncached -= writes
        return money + uncached * self.price_per_input_token + (
            output_tokens or 0
        ) * self.price_per_output_token

    def exceeded(self, tokens: int, cost: float | None) -> bool:
        """Has a query that spent ``tokens`` and ``cost`` reached a token or money cap?

        ``cost`` is a float sum, so a spend that reaches the cap exactly may fall a rounding
        error short of it (0.1 eight times is 0.7999999999999999): within a relative 1e-9 of
        the cap counts as reaching it.
        """
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return True
        mc = self.max_cost
        return mc is not None and cost is not None and cost >= mc * (1.0 - 1e-9)

    def unpriced_side(self, input_tokens: int | None, output_tokens: int | None) -> str | None:
        """The priced side (``"input"`` or ``"output"``) whose token count a response left out.

        :meth:`price` counts a missing count as 0 tokens, so the money it returns is then only
        a lower bound: e.g. a budget pricing input tokens alone, over a model that reports only
        output tokens, would price every call at 0.
        """
        if input_tokens is None and (
            self.price_per_input_token or self.price_per_cache_read_token
            or self.price_per_cache_write_token or self.price_per_cache_write_1h_token
        ):
            return "input"
        if self.price_per_output_token and output_tokens is None:
            return "output"
        return None

    def unmeasured(
        self, input_tokens: int | None, output_tokens: int | None, cost: float | None,
        *, priced: bool = False,
    ) -> tuple[str, ...]:
        """The token/money caps that a response reporting these numbers escapes.

        ``cost`` is the response's money as the engine counts it: reported by the model, or
        (``priced=True``) computed by :meth:`price` from the token counts. A priced cost that
        misses a priced side's tokens (:meth:`unpriced_side`) is a lower bound, so it escapes
        ``max_cost`` too. A cap escaped by one response no longer bounds the query's spend:
        that response's spend is unknown to it (the cap may still fire on what is counted).
        """
        out: tuple[str, ...] = ()
        if self.max_tokens is not None and input_tokens is None and output_tokens is None:
            out += ("max_tokens",)
        if self.max_cost is not None and (
            cost is None or (priced and self.unpriced_side(input_tokens, output_tokens))
        ):
            out += ("max_cost",)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict; the cache prices only where set (a budget without
        them has the same dict as before they existed)."""
        out: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "max_cost": self.max_cost,
            "max_seconds": self.max_seconds,
            "price_per_input_token": self.price_per_input_token,
            "price_per_output_token": self.price_per_output_token,
        }
        for name in ("price_per_cache_read_token", "price_per_cache_write_token",
                     "price_per_cache_write_1h_token"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        """Inverse of :meth:`to_dict`; a non-mapping or an unknown key is a ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigTypeError("budget", data, "must be a mapping (a dict)")
        for key in data:
            if key not in cls.__dataclass_fields__:
                raise ConfigError(
                    f"budget.{key}", data[key],
                    f"unknown field; known: {', '.join(cls.__dataclass_fields__)}",
                )
        return cls(**data)


def cost_from_price(
    price_per_token: float | None = None,
    tokens_per_sample: float | None = None,
    value_per_reward_unit: float | None = None,
    *,
    price_per_1k_tokens: float | None = None,
    price_per_1m_tokens: float | None = None,
    extra_cost_per_sample: float = 0.0,
) -> float:
    """BEACON's sampling cost ``c`` (reward units per sample) from money.

    Paper appendix "Cost Parameter Calibration": ``c`` is proportional to
    ($/token) x (tokens per sample); dividing by what one reward unit is worth makes it a
    reward-unit quantity::

        c = (price_per_token * tokens_per_sample + extra_cost_per_sample) / value_per_reward_unit

    Units: prices in money per token (or per 1,000 / 1,000,000 tokens via the keyword
    alternatives; give exactly one), ``tokens_per_sample`` in tokens (prompt + completion as
    billed), ``extra_cost_per_sample`` in money (e.g. one reward-model call), and
    ``value_per_reward_unit`` in money per unit of reward. Example from the paper: a sample
    costing $0.01 with one reward unit worth $0.10 gives ``c = 0.1`` -- stop when the expected
    gain of one more sample is worth less than the $0.01 it costs.
    """
    prices = (price_per_token, price_per_1k_tokens, price_per_1m_tokens)
    given = [p for p in prices if p is not None]
    if len(given) != 1:
        raise ConfigError(
            "price_per_token",
            price_per_token,
            "give exactly one of price_per_token, price_per_1k_tokens, price_per_1m_tokens",
        )
    if price_per_token is not None:
        per_token = _check_nonneg("price_per_token", price_per_token)
    elif price_per_1k_tokens is not None:
        per_token = (_check_nonneg("price_per_1k_tokens", price_per_1k_tokens) or 0.0) / 1e3
    else:
        per_token = (_check_nonneg("price_per_1m_tokens", price_per_1m_tokens) or 0.0) / 1e6
    tokens = _check_nonneg("tokens_per_sample", tokens_per_sample)
    if tokens is None:
        raise ConfigError("tokens_per_sample", tokens_per_sample, "is required")
    value = _check_nonneg("value_per_reward_unit", value_per_reward_unit, positive=True)
    if value is None:
        raise ConfigError("value_per_reward_unit", value_per_reward_unit, "is required")
    extra = _check_nonneg("extra_cost_per_sample", extra_cost_per_sample) or 0.0
    c = ((per_token or 0.0) * tokens + extra) / value
    if c <= 0:
        raise ConfigError("price_per_token", price_per_token, "gives c = 0; c must be > 0")
    if not math.isfinite(c):
        # finite inputs whose product overflows (or a value so small that the division does)
        raise ConfigError(
            "value_per_reward_unit", value, f"gives c = {c} (overflow); c must be finite"
        )
    return c
