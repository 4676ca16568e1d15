"""BEACON's Celery worker tier: ``worker.app`` (the app), ``worker.tasks`` (one task per prompt),
``worker.state`` (job state and fan-in in Redis), ``worker.config`` (settings from ``BEACON_*``).

Start a worker with ``beacon worker`` or ``celery -A worker.app worker``. Importing this package
imports nothing heavy; ``worker.app`` reads the environment when imported.
"""
