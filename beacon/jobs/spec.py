"""Bulk-job specification: prompt records, factories named by import path, the job spec.

A bulk job runs BEACON (the Stopper driven by :class:`beacon.BeaconSampler`) once per prompt of a
JSONL file. Everything a remote worker needs travels as JSON: the prompt record, the generator
and scorer *factories* named by ``"package.module:factory"`` plus JSON keyword arguments, engine
options, and the :class:`beacon.BeaconConfig` (``to_dict``/``from_dict``, so fitted priors and
transforms travel too). Nothing is pickled.

Factories
    ``factory(**kwargs)`` returns the generator (``generate(prompt) -> str``, sync or async) or
    the scorer (``score(prompt, response) -> float``, sync or async). If the returned object has a
    ``bind(record)`` method, it is called once per prompt with the prompt record's dict and its
    return value is used for that prompt (e.g. a verifier bound to the record's reference answer).

Allow-list
    Importing a module runs its code, so a worker imports only modules whose dotted name equals
    one of the allowed prefixes or starts with ``prefix + "."``; the factory attribute must be a
    public top-level name defined in such a module (a re-exported ``os.system`` is refused). The
    check happens before the import. An ``allowed`` argument given as a string is parsed like the
    environment variable (:func:`normalize_allow_list`), never iterated character by character.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import reprlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from beacon._checks import boolean, is_integer, is_real
from beacon.config import BeaconConfig
from beacon.errors import ConfigError

__all__ = [
    "DEFAULT_ALLOWED_FACTORIES",
    "FactoryNotAllowedError",
    "FactorySpec",
    "JobInputError",
    "JobSpec",
    "LineError",
    "PromptRecord",
    "canonical_json",
    "is_allowed",
    "is_blank_line",
    "iter_prompt_file",
    "iter_prompt_lines",
    "normalize_allow_list",
    "open_prompt_file",
    "parse_allow_list",
    "parse_prompt_line",
]

#: Module prefixes every runner accepts without configuration (offline, side-effect free).
DEFAULT_ALLOWED_FACTORIES: tuple[str, ...] = ("beacon.demo",)

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_FACTORY_RE = re.compile(rf"^({_DOTTED}):([A-Za-z][A-Za-z0-9_]*)$")
_RECORD_FIELDS = ("id", "prompt", "reference", "metadata", "generator", "scorer")
_MAX_SHOWN = 120


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _MAX_SHOWN


def _short(value: Any, *, containers: bool = False) -> Any:
    # Error messages quote the offending value; a 50 kB prompt would drown the message.
    if isinstance(value, str):
        return value[:_MAX_SHOWN] + "..." if len(value) > _MAX_SHOWN else value
    if containers and isinstance(value, Mapping | list | tuple):
        # A 5 MB message list or metadata object of an input line, too: quoted whole (in the
        # message and in "value"), its error line was twice the size of the input line.
        shown = _REPR.repr(value)
        if len(shown) > _MAX_SHOWN:
            return shown[:_MAX_SHOWN] + "..."
        if len(repr(value)) > _MAX_SHOWN:
            return shown
    return value


class JobInputError(ConfigError):
    """A bad prompt line, factory or job field; ``line`` is the 1-based input line (or None)."""

    def __init__(
        self,
        field: str,
        value: Any,
        reason: str,
        *,
        line: int | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(field, _short(value, containers=line is not None), reason)
        self.line = line
        self.source = source
        if line is not None:
            self.args = (f"{source or 'input'} line {line}: {self.args[0]}",)


class FactoryNotAllowedError(JobInputError):
    """A factory whose module is outside the runner's allow-list (it was not imported)."""


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces, UTF-8 kept): the input of every job hash."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _check_json(field: str, value: Any) -> None:
    try:
        text = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise JobInputError(field, value, f"must be JSON-serializable without NaN/inf ({exc})") \
            from exc
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # a lone surrogate (JSON "\ud800", or undecodable bytes in the file): no UTF-8 form,
        # so no model API could be sent it, and the job's keys and outputs could not hold it
        bad = text[exc.start:exc.end]
        raise JobInputError(
            field, value, f"holds {bad!r}, a lone surrogate that is not valid Unicode text "
            "(fix the input's encoding)"
        ) from exc


