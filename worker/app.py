"""The Celery application of the BEACON worker tier, configured from the environment.

Start a worker with ``beacon worker`` or ``celery -A worker.app worker``; settings come from
``BEACON_*`` variables (:mod:`worker.config`). Choices, and why:

* JSON only (``task_serializer``, ``result_serializer``, ``accept_content``): messages come from
  the network; pickle would let anyone who can write to the broker run code on the workers.
* ``task_acks_late`` + ``task_reject_on_worker_lost``: a task is acknowledged after it finished,
  so a worker killed mid-task leaves the message to be redelivered (prompt tasks are idempotent,
  see :mod:`worker.state`). ``worker_prefetch_multiplier=1``: a worker reserves only what it
  runs, so a crash strands few messages and long tasks do not queue behind each other.
* Redis ``visibility_timeout`` above the hard time limit plus the longest retry backoff: Redis
  redelivers an unacknowledged message after it, so a shorter value would run live tasks twice.
  ``unacked_restore_interval`` is a quarter of it (at most 10 s) so a dead worker's messages are
  found soon after they become visible again.
* ``task_soft_time_limit`` is a backstop: the engine itself stops at the same deadline with
  ``stop_reason="budget"`` and the partial result is saved (:mod:`worker.tasks`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from worker.config import WorkerSettings

__all__ = ["app", "make_app", "settings"]


def celery_config(s: WorkerSettings) -> dict[str, Any]:
    """The Celery settings dict for ``s`` (kept separate so tests can inspect it)."""
    restore_interval = max(1, min(10, int(s.visibility_timeout // 4)))
    return {
        "broker_url": s.broker_url,
        "result_backend": s.result_backend,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_soft_time_limit": s.celery_soft_time_limit,
        "task_time_limit": s.time_limit,
        "task_default_queue": s.queue,
        "task_track_started": False,
        "result_expires": s.job_ttl,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": s.visibility_timeout,
            "unacked_restore_interval": restore_interval,
            "unacked_restore_throttle": 1,
            # The restore mutex outlives a worker killed while holding it; keep that short.
            "unacked_mutex_expire": max(5, min(300, int(s.visibility_timeout // 2))),
        },
        "result_backend_transport_options": {"visibility_timeout": s.visibility_timeout},
        "worker_hijack_root_logger": False,
        "include": ["worker.tasks"],
    }


def make_app(s: WorkerSettings | None = None) -> Celery:
    """A Celery app for settings ``s`` (default: from the environment)."""
    s = s or WorkerSettings.from_env()
    a = Celery("beacon")
    a.conf.update(celery_config(s))
    a.conf.beacon_settings = s
    return a


settings = WorkerSettings.from_env()
app = make_app(settings)
