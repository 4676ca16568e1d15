"""Job state in Redis: the fan-in point of the worker tier.

Keys (``P`` = ``BEACON_KEY_PREFIX``, ``J`` = job id), all expiring together ``BEACON_JOB_TTL``
after the job's last activity -- its creation, a registration of prompts, a send of tasks, the
start of a run, a stored outcome: each of these refreshes the expiry of all six ``P:job:J:*``
keys in the round trip that does it, so a job never loses part of its state (its results while
its meta lives on, or its meta while its prompts still run):

* ``P:job:J:meta``    hash: ``spec`` (JSON), ``total``, ``source``, ``created``, ``queue`` (where
  its tasks go), ``queue:Q`` for every queue its tasks were ever sent to (a job submitted again
  to another queue may still have messages waiting in the first), ``sent`` (when tasks were
  last sent; see :mod:`worker.recovery`)
* ``P:job:J:prompts`` hash: prompt key -> ``{"record": ..., "line": n, "spec": ref}`` (what to
  resubmit, and the reference of the spec it was submitted with)
* ``P:job:J:results`` hash: prompt key -> ``{"record": output line, "dpo": DPO line | null}``
* ``P:job:J:errors``  hash: prompt key -> ``{"record": error line}`` (failed prompts, bad lines)
* ``P:job:J:runs``    hash: prompt key -> runs of it started and not ended; what is left above
  zero counts runs cut off by the death of their worker process (``BEACON_MAX_LOST_RUNS``)
* ``P:job:J:sends``   hash: prompt key -> when its task was last sent, in microseconds of the
  state store's clock (``TIME``); while a sender holds the prompt's send claim
  (:meth:`JobStore.claim_sends`: claimed, not yet sent), when it was claimed, followed by
  ``:token``
* ``P:jobs``          set of job ids that may still have pending prompts (what the lost-message
  sweeper of :mod:`worker.recovery` visits; a job leaves it once finished)
* ``P:store-id``      a random id naming this state store (never expires): submitters put it,
  with ``P``, in the headers of each task message, and a worker checks it against the store it
  is configured with before it touches the job (:mod:`worker.tasks`)

Writes are idempotent: a result is stored with ``HSETNX`` (the first delivery wins; a redelivered
or retried task finds it and does nothing) and removes the key from ``errors`` in the same Lua
script, so a retried failure that later succeeds is counted once.

Sends are claimed per prompt (:meth:`JobStore.claim_sends`, one script per chunk): two senders
of one job -- two ``beacon submit`` of the same file at once, a submission and the lost-message
sweeper or ``status --requeue-lost`` -- never both send a prompt's task, so it is not run, and
paid for, twice. A sender reads what is in the broker at some moment ``since`` and then claims
the prompts it found missing: a prompt is claimable when it was never sent, when it was last sent
before ``since`` (its message was in the broker by then, so missing from the broker means lost),
or when its claim is older than ``SEND_LEASE`` seconds (its sender died between the claim and the
send: the claim must not keep a lost prompt unsent for ever). A prompt claimed or sent after
``since`` is left to that sender. ``done`` = HLEN results,
``failed`` = HLEN errors, ``pending`` = total - done - failed. ``beacon collect`` copies results
and errors to local JSONL files through :class:`~beacon.jobs.output.KeyedJsonlWriter`, which never
writes a key twice: that is the tier's idempotent fan-in writer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import redis

__all__ = ["CollectResult", "JobStatus", "JobStore", "UnknownJobError", "collect_job",
           "purge_refusal"]

# Every key of the job (JobStore._job_keys, in that order): any activity on a job keeps all
# of it BEACON_JOB_TTL longer. EXPIRE of a key that does not exist (purged, or not written
# yet) does nothing.
_JOB_PARTS = ("results", "errors", "meta", "prompts", "runs", "sends")

# Seconds a send claim (JobStore.claim_sends) holds its prompts: longer than sending one chunk
# of tasks takes (500 messages, well under a second on a live broker), so a live sender is never
# overtaken; short next to the sweeper's grace period (BEACON_SWEEP_GRACE, 60 s), so the prompts
# of a sender that died after claiming are resent by the next sweep or resubmission.
SEND_LEASE = 30.0
# Prompts claimed (and then sent) together: a send holds its claims while it publishes them,
# one broker round trip per message, so a group must be sent well within SEND_LEASE even on a
# distant broker (100 messages at 60 ms each: 6 s).
SEND_GROUP = 100

_T = TypeVar("_T")


def _touch_job(ttl_arg: int) -> str:
    """Lua refreshing the expiry of KEYS[1..6] (every key of the job) to ARGV[ttl_arg] s."""
    return f"\nfor i = 1, 6 do redis.call('EXPIRE', KEYS[i], ARGV[{ttl_arg}]) end\n"


# KEYS: the job's keys; ARGV: prompt key, payload, ttl, end_run ("1": the run that computed the
# outcome is counted as ended in the same round trip, JobStore.end_run).
_END_RUN_IN_STORE = """
if ARGV[4] == '1' then
  local n = redis.call('HINCRBY', KEYS[5], ARGV[1], -1)
  if n <= 0 then redis.call('HDEL', KEYS[5], ARGV[1]) end
