"""Worker-tier settings, read from the environment (12-factor: the same image runs everywhere).

=============================  ==============================================================
variable                       meaning (default)
=============================  ==============================================================
BEACON_BROKER_URL              Celery broker: ``redis://...`` or ``amqp://...``
                               (``redis://127.0.0.1:6379/0``)
BEACON_RESULT_BACKEND          Celery result backend (the broker URL when it is Redis, else
                               ``redis://127.0.0.1:6379/0``)
BEACON_STATE_URL               Redis holding job state and results (the result backend when it
                               is Redis, else the broker when it is Redis)
BEACON_KEY_PREFIX              prefix of every job-state key (``beacon``); submitters put theirs
                               in each task message, and a worker works on the job under it
BEACON_QUEUE                   queue the prompt tasks go to (``beacon``)
BEACON_ALLOWED_FACTORIES       comma-separated module prefixes workers may import, on top of
                               ``beacon.demo`` (none)
BEACON_SOFT_TIME_LIMIT         seconds a prompt may sample; at it the engine stops with
                               ``stop_reason="budget"`` and the partial result is saved (600)
BEACON_TIME_LIMIT              hard kill of a stuck task, seconds (soft + 60)
BEACON_VISIBILITY_TIMEOUT      seconds before Redis redelivers an unacknowledged task; must
                               exceed the hard limit plus the longest retry backoff (hard + 300)
BEACON_TASK_MAX_RETRIES        task-level retries of transient errors (5)
BEACON_MAX_LOST_RUNS           runs of a prompt that may be cut off by the death of their worker
                               process (killed, out of memory, a crash, BEACON_TIME_LIMIT)
                               before the prompt is failed instead of run again; 0: no limit (3)
BEACON_RETRY_BACKOFF_MAX       cap of the task retry backoff, seconds (120)
BEACON_JOB_TTL                 seconds job state is kept in Redis after the last write (7 days)
BEACON_ENGINE_CONCURRENCY      concurrent model/scorer calls per worker process (64)
BEACON_SWEEP_INTERVAL          seconds between a worker's checks for prompt messages the broker
                               lost (:mod:`worker.recovery`); 0 turns the check off (60)
BEACON_SWEEP_GRACE             a job is checked only when its last tasks were sent at least
                               this many seconds ago (60)
=============================  ==============================================================

Every numeric setting is a finite number from its minimum up to 1e9 (about 31 years in
seconds); anything else is a :class:`beacon.ConfigError` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from beacon.errors import ConfigError
from beacon.jobs.spec import parse_allow_list

__all__ = ["WorkerSettings", "is_redis_url", "url_without_credentials"]

_DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


_SECRET_PARAMS = frozenset({"password", "username", "user"})


def url_without_credentials(url: str) -> str:
    """``url`` as a user may see it (logs, banners, error lines): scheme, host, port, path and
    database kept; any ``user:password@`` and any ``password=`` / ``username=`` query parameter
    (redis-py reads both) removed. The rest is shown as written (nothing re-encoded).

    The host part ends where a URL parser (redis-py's) ends it, at the first ``/``, ``?`` or
    ``#``, and its credentials at its last ``@``. An ``@`` after the host part is ambiguous: a
    password holding an unescaped ``/``, ``?`` or ``#`` (``redis://:p/w@host``), or a query
    value (``?client_name=a@b``). Guessing either way can show a password or a wrong host, so
    such a URL is shown as its scheme alone. One function for every URL the worker tier
    names, so no place strips less than another.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # not a URL (a bare "host:port", or "user:pw@host"): keep what follows any @
        return url.rpartition("@")[2]
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    host, tail = rest[:cut].rpartition("@")[2], rest[cut:]
    if "@" in tail:
        return f"{scheme}://(host hidden: an '@' outside the host part may belong to a password)"
    path, qsep, query = tail.partition("?")
    if qsep:
        query, hsep, fragment = query.partition("#")
        kept = [kv for kv in query.split("&")
                if kv.partition("=")[0].lower() not in _SECRET_PARAMS]
        tail = path + ("?" + "&".join(kept) if kept else "") + hsep + fragment
    return f"{scheme}://{host}{tail}"


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server (``redis://``, ``rediss://`` or ``unix://``)."""
    return url.startswith(("redis://", "rediss://", "unix://"))


# Largest value of any numeric setting: ~31 years in seconds, beyond every sensible time
# limit, TTL or count, and below what a thread's wait() (threading.TIMEOUT_MAX) and Redis
# EXPIRE take.
_MAX_SETTING = 1e9


def _num(env: Mapping[str, str], name: str, default: float, *, integer: bool = False,
         minimum: float = 0.0) -> Any:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return int(default) if integer else float(default)
    try:
        v: float = int(raw) if integer else float(raw)
    except ValueError:
        raise ConfigError(name, raw, "must be an integer" if integer else "must be a number") \
            from None
    if not v >= minimum:
        raise ConfigError(name, raw, f"must be >= {minimum}")
    if not v <= _MAX_SETTING:
        # float() takes "inf" and "1e300", int() any digits: a time limit, TTL or backoff cap
        # that large reaches int(), a thread's wait() or Redis EXPIRE and crashes the worker's
        # start (or its sweeper) with an OverflowError naming no variable.
        raise ConfigError(name, raw, f"must be <= {_MAX_SETTING:g}")
    return v


@dataclass(frozen=True)
class WorkerSettings:
    """Validated worker-tier settings (see the module docstring for the variables)."""

    broker_url: str = _DEFAULT_REDIS
    result_backend: str = _DEFAULT_REDIS
    state_url: str = _DEFAULT_REDIS
    key_prefix: str = "beacon"
    queue: str = "beacon"
    allowed_factories: tuple[str, ...] = ("beacon.demo",)
    soft_time_limit: float = 600.0
    time_limit: float = 660.0
    visibility_timeout: float = 960.0
    task_max_retries: int = 5
    max_lost_runs: int = 3
    retry_backoff_max: float = 120.0
    job_ttl: int = 7 * 24 * 3600
    engine_concurrency: int = 64
    sweep_interval: float = 60.0
    sweep_grace: float = 60.0

    def __post_init__(self) -> None:
        if self.soft_time_limit <= 0:
            raise ConfigError("BEACON_SOFT_TIME_LIMIT", self.soft_time_limit, "must be > 0")
        if self.time_limit <= self.soft_time_limit:
            raise ConfigError("BEACON_TIME_LIMIT", self.time_limit,
                              f"must exceed BEACON_SOFT_TIME_LIMIT={self.soft_time_limit}")
        if self.visibility_timeout <= self.time_limit:
            # Redis redelivers an unacknowledged message after the visibility timeout; a
            # shorter timeout would hand a still-running task to a second worker.
            raise ConfigError("BEACON_VISIBILITY_TIMEOUT", self.visibility_timeout,
                              f"must exceed BEACON_TIME_LIMIT={self.time_limit} (the longest "
                              "task), or running tasks get delivered twice")
        if not self.key_prefix or any(c.isspace() for c in self.key_prefix):
            raise ConfigError("BEACON_KEY_PREFIX", self.key_prefix, "must be non-empty, "
                                                                    "without spaces")
        if not is_redis_url(self.state_url):
            raise ConfigError("BEACON_STATE_URL", url_without_credentials(self.state_url),
                              "job state needs Redis (redis://, rediss:// or unix://)")
        if self.engine_concurrency < 1:
            raise ConfigError("BEACON_ENGINE_CONCURRENCY", self.engine_concurrency,
                              "must be >= 1")

    @property
    def celery_soft_time_limit(self) -> float:
        """Celery's soft limit: the engine deadline plus a grace period (a backstop only)."""
        return self.soft_time_limit + min(30.0, (self.time_limit - self.soft_time_limit) / 2)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        e = os.environ if env is None else env
        broker = e.get("BEACON_BROKER_URL") or _DEFAULT_REDIS
        backend = e.get("BEACON_RESULT_BACKEND") or (broker if is_redis_url(broker)
                                                      else _DEFAULT_REDIS)
        state = e.get("BEACON_STATE_URL") or (backend if is_redis_url(backend) else
                                              broker if is_redis_url(broker) else _DEFAULT_REDIS)
        soft = _num(e, "BEACON_SOFT_TIME_LIMIT", 600.0, minimum=0.001)
        hard = _num(e, "BEACON_TIME_LIMIT", soft + 60.0, minimum=0.001)
        backoff_max = _num(e, "BEACON_RETRY_BACKOFF_MAX", 120.0)
        vis = _num(e, "BEACON_VISIBILITY_TIMEOUT", hard + max(300.0, backoff_max), minimum=1.0)
        return cls(
            broker_url=broker,
            result_backend=backend,
            state_url=state,
            key_prefix=e.get("BEACON_KEY_PREFIX") or "beacon",
            queue=e.get("BEACON_QUEUE") or "beacon",
            allowed_factories=parse_allow_list(e.get("BEACON_ALLOWED_FACTORIES")),
            soft_time_limit=soft,
            time_limit=hard,
            visibility_timeout=vis,
            task_max_retries=_num(e, "BEACON_TASK_MAX_RETRIES", 5, integer=True),
            max_lost_runs=_num(e, "BEACON_MAX_LOST_RUNS", 3, integer=True),
            retry_backoff_max=backoff_max,
            job_ttl=_num(e, "BEACON_JOB_TTL", 7 * 24 * 3600, integer=True, minimum=60),
            engine_concurrency=_num(e, "BEACON_ENGINE_CONCURRENCY", 64, integer=True,
                                    minimum=1),
            sweep_interval=_num(e, "BEACON_SWEEP_INTERVAL", 60.0),
            sweep_grace=_num(e, "BEACON_SWEEP_GRACE", 60.0),
        )
