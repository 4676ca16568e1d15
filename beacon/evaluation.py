"""Offline evaluation of BEACON against fixed best-of-N on logged rewards.

This module holds the pure metrics shared by ``beacon replay`` / ``beacon tune`` and the benchmark
suite. It performs no printing and no plotting.

Logged rewards
    One JSON object per line, one line per prompt (``../shared/data/README.md``)::

        {"id": str, "rewards": [float | null, ...], "correct": [bool | null, ...] | null, ...}

    ``rewards[i]`` and ``correct[i]`` belong to the i-th sampled response in the order drawn;
    extra fields are ignored. :func:`load_logged` turns a file into :class:`LoggedRewards`: a
    prompts x samples float array in which missing samples (``null``/NaN) are dropped and each
    row is left-aligned (so column ``j`` is the j-th *available* sample) and padded with NaN.
    In a file a missing sample is ``null``: the non-standard literals ``NaN`` and ``Infinity``
    (which Python's ``json`` reads) are refused, naming the line and the reward's index; NaN
    marks a missing sample only in records built in Python (:func:`logged_from_records`), whose
    rewards may also be numpy scalars, ``Fraction`` or finite ``Decimal`` values.

Metrics (all means are over prompts)
    * average samples used ``E[K]``;
    * mean best raw reward ``E[z_K]`` (the best raw reward among the samples used);
    * mean standardized best reward ``E[zhat_K]``: every prompt's rewards are z-scored by that
      prompt's own mean and standard deviation over *all* its logged samples (population std,
      ``ddof=0``), as the paper's "expected standardized reward"; a prompt whose logged rewards
      are all equal has ``zhat = 0`` for every sample;
    * accuracy, where ``correct`` labels exist: the label of the chosen sample (unlabelled
      chosen samples are left out of the mean);
    * value ``E[zhat_K - K c]``: the paper's objective ``E[z_K - K c]`` (eq. of the Bellman
      problem, section "Problem Setting") on the standardized scale, with the same numeric ``c``
      the stopping rule used, as in the paper's tables. ``c`` is charged per sample used.

    A mean (or a standard error over prompts) whose plain sum would overflow, for finite
    rewards near the float limit (1e308), is taken in units of the largest ``|value|``;
    every other one is numpy's own, bit for bit.

Fixed best-of-N uses the first ``N`` logged samples of every prompt and picks the best raw reward
(first on ties), for N = 1..horizon. BEACON uses :func:`beacon.replay.replay` on the same samples.

Cross-fitted priors (:func:`cross_fit`)
    A prior fitted on a log and then scored on the same log has seen the rewards it is judged
    on. :func:`cross_fit` splits the prompts into ``K`` folds (a seeded permutation, so the split
    is reproducible) and, for each fold ``f``, fits the empirical-Bayes prior (and a fitted
    transform such as ``gaussianize``) with :func:`beacon.fitting.fit_reward_model` on the
    prompts *outside* ``f`` only; the prompts of ``f`` are replayed with that fit. Every prompt is
    scored exactly once, never with a prior fitted on its own rewards.

    Units of ``c`` under cross-fitting: ``c`` is a cost per sample in per-prompt standardized
    units (one typical within-prompt standard deviation of the reward = 1), the units of the
    value ``E[zhat_K - K c]``. Fold ``f``'s Stopper runs at ``c * s_f`` with ``s_f =
    FitResult.within_scale = sqrt(beta0 / alpha0)``, the typical within-prompt standard deviation
    in the model's (transformed) units under that fold's prior; ``s_f = 1`` for the Beta-prior
    families (``bernoulli``, ``judge``), whose ``c`` is in successes / wins.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from beacon._checks import is_integer, is_real, real_as_float
from beacon.config import BeaconConfig
from beacon.errors import ConfigError, ConfigTypeError, RewardError
from beacon.priors import Prior, rewards_before_first_decision
from beacon.transforms import RewardTransform, is_pandas_na, table_values

if TYPE_CHECKING:
    from beacon.fitting import FitResult

__all__ = [
    "CROSSFIT_SEED",
    "DEFAULT_FOLDS",
    "FIT_TRANSFORMS",
    "QUALITY_KINDS",
    "CostChoice",
    "CrossFit",
    "Evaluation",
    "FoldFit",
    "LogFormatError",
    "LoggedRewards",
    "MatchedDifference",
    "PolicyMetrics",
    "PromptOutcomes",
    "QualityKind",
    "SweepPoint",
    "TuneResult",
    "cap_horizon",
    "choose_cost_for_max_quality_loss",
    "choose_cost_for_target_samples",
    "cost_grid",
    "cross_fit",
    "default_quality",
    "evaluate",
    "evaluate_beacon",
    "evaluate_fixed",
    "find_knee",
    "fixed_best_of_n",
    "fold_assignment",
    "interpolate_fixed",
    "load_logged",
    "logged_from_records",
    "matched_difference",
    "matched_fixed_per_prompt",
    "name_reward_error",
    "quality_of",
    "quality_per_prompt",
    "standardize",
    "sweep_costs",
    "tune",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
QualityKind = Literal["standardized", "reward", "accuracy"]
QUALITY_KINDS: tuple[str, ...] = ("standardized", "reward", "accuracy")
ProgressFn = Callable[[int, int], None]

# Relative size (to the largest |reward| of the prompt) below which a prompt's reward spread
# counts as zero: all rewards equal up to float rounding of the mean (about 1e-16 relative), so
# such prompts get zhat = 0 instead of a division by ~0. Relative, not absolute: rewards on a
# 1e-9 scale have a real spread.
_STD_EPS = 1e-12


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
class LogFormatError(ConfigError):
    """A logged-rewards file or record that cannot be used.

    ``field`` and ``value`` name the offending JSON field; ``path`` and ``line`` (1-based) say
    where it is (``line`` is None for a problem with the file as a whole).
    """

    def __init__(
        self,
        path: str | None,
        line: int | None,
        field: str,
        value: Any,
        reason: str,
    ) -> None:
        super().__init__(field, value, reason)
        self.path = path
        self.line = line
        where = path or "<records>"
        if line is not None:
            where = f"{where}:{line}"
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        self.args = (f"{where}: invalid {field}={shown}: {reason}",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, eq=False)
class LoggedRewards:
    """Logged rewards of many prompts, left-aligned in a NaN-padded 2-D array.

    Attributes:
        ids: prompt ids, one per row.
        rewards: ``(prompts, samples)`` raw rewards; row ``i`` holds ``counts[i]`` finite rewards
            in the order drawn, then NaN (a NaN given in the middle of a row is moved to its
            end on construction, with the matching label). Every row needs one reward.
        correct: same shape, 1.0 / 0.0 labels of the same samples (NaN = unlabelled or
            padding), or None when the log has no labels at all.
        source: where the data came from (a path, or ``<records>``).
        zscores: per-prompt standardized rewards (same shape); None computes them from
            ``rewards``. :meth:`truncate` and :meth:`subset` carry them over, so the z-scores
            always use every logged sample of a prompt, not only the first ``horizon``.
        positions: same shape, the index of each sample in its record's logged list (-1 for
            padding), so that errors name a sample as the log numbers it after missing
            samples were dropped; None: the column (nothing was dropped or moved).
        records: the 1-based record (position in the log) of each prompt, kept by
            :meth:`subset`; None: row + 1.
    """

    ids: tuple[str, ...]
    rewards: FloatArray
    correct: FloatArray | None = None
    source: str = "<records>"
    zscores: FloatArray | None = None
    positions: IntArray | None = None
    records: IntArray | None = None

    def __post_init__(self) -> None:
        r = _float_array(self.rewards, "rewards")
        if r.ndim != 2:
            raise ConfigError("rewards", f"shape {r.shape}", "must be 2-D (prompts x samples)")
        if len(self.ids) != r.shape[0]:
            raise ConfigError("ids", len(self.ids), f"must have one id per row ({r.shape[0]})")
        if r.shape[0] == 0:
            raise ConfigError("rewards", "0 prompts", "the log holds no prompt")
        if self.correct is not None:
            c = _float_array(self.correct, "correct")
            if c.shape != r.shape:
                raise ConfigError("correct", f"shape {c.shape}", f"must match rewards {r.shape}")
            object.__setattr__(self, "correct", c)
        if self.zscores is not None:
            z = np.asarray(self.zscores, dtype=np.float64)
            if z.shape != r.shape:
                raise ConfigError("zscores", f"shape {z.shape}", f"must match rewards {r.shape}")
            object.__setattr__(self, "zscores", z)
        if self.positions is not None:
            pos = np.asarray(self.positions, dtype=np.int64)
            if pos.shape != r.shape:
                raise ConfigError(
                    "positions", f"shape {pos.shape}", f"must match rewards {r.shape}"
                )
            object.__setattr__(self, "positions", pos)
        if self.records is not None:
            rec = np.asarray(self.records, dtype=np.int64)
            if rec.shape != (r.shape[0],):
                raise ConfigError("records", f"shape {rec.shape}", f"must be ({r.shape[0]},)")
            object.__setattr__(self, "records", rec)
        present = ~np.isnan(r)
        empty = np.flatnonzero(~present.any(axis=1))
        if empty.size:
            i = int(empty[0])
            raise ConfigError("rewards", f"prompt {self.ids[i]!r}", "has no logged reward")
        if np.any(present[:, 1:] & ~present[:, :-1]):
            # A missing sample in the middle of a row: move it to the end (stable, so the order
            # of the logged samples is kept), with the labels and z-scores of the same samples.
            order = np.argsort(~present, axis=1, kind="stable")
            rows = np.arange(r.shape[0])[:, None]
            r = r[rows, order]
            if self.correct is not None:
                object.__setattr__(self, "correct", self.correct[rows, order])
            if self.zscores is not None:
                object.__setattr__(self, "zscores", self.zscores[rows, order])
            object.__setattr__(self, "positions", self.sample_positions[rows, order])
        object.__setattr__(self, "rewards", r)

    # -- shape ------------------------------------------------------------------------------
    @property
    def n_prompts(self) -> int:
        return int(self.rewards.shape[0])

    @cached_property
    def counts(self) -> IntArray:
        """Number of logged (finite) rewards per prompt."""
        counts: IntArray = np.sum(~np.isnan(self.rewards), axis=1).astype(np.int64)
        return counts

    @property
    def min_samples(self) -> int:
        """Samples every prompt has: the largest horizon a fair best-of-N comparison allows."""
        return int(self.counts.min())

    @property
    def max_samples(self) -> int:
        return int(self.counts.max())

    @property
    def sample_positions(self) -> IntArray:
        """:attr:`positions`, or each column's own index where it is None (a read-only view:
        callers index it, which copies)."""
        if self.positions is not None:
            return self.positions
        out: IntArray = np.broadcast_to(
            np.arange(self.rewards.shape[1], dtype=np.int64), self.rewards.shape
        )
        return out

    @property
    def record_numbers(self) -> IntArray:
        """:attr:`records`, or row + 1 where it is None."""
        if self.records is not None:
            return self.records
        return np.arange(1, self.n_prompts + 1, dtype=np.int64)

    def sample_position(self, row: int, column: int) -> int:
        """Index in its record's logged list of the sample at ``(row, column)``."""
        return column if self.positions is None else int(self.positions[row, column])

    def record(self, row: int) -> int:
        """The 1-based record (position in the log) of prompt ``row``."""
        return int(self.record_numbers[row])

    @cached_property
    def is_binary(self) -> bool:
        """Every logged reward is 0 or 1 (pass/fail verdicts)."""
        r = self.rewards[~np.isnan(self.rewards)]
        return bool(np.all((r == 0.0) | (r == 1.0)))

    @property
    def has_labels(self) -> bool:
        return self.correct is not None and bool(np.any(~np.isnan(self.correct)))

    # -- views ------------------------------------------------------------------------------
    def subset(
        self, rows: Sequence[int] | NDArray[np.integer[Any]] | NDArray[np.bool_]
    ) -> LoggedRewards:
        """The prompts selected by ``rows`` (indices or a boolean mask), e.g. a train/test split."""
        sel = np.asarray(rows)
        if sel.size == 0:
            sel = sel.astype(np.int64)  # [] is a float array, not an index: 0 prompts below
        idx = np.arange(self.n_prompts)[sel]
        return LoggedRewards(
            ids=tuple(self.ids[int(i)] for i in idx),
            rewards=self.rewards[idx],
            correct=None if self.correct is None else self.correct[idx],
            source=self.source,
            zscores=self.standardized[idx],
            positions=None if self.positions is None else self.positions[idx],
            records=self.record_numbers[idx],
        )

    def truncate(self, horizon: int) -> LoggedRewards:
        """Only the first ``horizon`` samples of every prompt."""
        if horizon < 1:
            raise ConfigError("horizon", horizon, "must be >= 1")
        return replace(
            self,
            rewards=self.rewards[:, :horizon],
            correct=None if self.correct is None else self.correct[:, :horizon],
            zscores=self.standardized[:, :horizon],
            positions=None if self.positions is None else self.positions[:, :horizon],
        )

    def permuted(self, seed: int | np.random.Generator) -> LoggedRewards:
        """Each prompt's logged samples (and their labels) in a random order.

        The arrival order is what a sequential rule sees; averaging a metric over a few
        permutations removes the luck of the logged order. Padding stays at the end of each row,
        and the z-scores are unchanged (they do not depend on order).
        """
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        order = np.tile(np.arange(self.rewards.shape[1]), (self.n_prompts, 1))
        for i, k in enumerate(self.counts):
            order[i, :k] = rng.permutation(int(k))
        rows = np.arange(self.n_prompts)[:, None]
        return replace(
            self,
            rewards=self.rewards[rows, order],
            correct=None if self.correct is None else self.correct[rows, order],
            zscores=self.standardized[rows, order],
            positions=self.sample_positions[rows, order],
        )

    def for_family(self, family: str) -> LoggedRewards:
        """The data the given family replays: for ``bernoulli`` the ``correct`` labels as rewards.

        A log without labels whose rewards are all 0 or 1 (a verifier's verdicts logged as the
        reward) is its own labels. Other families use the rewards unchanged.
        """
        if family != "bernoulli":
            return self
        if not self.has_labels:
            if self.is_binary:
                return LoggedRewards(
                    self.ids,
                    self.rewards,
                    self.rewards,
                    self.source,
                    positions=self.positions,
                    records=self.records,
                )
            bad = np.argwhere(~np.isnan(self.rewards) & (self.rewards != 0.0)
                              & (self.rewards != 1.0))[0]
            i, j = int(bad[0]), int(bad[1])
            raise LogFormatError(
                self.source,
                None,
                "correct",
                None,
                "the bernoulli family needs per-sample 'correct' labels, or rewards that are "
                f"all 0 or 1; this log has no labels and prompt {self.ids[i]!r} has reward "
                f"{float(self.rewards[i, j])!r} (sample {self.sample_position(i, j)})",
            )
        assert self.correct is not None
        rows = [row[~np.isnan(row)] for row in self.correct]
        unlabelled = [i for i, row in enumerate(rows) if row.size == 0]
        if unlabelled:
            # LoggedRewards would say the prompt "has no logged reward": it has rewards, no labels
            i = unlabelled[0]
            raise LogFormatError(
                self.source,
                None,
                "correct",
                f"prompt {self.ids[i]!r}",
                f"has rewards but no 'correct' label ({len(unlabelled)} of {self.n_prompts} "
                "prompts have none); the bernoulli family replays the labels: leave such "
                "prompts out (beacon's --min-samples 1), or label them",
            )
        pos = self.sample_positions
        kept = [pos[i][~np.isnan(row)] for i, row in enumerate(self.correct)]
        return LoggedRewards(
            self.ids,
            _pad(rows),
            _pad(rows),
            self.source,
            positions=_pad(kept, -1, np.int64),
            records=self.records,
        )

    @cached_property
    def standardized(self) -> FloatArray:
        """Rewards z-scored per prompt over all its logged samples (see :func:`standardize`)."""
        return standardize(self.rewards) if self.zscores is None else self.zscores


