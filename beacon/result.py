"""What one BEACON query produced: every candidate, the chosen best, usage and the decision trace.

A :class:`BeaconResult` is plain data. :meth:`BeaconResult.to_dict` gives a JSON-ready dict
(``json.dumps`` works on it) and :meth:`BeaconResult.from_dict` inverts it. In-memory-only
objects (the raw model response of each candidate, e.g. a LangChain ``AIMessage``, and the
parts of a prompt or metadata that JSON cannot hold) are dropped by ``to_dict``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beacon._checks import is_integer, is_real, real_as_float
from beacon.errors import ConfigError, ConfigTypeError
from beacon.stopper import STOP_REASONS, TraceRecord

__all__ = ["BeaconResult", "Candidate", "Usage"]

# Budget caps that count what the model reports (beacon.budget.Budget.unmeasured)
_UNENFORCEABLE = ("max_tokens", "max_cost")


def _json_float(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


# -- reading a dict back (from_dict): every field checked, a ConfigError naming it -------------
def _mapping(name: str, v: Any) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ConfigTypeError(name, v, "must be a JSON object (a dict)")
    return v


def _count_field(name: str, v: Any, *, optional: bool = False) -> int | None:
    if v is None and optional:
        return None
    if not is_integer(v) or v < 0:
        raise ConfigError(name, v, "must be an integer >= 0" + (" or null" if optional else ""))
    return int(v)


def _float_field(name: str, v: Any, *, optional: bool = False, nonneg: bool = False
                 ) -> float | None:
    if v is None and optional:
        return None
    if not is_real(v) or not math.isfinite(real_as_float(v)) or (nonneg and v < 0):
        kind = "a finite number" + (" >= 0" if nonneg else "")
        raise ConfigError(name, v, f"must be {kind}" + (" or null" if optional else ""))
    return real_as_float(v)


def _str_field(name: str, v: Any, *, optional: bool = False) -> str | None:
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise ConfigTypeError(name, v, "must be a string" + (" or null" if optional else ""))
    return v


def _list_field(name: str, v: Any) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list | tuple):
        raise ConfigTypeError(name, v, "must be a JSON array (a list)")
    return list(v)


def _is_jsonable(obj: Any) -> bool:
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _json_ready(obj: Any) -> Any:
    """``obj`` (a prompt or metadata) as JSON can hold it, for :meth:`BeaconResult.to_dict`.

    Already JSON-able (the common case, one ``json.dumps`` check): unchanged. Otherwise, part
    by part: numpy numbers and booleans (a DataFrame row's ``id``) become plain ones, tuples
    lists, non-finite floats ``None``, and anything JSON has no form for (an object, bytes)
    ``None``, as raw objects are dropped; mapping keys become strings as ``json.dumps`` makes
    them. Without this, ``json.dumps(result.to_dict())`` failed on such a value.
    """
    if _is_jsonable(obj):
        return obj
    return _json_part(obj)


def _json_prompt(prompt: Any) -> Any:
    """The prompt as JSON holds it (:func:`_json_ready`), or ``None`` when a part of it had to
    be dropped (a LangChain message, an image's bytes): a prompt missing parts would read as
    another prompt, and ``None`` has always meant "not serialisable"."""
    if _is_jsonable(prompt):
        return prompt
    dropped: list[Any] = []
    out = _json_part(prompt, dropped=dropped)
    return None if dropped else out


def _json_part(obj: Any, within: tuple[int, ...] = (), dropped: list[Any] | None = None) -> Any:
    """One part of :func:`_json_ready`; ``within``: the ids of the containers holding it (a
    container that holds itself is ``None`` there, not endless recursion); ``dropped``, when
    given, collects the parts made ``None`` that were not ``None`` or a non-finite float."""
    if obj is None or isinstance(obj, str | bool):
        return obj
    if isinstance(obj, np.bool_):
        return bool(obj)
    if is_integer(obj):
        return int(obj)
    if is_real(obj):
        f = real_as_float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, Mapping | list | tuple) and id(obj) not in within:
        inner = (*within, id(obj))
        if isinstance(obj, Mapping):
            return {_json_key(k): _json_part(v, inner, dropped) for k, v in obj.items()}
        return [_json_part(v, inner, dropped) for v in obj]
    if dropped is not None:
        dropped.append(obj)
    return None


def _json_key(key: Any) -> str:
    """A mapping key as the string ``json.dumps`` writes it (``str(key)`` for other kinds)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | np.bool_) or is_real(key):
        return json.dumps(_json_part(key))
    return str(key)


@dataclass(slots=True)
class Usage:
    """Resource use of one sample (on a :class:`Candidate`) or of a whole query (on a result).

    Attributes:
        model_calls: calls made to the model, retries included.
        score_calls: calls made to the scorer, retries included (a batched scorer call counts 1).
        failed_calls: calls (model or scorer) that raised or timed out.
        retries: calls that were retries of an earlier failed call.
        cancelled: samples cancelled in flight because the query stopped (query level only).
        input_tokens: prompt tokens reported by the model, those read from or written to a
            prompt cache included; ``None`` when the model never reported.
        output_tokens: completion tokens reported by the model; ``None`` likewise.
        cost: money of the whole sample or query -- the model's, reported or priced by the
            :class:`~beacon.budget.Budget` (same currency as the prices), plus the scorer's
            ``score_cost`` -- ``None`` when unknown.
        wall_seconds: elapsed wall-clock seconds (per sample: generate + score, retries and
            backoff included; per query: from start to result).
        cache_read_tokens / cache_write_tokens: how many of ``input_tokens`` the model reported
            as read from / written to its prompt cache (``Generation.cache_read_tokens`` /
            ``cache_write_tokens``); ``None`` when never reported.
        cache_write_1h_tokens: the part of ``cache_write_tokens`` written with a 1-hour
            lifetime (billed apart); ``None`` likewise.
        score_input_tokens / score_output_tokens: tokens the scorer reported for its own
            model calls (an LLM judge returning :class:`~beacon.engine.protocol.Score`);
            ``None`` when it never reported. Kept apart from the model's ``input_tokens`` /
            ``output_tokens``, which stay the policy model's tokens per sample (what
            :func:`~beacon.budget.cost_from_price` calibrates ``c`` from); ``total_tokens``
            and the budget's ``max_tokens`` count both.
        score_cost: the scorer's money (reported, or priced by the budget from its tokens),
            a part of ``cost``; ``None`` when unknown.
    """

    model_calls: int = 0
    score_calls: int = 0
    failed_calls: int = 0
    retries: int = 0
    cancelled: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    wall_seconds: float = 0.0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    score_input_tokens: int | None = None
    score_output_tokens: int | None = None
    score_cost: float | None = None

    @property
    def calls(self) -> int:
        """All model and scorer calls."""
        return self.model_calls + self.score_calls

    @property
    def total_tokens(self) -> int:
        """Reported input + output tokens of the model and of the scorer (0 when none)."""
        return ((self.input_tokens or 0) + (self.output_tokens or 0)
                + (self.score_input_tokens or 0) + (self.score_output_tokens or 0))

    def add_tokens(self, input_tokens: int | None, output_tokens: int | None) -> None:
        """Add the model's input / output tokens (``None``: not reported, nothing added)."""
        if input_tokens is not None:
            self.input_tokens = (self.input_tokens or 0) + int(input_tokens)
        if output_tokens is not None:
            self.output_tokens = (self.output_tokens or 0) + int(output_tokens)

    def add_cache(self, read: int | None, write: int | None, write_1h: int | None) -> None:
        """Add the model's cache read / write / 1-hour write tokens (parts of its input)."""
        if read is not None:
            self.cache_read_tokens = (self.cache_read_tokens or 0) + int(read)
        if write is not None:
            self.cache_write_tokens = (self.cache_write_tokens or 0) + int(write)
        if write_1h is not None:
            self.cache_write_1h_tokens = (self.cache_write_1h_tokens or 0) + int(write_1h)

    def add_score(self, input_tokens: int | None, output_tokens: int | None,
                  cost: float | None) -> None:
        """Add the scorer's tokens and money (its money counted in ``cost`` too)."""
        self._add_score_parts(input_tokens, output_tokens, cost)
        self.add_cost(cost)

    def _add_score_parts(self, input_tokens: int | None, output_tokens: int | None,
                         cost: float | None) -> None:
        if input_tokens is not None:
            self.score_input_tokens = (self.score_input_tokens or 0) + int(input_tokens)
        if output_tokens is not None:
            self.score_output_tokens = (self.score_output_tokens or 0) + int(output_tokens)
        if cost is not None:
            self.score_cost = (self.score_cost or 0.0) + float(cost)

    def add_cost(self, cost: float | None) -> None:
        if cost is not None:
            self.cost = (self.cost or 0.0) + float(cost)

    def merge(self, other: Usage) -> None:
        """Add ``other``'s counters, tokens and cost (not its wall time) into this one."""
        self.model_calls += other.model_calls
        self.score_calls += other.score_calls
        self.failed_calls += other.failed_calls
        self.retries += other.retries
        self.cancelled += other.cancelled
        self.add_tokens(other.input_tokens, other.output_tokens)
        self.add_cost(other.cost)
        # the rarely reported parts: one test each for the common sample that has none
        if (other.cache_read_tokens is not None or other.cache_write_tokens is not None
                or other.cache_write_1h_tokens is not None):
            self.add_cache(other.cache_read_tokens, other.cache_write_tokens,
                           other.cache_write_1h_tokens)
        if (other.score_input_tokens is not None or other.score_output_tokens is not None
                or other.score_cost is not None):
            # its score_cost is a part of its cost, added above
            self._add_score_parts(other.score_input_tokens, other.score_output_tokens,
                                  other.score_cost)

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "model_calls": self.model_calls,
            "score_calls": self.score_calls,
            "failed_calls": self.failed_calls,
            "retries": self.retries,
            "cancelled": self.cancelled,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost": _json_float(self.cost),
            "wall_seconds": float(self.wall_seconds),
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_write_1h_tokens": self.cache_write_1h_tokens,
            "score_input_tokens": self.score_input_tokens,
            "score_output_tokens": self.score_output_tokens,
            "score_cost": _json_float(self.score_cost),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, field: str = "usage") -> Usage:
        """Inverse of :meth:`to_dict` (``calls``, derived, is ignored); a missing counter is 0,
        a missing token count or cost ``None`` (a dict written before a field existed reads).

        A value of the wrong kind (a negative or fractional count, a NaN cost...) is a
        :class:`beacon.ConfigError` naming it (``field`` prefixes the names).
        """
        d = _mapping(field, data)
        u = cls()
        for name in ("model_calls", "score_calls", "failed_calls", "retries", "cancelled"):
            if name in d:
                setattr(u, name, _count_field(f"{field}.{name}", d[name]))
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                     "cache_write_1h_tokens", "score_input_tokens", "score_output_tokens"):
            setattr(u, name, _count_field(f"{field}.{name}", d.get(name), optional=True))
        u.cost = _float_field(f"{field}.cost", d.get("cost"), optional=True, nonneg=True)
        u.score_cost = _float_field(f"{field}.score_cost", d.get("score_cost"), optional=True,
                                    nonneg=True)
        u.wall_seconds = _float_field(
            f"{field}.wall_seconds", d.get("wall_seconds", 0.0), nonneg=True
        ) or 0.0
        return u