# -- allow-list ------------------------------------------------------------------------------
_ALLOW_REASON = ("each entry must be a dotted module prefix (submodules included) or '*' "
                 "(every module)")


def parse_allow_list(
    text: str | None,
    *,
    include_defaults: bool = True,
    name: str = "BEACON_ALLOWED_FACTORIES",
) -> tuple[str, ...]:
    """Comma-separated module prefixes (``BEACON_ALLOWED_FACTORIES``) -> normalized tuple.

    ``*`` allows every module (only for single-tenant, trusted brokers). The defaults
    (:data:`DEFAULT_ALLOWED_FACTORIES`) are included unless ``include_defaults`` is False.
    ``name`` is the setting named in the :class:`~beacon.ConfigError` of a bad entry.
    """
    if text is not None and not isinstance(text, str):
        raise ConfigError(name, text, "must be a comma-separated string of module prefixes")
    out: list[str] = list(DEFAULT_ALLOWED_FACTORIES) if include_defaults else []
    for raw in (text or "").split(","):
        p = raw.strip().rstrip(".")
        if not p:
            continue
        if p != "*" and not re.fullmatch(_DOTTED, p):
            raise ConfigError(name, raw.strip(), _ALLOW_REASON)
        if p not in out:
            out.append(p)
    return tuple(out)


def normalize_allow_list(
    allowed: str | Iterable[str] | None, *, name: str = "allowed"
) -> tuple[str, ...] | None:
    """An ``allowed`` argument -> a tuple of module prefixes, or None (allow every module).

    A ``str`` is parsed exactly like ``BEACON_ALLOWED_FACTORIES`` (:func:`parse_allow_list`:
    comma-separated, the defaults included) -- never iterated character by character, where a
    stray ``*`` would allow every module. Any other iterable must hold prefix strings (or
    ``"*"``) and is taken as is, without the defaults. Raises :class:`JobInputError` naming
    ``name`` for anything else.
    """
    if allowed is None:
        return None
    if isinstance(allowed, str):
        try:
            return parse_allow_list(allowed, name=name)
        except ConfigError as exc:
            raise JobInputError(name, exc.value, exc.reason) from None
    if isinstance(allowed, bytes | bytearray | Mapping) or not isinstance(allowed, Iterable):
        raise JobInputError(name, allowed, "must be None (allow every module), a "
                                           "comma-separated string or a list of module prefixes")
    out: list[str] = []
    for entry in list(allowed):
        if not isinstance(entry, str):
            raise JobInputError(name, entry, "entries must be strings: " + _ALLOW_REASON)
        p = entry.strip().rstrip(".")
        if p != "*" and not re.fullmatch(_DOTTED, p):
            raise JobInputError(name, entry, _ALLOW_REASON)
        if p not in out:
            out.append(p)
    return tuple(out)


def is_allowed(module: str, allowed: str | Iterable[str] | None) -> bool:
    """True if ``module`` is one of ``allowed`` or a submodule of one (``None``: allow all).

    ``allowed`` is read by :func:`normalize_allow_list` (a string like the environment variable).
    """
    return _matches(module, normalize_allow_list(allowed))


def _matches(module: str, prefixes: tuple[str, ...] | None) -> bool:
    """:func:`is_allowed` on an already normalized allow-list."""
    if prefixes is None:
        return True
    return any(p == "*" or module == p or module.startswith(p + ".") for p in prefixes)