def _float_array(value: Any, field: str) -> FloatArray:
    """``value`` as a float array; a pandas table's missing values (``pd.NA``) are NaN.

    Was numpy's bare TypeError (a nullable ``Float64`` frame holding ``pd.NA``) or ValueError
    (lists of different lengths); now a ConfigError naming ``field``. The plain conversion is
    tried first, so an array that converts costs nothing more.
    """
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        table = table_values(value)
        if table is not None:
            return table
        raise ConfigError(
            field, f"{type(value).__name__} object",
            "must be numbers (NaN = missing) in a rectangular prompts x samples array; build "
            "ragged per-prompt lists with logged_from_records or beacon.fitting.reward_matrix",
        ) from exc


def _pad(rows: Sequence[Any], fill: float = np.nan, dtype: Any = np.float64) -> Any:
    """Rows of unequal length as one array, padded with ``fill`` (NaN for rewards and labels,
    -1 for sample positions)."""
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _real_of(v: Any) -> float | None:
    """``v`` as a float when it is a real number: a Python or numpy one (not a boolean), a
    ``fractions.Fraction``, or a ``decimal.Decimal`` (a record built from a database column);
    None otherwise. A non-finite Decimal is NaN or +-inf (a signalling NaN cannot be
    converted by ``float``), an int beyond the float range +-inf: the caller refuses both."""
    if is_real(v):
        return real_as_float(v)
    if isinstance(v, Decimal):
        if v.is_nan():
            return math.nan
        return float(v)  # +-inf for Decimal('Infinity') and beyond the float range
    return None


def _parse_number_list(
    obj: Any,
    name: str,
    path: str | None,
    line: int | None,
    labels: bool,
    nan_is_missing: bool = True,
) -> list[float]:
    """The numbers of one record's ``rewards`` (``labels=False``) or ``correct`` list; None is
    a missing sample (NaN). A NaN reward is missing too in records built in Python
    (``nan_is_missing``, numpy's marker); in a JSONL file (``load_logged``) it is the
    non-standard literal ``NaN``, refused with ``Infinity``: a log writes null for a missing
    sample, and a NaN score is a scorer's failure, not an absent sample."""
    if isinstance(obj, tuple) or (isinstance(obj, np.ndarray) and obj.ndim == 1):
        obj = list(obj)  # records built in Python (logged_from_records), not parsed from JSON
    elif not isinstance(obj, list | np.ndarray):
        table = table_values(obj)  # a pandas Series (a DataFrame row): pd.NA / NaN = null
        if table is not None and table.ndim == 1:
            obj = [None if math.isnan(v) else v for v in table.tolist()]
        elif table is None and getattr(obj, "ndim", None) == 1 and hasattr(obj, "tolist"):
            obj = obj.tolist()  # a Series of objects (numbers and pd.NA): value by value
    if not isinstance(obj, list):
        kind = "true/false/null" if labels else "numbers or null"
        raise LogFormatError(path, line, name, obj, f"must be a JSON list of {kind}")
    out: list[float] = []
    for j, v in enumerate(obj):
        if v is None:
            out.append(math.nan)
        elif labels and (isinstance(v, bool | np.bool_) or _real_of(v) in (0.0, 1.0)):
            out.append(1.0 if v else 0.0)
        elif not labels and (fv := _real_of(v)) is not None:  # numpy scalars, not booleans
            if math.isinf(fv) or (math.isnan(fv) and not (nan_is_missing and is_real(v))):
                raise LogFormatError(
                    path, line, f"{name}[{j}]", v,
                    "rewards must be finite (null marks a missing sample)",
                )  # fmt: skip
            out.append(fv)
        elif is_pandas_na(v):  # pd.NA in a list built from a pandas column: null
            out.append(math.nan)
        else:
            want = "true, false, 0, 1 or null" if labels else "a number or null"
            raise LogFormatError(path, line, f"{name}[{j}]", v, f"must be {want}")
    return out


_Row = tuple[str, list[float], list[float] | None, list[int]]