end
"""

# The job must still exist (KEYS[3], its meta, with the spec JobStore.create writes: a meta
# hash without one is a shell that a write racing a purge left, not a job): a run begun
# before a purge must not recreate part of the job (its results alone, for another
# BEACON_JOB_TTL) when it ends, nor a submission racing a purge its prompts.
_JOB_GONE = """
if redis.call('HEXISTS', KEYS[3], 'spec') == 0 then return -1 end
"""

# KEYS: the job's keys; ARGV: ttl, then prompt key and payload pairs (JobStore.add_prompts).
_ADD_PROMPTS = _JOB_GONE + """
local added = 0
for i = 2, #ARGV, 2 do
  added = added + redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[3], 'total', redis.call('HLEN', KEYS[4]))
""" + _touch_job(1) + """
return added
"""

_STORE_RESULT = _JOB_GONE + _END_RUN_IN_STORE + """
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if added == 1 then redis.call('HDEL', KEYS[2], ARGV[1]) end
""" + _touch_job(3) + """
return added
"""

_END_RUN = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return n
"""

# KEYS: the job's keys; ARGV: prompt key, ttl. What a task does before it runs a
# prompt, in one round trip: 0 when the prompt has a result (a redelivery: nothing to run), -1
# when the job is gone (purged or expired: the outcome would be stored where nobody reads it),
# else the run is counted as started and the runs started and not ended are returned
# (JobStore.begin_run). A started run is activity: a prompt may run for longer than the time
# left to the job, whose meta (the spec, the "is it still there" check of its next messages)
# must not expire under it.
_BEGIN_RUN = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 0 then return -1 end
local n = redis.call('HINCRBY', KEYS[5], ARGV[1], 1)
""" + _touch_job(2) + """
return n
"""

# KEYS: the job's keys, then P:jobs; ARGV: queue, time, ttl, job id (JobStore.mark_sent).
_MARK_SENT = _JOB_GONE + """
redis.call('HSET', KEYS[3], 'queue', ARGV[1], 'queue:' .. ARGV[1], '1', 'sent', ARGV[2])
""" + _touch_job(3) + """
redis.call('SADD', KEYS[7], ARGV[4])
return 1
"""

# The state store's clock in microseconds, as a string of digits (a Lua number of ~1.7e15 is
# exact, but Lua 5.1 would print it in exponent form).
_NOW_US = """
local t = redis.call('TIME')
local now_s = t[1] .. string.format('%06d', tonumber(t[2]))
local now = tonumber(now_s)
"""

# KEYS: the job's keys; ARGV: ttl, since (us), lease (us), token, then prompt keys
# (JobStore.claim_sends). Returns -1 when the job is gone, else the 1-based positions of the
# keys claimed, and minus those of the keys another sender's live claim holds. A sends entry is
# "<us>" (sent then) or "<us>:<token>" (claimed then, not sent).
_CLAIM_SENDS = _JOB_GONE + _NOW_US + """
local since, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
local mine = now_s .. ':' .. ARGV[4]
local out = {}
for i = 5, #ARGV do
  local v = redis.call('HGET', KEYS[6], ARGV[i])
  local free, at, tok = true, nil, ''
  if v then
    at, tok = string.match(v, '^(%d+):?(.*)$')
    at = tonumber(at)
    if at == nil then free = true
    elseif tok ~= '' then free = now - at > lease
    else free = at < since end
  end
  if free then
    redis.call('HSET', KEYS[6], ARGV[i], mine)
    out[#out + 1] = i - 4
  elseif tok ~= '' then
    out[#out + 1] = 4 - i
  end
end
""" + _touch_job(1) + """
return out
"""

# KEYS: the job's keys; ARGV: ttl, token, then prompt keys (JobStore.finish_sends). Each key
# whose claim is still this token's is stamped sent now; -1 when the job is gone (nothing is
# written: a send must not bring a purged job back).
_FINISH_SENDS = _JOB_GONE + _NOW_US + """
local n = 0
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[6], ARGV[i])
  if v and string.match(v, ':(.*)$') == ARGV[2] then
    redis.call('HSET', KEYS[6], ARGV[i], now_s)
    n = n + 1
  end
end
""" + _touch_job(1) + """
return n
"""

_STORE_ERROR = _JOB_GONE + _END_RUN_IN_STORE + """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
""" + _touch_job(3) + """
return 1
"""


class UnknownJobError(LookupError):
    """No job with this id in the state store (never submitted, purged, or expired)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"unknown job {job_id!r} (never submitted, purged, or expired)")
        self.job_id = job_id