# -- factories -------------------------------------------------------------------------------
@dataclass(frozen=True)
class FactorySpec:
    """``factory`` = ``"package.module:name"``; ``kwargs`` = JSON keyword arguments."""

    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.factory, str) or not _FACTORY_RE.match(self.factory):
            raise JobInputError(
                "factory", self.factory,
                "must be 'package.module:name' (a public top-level name, no dots after ':')",
            )
        if not isinstance(self.kwargs, Mapping):
            raise JobInputError("kwargs", self.kwargs, "must be a JSON object")
        kw = dict(self.kwargs)
        for k in kw:
            if not isinstance(k, str) or not k.isidentifier():
                raise JobInputError("kwargs", k, "keys must be Python identifiers")
        _check_json("kwargs", kw)
        object.__setattr__(self, "kwargs", kw)

    @property
    def module(self) -> str:
        return self.factory.split(":", 1)[0]

    @property
    def attribute(self) -> str:
        return self.factory.split(":", 1)[1]

    def to_dict(self) -> dict[str, Any]:
        return {"factory": self.factory, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, data: Any, *, field_name: str = "factory") -> FactorySpec:
        """Accept ``{"factory": ..., "kwargs": {...}}`` or a bare ``"module:name"`` string."""
        if isinstance(data, FactorySpec):
            return data
        if isinstance(data, str):
            try:
                return cls(data)
            except JobInputError as exc:
                raise JobInputError(f"{field_name}.{exc.field}", exc.value, exc.reason) from None
        if not isinstance(data, Mapping):
            raise JobInputError(field_name, data, "must be 'module:name' or "
                                                  "{'factory': 'module:name', 'kwargs': {...}}")
        unknown = sorted(set(data) - {"factory", "kwargs"})
        if unknown:
            raise JobInputError(f"{field_name}.{unknown[0]}", data[unknown[0]],
                                "unknown field; known: factory, kwargs")
        if "factory" not in data:
            raise JobInputError(f"{field_name}.factory", None, "is required")
        try:
            return cls(data["factory"], data.get("kwargs") or {})
        except JobInputError as exc:
            raise JobInputError(f"{field_name}.{exc.field}", exc.value, exc.reason) from None

    def check_allowed(
        self, allowed: str | Iterable[str] | None, *, role: str = "factory"
    ) -> None:
        """Raise :class:`FactoryNotAllowedError` unless the module is allowed (no import).

        ``allowed``: see :func:`normalize_allow_list` (a string is parsed, never iterated)."""
        self._check_prefixes(normalize_allow_list(allowed), role)

    def _check_prefixes(self, prefixes: tuple[str, ...] | None, role: str) -> None:
        if not _matches(self.module, prefixes):
            shown = ", ".join(prefixes or ()) or "(empty)"
            raise FactoryNotAllowedError(
                role, self.factory,
                f"module {self.module!r} is not in this runner's allow-list [{shown}]; "
                "add its prefix to BEACON_ALLOWED_FACTORIES in the environment of what runs "
                "the job (beacon run, or the workers)",
            )

    def build(self, allowed: str | Iterable[str] | None, *, role: str = "factory") -> Any:
        """Check the allow-list, import the module, call ``factory(**kwargs)``."""
        prefixes = normalize_allow_list(allowed)
        self._check_prefixes(prefixes, role)
        try:
            mod = importlib.import_module(self.module)
        except ImportError as exc:
            raise JobInputError(role, self.factory, f"cannot import {self.module!r}: {exc}") \
                from exc
        obj = getattr(mod, self.attribute, None)
        if obj is None:
            raise JobInputError(role, self.factory,
                                f"module {self.module!r} has no attribute {self.attribute!r}")
        defined_in = getattr(obj, "__module__", None)
        if prefixes is not None and not (isinstance(defined_in, str)
                                         and _matches(defined_in, prefixes)):
            raise FactoryNotAllowedError(
                role, self.factory,
                f"{self.attribute!r} is defined in {defined_in!r}, outside the allow-list "
                "(re-exported names are refused)",
            )
        if not callable(obj):
            raise JobInputError(role, self.factory, "is not callable")
        try:
            built = obj(**self.kwargs)
        except TypeError as exc:
            raise JobInputError(f"{role}.kwargs", dict(self.kwargs),
                                f"rejected by {self.factory}: {exc}") from exc
        except ConfigError:
            raise  # already names its field and value
        except Exception as exc:
            # A missing API key, an unreachable server...: typed, naming the factory (a bare
            # KeyError('OPENAI_API_KEY') said neither what failed nor where)
            raise JobInputError(role, self.factory,
                                f"building it raised {type(exc).__name__}: {exc}") from exc
        if built is None:
            raise JobInputError(role, self.factory, "returned None; a factory must return the "
                                                    "generator or scorer object")
        return built