def _record_row(
    rec: Any, path: str | None, line: int | None, default_id: str, nan_is_missing: bool = True
) -> _Row:
    if not isinstance(rec, Mapping):
        raise LogFormatError(path, line, "record", rec, "each line must be a JSON object")
    if "rewards" not in rec:
        raise LogFormatError(
            path, line, "rewards", None, "missing; each line needs a 'rewards' list"
        )
    rid = rec.get("id", default_id)
    if not (isinstance(rid, str) or is_integer(rid)):  # numpy integers too (a pandas column)
        raise LogFormatError(path, line, "id", rid, "must be a string or an integer")
    if not isinstance(rid, str):
        rid = int(rid)
    rewards = _parse_number_list(
        rec["rewards"], "rewards", path, line, labels=False, nan_is_missing=nan_is_missing
    )
    labels_obj = rec.get("correct")
    labels: list[float] | None = None
    if labels_obj is not None:
        labels = _parse_number_list(labels_obj, "correct", path, line, labels=True)
        if len(labels) != len(rewards):
            raise LogFormatError(
                path,
                line,
                "correct",
                f"{len(labels)} labels",
                f"must have one label per reward ({len(rewards)} rewards)",
            )
    keep = [j for j, r in enumerate(rewards) if not math.isnan(r)]
    if not keep:
        raise LogFormatError(path, line, "rewards", rec["rewards"], "no logged reward")
    kept_labels = None if labels is None else [labels[j] for j in keep]
    return str(rid), [rewards[j] for j in keep], kept_labels, keep


def _build(
    rows: list[_Row],
    source: str,
    lines: Sequence[int] | None = None,
) -> LoggedRewards:
    """``rows`` (id, rewards, labels, positions of the kept samples) as :class:`LoggedRewards`;
    ``lines[i]`` is row i's line."""
    if not rows:
        raise LogFormatError(source, None, "file", source, "holds no prompt (empty log)")
    where = list(range(1, len(rows) + 1)) if lines is None else list(lines)
    first: dict[str, int] = {}
    for (rid, _, _, _), line in zip(rows, where, strict=True):
        if rid in first:
            # Two lines of one prompt would be scored twice, and cross-fitting could fit a
            # prompt's prior on its own rewards (the other line in another fold).
            raise LogFormatError(
                source,
                line,
                "id",
                rid,
                f"repeats the id of line {first[rid]}; a log has one line per prompt: merge "
                "the lines' samples into one, or give them distinct ids",
            )
        first[rid] = line
    ids = tuple(r[0] for r in rows)
    rewards = _pad([np.asarray(r[1], dtype=np.float64) for r in rows])
    correct: FloatArray | None = None
    if any(r[2] is not None for r in rows):
        correct = np.full(rewards.shape, np.nan)
        for i, (_, rw, lab, _) in enumerate(rows):
            if lab is not None:
                correct[i, : len(rw)] = lab
    positions = _pad([np.asarray(r[3], dtype=np.int64) for r in rows], -1, np.int64)
    return LoggedRewards(ids, rewards, correct, source, positions=positions)


def logged_from_records(records: Iterable[Any], source: str = "<records>") -> LoggedRewards:
    """Build :class:`LoggedRewards` from already-parsed records (dicts in the file format).

    Errors name the record by its 1-based position as ``line``.
    """
    rows = [_record_row(rec, source, i, str(i - 1)) for i, rec in enumerate(records, start=1)]
    return _build(rows, source)


def load_logged(path: str | Path) -> LoggedRewards:
    """Read a logged-rewards JSONL file (format in the module docstring).

    Blank lines are skipped. Raises :class:`LogFormatError` with the 1-based line number and the
    reason for a line that is not a JSON object of the expected shape, that is not UTF-8 text,
    or that repeats an earlier line's ``id`` (one line per prompt), and for a missing file.
    """
    p = Path(path)
    src = str(p)
    if not p.exists():
        raise LogFormatError(src, None, "file", src, "no such file")
    if p.is_dir():
        raise LogFormatError(src, None, "file", src, "is a directory, not a JSONL file")
    rows: list[_Row] = []
    lines: list[int] = []
    try:
        with p.open("r", encoding="utf-8-sig") as fh:
            for lineno, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise LogFormatError(
                        src,
                        lineno,
                        "line",
                        text.strip(),
                        f"not valid JSON ({exc.msg}, column {exc.colno})",
                    ) from exc
                rows.append(_record_row(rec, src, lineno, str(lineno), nan_is_missing=False))
                lines.append(lineno)
    except UnicodeDecodeError as exc:
        raise _not_utf8(p) from exc
    return _build(rows, src, lines)