@dataclass(slots=True)
class Candidate:
    """One drawn sample.

    Attributes:
        index: 0-based draw order within the query. Samples cancelled in flight when the query
            stopped are not candidates, so indices may skip inside the last batch.
        text: the response text ("" when generation failed).
        reward: the raw reward from the scorer (before any config transform); ``None`` when the
            sample failed.
        failed: generation or scoring failed after retries, or the reward was invalid.
        error: ``"ExceptionType: message"`` of the failure, else ``None``.
        usage: this sample's calls, tokens and cost; ``wall_seconds`` is its latency.
        raw: the model's own response object (e.g. an ``AIMessage``); in memory only.
    """

    index: int
    text: str
    reward: float | None = None
    failed: bool = False
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    raw: Any = field(default=None, repr=False, compare=False)

    @property
    def latency(self) -> float:
        """Seconds from the start of generation to the end of scoring (retries included)."""
        return self.usage.wall_seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "text": self.text,
            "reward": _json_float(self.reward),
            "failed": self.failed,
            "error": self.error,
            "usage": self.usage.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, field: str = "candidate") -> Candidate:
        """Inverse of :meth:`to_dict`; a missing or invalid field is a
        :class:`beacon.ConfigError` naming it (``field`` prefixes the names)."""
        d = _mapping(field, data)
        if "index" not in d:
            raise ConfigError(f"{field}.index", None, "is required")
        failed = d.get("failed", False)
        if not isinstance(failed, bool):
            raise ConfigTypeError(f"{field}.failed", failed, "must be true or false")
        usage = d.get("usage")
        return cls(
            index=_count_field(f"{field}.index", d["index"]) or 0,
            text=_str_field(f"{field}.text", d.get("text", "")) or "",
            reward=_float_field(f"{field}.reward", d.get("reward"), optional=True),
            failed=failed,
            error=_str_field(f"{field}.error", d.get("error"), optional=True),
            usage=Usage() if usage is None else Usage.from_dict(usage, field=f"{field}.usage"),
        )