# -- prompt records --------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a job.

    ``id``: str or int, unique within the job's input: the runners refuse two different
    records with one id (:func:`beacon.jobs.keys.check_unique_ids`; the idempotency key is
    the hash of the whole record, so both would run and write results under that id).
    ``prompt``: the text, or a list of chat messages (JSON objects) passed to the generator as
    is. ``reference``: any JSON (e.g. the reference answer for a
    verifier). ``metadata``: a JSON object copied to the output. ``generator`` / ``scorer``:
    optional per-prompt factory overrides. ``line``: 1-based input line (not part of the key).
    """

    id: str | int
    prompt: str | list[Any]
    reference: Any = None
    metadata: Mapping[str, Any] | None = None
    generator: FactorySpec | None = None
    scorer: FactorySpec | None = None
    line: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        line = self.line
        if not (isinstance(self.id, str) or is_integer(self.id)):
            raise JobInputError("id", self.id, "must be a string or an integer", line=line)
        if isinstance(self.id, str) and not self.id:
            raise JobInputError("id", self.id, "must not be empty", line=line)
        # plain int / str (a numpy integer id is the same id): the record travels as JSON
        object.__setattr__(self, "id", str(self.id) if isinstance(self.id, str)
                           else int(self.id))
        p = self.prompt
        if isinstance(p, str):
            if not p.strip():
                raise JobInputError("prompt", p, "must not be empty", line=line)
        elif isinstance(p, list):
            if not p or not all(isinstance(m, Mapping) for m in p):
                raise JobInputError("prompt", p, "a message list must be a non-empty list of "
                                                 "JSON objects", line=line)
        else:
            raise JobInputError("prompt", p, "must be a string or a list of chat messages",
                                line=line)
        if self.metadata is not None and not isinstance(self.metadata, Mapping):
            raise JobInputError("metadata", self.metadata, "must be a JSON object", line=line)
        for name in ("prompt", "reference", "metadata"):
            try:
                _check_json(name, getattr(self, name))
            except JobInputError as exc:
                raise JobInputError(exc.field, exc.value, exc.reason, line=line) from None

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON (without ``line``); the input of the idempotency key."""
        d: dict[str, Any] = {"id": self.id, "prompt": self.prompt}
        if self.reference is not None:
            d["reference"] = self.reference
        if self.metadata is not None:
            d["metadata"] = dict(self.metadata)
        if self.generator is not None:
            d["generator"] = self.generator.to_dict()
        if self.scorer is not None:
            d["scorer"] = self.scorer.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: Any, *, line: int | None = None) -> PromptRecord:
        if not isinstance(data, Mapping):
            raise JobInputError("record", data, "each line must be a JSON object", line=line)
        unknown = sorted(set(data) - set(_RECORD_FIELDS))
        if unknown:
            raise JobInputError(
                unknown[0], data[unknown[0]],
                f"unknown field; known: {', '.join(_RECORD_FIELDS)} (put extras in 'metadata')",
                line=line,
            )
        for req in ("id", "prompt"):
            if req not in data:
                raise JobInputError(req, None, "is required", line=line)
        specs: dict[str, FactorySpec | None] = {}
        for role in ("generator", "scorer"):
            raw = data.get(role)
            try:
                specs[role] = None if raw is None else FactorySpec.from_dict(raw, field_name=role)
            except JobInputError as exc:
                raise JobInputError(exc.field, exc.value, exc.reason, line=line) from None
        return cls(
            id=data["id"],
            prompt=data["prompt"],
            reference=data.get("reference"),
            metadata=data.get("metadata"),
            generator=specs["generator"],
            scorer=specs["scorer"],
            line=line,
        )