def _not_utf8(path: Path) -> LogFormatError:
    """The error for a file that is not UTF-8: the line and the bytes that do not decode."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        return LogFormatError(
            str(path),
            line,
            "line",
            raw[exc.start : exc.end],
            f"not UTF-8 text (byte {raw[exc.start]:#04x} at column {col}); save the log as UTF-8",
        )
    return LogFormatError(str(path), None, "file", str(path), "not UTF-8 text")


# ---------------------------------------------------------------------------------------------
# cross-fitted priors
# ---------------------------------------------------------------------------------------------
# Fixed so that a cross-fitted result is reproducible run to run (and in the docs); the split is
# a permutation of the prompts, so no fold depends on the order of the log.
CROSSFIT_SEED = 20_251_122
DEFAULT_FOLDS = 5
FIT_TRANSFORMS: tuple[str, ...] = ("gaussianize", "logit", "none")
# Families whose prior is a Beta on a success / win probability: c is in successes, < 1.
_BETA_FAMILIES = ("bernoulli", "judge")

Fitter = Callable[[FloatArray, str, "str | RewardTransform | None"], "FitResult"]


def fold_assignment(n_prompts: int, folds: int, seed: int = CROSSFIT_SEED) -> IntArray:
    """Fold of each prompt: ``permutation(n_prompts) % folds`` with a seeded generator.

    Folds differ in size by at most one prompt. Raises :class:`beacon.ConfigError` on
    ``folds`` outside ``[2, n_prompts]``.
    """
    if isinstance(folds, bool) or not isinstance(folds, int | np.integer):
        raise ConfigError("folds", folds, "must be an integer")
    if folds < 2:
        raise ConfigError("folds", folds, "must be >= 2 (a prior needs prompts outside the fold)")
    if folds > n_prompts:
        raise ConfigError("folds", folds, f"must be at most the number of prompts ({n_prompts})")
    perm = np.random.default_rng(seed).permutation(n_prompts)
    out: IntArray = (perm % int(folds)).astype(np.int64)
    return out


@dataclass(frozen=True, eq=False)
class FoldFit:
    """The prior (and transform) fitted for one fold, on the prompts outside it.

    Attributes:
        prior: the fitted prior (model units).
        transform: the transform the prior lives on (fitted on the same prompts for
            ``gaussianize``), or None.
        within_scale: ``s_f``, the typical within-prompt sd in model units
            (:attr:`beacon.fitting.FitResult.within_scale`); the Stopper's cost is ``c * s_f``.
        train_rows: indices (into the log) of the prompts the fit used.
    """

    prior: Prior
    transform: RewardTransform | None
    within_scale: float
    train_rows: IntArray


@dataclass(frozen=True, eq=False)
class CrossFit:
    """A K-fold cross-fitted prior: one :class:`FoldFit` per fold, and each prompt's fold.

    Attributes:
        family: the reward family fitted (``normal``, ``bernoulli`` or ``judge``).
        transform: the transform kind (``gaussianize``, ``logit``, ``none`` or a custom kind).
        folds: fold of each prompt (length = prompts of the log it was fitted on).
        fits: ``fits[f]`` was fitted on the prompts with ``folds != f``.
        seed: the seed of :func:`fold_assignment`.
        ids: the ids of the prompts it was fitted on, in the log's order (set by
            :func:`cross_fit`); None for one built by hand, whose prompts are then checked by
            count only.
    """

    family: str
    transform: str
    folds: IntArray
    fits: tuple[FoldFit, ...]
    seed: int = CROSSFIT_SEED
    ids: tuple[str, ...] | None = None

    @property
    def n_folds(self) -> int:
        return len(self.fits)

    @property
    def n_prompts(self) -> int:
        return int(self.folds.shape[0])

    def fold_config(self, fold: int, cfg: BeaconConfig) -> BeaconConfig:
        """``cfg`` for the prompts of ``fold``: that fold's prior and transform, cost ``c * s_f``.

        ``cfg.cost`` is ``c`` in per-prompt standardized units (module docstring).
        """
        fit = self.fits[fold]
        return cfg.replace(
            family=self.family,
            prior=fit.prior,
            transform=fit.transform,
            cost=cfg.cost * fit.within_scale,
        )

    @property
    def scales(self) -> FloatArray:
        """``s_f`` of every fold."""
        return np.array([f.within_scale for f in self.fits], dtype=np.float64)

    def describe(self) -> str:
        """One line: what was fitted, on how many folds."""
        prior = "Beta" if self.family in _BETA_FAMILIES else "NIG"
        tr = "" if self.transform == "none" else f" + {self.transform} transform"
        return f"{prior} prior{tr} cross-fitted on {self.n_folds} folds"

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "transform": self.transform,
            "folds": self.n_folds,
            "seed": self.seed,
            "cost_units": "per-prompt standardized (c * within_scale per fold)"
            if self.family not in _BETA_FAMILIES
            else "successes (within_scale = 1)",
            "fits": [
                {
                    "prior": f.prior.to_dict(),
                    "transform": None if f.transform is None else f.transform.kind,
                    "within_scale": f.within_scale,
                    "train_prompts": int(f.train_rows.size),
                }
                for f in self.fits
            ],
        }


def _default_fitter(
    train: FloatArray, family: str, transform: str | RewardTransform | None
) -> FitResult:
    from beacon.fitting import fit_reward_model

    return fit_reward_model(train, family, transform=transform)


def cross_fit(
    data: LoggedRewards,
    family: str = "normal",
    transform: str | RewardTransform | None = "gaussianize",
    folds: int = DEFAULT_FOLDS,
    seed: int = CROSSFIT_SEED,
    fitter: Fitter | None = None,
) -> CrossFit:
    """Fit a prior (and transform) per fold on the *other* folds' prompts (module docstring).

    Args:
        data: the raw log (``bernoulli`` fits on its ``correct`` labels).
        family: ``normal`` (NIG prior), ``bernoulli`` or ``judge`` (Beta prior).
        transform: ``gaussianize`` (fitted per fold on the training prompts' raw rewards),
            ``logit``, ``none`` (or ``identity``)/None, or a :class:`RewardTransform` used as
            given. Only the ``normal`` family takes a transform.
        folds: K >= 2 (at most the number of prompts).
        seed: seed of the fold split (:func:`fold_assignment`).
        fitter: ``fitter(train_rewards, family, transform) -> FitResult``; defaults to
            :func:`beacon.fitting.fit_reward_model`. It only ever receives the training rows.
    """
    if family not in ("normal", *_BETA_FAMILIES):
        raise ConfigError("family", family, "cross-fitting supports normal, bernoulli and judge")
    kind: str
    spec: str | RewardTransform | None
    if transform is None or (isinstance(transform, str) and transform in ("none", "identity")):
        kind, spec = "none", None
    elif isinstance(transform, RewardTransform):
        kind, spec = transform.kind, transform
    elif isinstance(transform, str) and transform in FIT_TRANSFORMS:
        kind, spec = transform, transform
    else:
        raise ConfigError("transform", transform, f"must be one of {', '.join(FIT_TRANSFORMS)}")
    if family != "normal" and kind != "none":
        raise ConfigError("transform", kind, f"the {family} family takes raw rewards")
    fam = data.for_family(family)
    assign = fold_assignment(fam.n_prompts, folds, seed)
    fit_fn = fitter or _default_fitter
    fits = []
    for f in range(int(folds)):
        train = np.flatnonzero(assign != f)
        try:
            res = fit_fn(fam.rewards[train], family, spec)
        except RewardError as exc:
            # the fit names (row, column) of the training rows; the user knows prompts by id
            named = name_reward_error(fam, exc, train)
            if named is exc:
                raise
            raise named from exc
        except ConfigError as exc:
            # "need 2 prompts with >= 2 rewards" or "no successes" may hold of the whole log
            # and fail only on one fold's training prompts: say which ones were fitted
            if type(exc) is not ConfigError:
                raise
            if fitter is None:
                # the same failure on the whole log (rewards that never vary, one sample per
                # prompt): no number of folds helps, so it is reported as the log's own
                try:
                    _default_fitter(fam.rewards, family, spec)
                except ConfigError as whole:
                    if type(whole) is ConfigError and whole.field == exc.field:
                        raise ConfigError(
                            whole.field, whole.value, f"{whole.reason} (on the whole log)"
                        ) from exc
            # more folds make each fold smaller and its training prompts more: the fit that
            # failed on these prompts may succeed on more of them (fewer folds, fewer prompts)
            todo = (
                "add prompts to the log (every fold already trains on all prompts but one)"
                if train.size >= fam.n_prompts - 1
                else f"use more folds (at most {fam.n_prompts}, leave-one-out) or a larger log"
            )
            raise ConfigError(
                exc.field, exc.value,
                f"{exc.reason} (cross-fitting fold {f} of {int(folds)}: its prior is fitted on "
                f"the {train.size} prompts outside it; {todo})",
            ) from exc
        fits.append(FoldFit(res.prior, res.transform, float(res.within_scale), train))
    return CrossFit(family, kind, assign, tuple(fits), seed, tuple(fam.ids))


def _check_crossfit(data: LoggedRewards, crossfit: CrossFit) -> None:
    """``crossfit`` was fitted on ``data``'s prompts, in the same order.

    Each row is replayed with the prior of its fold, found by position: a cross-fit of another
    log of as many prompts, or of this log's prompts in another order (a subset, a shuffle),
    would replay prompts with priors fitted on their own rewards, or on another log, without
    a word. The ids tell (when the cross-fit has them; one built by hand may not).
    """
    if crossfit.n_prompts != data.n_prompts:
        raise ConfigError(
            "crossfit",
            f"{crossfit.n_prompts} prompts",
            f"was fitted on another log (this one has {data.n_prompts} prompts)",
        )
    if crossfit.ids is None:
        return
    # ids may be any sequence (a list, a numpy array): compared element by element
    i = next(
        (k for k, (a, b) in enumerate(zip(crossfit.ids, data.ids, strict=True)) if a != b), None
    )
    if i is None:
        return
    raise ConfigError(
        "crossfit",
        f"prompt {crossfit.ids[i]!r} at row {i}",
        f"was fitted on other prompts or another order (row {i} of {data.source} is prompt "
        f"{data.ids[i]!r}); cross-fit this log as it is evaluated: cross_fit(data, ...)",
    )


# ---------------------------------------------------------------------------------------------
# elementary metrics
# ---------------------------------------------------------------------------------------------
def standardize(rewards: FloatArray) -> FloatArray:
    """Z-score each row by its own mean and population std over its finite entries.

    ``zhat_ij = (r_ij - mean_i) / std_i``; rows whose spread is zero (relative to their largest
    ``|r|``, up to float rounding) get ``zhat = 0``, whatever the scale of the rewards: z-scores
    do not change when every reward is multiplied by a constant. NaN stays NaN.
    """
    r = _float_array(rewards, "rewards")
    if r.ndim != 2:
        raise ConfigError("rewards", f"shape {r.shape}", "must be 2-D (prompts x samples)")
    with np.errstate(invalid="ignore"):
        scale = np.nanmax(np.abs(r), axis=1, keepdims=True)
        # Each row in units of its largest |r| first: the squares of 1e-200 or 1e200 rewards
        # would under- or overflow. z-scores do not change.
        r = r / np.where(scale > 0, scale, 1.0)
        mean = np.nanmean(r, axis=1, keepdims=True)
        sd = np.nanstd(r, axis=1, keepdims=True)
    flat = sd <= _STD_EPS
    z = (r - mean) / np.where(flat, 1.0, sd)
    return np.where(flat & ~np.isnan(r), 0.0, z)


def _unit_scaled(stat: Callable[[FloatArray], Any], x: FloatArray) -> float:
    """``stat(x)``, retaken in units of the largest ``|x|`` where it overflowed.

    ``stat`` is a mean, a standard deviation or an interpolation: a statistic that scales with
    ``x`` (``stat(x / s) * s == stat(x)`` in exact arithmetic). Finite values near the float
    limit (1e308) overflow its intermediate sums, squares or slopes to inf (or inf - inf =
    NaN); in units of ``s = max |x|`` they cannot, and the result is scaled back (to inf only
    where the true value itself lies beyond the limit, as a spread of +-1e308 values may).
    Only then: any other result is ``stat(x)``'s own, bit for bit. NaN in ``x`` is kept.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        v = float(stat(x))
        if not math.isfinite(v) and x.size and bool(np.isfinite(x).all()):
            s = float(np.max(np.abs(x)))
            v = float(stat(x / s)) * s
    return v


def _mean(x: FloatArray) -> float:
    """``np.mean(x)``, overflow-safe (:func:`_unit_scaled`)."""
    return _unit_scaled(np.mean, x)


def _std(x: FloatArray, ddof: int) -> float:
    """``np.std(x, ddof=ddof)``, overflow-safe (:func:`_unit_scaled`)."""
    return _unit_scaled(lambda v: np.std(v, ddof=ddof), x)


def fixed_best_of_n(rewards: FloatArray, n: int) -> tuple[IntArray, FloatArray]:
    """Column and raw value of the best of the first ``n`` samples of every row (first on ties).

    Rows must have at least one finite reward among their first ``n``.
    """
    if n < 1:
        raise ConfigError("n", n, "must be >= 1")
    head = np.asarray(rewards, dtype=np.float64)[:, :n]
    filled = np.where(np.isnan(head), -np.inf, head)
    chosen = np.argmax(filled, axis=1).astype(np.int64)
    best = head[np.arange(head.shape[0]), chosen]
    return chosen, best


@dataclass(frozen=True, eq=False)
class PromptOutcomes:
    """What one policy chose on each prompt, in prompt order (kept for paired comparisons).

    Attributes:
        best_reward: raw reward of the chosen sample.
        standardized: its per-prompt z-score.
        correct: its ``correct`` label (NaN where unlabelled), or None when the log has none.
    """

    best_reward: FloatArray
    standardized: FloatArray
    correct: FloatArray | None = None

    @property
    def n_prompts(self) -> int:
        return int(self.best_reward.size)


@dataclass(frozen=True)
class PolicyMetrics:
    """Metrics of one policy (BEACON at one ``c``, or fixed best-of-N) over a set of prompts.

    Attributes:
        policy: ``"beacon"`` or ``"best-of-N"``.
        n: N for best-of-N, None for BEACON.
        cost: the ``c`` charged in ``value`` (per sample, standardized units).
        avg_samples: ``E[K]``.
        mean_best_reward: ``E[z_K]`` in raw reward units.
        mean_standardized_reward: ``E[zhat_K]`` (per-prompt z-scores).
        accuracy: mean ``correct`` label of the chosen sample, None without labels.
        value: ``E[zhat_K - K c]``.
        stop_reasons: BEACON's stop-reason counts (None for best-of-N).
        truncated: prompts whose log ran out before BEACON stopped (0 for best-of-N).
        outcomes: the per-prompt values these means average (:func:`quality_per_prompt`), for
            paired standard errors; None for metrics built without them. Not serialized and
            not compared.
    """

    policy: str
    n: int | None
    cost: float
    avg_samples: float
    mean_best_reward: float
    mean_standardized_reward: float
    accuracy: float | None
    value: float
    stop_reasons: dict[str, int] | None = None
    truncated: int = 0
    outcomes: PromptOutcomes | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "n": self.n,
            "cost": self.cost,
            "avg_samples": self.avg_samples,
            "mean_best_reward": self.mean_best_reward,
            "mean_standardized_reward": self.mean_standardized_reward,
            "accuracy": self.accuracy,
            "value": self.value,
            "stop_reasons": self.stop_reasons,
            "truncated": self.truncated,
        }


def _metrics(
    data: LoggedRewards,
    chosen: IntArray,
    n_samples: IntArray,
    cost: float,
    policy: str,
    n: int | None,
) -> PolicyMetrics:
    rows = np.arange(data.n_prompts)
    best = data.rewards[rows, chosen]
    zbest = data.standardized[rows, chosen]
    accuracy: float | None = None
    labels: FloatArray | None = None
    if data.correct is not None:
        labels = data.correct[rows, chosen]
        known = ~np.isnan(labels)
        if known.any():
            accuracy = float(np.mean(labels[known]))
    k = n_samples.astype(np.float64)
    with np.errstate(over="ignore"):  # an absurd c (1e308) gives value -inf, not a warning
        value = float(np.mean(zbest - k * cost))
    return PolicyMetrics(
        policy=policy,
        n=n,
        cost=float(cost),
        avg_samples=float(np.mean(k)),
        mean_best_reward=_mean(best),
        mean_standardized_reward=_mean(zbest),
        accuracy=accuracy,
        value=value,
        outcomes=PromptOutcomes(
            best_reward=best,
            standardized=zbest,
            correct=labels,
        ),
    )