@dataclass(slots=True)
class BeaconResult:
    """The outcome of one query.

    Attributes:
        prompt: the prompt as given (any object; ``to_dict`` keeps what JSON can hold).
        candidates: every sample that completed or failed, in draw order.
        n_samples: successful samples charged (rewards the Stopper observed); failed and
            cancelled samples are not charged.
        stop_reason: one of ``index | horizon | absorbed | budget | error``.
        trace: the Stopper's :class:`~beacon.stopper.TraceRecord` per decision (serialized as
            dicts by :meth:`to_dict`).
        usage: calls, failures, tokens, cost and wall time of the whole query.
        error: for ``stop_reason == "error"``: what ended the query (the last failure, or an
            unexpected exception), as ``"ExceptionType: message"``. Also set, with the
            Stopper's own ``stop_reason`` kept, when an observer raised on the final stop
            decision (the query was complete; the observer's error is still reported).
            Otherwise ``None``.
        metadata: the caller's metadata, passed through unchanged (``to_dict`` keeps what JSON
            can hold: numpy numbers as plain ones, other objects as ``None``).
        config: the :class:`~beacon.config.BeaconConfig` used, as ``to_dict()``.
        budget_unenforced: the :class:`~beacon.budget.Budget` caps (``"max_tokens"``,
            ``"max_cost"``) this query could not enforce because a model response reported
            nothing they count (no tokens; no cost and no per-token price that applies): the
            query's spend may exceed them. Empty when every cap set was enforced.
    """

    prompt: Any
    candidates: list[Candidate] = field(default_factory=list)
    n_samples: int = 0
    stop_reason: str = "error"
    trace: list[TraceRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    budget_unenforced: list[str] = field(default_factory=list)

    # -- views ----------------------------------------------------------------------------------
    @property
    def scored(self) -> list[Candidate]:
        """Candidates with a reward (not failed)."""
        return [c for c in self.candidates if c.reward is not None and not c.failed]

    @property
    def n_failed(self) -> int:
        """Failed samples (after retries)."""
        return sum(1 for c in self.candidates if c.failed)

    @property
    def best(self) -> Candidate | None:
        """The candidate with the highest raw reward (first drawn on ties); ``None`` if none.

        This is the response BEACON returns: ``z_K``, the maximum observed reward, together
        with its text and index.
        """
        best: Candidate | None = None
        for c in self.scored:
            assert c.reward is not None
            if best is None or c.reward > (best.reward if best.reward is not None else -math.inf):
                best = c
        return best

    @property
    def best_text(self) -> str | None:
        b = self.best
        return None if b is None else b.text

    @property
    def best_reward(self) -> float | None:
        b = self.best
        return None if b is None else b.reward

    def preference_pair(self) -> tuple[Candidate, Candidate] | None:
        """``(chosen, rejected)``: highest and lowest reward among scored candidates.

        The paper's DPO rule (appendix "Preference Pair Generation Strategies for DPO"): chosen
        ``y_w`` has the highest reward, rejected ``y_l`` the lowest; when all rewards are equal
        (or fewer than two samples were scored) the prompt yields no pair and ``None`` is
        returned. Ties for best or worst resolve to the earliest drawn candidate.
        """
        scored = self.scored
        if len(scored) < 2:
            return None
        chosen = self.best
        rejected = scored[0]
        for c in scored[1:]:
            assert c.reward is not None and rejected.reward is not None
            if c.reward < rejected.reward:
                rejected = c
        assert chosen is not None and chosen.reward is not None and rejected.reward is not None
        if not chosen.reward > rejected.reward:
            return None
        return chosen, rejected

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``json.dumps(res.to_dict())`` works); :meth:`from_dict` inverts it.

        Non-finite floats become ``None``; in the prompt and metadata, numpy numbers become
        plain ones; a metadata value JSON cannot hold becomes ``None`` (:func:`_json_ready`),
        and so does a prompt with such a part (:func:`_json_prompt`); raw model responses
        are dropped.
        """
        best = self.best
        return {
            "prompt": _json_prompt(self.prompt),
            "best_index": None if best is None else best.index,
            "best_text": None if best is None else best.text,
            "best_reward": None if best is None else _json_float(best.reward),
            "n_samples": self.n_samples,
            "stop_reason": self.stop_reason,
            "candidates": [c.to_dict() for c in self.candidates],
            "trace": [t.to_dict() for t in self.trace],
            "usage": self.usage.to_dict(),
            "error": self.error,
            "metadata": _json_ready(dict(self.metadata)),
            "config": self.config,
            "budget_unenforced": list(self.budget_unenforced),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BeaconResult:
        """Inverse of :meth:`to_dict` (the derived ``best_*`` keys are ignored).

        Malformed data (a missing candidate index, a reward that is a string or NaN, a trace
        record missing fields...) is a :class:`beacon.ConfigError` naming the field by its
        path, e.g. ``candidates[2].reward``; never a ``KeyError`` or a silent coercion.
        """
        if not isinstance(data, Mapping):
            raise ConfigTypeError("result", data, "must be a JSON object")
        reason = data.get("stop_reason")
        if reason not in STOP_REASONS:
            raise ConfigError("stop_reason", reason, f"must be one of {STOP_REASONS}")
        candidates = [
            Candidate.from_dict(c, field=f"candidates[{i}]")
            for i, c in enumerate(_list_field("candidates", data.get("candidates")))
        ]
        trace = []
        for i, t in enumerate(_list_field("trace", data.get("trace"))):
            name = f"trace[{i}]"
            try:
                trace.append(TraceRecord.from_dict(dict(_mapping(name, t))))
            except ConfigError:
                raise
            except (TypeError, ValueError) as exc:
                raise ConfigError(name, t, f"is not a trace record ({exc})") from exc
        usage = data.get("usage")
        metadata = data.get("metadata")
        config = data.get("config")
        unenforced = _list_field("budget_unenforced", data.get("budget_unenforced"))
        for i, cap in enumerate(unenforced):
            if cap not in _UNENFORCEABLE:
                raise ConfigError(
                    f"budget_unenforced[{i}]", cap, f"must be one of {_UNENFORCEABLE}"
                )
        return cls(
            prompt=data.get("prompt"),
            candidates=candidates,
            n_samples=_count_field("n_samples", data.get("n_samples", 0)) or 0,
            stop_reason=str(reason),
            trace=trace,
            usage=Usage() if usage is None else Usage.from_dict(usage),
            error=_str_field("error", data.get("error"), optional=True),
            metadata={} if metadata is None else dict(_mapping("metadata", metadata)),
            config=None if config is None else dict(_mapping("config", config)),
            budget_unenforced=list(unenforced),
        )