@dataclass(frozen=True)
class LineError:
    """An input line that is not a valid prompt record; the job records it and goes on."""

    line: int
    raw: str
    error: JobInputError


def parse_prompt_line(text: str, line: int, *, source: str | None = None) -> PromptRecord:
    """Parse one JSONL line into a :class:`PromptRecord` (raises :class:`JobInputError`)."""
    try:
        # without its line break: an error at the end of the line (a line cut short) is
        # placed in this line, not at "line 2 column 1" of a one-line text; and without a
        # BOM, which files exported with one and concatenated carry mid-file (the file's
        # own is dropped on open)
        body = text.rstrip("\r\n").lstrip("\ufeff")  # one per file concatenated before it
        data = json.loads(body, parse_constant=_reject_constant)
    except ValueError as exc:
        raise JobInputError("line", text.strip(), f"not valid JSON ({exc})", line=line,
                            source=source) from None
    try:
        return PromptRecord.from_dict(data, line=line)
    except JobInputError as exc:
        raise JobInputError(exc.field, exc.value, exc.reason, line=line, source=source) from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def iter_prompt_lines(
    lines: Iterator[str] | Sequence[str], *, source: str | None = None
) -> Iterator[PromptRecord | LineError]:
    """Parse JSONL lines lazily; blank lines are skipped, bad ones yield :class:`LineError`."""
    for n, text in enumerate(lines, start=1):
        if is_blank_line(text):
            continue
        try:
            yield parse_prompt_line(text, n, source=source)
        except JobInputError as exc:
            yield LineError(n, text.rstrip("\r\n"), exc)


def is_blank_line(text: str) -> bool:
    """A line the prompt reader skips: only whitespace, Unicode whitespace included (a
    non-breaking space, U+3000...), as ``str.strip`` sees it, and byte-order marks (what
    concatenating an empty or blank-first-line export saved with a BOM leaves mid-file)."""
    return not text.strip().lstrip("\ufeff").strip()


def open_prompt_file(path: str | Path) -> TextIO:
    """A prompts file opened as the reader reads it (UTF-8, a BOM dropped, undecodable bytes
    kept as surrogates, universal newlines): whoever counts its lines must split them alike."""
    return Path(path).open("r", encoding="utf-8-sig", errors="surrogateescape")


def iter_prompt_file(path: str | Path) -> Iterator[PromptRecord | LineError]:
    """Stream a prompts JSONL file (UTF-8) as records and per-line errors."""
    p = Path(path)
    with open_prompt_file(p) as fh:
        yield from iter_prompt_lines(fh, source=p.name)


# -- the job ---------------------------------------------------------------------------------
_RETRY_KEYS = ("max_attempts", "base_delay", "max_delay", "max_retry_after")
_BUDGET_KEYS = ("max_tokens", "max_cost", "max_seconds", "price_per_input_token",
                "price_per_output_token", "price_per_cache_read_token",
                "price_per_cache_write_token", "price_per_cache_write_1h_token")
_SAMPLING_KEYS = ("timeout", *_RETRY_KEYS, *_BUDGET_KEYS)