def evaluate_fixed(data: LoggedRewards, horizon: int, cost: float) -> list[PolicyMetrics]:
    """Fixed best-of-N metrics for N = 1..horizon (``horizon`` <= ``data.min_samples``)."""
    if horizon < 1 or horizon > data.min_samples:
        raise ConfigError(
            "horizon", horizon, f"must be in [1, {data.min_samples}] (samples every prompt has)"
        )
    out = []
    for n in range(1, horizon + 1):
        chosen, _ = fixed_best_of_n(data.rewards, n)
        used = np.full(data.n_prompts, n, dtype=np.int64)
        out.append(_metrics(data, chosen, used, cost, "best-of-N", n))
    return out


def name_reward_error(
    data: LoggedRewards, exc: RewardError, rows: IntArray | None = None
) -> RewardError:
    """``exc`` with its ``(row, column)`` position named by prompt id, as the user knows it.

    The prompt's record is its place in the log (kept through :meth:`LoggedRewards.subset`)
    and the sample its index in the record's logged list (missing samples included).

    ``rows`` maps the rows of the array that raised to the prompts of ``data`` (None: the same
    rows). A position of another form is returned unchanged.
    """
    pos = exc.position
    n = data.n_prompts if rows is None else rows.size
    if isinstance(pos, tuple) and len(pos) == 2 and 0 <= int(pos[0]) < n:
        i = int(pos[0]) if rows is None else int(rows[int(pos[0])])
        j: Any = pos[1]
        if isinstance(j, int | np.integer) and 0 <= j < data.rewards.shape[1]:
            j = data.sample_position(i, int(j))  # as the log numbers it, missing ones included
        where = f"prompt {data.ids[i]!r} (record {data.record(i)}), sample {j}"
        return RewardError(where, exc.value, exc.reason)
    return exc


def _replay_rows(data: LoggedRewards, rows: IntArray, cfg: BeaconConfig) -> Any:
    """:func:`beacon.replay.replay` of the prompts ``rows``; errors name the prompt by id."""
    from beacon.replay import replay

    try:
        return replay(data.rewards[rows, : cfg.horizon], cfg)
    except RewardError as exc:
        # replay names (row, column) of its array; the user knows prompts by id.
        named = name_reward_error(data, exc, rows)
        if named is exc:
            raise
        raise named from exc


def evaluate_beacon(
    data: LoggedRewards, cfg: BeaconConfig, crossfit: CrossFit | None = None
) -> PolicyMetrics:
    """BEACON's metrics from :func:`beacon.replay.replay` of ``cfg`` (value at ``cfg.cost``).

    ``data`` must already be the family's data (:meth:`LoggedRewards.for_family`). With
    ``crossfit`` the prompts of each fold are replayed with :meth:`CrossFit.fold_config` (that
    fold's prior and transform, cost ``cfg.cost * s_f``), and ``cfg.cost`` is ``c`` in
    per-prompt standardized units, the ``c`` charged in the value.
    """
    n = data.n_prompts
    chosen = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    reason = np.empty(n, dtype=object)
    truncated = np.zeros(n, dtype=bool)
    if crossfit is None:
        parts = [(np.arange(n, dtype=np.int64), cfg)]
    else:
        _check_crossfit(data, crossfit)
        parts = [
            (np.flatnonzero(crossfit.folds == f).astype(np.int64), crossfit.fold_config(f, cfg))
            for f in range(crossfit.n_folds)
        ]
    for rows, fcfg in parts:
        if rows.size == 0:
            continue
        res = _replay_rows(data, rows, fcfg)
        chosen[rows] = np.asarray(res.chosen, dtype=np.int64)
        used[rows] = np.asarray(res.n_samples, dtype=np.int64)
        reason[rows] = np.asarray(res.stop_reason, dtype=object)
        truncated[rows] = np.asarray(res.truncated, dtype=bool)
    m = _metrics(data, chosen, used, cfg.cost, "beacon", None)
    reasons, counts = np.unique(reason.astype(str), return_counts=True)
    return replace(
        m,
        stop_reasons={str(r): int(c) for r, c in zip(reasons, counts, strict=True)},
        truncated=int(np.sum(truncated)),
    )


def interpolate_fixed(
    fixed: Sequence[PolicyMetrics], avg_samples: float, quality: QualityKind = "standardized"
) -> float:
    """Best-of-N quality at a fractional number of samples, by linear interpolation in N.

    Interpolating between N and N+1 is the quality of the achievable mixed policy that uses
    best-of-(N+1) on a fraction of the prompts: the fair "matched average samples" baseline.
    Outside [1, horizon] the end value is returned.
    """
    if not fixed:
        raise ConfigError("fixed", 0, "no best-of-N metrics to interpolate")
    xs = np.array([float(m.avg_samples) for m in fixed])
    ys = np.array([quality_of(m, quality) for m in fixed])
    # Slopes between mean rewards of opposite signs near 1e308 overflow; a convex combination
    # of finite values does not, in units of the largest one.
    return _unit_scaled(lambda v: np.interp(avg_samples, xs, v), ys)


def quality_of(m: PolicyMetrics, quality: QualityKind) -> float:
    """The quality number named by ``quality`` (``accuracy`` needs labels)."""
    if quality == "standardized":
        return m.mean_standardized_reward
    if quality == "reward":
        return m.mean_best_reward
    if quality == "accuracy":
        if m.accuracy is None:
            o = m.outcomes
            if o is not None and o.correct is not None:
                # the log has labels, only not on any sample this policy chose
                who = "BEACON" if m.n is None else f"best-of-{m.n}"
                raise ConfigError(
                    "quality",
                    quality,
                    f"no sample that {who} chose is labelled (the log's 'correct' labels cover "
                    "only some samples), so its accuracy is not measured: label every sample, "
                    "or use quality 'standardized' or 'reward'",
                )
            raise ConfigError("quality", quality, "the log has no 'correct' labels")
        return m.accuracy
    raise ConfigError("quality", quality, f"must be one of {', '.join(QUALITY_KINDS)}")


def quality_per_prompt(m: PolicyMetrics, quality: QualityKind) -> FloatArray:
    """Per-prompt values whose mean is :func:`quality_of` ``(m, quality)`` (up to rounding).

    ``standardized`` and ``reward``: the chosen sample's z-score or raw reward. ``accuracy``
    averages only the labelled chosen samples, a ratio; its per-prompt values are the
    linearization ``acc + (P / L) * labelled * (label - acc)`` (``P`` prompts, ``L`` labelled),
    which is the label itself when every chosen sample is labelled and whose mean is ``acc``
    either way, so a standard error over prompts is the ratio's (delta method).
    Raises :class:`beacon.ConfigError` when ``m`` carries no per-prompt outcomes.
    """
    o = m.outcomes
    if o is None:
        raise ConfigError("metrics", m.policy, "carry no per-prompt outcomes")
    if quality == "standardized":
        return np.asarray(o.standardized, dtype=np.float64)
    if quality == "reward":
        return np.asarray(o.best_reward, dtype=np.float64)
    if quality == "accuracy":
        acc = quality_of(m, quality)  # raises without labels
        assert o.correct is not None
        labels = np.asarray(o.correct, dtype=np.float64)
        known = ~np.isnan(labels)
        dev = np.where(known, labels - acc, 0.0)
        out: FloatArray = acc + (labels.size / int(np.sum(known))) * dev
        return out
    raise ConfigError("quality", quality, f"must be one of {', '.join(QUALITY_KINDS)}")


def matched_fixed_per_prompt(
    fixed: Sequence[PolicyMetrics], avg_samples: float, quality: QualityKind = "standardized"
) -> FloatArray:
    """Per prompt, the matched best-of-N quality that :func:`interpolate_fixed` averages.

    At ``avg_samples = N + f`` (``0 <= f < 1``) the matched baseline runs best-of-(N+1) on a
    fraction ``f`` of the prompts and best-of-N on the rest; in expectation each prompt gets
    ``(1 - f) q_N(p) + f q_{N+1}(p)``, the same weights as the aggregate interpolation, so the
    mean over prompts is :func:`interpolate_fixed`'s value (up to rounding). Outside
    [1, horizon] the end N's values.
    """
    if not fixed:
        raise ConfigError("fixed", 0, "no best-of-N metrics to interpolate")
    xs = np.array([float(m.avg_samples) for m in fixed])
    if len(fixed) == 1 or avg_samples <= xs[0]:
        return quality_per_prompt(fixed[0], quality)
    if avg_samples >= xs[-1]:
        return quality_per_prompt(fixed[-1], quality)
    j = min(int(np.searchsorted(xs, avg_samples, side="right")) - 1, len(fixed) - 2)
    f = (avg_samples - xs[j]) / (xs[j + 1] - xs[j])
    lo, hi = quality_per_prompt(fixed[j], quality), quality_per_prompt(fixed[j + 1], quality)
    out: FloatArray = (1.0 - f) * lo + f * hi
    return out


@dataclass(frozen=True, eq=False)
class MatchedDifference:
    """BEACON minus best-of-N at the same average samples, with its paired standard error.

    Attributes:
        diff: ``quality_of(beacon) - interpolate_fixed(fixed, beacon's E[K])``.
        se: ``sd(d_p) / sqrt(P)`` over the per-prompt differences ``d_p`` (sample sd,
            ``ddof=1``); None with fewer than 2 prompts or without per-prompt outcomes.
        n_prompts: ``P``, the prompts compared (0 without per-prompt outcomes).
        per_prompt: the ``d_p`` (their mean is ``diff`` up to rounding), None without outcomes.
    """

    diff: float
    se: float | None
    n_prompts: int
    per_prompt: FloatArray | None = None

    def exceeds(self, sds: float = 2.0) -> int:
        """+1 if ``diff`` is above ``sds`` standard errors, -1 if below minus that, else 0."""
        if self.se is None:
            return 0
        bound = sds * self.se
        return 1 if self.diff > bound else -1 if self.diff < -bound else 0