@dataclass(frozen=True)
class JobStatus:
    """Counts of one job; ``pending`` = total - done - failed."""

    job_id: str
    total: int
    done: int
    failed: int
    created: float
    source: str

    @property
    def pending(self) -> int:
        return max(0, self.total - self.done - self.failed)

    @property
    def finished(self) -> bool:
        return self.pending == 0

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "total": self.total, "done": self.done,
                "failed": self.failed, "pending": self.pending, "source": self.source,
                "created": self.created}


class JobStore:
    """Redis-backed job state (see the module docstring for the layout)."""

    def __init__(self, url: str, *, prefix: str = "beacon", ttl: int = 7 * 24 * 3600,
                 client: Any = None) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl = int(ttl)
        self.r: Any = client if client is not None else redis.Redis.from_url(url)
        self._id: str | None = None
        self._store_result = self.r.register_script(_STORE_RESULT)
        self._store_error = self.r.register_script(_STORE_ERROR)
        self._end_run = self.r.register_script(_END_RUN)
        self._begin_run = self.r.register_script(_BEGIN_RUN)
        self._mark_sent = self.r.register_script(_MARK_SENT)
        self._add_prompts = self.r.register_script(_ADD_PROMPTS)
        self._claim_sends = self.r.register_script(_CLAIM_SENDS)
        self._finish_sends = self.r.register_script(_FINISH_SENDS)

    @classmethod
    def from_settings(cls, settings: Any) -> JobStore:
        return cls(settings.state_url, prefix=settings.key_prefix, ttl=settings.job_ttl)

    def close(self) -> None:
        self.r.close()

    # -- keys --------------------------------------------------------------------------------
    def _k(self, job_id: str, part: str) -> str:
        return f"{self.prefix}:job:{job_id}:{part}"

    def _job_keys(self, job_id: str) -> list[str]:
        """Every key of the job, in the order the scripts above take them (``_JOB_PARTS``)."""
        return [self._k(job_id, p) for p in _JOB_PARTS]

    def _touch(self, pipe: Any, job_id: str) -> None:
        """Queue on ``pipe`` the refresh of the expiry of every key of the job (activity on a
        job keeps all of it: see the module docstring)."""
        for k in self._job_keys(job_id):
            pipe.expire(k, self.ttl)

    # -- submission --------------------------------------------------------------------------
    @staticmethod
    def spec_ref(spec: dict[str, Any]) -> str:
        """Content hash naming a job spec (what each task message carries instead of the spec:
        a fitted transform can be tens of kB, too much to repeat in every message)."""
        from beacon.jobs.spec import canonical_json

        return hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()[:32]

    def create(self, job_id: str, spec: dict[str, Any], *, source: str) -> str:
        """Create (or update) a job; returns the spec's reference for the task messages."""
        from beacon.jobs.spec import canonical_json

        ref = self.spec_ref(spec)
        meta = self._k(job_id, "meta")
        pipe = self.r.pipeline(transaction=True)
        pipe.hsetnx(meta, "created", repr(time.time()))
        pipe.hset(meta, mapping={"spec": canonical_json(spec), f"spec:{ref}": canonical_json(spec),
                                 "source": source})
        pipe.hsetnx(meta, "total", 0)
        self._touch(pipe, job_id)
        pipe.sadd(self._jobs_key, job_id)
        pipe.execute()
        return ref

    def store_id(self, *, create: bool = True, fresh: bool = False) -> str | None:
        """The random id this store keeps under ``P:store-id``, created on first use unless
        ``create`` is False (then None while there is none). Read once per instance unless
        ``fresh``. Two :class:`JobStore` objects with the same id work on the same Redis
        database, whatever the URLs they were given."""
        if self._id is None or fresh:
            k = f"{self.prefix}:store-id"
            if create:
                self.r.set(k, uuid.uuid4().hex, nx=True)
            raw = self.r.get(k)
            self._id = raw.decode() if raw is not None else None
        return self._id

    @property
    def _jobs_key(self) -> str:
        return f"{self.prefix}:jobs"

    def meta(self, job_id: str) -> dict[str, str]:
        """The job's meta hash, decoded (raises :class:`UnknownJobError` if there is none)."""
        raw = self.r.hgetall(self._k(job_id, "meta"))
        if not raw:
            raise UnknownJobError(job_id)
        return {k.decode(): v.decode() for k, v in raw.items()}

    def check_exists(self, job_id: str) -> None:
        """Raise :class:`UnknownJobError` when the job is gone (purged or expired; a meta hash
        without a spec is no job): what a sender checks before each chunk goes out."""
        if not self.r.hexists(self._k(job_id, "meta"), "spec"):
            raise UnknownJobError(job_id)

    def mark_sent(self, job_id: str, queue: str) -> None:
        """Record that tasks of the job were just sent to ``queue``. Raises
        :class:`UnknownJobError`, writing nothing, when the job is gone (purged or expired
        while its tasks were being sent): a send must not bring back a meta hash without a
        spec, which ``status`` would show as a job of 0 prompts for another BEACON_JOB_TTL."""
        self._stored(job_id, self._mark_sent(
            keys=[*self._job_keys(job_id), self._jobs_key],
            args=[queue, repr(time.time()), self.ttl, job_id],
        ))

    def now_us(self) -> int:
        """The state store's clock (``TIME``), in microseconds since the epoch: the ``since``
        of :meth:`claim_sends` (one clock for every submitter and worker, whatever theirs)."""
        sec, usec = self.r.time()
        return int(sec) * 1_000_000 + int(usec)

    def claim_sends(self, job_id: str, keys: list[str], *, since: int
                    ) -> tuple[str, list[str], int]:
        """Claim the sending of the tasks of ``keys``; returns the claim's token, the keys
        claimed (in the order given) and how many of the others another sender's claim holds
        now (being sent, or its sender died: sent again once the claim lapses). The others
        are another sender's: claimed less than ``SEND_LEASE`` seconds ago, or sent at or after
        ``since`` (:meth:`now_us`, read before the caller looked for the job's messages in the
        broker, so a message sent after it may have been missed). Send the claimed tasks, then
        call :meth:`finish_sends` (also when the send fails: a half-sent chunk may be in the
        broker). One round trip; raises :class:`UnknownJobError`, claiming nothing, when the
        job is gone."""
        token = uuid.uuid4().hex[:16]
        if not keys:
            self.check_exists(job_id)
            return token, [], 0
        reply = self._claim_sends(
            keys=self._job_keys(job_id),
            args=[self.ttl, since, int(SEND_LEASE * 1_000_000), token, *keys])
        if not isinstance(reply, list):
            raise UnknownJobError(job_id)
        pos = [int(i) for i in reply]
        return token, [keys[i - 1] for i in pos if i > 0], sum(1 for i in pos if i < 0)

    def send_claimed(self, job_id: str, items: list[_T], key: Callable[[_T], str], *,
                     since: int, send: Callable[[list[_T]], None]) -> tuple[list[_T], int]:
        """Claim the sends of ``items`` (prompt keys by ``key``; :meth:`claim_sends` with
        ``since``), ``send`` the claimed ones and stamp them sent (:meth:`finish_sends`, also
        when ``send`` raises: part of them may have gone out, and a later check looks for them
        in the broker; with Redis away, the claims lapse after ``SEND_LEASE`` by themselves).
        Returns the items sent and how many others another sender's claim holds."""
        token, claimed, held = self.claim_sends(job_id, [key(i) for i in items], since=since)
        mine = set(claimed)
        todo = [i for i in items if key(i) in mine]
        if not todo:
            return todo, held
        try:
            send(todo)
        except BaseException:
            with contextlib.suppress(redis.exceptions.RedisError):
                self.finish_sends(job_id, token, claimed)
            raise
        self.finish_sends(job_id, token, claimed)
        return todo, held

    def finish_sends(self, job_id: str, token: str, keys: list[str]) -> int:
        """Stamp ``keys`` claimed under ``token`` (:meth:`claim_sends`) as sent now; returns how
        many still held that claim (one whose lease ran out may have been taken over). Nothing
        is written for a job that is gone (purged while its tasks were sent): returns -1."""
        if not keys:
            return 0
        return int(self._finish_sends(keys=self._job_keys(job_id), args=[self.ttl, token, *keys]))

    @staticmethod
    def sent_queues(meta: dict[str, str]) -> set[str]:
        """Every queue a job's tasks were sent to, from its :meth:`meta` (jobs registered before
        ``queue:Q`` was recorded name only their latest queue)."""
        out = {k[len("queue:"):] for k in meta if k.startswith("queue:")}
        if meta.get("queue"):
            out.add(meta["queue"])
        return out

    def active_jobs(self) -> list[str]:
        """Ids of jobs that may still have pending prompts."""
        return sorted(x.decode() for x in self.r.smembers(self._jobs_key))

    def retire(self, job_id: str) -> None:
        """Take a finished (or expired) job off the sweeper's list."""
        self.r.srem(self._jobs_key, job_id)

    def add_prompts(self, job_id: str, items: Iterable[tuple[str, dict[str, Any]]]) -> int:
        """Register prompts (key -> payload); returns how many keys were new to the job.

        One script: raises :class:`UnknownJobError`, writing nothing, when the job is gone
        (purged while it is submitted), where the writes used to bring back its prompts and
        a meta hash without a spec."""
        args: list[Any] = [self.ttl]
        for key, payload in items:
            args += (key, json.dumps(payload))
        if len(args) == 1:
            return 0
        added = int(self._add_prompts(keys=self._job_keys(job_id), args=args))
        if added < 0:
            raise UnknownJobError(job_id)
        return added

    def spec(self, job_id: str, ref: str | None = None) -> dict[str, Any]:
        """The job's spec (the latest, or the one named ``ref``), checked against its hash."""
        raw = self.r.hget(self._k(job_id, "meta"), "spec" if ref is None else f"spec:{ref}")
        if raw is None:
            raise UnknownJobError(job_id)
        out: dict[str, Any] = json.loads(raw)
        if ref is not None and self.spec_ref(out) != ref:
            raise ValueError(f"job {job_id!r}: stored spec does not match its reference {ref}")
        return out

    # -- results -----------------------------------------------------------------------------
    def has_result(self, job_id: str, key: str) -> bool:
        return bool(self.r.hexists(self._k(job_id, "results"), key))

    def store_result(self, job_id: str, key: str, payload: dict[str, Any], *,
                     end_run: bool = False) -> bool:
        """Store a finished prompt; False if a result for ``key`` was already there.
        ``end_run``: also count the run that computed it as ended (:meth:`end_run`), atomically
        with the store. Raises :class:`UnknownJobError`, storing nothing, when the job is gone
        (purged or expired while the prompt ran)."""
        return self._stored(job_id, self._store_result(
            keys=self._job_keys(job_id),
            args=[key, json.dumps(payload, allow_nan=False), self.ttl, int(end_run)],
        ))

    def store_error(self, job_id: str, key: str, payload: dict[str, Any], *,
                    end_run: bool = False) -> bool:
        """Record a failed prompt unless it already has a result; True if recorded.
        ``end_run`` and a job that is gone as for :meth:`store_result`."""
        return self._stored(job_id, self._store_error(
            keys=self._job_keys(job_id),
            args=[key, json.dumps(payload, allow_nan=False), self.ttl, int(end_run)],
        ))

    @staticmethod
    def _stored(job_id: str, reply: Any) -> bool:
        if int(reply) < 0:
            raise UnknownJobError(job_id)
        return bool(reply)

    def reopen(self, job_id: str, keys: list[str]) -> int:
        """Forget the errors of ``keys`` (failed prompts about to be sent again): they are
        pending until their retry stores an outcome. Returns how many errors were removed."""
        return int(self.r.hdel(self._k(job_id, "errors"), *keys)) if keys else 0

    def begin_run(self, job_id: str, key: str) -> int | None:
        """:meth:`has_result` and the count of a run of ``key`` starting, in one round trip
        (what a task does before it runs a prompt): None when ``key`` already has a result
        (nothing is counted), else the runs of ``key`` started and not ended (:meth:`end_run`),
        this one included: the others died with their worker process (or are running right
        now, on a duplicate delivery). Raises :class:`UnknownJobError` when the job is gone
        (purged, expired): a message still queued for it must not run, and be paid for, with
        nowhere to store the outcome."""
        n = int(self._begin_run(keys=self._job_keys(job_id), args=[key, self.ttl]))
        if n < 0:
            raise UnknownJobError(job_id)
        return n or None

    def end_run(self, job_id: str, key: str, *, forget: bool = False) -> None:
        """A run of ``key`` ended (``forget``: and the count of its lost runs starts again)."""
        if forget:
            self.r.hdel(self._k(job_id, "runs"), key)
        else:
            self._end_run(keys=[self._k(job_id, "runs")], args=[key])

    def status(self, job_id: str) -> JobStatus:
        meta_key = self._k(job_id, "meta")
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(meta_key)
        pipe.hlen(self._k(job_id, "results"))
        pipe.hlen(self._k(job_id, "errors"))
        meta, done, failed = pipe.execute()
        if not meta:
            raise UnknownJobError(job_id)
        m = {k.decode(): v.decode() for k, v in meta.items()}
        return JobStatus(job_id, int(m.get("total", 0)), int(done), int(failed),
                         float(m.get("created", 0.0)), m.get("source", ""))

    def _scan(self, job_id: str, part: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for k, v in self.r.hscan_iter(self._k(job_id, part), count=500):
            yield k.decode(), json.loads(v)

    def iter_results(self, job_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._scan(job_id, "results")

    def iter_errors(self, job_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._scan(job_id, "errors")

    def iter_prompts(self, job_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return self._scan(job_id, "prompts")

    def outcome_flags(self, job_id: str, keys: list[str]) -> list[tuple[bool, bool]]:
        """``(has_result, has_error)`` for each key, in one round trip."""
        res_k, err_k = self._k(job_id, "results"), self._k(job_id, "errors")
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.hexists(res_k, key)
            pipe.hexists(err_k, key)
        flags = pipe.execute()
        return [(bool(flags[2 * i]), bool(flags[2 * i + 1])) for i in range(len(keys))]

    def error_records(self, job_id: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The stored error line of each of ``keys`` that has one, in one round trip."""
        if not keys:
            return {}
        raw = self.r.hmget(self._k(job_id, "errors"), keys)
        return {k: json.loads(v)["record"] for k, v in zip(keys, raw, strict=True)
                if v is not None}

    def unfinished(self, job_id: str, *, include_failed: bool = False
                   ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Prompts without a result (and, unless ``include_failed``, without an error)."""
        batch: list[tuple[str, dict[str, Any]]] = []

        def flush() -> Iterator[tuple[str, dict[str, Any]]]:
            flags = self.outcome_flags(job_id, [k for k, _ in batch])
            for item, (has_res, has_err) in zip(batch, flags, strict=True):
                if not has_res and (include_failed or not has_err):
                    yield item

        for item in self.iter_prompts(job_id):
            batch.append(item)
            if len(batch) >= 500:
                yield from flush()
                batch = []
        if batch:
            yield from flush()

    def purge(self, job_id: str) -> int:
        self.retire(job_id)
        return int(self.r.delete(*self._job_keys(job_id)))


@dataclass(frozen=True)
class CollectResult:
    """``written`` / ``dpo_written``: lines added now; ``status``: the job's counts;
    ``dpo_foreign``: pairs not written because the prompt's line in ``out`` holds another
    draw (written by another run of the same prompt and spec, e.g. ``beacon run``);
    ``complete``: every outcome of the job is in ``out`` -- nothing was pending when the
    collect started and no outcome changed while it ran (a prompt finishing during the scan
    may have been missed: collect again). Only then may the job's state be purged.
    ``bad_lines``: how many of the job's failed outcomes are bad input lines (no retry fixes
    them)."""

    written: int
    dpo_written: int
    replaced_errors: int
    status: JobStatus
    dpo_foreign: int = 0
    complete: bool = False
    bad_lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"written": self.written, "dpo_written": self.dpo_written,
                "replaced_errors": self.replaced_errors, "dpo_foreign": self.dpo_foreign,
                "complete": self.complete, "bad_lines": self.bad_lines,
                **self.status.to_dict()}


def purge_refusal(c: CollectResult, *, allow_failed: bool = False) -> str | None:
    """Why the job collected by ``c`` must not be purged yet (None: it may be).

    Purging deletes the record of which prompts are finished: a later ``beacon submit`` of
    the same file (``--retry-failed`` to retry the failures) would then send every prompt
    again, and pay again for the finished ones. So a job is purged only once it is complete
    in ``out`` and no prompt failed, unless ``allow_failed`` gives up on its failed prompts."""
    st = c.status
    if st.pending:
        return (f"{st.pending} prompt(s) still pending; collect again once they are finished "
                "(--wait)")
    if not c.complete:
        return ("prompts finished while this collect ran and may not be in the output yet; "
                "collect again")
    if st.failed and not allow_failed:
        if c.bad_lines >= st.failed:  # nothing a retry could fix: say so, not "retry them"
            return (f"{st.failed} bad input line(s) failed, which no retry fixes: purging "
                    "would forget which prompts are finished, so submitting the file again "
                    f"would run, and pay for, all {st.total} prompts again. Add --purge-failed "
                    "to purge anyway and give the bad lines up")
        bad = (f" ({c.bad_lines} of them bad input lines, which no retry fixes)"
               if c.bad_lines else "")
        return (f"{st.failed} prompt(s) failed{bad}: purging would forget which prompts are "
                "finished, so retrying them (beacon submit PROMPTS --retry-failed) would run, "
                f"and pay for, all {st.total} prompts again. Retry the failed ones, collect, "
                "then purge; or add --purge-failed to purge anyway and give them up")
    return None


def _draw(line: dict[str, Any]) -> tuple[bytes, Any]:
    """What tells two output lines of one prompt key apart: the same draw has the same best
    response (compared by a 128-bit digest of its JSON) and the same reward."""
    best = json.dumps(line.get("best"), sort_keys=True, ensure_ascii=False)
    return (hashlib.blake2b(best.encode("utf-8", "surrogatepass"), digest_size=16).digest(),
            line.get("reward"))


def collect_job(store: JobStore, job_id: str, out: str | Path, *, dpo: str | Path | None = None,
                fsync: bool = True) -> CollectResult:
    """Copy a job's outcomes from Redis to JSONL files; safe to repeat at any time.

    Each key is written at most once (:class:`~beacon.jobs.output.KeyedJsonlWriter`); an error
    line written by an earlier collect is replaced (atomic rewrite) once the prompt has
    succeeded on a retry, or failed again with another error; lines of other jobs in ``out``
    are left alone. DPO lines are written before output lines, as in the local runner, and a
    pair missing from ``dpo`` is written even when its output line was collected earlier (e.g.
    by a collect without ``dpo``) -- unless that line holds another draw of the prompt (the
    same key written by another run, e.g. ``beacon run`` of the same prompts and spec): a pair
    always comes from its line's draw, so such pairs are counted in ``dpo_foreign`` instead.
    Lines are written as the job's hashes are scanned (batches of about 500 entries); what is
    held for the whole collect is bounded per prompt: the keys in ``out`` and ``dpo`` and, with
    ``dpo``, a digest and reward per ok line of ``out`` -- never the responses.
    """
    from beacon.jobs.dpo import DpoWriter
    from beacon.jobs.output import KeyedJsonlWriter, read_jsonl

    before = store.status(job_id)  # raises UnknownJobError before any file is touched
    written = dpo_written = foreign = bad_lines = 0
    with KeyedJsonlWriter(out, fsync=fsync) as out_w:
        failed_here: dict[str, dict[str, Any]] = {}  # error lines already there, by key
        # ok lines already there: key -> their draw, a digest of the best response (not the
        # text: a large job's responses need not fit in memory) and its reward
        drawn: dict[str, tuple[bytes, Any]] = {}
        for rec in read_jsonl(out):
            if rec.get("ok") is False:
                failed_here[str(rec["key"])] = rec
            elif dpo is not None and rec.get("ok") is True:
                drawn[str(rec["key"])] = _draw(rec)
        replaced = 0
        if failed_here:
            keys = list(failed_here)
            flags = store.outcome_flags(job_id, keys)
            now_ok = {k for k, (has_res, _) in zip(keys, flags, strict=True) if has_res}
            # A prompt retried (submit --retry-failed) that failed again: its line says why
            # it failed last, not the first time.
            latest = store.error_records(job_id, [k for k in keys if k not in now_ok])
            redo = now_ok | {k for k, rec in latest.items() if rec != failed_here[k]}
            if redo:
                replaced = len(out_w.compact(
                    lambda rec: not (rec.get("ok") is False and rec.get("key") in redo)))
        dpo_w = DpoWriter(dpo, fsync=fsync).open() if dpo is not None else None
        try:
            for key, payload in store.iter_results(job_id):
                # The pair too when the line is already there (collected earlier without
                # --dpo, or cut off by an interruption): the DPO writer keeps one per key.
                if dpo_w is not None and payload.get("dpo") is not None:
                    there = drawn.get(key)
                    if there is None or there == _draw(payload["record"]):
                        dpo_written += int(dpo_w.write(payload["dpo"]))
                    elif key not in dpo_w:
                        foreign += 1
                if key not in out_w:
                    written += int(out_w.write(payload["record"]))
            for key, payload in store.iter_errors(job_id):
                bad_lines += "lines" in payload["record"]  # line_error_record's own field
                if key not in out_w:
                    written += int(out_w.write(payload["record"]))
        finally:
            if dpo_w is not None:
                dpo_w.close()
    after = store.status(job_id)
    # Nothing pending at the start and the same counts at the end: every prompt already had
    # its outcome, results are never overwritten (HSETNX), and an error that became a result
    # (a retry) would have moved the counts -- so the scan above saw every outcome.
    complete = before.finished and (before.total, before.done, before.failed) == (
        after.total, after.done, after.failed)
    return CollectResult(written, dpo_written, replaced, after, foreign, complete, bad_lines)