@dataclass(frozen=True)
class JobSpec:
    """What to run on every prompt.

    ``sampling``: engine options that change results and therefore enter the idempotency key:
    ``timeout`` (seconds per model/scorer attempt), the :class:`beacon.retry.RetryPolicy`
    fields ``max_attempts`` (per call, first included), ``base_delay`` and ``max_delay``
    (backoff seconds) and ``max_retry_after`` (the longest server ``Retry-After`` waited for,
    seconds; a longer one fails the call), and the per-query :class:`beacon.budget.Budget` caps
    ``max_tokens``, ``max_cost`` (money), ``max_seconds`` (wall time) with
    ``price_per_input_token`` / ``price_per_output_token`` and, for a provider with a prompt
    cache, ``price_per_cache_read_token`` / ``price_per_cache_write_token`` (and
    ``price_per_cache_write_1h_token`` for 1-hour cache writes). Unset ones take
    the engine's defaults (``RetryPolicy()``'s: 3 attempts, 0.5 s, 10 s, 60 s) and are left out
    of the key.
    ``keep_candidates``: write every candidate with its reward to the output (formatting only;
    not part of the key).
    """

    generator: FactorySpec
    scorer: FactorySpec
    config: BeaconConfig
    sampling: Mapping[str, Any] = field(default_factory=dict)
    keep_candidates: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.config, BeaconConfig):
            raise JobInputError("config", self.config, "must be a BeaconConfig")
        if not isinstance(self.sampling, Mapping):
            raise JobInputError("sampling", self.sampling, "must be a JSON object")
        s = dict(self.sampling)
        for k, v in s.items():
            if k not in _SAMPLING_KEYS:
                raise JobInputError(f"sampling.{k}", v,
                                    f"unknown option; known: {', '.join(_SAMPLING_KEYS)}")
            if v is None:
                continue
            if not is_real(v) or not math.isfinite(v) or v < 0:
                raise JobInputError(f"sampling.{k}", v, "must be a finite number >= 0")
            if k in ("max_attempts", "max_tokens") and (not is_integer(v) or v < 1):
                raise JobInputError(f"sampling.{k}", v, "must be an integer >= 1")
            if k in ("max_cost", "max_seconds") and v == 0:  # timeout 0: no limit
                raise JobInputError(f"sampling.{k}", v, "must be > 0")
            # plain int / float: the spec travels as JSON to the workers (np.int64 would not)
            s[k] = int(v) if is_integer(v) else float(v)
        object.__setattr__(self, "sampling", {k: v for k, v in s.items() if v is not None})
        # a plain bool: "false" (a string from a JSON file) must not switch candidates on
        object.__setattr__(self, "keep_candidates",
                           boolean("keep_candidates", self.keep_candidates, JobInputError))

    def retry_kwargs(self) -> dict[str, Any]:
        """The ``sampling`` entries that are :class:`beacon.retry.RetryPolicy` fields."""
        return {k: v for k, v in self.sampling.items() if k in _RETRY_KEYS}

    def budget_kwargs(self) -> dict[str, Any]:
        """The ``sampling`` entries that are :class:`beacon.budget.Budget` fields."""
        return {k: v for k, v in self.sampling.items() if k in _BUDGET_KEYS}

    def generator_for(self, record: PromptRecord) -> FactorySpec:
        return record.generator or self.generator

    def scorer_for(self, record: PromptRecord) -> FactorySpec:
        return record.scorer or self.scorer

    def to_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.to_dict(),
            "scorer": self.scorer.to_dict(),
            "config": self.config.to_dict(),
            "sampling": dict(self.sampling),
            "keep_candidates": self.keep_candidates,
        }

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        if not isinstance(data, Mapping):
            raise JobInputError("job", data, "must be a JSON object")
        known = {"generator", "scorer", "config", "sampling", "keep_candidates"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobInputError(unknown[0], data[unknown[0]],
                                f"unknown job field; known: {', '.join(sorted(known))}")
        for req in ("generator", "scorer", "config"):
            if req not in data:
                raise JobInputError(req, None, "is required")
        # checked here: dict() raised a bare ValueError for a string and took a list of
        # pairs for an object
        config, sampling = data["config"], data.get("sampling")
        if not isinstance(config, Mapping):
            raise JobInputError("config", config, "must be a JSON object "
                                                  "(BeaconConfig.to_dict())")
        if sampling is not None and not isinstance(sampling, Mapping):
            raise JobInputError("sampling", sampling, "must be a JSON object or null")
        return cls(
            generator=FactorySpec.from_dict(data["generator"], field_name="generator"),
            scorer=FactorySpec.from_dict(data["scorer"], field_name="scorer"),
            config=BeaconConfig.from_dict(dict(config)),
            sampling=dict(sampling or {}),
            keep_candidates=data.get("keep_candidates", False),
        )