def matched_difference(
    m: PolicyMetrics, fixed: Sequence[PolicyMetrics], quality: QualityKind = "standardized"
) -> MatchedDifference:
    """``m`` against best-of-N at its average samples, paired over prompts.

    ``d_p = q_beacon(p) - ((1 - f) q_N(p) + f q_{N+1}(p))`` with :func:`quality_per_prompt`'s
    values (BEACON's chosen sample of each prompt comes from that prompt's own replay, its
    own fold's under cross-fitting) and :func:`matched_fixed_per_prompt`'s weights; the
    standard error is ``sd(d_p) / sqrt(P)``. Metrics without per-prompt outcomes get the
    difference only.
    """
    diff = quality_of(m, quality) - interpolate_fixed(fixed, m.avg_samples, quality)
    sizes = {None if x.outcomes is None else x.outcomes.n_prompts for x in (m, *fixed)}
    if None in sizes:
        return MatchedDifference(diff, None, 0)
    if len(sizes) > 1:
        raise ConfigError("fixed", sorted(sizes), "BEACON and best-of-N cover other prompts")
    d = quality_per_prompt(m, quality) - matched_fixed_per_prompt(fixed, m.avg_samples, quality)
    se = _std(d, ddof=1) / math.sqrt(d.size) if d.size >= 2 else None
    return MatchedDifference(diff, se, int(d.size), d)


def default_quality(family: str) -> QualityKind:
    """``reward`` (success rate) for ``bernoulli``, ``standardized`` otherwise."""
    return "reward" if family == "bernoulli" else "standardized"


@dataclass(frozen=True)
class Evaluation:
    """BEACON versus fixed best-of-N on the same logged rewards at one ``c``.

    Attributes:
        config: the config replayed (its horizon possibly capped, see ``requested_horizon``).
        n_prompts: prompts evaluated.
        requested_horizon: the horizon asked for when it was capped to the samples every prompt
            has; None when not capped.
        beacon: BEACON's metrics.
        fixed: best-of-N metrics for N = 1..horizon.
        matched_fixed_standardized: best-of-N ``E[zhat]`` interpolated at BEACON's ``E[K]``.
        matched_fixed_reward: best-of-N ``E[z]`` interpolated at BEACON's ``E[K]``.
        matched_fixed_accuracy: same for accuracy (None without labels).
    """

    config: BeaconConfig
    n_prompts: int
    requested_horizon: int | None
    beacon: PolicyMetrics
    fixed: tuple[PolicyMetrics, ...]
    matched_fixed_standardized: float
    matched_fixed_reward: float
    matched_fixed_accuracy: float | None

    @property
    def horizon(self) -> int:
        return self.config.horizon

    @property
    def best_fixed(self) -> PolicyMetrics:
        """The fixed N with the highest value ``E[zhat_N - N c]``."""
        return max(self.fixed, key=lambda m: m.value)

    def matched(self, quality: QualityKind = "standardized") -> MatchedDifference:
        """BEACON minus best-of-N at its average samples in ``quality``, with the paired
        standard error over prompts (:func:`matched_difference`)."""
        return matched_difference(self.beacon, self.fixed, quality)

    def to_dict(self) -> dict[str, Any]:
        kinds: list[QualityKind] = ["standardized", "reward"]
        if self.matched_fixed_accuracy is not None:
            kinds.append("accuracy")
        diffs = {}
        for q in kinds:
            md = self.matched(q)
            diffs[q] = {"diff": md.diff, "se": md.se, "prompts": md.n_prompts}
        return {
            "config": self.config.to_dict(),
            "n_prompts": self.n_prompts,
            "horizon": self.horizon,
            "requested_horizon": self.requested_horizon,
            "beacon": self.beacon.to_dict(),
            "fixed": [m.to_dict() for m in self.fixed],
            "matched_fixed": {
                "avg_samples": self.beacon.avg_samples,
                "mean_standardized_reward": self.matched_fixed_standardized,
                "mean_best_reward": self.matched_fixed_reward,
                "accuracy": self.matched_fixed_accuracy,
            },
            # BEACON minus matched best-of-N per quality, with its paired SE over prompts
            "matched_difference": diffs,
            "best_fixed_value": {"n": self.best_fixed.n, "value": self.best_fixed.value},
        }


def cap_horizon(
    data: LoggedRewards, cfg: BeaconConfig, crossfit: CrossFit | None = None
) -> tuple[BeaconConfig, int | None]:
    """``cfg`` with its horizon capped at ``data.min_samples``, and the requested one if capped.

    Raises :class:`beacon.ConfigError` if the log is too short for the prior's ``k0``. With
    ``crossfit`` the priors replayed are the fitted ones (``k0 <= 1``), not ``cfg``'s own: a
    log too short for ``cfg``'s prior (Jeffreys needs 4 samples) is capped all the same, and
    ``cfg`` then carries the fitted prior (and transform) needing most samples as its unused own.
    """
    avail = data.min_samples
    if cfg.horizon <= avail:
        return cfg, None
    k0 = cfg.k0
    if crossfit is not None:
        k0 = max(rewards_before_first_decision(fit.prior) for fit in crossfit.fits)
    if avail < k0 + 1:
        raise ConfigError(
            "horizon",
            avail,
            f"the shortest prompt in {data.source} has {avail} samples; this prior needs at "
            f"least k0 + 1 = {k0 + 1}",
        )
    if crossfit is not None and avail < cfg.k0 + 1:
        fit = max(crossfit.fits, key=lambda f: rewards_before_first_decision(f.prior))
        return cfg.replace(horizon=avail, prior=fit.prior, transform=fit.transform), cfg.horizon
    return cfg.replace(horizon=avail), cfg.horizon


def _check_args(data: LoggedRewards, cfg: BeaconConfig, crossfit: CrossFit | None) -> None:
    """The argument types of :func:`evaluate` / :func:`tune` (a list of rewards or a dict
    failed deep inside as an AttributeError), then ``cfg``'s family against ``crossfit``'s."""
    if not isinstance(data, LoggedRewards):
        raise ConfigTypeError(
            "data",
            type(data).__name__,
            "must be a LoggedRewards: load_logged(path), logged_from_records(records) or "
            "LoggedRewards(ids, rewards)",
        )
    if not isinstance(cfg, BeaconConfig):
        raise ConfigTypeError(
            "cfg", type(cfg).__name__, "must be a beacon.BeaconConfig (BeaconConfig(cost=...))"
        )
    if crossfit is not None and not isinstance(crossfit, CrossFit):
        raise ConfigTypeError(
            "crossfit", type(crossfit).__name__, "must be None or a CrossFit from cross_fit()"
        )
    if crossfit is not None and crossfit.family != cfg.family:
        raise ConfigError(
            "family", cfg.family, f"the cross-fitted prior is for the {crossfit.family} family"
        )


def evaluate(
    data: LoggedRewards, cfg: BeaconConfig, crossfit: CrossFit | None = None
) -> Evaluation:
    """Replay ``cfg`` and fixed best-of-N (N = 1..horizon) on ``data`` at ``cfg.cost``.

    ``data`` is the raw log: for the ``bernoulli`` family its ``correct`` labels become the
    rewards. The horizon is capped at the samples every prompt has (``requested_horizon`` says
    when it was). With ``crossfit`` (from :func:`cross_fit` on the same log) each fold is
    replayed with the prior fitted on the other folds and ``cfg.cost`` is in per-prompt
    standardized units; ``cfg``'s own prior and transform are not used.
    """
    _check_args(data, cfg, crossfit)
    data = data.for_family(cfg.family)
    cfg, requested = cap_horizon(data, cfg, crossfit)
    data = data.truncate(cfg.horizon)
    fixed = evaluate_fixed(data, cfg.horizon, cfg.cost)
    b = evaluate_beacon(data, cfg, crossfit)
    acc = None
    if b.accuracy is not None and all(m.accuracy is not None for m in fixed):
        acc = interpolate_fixed(fixed, b.avg_samples, "accuracy")
    return Evaluation(
        config=cfg,
        n_prompts=data.n_prompts,
        requested_horizon=requested,
        beacon=b,
        fixed=tuple(fixed),
        matched_fixed_standardized=interpolate_fixed(fixed, b.avg_samples, "standardized"),
        matched_fixed_reward=interpolate_fixed(fixed, b.avg_samples, "reward"),
        matched_fixed_accuracy=acc,
    )


# ---------------------------------------------------------------------------------------------
# sweeping c, the knee, and budget targets
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepPoint:
    """BEACON's metrics at one cost ``c`` of a sweep.

    ``short``: set by :func:`tune` for a ``c`` the caller gave, which may carry more digits
    than are printed: the fewest significant digits (4 or more) at which BEACON makes the same
    choices as at ``cost`` (:func:`_short_cost`), so that the printed ``c`` replays to this
    point's numbers. None where ``cost`` is itself that short (a default grid's ``c``).
    """

    cost: float
    metrics: PolicyMetrics
    short: float | None = None

    @property
    def shown_cost(self) -> float:
        """The ``c`` to print for this point: ``short`` where set, else ``cost``."""
        return self.cost if self.short is None else self.short

    def to_dict(self) -> dict[str, Any]:
        return {"cost": self.cost, **self.metrics.to_dict()}


def cost_grid(
    data: LoggedRewards,
    cfg: BeaconConfig,
    points: int = 25,
    decades: tuple[float, float] = (-3.0, 1.0),
    crossfit: CrossFit | None = None,
) -> FloatArray:
    """Log-spaced costs spanning "almost never stop" to "stop after k0" for this data.

    The stopping rule compares ``h_{n,k}(zhat)`` with ``c / sigma_k`` (eq. UIP), so ``c`` lives
    on the scale of the (transformed) rewards: the grid is ``s * 10**linspace(*decades)`` with
    ``s`` the median per-prompt standard deviation of the transformed rewards; for
    ``bernoulli`` and ``judge`` ``s = 1`` (``c`` is in success-probability units, the index
    lies in [0, 1]) and the grid stops at ``c = 0.5``. With ``crossfit``, ``c`` is already in
    per-prompt standardized units, so ``s = 1``.
    """
    if points < 2:
        raise ConfigError("points", points, "must be >= 2")
    lo, hi = decades
    if not lo < hi:
        raise ConfigError("decades", decades, "must be increasing (low, high)")
    scale = 1.0
    if cfg.family in _BETA_FAMILIES:
        # h^B lies in [0, 1] and the family rejects c >= 1: cap the grid at c = 0.5.
        hi = min(hi, math.log10(0.5))
        lo = min(lo, hi - 1.0)
    elif crossfit is None:
        x = data.rewards if cfg.transform is None else cfg.transform.apply(data.rewards)
        with np.errstate(invalid="ignore", over="ignore"):  # |r| > 1e154: sd inf, left out
            sd = np.nanstd(x, axis=1)
            top = np.fmax.reduce(np.abs(x), axis=1)  # NaN-skipping, no all-NaN warning
        # Rows flat up to float rounding (as in `standardize`) are left out: a spread of a few
        # ulps is rounding, and a shift of the rewards would turn it into exactly 0.
        sd = sd[np.isfinite(sd) & (sd > _STD_EPS * top)]
        if sd.size:
            scale = float(np.median(sd))
    return scale * np.logspace(lo, hi, points)


