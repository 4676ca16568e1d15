"""Worker tier, review of the fifth audit: URLs with an ``@`` after their host part, the state URL
in a settings error, a failed resend that must not count as a send, and a purge landing
between a submission's send stamp and its prompt registration. Real Redis on 127.0.0.1:6379
(DB 11, under test_worker's unique key prefix)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import test_worker

PREFIX = test_worker.PREFIX
REDIS_URL = test_worker.REDIS_URL
tier = test_worker.tier


# -- URLs whose '@' is not where a parser ends the host ---------------------------------------
@pytest.mark.parametrize("url", [
    # redis-py: host cache, password S3cret, client_name beacon@node1
    "redis://cache:6379/0?client_name=beacon@node1&password=S3cret",
    "redis://:S3cret@cache:6379/0?client_name=beacon@node1",
    # a password with an unescaped '/' (redis-py reads host 'p'; the user meant cache)
    "redis://:S3/cret@cache:6379/2",
    "unix:///run/user@1000/redis.sock?db=2&password=S3cret",
])
def test_an_at_sign_after_the_host_part_hides_the_host_rather_than_guess(url: str) -> None:
    """Cutting at the URL's last '@' showed ``redis://node1&password=S3cret`` for the first URL
    (a wrong host and the password) and ``redis://node1`` for the second. Whether such an '@'
    ends a password or sits in a query value cannot be told, so the scheme alone is shown."""
    from worker.config import url_without_credentials

    shown = url_without_credentials(url)
    assert "S3" not in shown and "cret" not in shown, shown
    assert "node1" not in shown and "1000" not in shown, shown
    assert shown.startswith(url.partition("://")[0] + "://"), shown


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://h:1/0?a=%2F&x=%2&password=pw", "redis://h:1/0?a=%2F&x=%2"),
    ("redis://:pw@h:1/0?db=3#frag", "redis://h:1/0?db=3#frag"),
    ("redis://:pw@h:1/0#frag", "redis://h:1/0#frag"),
    ("redis://[::1]:6379/0?Password=pw", "redis://[::1]:6379/0"),
])
def test_the_rest_of_a_url_is_shown_as_written(url: str, shown: str) -> None:
    """The query was decoded and encoded again (``a=%2F`` shown as ``a=/``, ``x=%2`` as
    ``x=%252``) and the fragment dropped when there was a query."""
    from worker.config import url_without_credentials

    assert url_without_credentials(url) == shown


def test_an_invalid_state_url_is_named_without_its_password() -> None:
    from beacon.errors import ConfigError
    from worker.config import WorkerSettings

    with pytest.raises(ConfigError) as ei:
        WorkerSettings.from_env({"BEACON_STATE_URL": "redis-sentinel://:S3cret@cache:6379/0"})
    assert "S3cret" not in str(ei.value) and "cache:6379" in str(ei.value), str(ei.value)


# -- a failed resend is no send -----------------------------------------------------------------
def test_a_resend_that_fails_does_not_start_the_grace_period(tier: SimpleNamespace) -> None:
    """The chunk was stamped ``sent`` before it went out: a broker error on the send left the
    stamp, and the next check within the grace period skipped the job ("messages sent 0 s
    ago"), so its lost prompts waited another sweep interval."""
    from worker.recovery import requeue_lost

    store, job = tier.store, f"{PREFIX}-failed-resend"
    store.create(job, {"spec": job}, source=job)
    store.add_prompts(job, [(f"k{i}", {"record": {"id": i, "prompt": "q"}, "line": i + 1,
                                       "spec": "ref"}) for i in range(3)])
    store.mark_sent(job, f"{PREFIX}-q")
    store.r.hset(store._k(job, "meta"), "sent", "0")  # sent long ago: past any grace

    class BrokerDown(Exception):
        pass

    def failing(job_id: str, items: list[tuple[str, dict[str, Any]]], queue: str) -> None:
        raise BrokerDown

    with pytest.raises(BrokerDown):
        requeue_lost(store, job, broker_url=REDIS_URL, send=failing, grace=60, settle=0)
    sent: list[str] = []

    def ok(job_id: str, items: list[tuple[str, dict[str, Any]]], queue: str) -> None:
        sent.extend(k for k, _ in items)

    res = requeue_lost(store, job, broker_url=REDIS_URL, send=ok, grace=60, settle=0)
    assert res.skipped == "" and sorted(sent) == ["k0", "k1", "k2"], res


# -- a purge between a submission's stamp and its prompt registration ---------------------------
def test_a_purge_before_the_prompts_are_registered_leaves_nothing(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``add_prompts`` had no gone-job check: after a purge it wrote the prompts hash and a meta
    hash of ``total`` alone, the send's stamp then found a meta hash and passed, and the job
    was back as a spec-less shell (its prompts pending for ever, resent by every sweep)."""
    import beacon
    from beacon.jobs.spec import FactorySpec, JobSpec, PromptRecord
    from worker.state import JobStore, UnknownJobError

    job = f"{PREFIX}-purge-before-register"
    original = JobStore.mark_sent

    def stamp_then_purge(self: JobStore, job_id: str, queue: str) -> None:
        original(self, job_id, queue)
        self.purge(job_id)  # collect --purge in another shell, just then

    monkeypatch.setattr(JobStore, "mark_sent", stamp_then_purge)
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    items = [PromptRecord(id=i, prompt=f"q {i}", line=i + 1) for i in range(3)]
    with pytest.raises(UnknownJobError):
        tier.submit(items, spec, job_id=job, store=tier.store, queue=f"{PREFIX}-nobody")
    r = tier.store.r
    assert not any(r.exists(k) for k in tier.store._job_keys(job)), \
        r.hgetall(tier.store._k(job, "meta"))
    assert job.encode() not in r.smembers(tier.store._jobs_key)
    assert r.llen(f"{PREFIX}-nobody") == 0