def sweep_costs(
    data: LoggedRewards,
    cfg: BeaconConfig,
    costs: Sequence[float] | FloatArray,
    progress: ProgressFn | None = None,
    crossfit: CrossFit | None = None,
) -> list[SweepPoint]:
    """BEACON's metrics at each cost (value ``E[zhat_K - K c]`` at that cost).

    ``data`` must be the family's data truncated to ``cfg.horizon``. ``progress(done, total)``
    is called after each cost. ``crossfit``: see :func:`evaluate_beacon`.
    """
    out = []
    total = len(costs)
    for i, c in enumerate(costs):
        m = evaluate_beacon(data, cfg.replace(cost=float(c)), crossfit)
        out.append(SweepPoint(float(c), m))
        if progress is not None:
            progress(i + 1, total)
    return out


def find_knee(points: Sequence[SweepPoint], quality: QualityKind = "standardized") -> int:
    """Index (into ``points``) of the knee of BEACON's quality-versus-samples curve.

    Kneedle criterion: with average samples and quality both rescaled to [0, 1] over the sweep,
    the knee is the point farthest above the straight line from the cheapest to the most
    expensive point, i.e. where extra samples stop buying proportionate quality. If the curve
    never rises above that line (or is flat), the cheapest point is returned.
    """
    if not points:
        raise ConfigError("points", 0, "the sweep is empty")
    x = np.array([p.metrics.avg_samples for p in points])
    y = np.array([quality_of(p.metrics, quality) for p in points])
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    xr, yr = xs[-1] - xs[0], float(np.max(ys) - np.min(ys))
    if xr <= 0 or yr <= 0:
        return int(order[0])
    xn = (xs - xs[0]) / xr
    yn = (ys - np.min(ys)) / yr
    chord = yn[0] + (yn[-1] - yn[0]) * xn
    gap = yn - chord
    j = int(np.argmax(gap))
    return int(order[j]) if gap[j] > 0 else int(order[0])


@dataclass(frozen=True)
class CostChoice:
    """A recommended ``c`` and BEACON's metrics there.

    ``rule`` is ``knee``, ``target-samples`` or ``max-quality-loss``; ``note`` explains a
    non-binding or unreachable budget in words (empty otherwise).
    """

    cost: float
    metrics: PolicyMetrics
    rule: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"cost": self.cost, "rule": self.rule, "note": self.note, **_drop_cost(self.metrics)}


def _drop_cost(m: PolicyMetrics) -> dict[str, Any]:
    d = m.to_dict()
    d.pop("cost")
    return d


def _bisect_log(
    data: LoggedRewards,
    cfg: BeaconConfig,
    c_ok: float,
    m_ok: PolicyMetrics,
    c_bad: float,
    ok: Callable[[PolicyMetrics], bool],
    steps: int,
    crossfit: CrossFit | None = None,
) -> tuple[float, PolicyMetrics]:
    # Keeps the invariant ok(c_ok) and not ok(c_bad); halves the gap in log c each step.
    for _ in range(steps):
        mid = math.sqrt(c_ok * c_bad)
        m = evaluate_beacon(data, cfg.replace(cost=mid), crossfit)
        if ok(m):
            c_ok, m_ok = mid, m
        else:
            c_bad = mid
    return c_ok, m_ok


def choose_cost_for_target_samples(
    data: LoggedRewards,
    cfg: BeaconConfig,
    points: Sequence[SweepPoint],
    target: float,
    steps: int = 16,
    crossfit: CrossFit | None = None,
) -> CostChoice:
    """The smallest ``c`` (best quality) whose average samples ``E[K]`` is at most ``target``.

    Per prompt the stopping time is non-increasing in ``c`` (the rule stops once
    ``h <= c / sigma``), so ``E[K]`` is monotone and a bisection in ``log c`` between the sweep's
    bracketing points finds the boundary. ``data`` is the family's data truncated to the horizon.
    """
    if not math.isfinite(target) or target <= 0:
        raise ConfigError("target_samples", target, "must be a positive number")
    if not points:
        raise ConfigError("points", 0, "the sweep is empty")
    pts = sorted(points, key=lambda p: p.cost)

    def ok(m: PolicyMetrics) -> bool:
        return m.avg_samples <= target

    feasible = [i for i, p in enumerate(pts) if ok(p.metrics)]
    if not feasible:
        least = min(p.metrics.avg_samples for p in pts)
        # the priors replayed: with crossfit the folds' fitted ones (k0 <= 1), not cfg's own
        k0 = cfg.k0 if crossfit is None else max(
            rewards_before_first_decision(fit.prior) for fit in crossfit.fits
        )
        why = f"the prior needs k0 = {k0} before the first decision"
        if least > k0:
            why += f"; a c above {pts[-1].cost:.4g} stops sooner"
        raise ConfigError(
            "target_samples",
            target,
            f"not reachable: even the largest c swept ({pts[-1].cost:.4g}) uses {least:.3g} "
            f"samples on average ({why})",
        )
    i = feasible[0]
    if i == 0:
        p = pts[0]
        return CostChoice(
            p.cost,
            p.metrics,
            "target-samples",
            f"not binding: the smallest c swept already uses {p.metrics.avg_samples:.3g} "
            f"<= {target:g} samples",
        )
    c, m = _bisect_log(data, cfg, pts[i].cost, pts[i].metrics, pts[i - 1].cost, ok, steps, crossfit)
    return CostChoice(c, m, "target-samples")


def choose_cost_for_max_quality_loss(
    data: LoggedRewards,
    cfg: BeaconConfig,
    points: Sequence[SweepPoint],
    reference: float,
    max_loss: float,
    quality: QualityKind = "standardized",
    steps: int = 16,
    crossfit: CrossFit | None = None,
) -> CostChoice:
    """The largest ``c`` (fewest samples) whose quality is at least ``reference - max_loss``.

    ``reference`` is normally best-of-horizon's quality; ``max_loss`` is in the units of
    ``quality``. Quality is not guaranteed monotone in ``c`` on finite data, so the largest
    swept ``c`` that satisfies the bound is taken and refined by bisection towards the next
    larger swept ``c`` (which violates it).
    """
    if not math.isfinite(max_loss) or max_loss < 0:
        raise ConfigError("max_quality_loss", max_loss, "must be a finite number >= 0")
    if not points:
        raise ConfigError("points", 0, "the sweep is empty")
    pts = sorted(points, key=lambda p: p.cost)
    floor = reference - max_loss

    def ok(m: PolicyMetrics) -> bool:
        return quality_of(m, quality) >= floor

    feasible = [i for i, p in enumerate(pts) if ok(p.metrics)]
    if not feasible:
        top = max(quality_of(p.metrics, quality) for p in pts)
        raise ConfigError(
            "max_quality_loss",
            max_loss,
            f"not reachable: the best BEACON quality in the sweep is {top:.4g}, below "
            f"{reference:.4g} - {max_loss:g}",
        )
    i = feasible[-1]
    if i == len(pts) - 1:
        p = pts[i]
        return CostChoice(
            p.cost,
            p.metrics,
            "max-quality-loss",
            "not binding: even the largest c swept stays within the allowed loss",
        )
    c, m = _bisect_log(data, cfg, pts[i].cost, pts[i].metrics, pts[i + 1].cost, ok, steps, crossfit)
    return CostChoice(c, m, "max-quality-loss")


def _same_policy(a: PolicyMetrics, b: PolicyMetrics) -> bool:
    """BEACON made the same choices at both costs, as far as any printed number can tell."""
    return (
        a.avg_samples == b.avg_samples
        and a.mean_standardized_reward == b.mean_standardized_reward
        and a.mean_best_reward == b.mean_best_reward
        and a.accuracy == b.accuracy
        and a.stop_reasons == b.stop_reasons
        and a.truncated == b.truncated
    )


# The fewest significant digits a recommended c is shortened to (the CLI prints c with 4).
_COST_DIGITS = 4


def _is_swept(choice: CostChoice, points: Sequence[SweepPoint]) -> bool:
    """Whether ``choice`` is one of the swept ``points`` (the knee, or a budget met at a swept
    point: the same metrics object), not a ``c`` bisected between them."""
    return any(p.metrics is choice.metrics for p in points)


def _short_cost(
    data: LoggedRewards,
    cfg: BeaconConfig,
    cost: float,
    metrics: PolicyMetrics,
    crossfit: CrossFit | None = None,
) -> tuple[float, PolicyMetrics]:
    """``cost`` shortened to the fewest significant digits (4 or more) at which BEACON makes
    the same choices as at ``cost``, and its metrics there; ``(cost, metrics)`` if none does.

    A recommended ``c`` is printed, and pasted into ``beacon replay --cost`` or a config:
    a budget's bisected ``c`` (0.11903517878502555) sits just inside the boundary where
    ``E[K]`` changes, and printed as ``0.119`` it replayed to 5.01 samples, not the 5.00
    printed for it. Each candidate (the nearest shorter decimals on both sides) is replayed
    once; at most ``2 * 6`` replays, only for the recommendation.
    """
    if not (math.isfinite(cost) and cost > 0):
        return cost, metrics
    for digits in range(_COST_DIGITS, _COST_DIGITS + 6):
        near = float(f"{cost:.{digits - 1}e}")
        if near == cost:
            return cost, metrics
        step = 10.0 ** (math.floor(math.log10(near)) - digits + 1)
        other = float(f"{(near + step if near < cost else near - step):.{digits - 1}e}")
        for cand in (near, other):
            try:
                shorter = cfg.replace(cost=cand)
            except ConfigError:  # 1.000 for a bernoulli c of 0.99996: not a cost
                continue
            m = evaluate_beacon(data, shorter, crossfit)
            if _same_policy(m, metrics):
                return cand, m
    return cost, metrics


def _round_costs(costs: FloatArray) -> FloatArray:
    """``costs`` rounded to the 4 significant digits a swept ``c`` is printed with.

    A default grid's ``c`` is rounded before it is replayed, so the ``c`` printed for a swept
    point (the knee included) is the very number whose choices the point reports: pasted into
    ``beacon replay --cost`` or a config it replays them exactly, and no extra replay is
    needed to check that. The rounding moves a grid point by at most 0.05%.
    """
    return np.array([float(f"{c:.{_COST_DIGITS - 1}e}") for c in costs], dtype=np.float64)


def _shorten_points(
    data: LoggedRewards,
    cfg: BeaconConfig,
    points: Sequence[SweepPoint],
    progress: Callable[[int], None],
    crossfit: CrossFit | None = None,
) -> list[SweepPoint]:
    """``points`` with ``short`` set (:func:`_short_cost`): for costs the caller gave, which
    keep their exact value; one replay per point whose 4 digits differ from its ``c``.
    ``progress(done)`` is called after each point."""
    out = []
    for i, p in enumerate(points):
        short, _ = _short_cost(data, cfg, p.cost, p.metrics, crossfit)
        out.append(p if short == p.cost else replace(p, short=short))
        progress(i + 1)
    return out


def _active_range(
    coarse: Sequence[SweepPoint], points: int, exact: FloatArray | None = None
) -> FloatArray:
    """A log grid over the part of a coarse sweep where ``E[K]`` actually changes.

    Costs below the last one that still uses the most samples, or above the first that already
    uses the fewest, all give the same policy on this data; resolution is spent in between.
    ``exact``: the coarse grid before :func:`_round_costs`, whose ends the grid spans (so
    rounding the coarse grid does not shift the fine one); None: the coarse points' own costs.
    """
    k = np.array([p.metrics.avg_samples for p in coarse])
    c = np.array([p.cost for p in coarse])
    lo = int(np.flatnonzero(k == k[0])[-1])
    hi = int(np.flatnonzero(k == k[-1])[0])
    if hi <= lo:
        return c
    ends = c if exact is None else exact
    return np.logspace(math.log10(ends[lo]), math.log10(ends[hi]), points)


@dataclass(frozen=True)
class TuneResult:
    """A ``c`` sweep with the best-of-N frontier and the recommended ``c``.

    Attributes:
        config: the base config (horizon possibly capped; its ``cost`` is not used).
        requested_horizon: set when the horizon was capped to the samples every prompt has.
        n_prompts: prompts evaluated.
        quality: which quality number the knee and budgets use.
        points: BEACON at each swept ``c`` (increasing ``c``).
        fixed: best-of-N for N = 1..horizon (value at the recommended ``c``).
        knee: index into ``points`` of the knee.
        choice: the recommendation (the knee unless a budget was given).
        crossfit: the cross-fitted prior the sweep used (costs in per-prompt standardized
            units), or None (``config``'s prior, costs in model units).
    """

    config: BeaconConfig
    requested_horizon: int | None
    n_prompts: int
    quality: QualityKind
    points: tuple[SweepPoint, ...]
    fixed: tuple[PolicyMetrics, ...]
    knee: int
    choice: CostChoice = field()
    crossfit: CrossFit | None = None

    @property
    def choice_is_swept(self) -> bool:
        """Whether the recommendation is one of the swept points (:func:`_is_swept`)."""
        return _is_swept(self.choice, self.points)

    def matched(self) -> MatchedDifference:
        """The recommendation against best-of-N at its average samples, with a paired SE."""
        return self._matched

    def sweep_matched(self) -> tuple[MatchedDifference, ...]:
        """Each swept point against best-of-N at its average samples, with its paired SE.

        One per ``points`` (same order), computed as :meth:`matched` is for the recommendation
        (:func:`matched_difference`), so a ``c`` picked from the sweep carries the same kind of
        standard error; a recommended knee's entry equals :meth:`matched`. Computed once per
        result (the table, the plot, the verdict and ``--json`` all read it).
        """
        return self._sweep_matched

    @cached_property
    def _matched(self) -> MatchedDifference:
        return matched_difference(self.choice.metrics, self.fixed, self.quality)

    @cached_property
    def _sweep_matched(self) -> tuple[MatchedDifference, ...]:
        return tuple(matched_difference(p.metrics, self.fixed, self.quality) for p in self.points)

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config.to_dict()
        cfg.pop("cost")
        md = self.matched()
        return {
            "config": cfg,
            "n_prompts": self.n_prompts,
            "horizon": self.config.horizon,
            "requested_horizon": self.requested_horizon,
            "quality": self.quality,
            "sweep": [
                {**p.to_dict(), "diff": md.diff, "diff_se": md.se, "diff_prompts": md.n_prompts}
                for p, md in zip(self.points, self.sweep_matched(), strict=True)
            ],
            "fixed": [m.to_dict() for m in self.fixed],
            "knee": self.points[self.knee].to_dict(),
            "recommended": self.choice.to_dict(),
            "matched_fixed_quality": interpolate_fixed(
                self.fixed, self.choice.metrics.avg_samples, self.quality
            ),
            "diff": md.diff,
            "diff_se": md.se,
            "diff_prompts": md.n_prompts,
            "crossfit": None if self.crossfit is None else self.crossfit.to_dict(),
        }


def tune(
    data: LoggedRewards,
    cfg: BeaconConfig,
    costs: Sequence[float] | FloatArray | None = None,
    *,
    target_samples: float | None = None,
    max_quality_loss: float | None = None,
    quality: QualityKind | None = None,
    progress: ProgressFn | None = None,
    crossfit: CrossFit | None = None,
    n_costs: int = 25,
) -> TuneResult:
    """Sweep ``c``, find the knee, and recommend a ``c`` (the knee, or one meeting a budget).

    ``data`` is the raw log (``bernoulli`` uses its labels). ``costs`` defaults to
    :func:`cost_grid` (``n_costs`` costs) followed by a second log grid of as many points over
    the range where ``E[K]`` changes, both rounded to 4 significant digits (the printed ``c``
    is the replayed one). Given ``costs`` are swept exactly as given, and each point's ``short``
    is the ``c`` to print for it (one more replay per point). ``target_samples`` (``E[K]`` at
    most this) and ``max_quality_loss`` (quality at least best-of-horizon's minus this) are
    mutually exclusive. ``progress(done, total)`` is called after each swept point (twice per
    given cost: its replay, then its shortening). With ``crossfit``
    (:func:`cross_fit` on the same log) every replay uses the prior fitted without the replayed
    prompts, and costs are in per-prompt standardized units (see :func:`evaluate`).
    """
    if target_samples is not None and max_quality_loss is not None:
        raise ConfigError(
            "target_samples", target_samples, "give target_samples or max_quality_loss, not both"
        )
    _check_args(data, cfg, crossfit)
    q: QualityKind = quality or default_quality(cfg.family)
    if q not in QUALITY_KINDS:
        raise ConfigError("quality", q, f"must be one of {', '.join(QUALITY_KINDS)}")
    data = data.for_family(cfg.family)
    if q == "accuracy" and not data.has_labels:
        raise ConfigError("quality", q, "the log has no 'correct' labels")
    cfg, requested = cap_horizon(data, cfg, crossfit)
    data = data.truncate(cfg.horizon)
    if costs is None:
        grid = cost_grid(data, cfg, n_costs, crossfit=crossfit)
        total = 2 * grid.size

        def first_pass(done: int, _total: int) -> None:
            if progress is not None:
                progress(done, total)

        def second_pass(done: int, _total: int) -> None:
            if progress is not None:
                progress(grid.size + done, total)

        exact, grid = grid, _round_costs(grid)
        coarse = sweep_costs(data, cfg, grid, first_pass, crossfit)
        fine = _round_costs(_active_range(coarse, grid.size, exact))
        points = sweep_costs(data, cfg, fine, second_pass, crossfit)
    else:
        grid = np.sort(np.asarray(costs, dtype=np.float64))
        if grid.size < 2 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise ConfigError("costs", [float(c) for c in grid], "need >= 2 finite costs > 0")
        size = int(grid.size)

        def swept(done: int, _total: int) -> None:
            if progress is not None:
                progress(done, 2 * size)

        def shortened(done: int) -> None:
            if progress is not None:
                progress(size + done, 2 * size)

        points = sweep_costs(data, cfg, grid, swept, crossfit)
        # the caller's c are kept exact; the digits printed for each are checked by replay
        points = _shorten_points(data, cfg, points, shortened, crossfit)
    knee = find_knee(points, q)
    if target_samples is not None:
        choice = choose_cost_for_target_samples(
            data, cfg, points, target_samples, crossfit=crossfit
        )
    elif max_quality_loss is not None:
        fixed_full = evaluate_fixed(data, cfg.horizon, cfg.cost)
        ref = quality_of(fixed_full[-1], q)
        choice = choose_cost_for_max_quality_loss(
            data, cfg, points, ref, max_quality_loss, q, crossfit=crossfit
        )
    else:
        kp = points[knee]
        choice = CostChoice(kp.cost, kp.metrics, "knee")
    if not _is_swept(choice, points):
        # a budget's bisected c, printed to be pasted: the shortest with the same choices (a
        # knee or a budget met at a swept point keeps the sweep's own c, printed as its point's
        # shown_cost)
        short, short_m = _short_cost(data, cfg, choice.cost, choice.metrics, crossfit)
        choice = replace(choice, cost=short, metrics=short_m)
    fixed = evaluate_fixed(data, cfg.horizon, choice.cost)
    return TuneResult(
        config=cfg,
        requested_horizon=requested,
        n_prompts=data.n_prompts,
        quality=q,
        points=tuple(points),
        fixed=tuple(fixed),
        knee=knee,
        choice=choice,
        crossfit=crossfit,
    )
