"""Throughput of the bulk tier with a zero-latency fake model (beacon.demo), measured in one run.

Runs the same job (N prompts, normal family, Jeffreys prior, c = 0.05, horizon 16) four ways:

* in-process runner, one prompt at a time (``concurrency=1``): the per-prompt engine cost;
* in-process runner, ``concurrency=16`` (the ``beacon run`` default);
* the Celery tier with 1 worker process, then with 2 (prefork, Redis broker on 127.0.0.1:6379
  DB 11), timed from the first message sent to the last result stored, after a warm-up job so
  that worker start-up and table loading are not counted;

and prints prompts/second, the ratios, and the tier's per-task overhead

    overhead = (tier wall time with 1 process - in-process sequential wall time) / N

i.e. what a prompt costs on the tier beyond running BEACON itself (message encode/decode,
broker round trips, the idempotency check and the result write in Redis, acks).
With a real model (seconds per call) that overhead is what matters; with a zero-latency model
the tier's prompts/s is bounded by it. The machine's load average is printed because the
figures are only comparable within one run.

Usage: ``python -m bench.bench_worker [--prompts 400]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from worker.local_redis import ensure_local_redis

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/11"
PREFIX = f"beacon-bench-{uuid.uuid4().hex[:8]}"


def write_prompts(path: Path, n: int, tag: str) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt": f"{tag} prompt {i}"}) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=400)
    args = ap.parse_args()
    n = args.prompts
    ensure_local_redis()
    os.environ.update({"BEACON_BROKER_URL": REDIS_URL, "BEACON_RESULT_BACKEND": REDIS_URL,
                       "BEACON_STATE_URL": REDIS_URL, "BEACON_KEY_PREFIX": PREFIX,
                       "BEACON_QUEUE": f"{PREFIX}-q"})
    import redis

    import beacon
    from beacon.jobs import FactorySpec, JobSpec, iter_prompt_file, run_job
    from worker.state import JobStore
    from worker.tasks import submit_job

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(family="normal", cost=0.05, horizon=16))
    tmp = Path(tempfile.mkdtemp(prefix="beacon-bench-"))
    store = JobStore(REDIS_URL, prefix=PREFIX)
    results: dict[str, float] = {}
    submit_s: dict[int, float] = {}
    samples = 0

    # -- in-process --------------------------------------------------------------------------
    run_job(write_prompts(tmp / "warm.jsonl", 20, "warm"), spec, tmp / "warm.out")
    for conc in (1, 16):
        p = write_prompts(tmp / f"local{conc}.jsonl", n, f"local{conc}")
        t0 = time.perf_counter()
        s = run_job(p, spec, tmp / f"local{conc}.out", concurrency=conc)
        results[f"in-process, concurrency {conc}"] = time.perf_counter() - t0
        samples = s.progress.samples
        assert s.progress.done == n, s

    # -- the tier ----------------------------------------------------------------------------
    for procs in (1, 2):
        queue = f"{PREFIX}-q{procs}"
        env = {**os.environ, "BEACON_QUEUE": queue, "BEACON_SOFT_TIME_LIMIT": "60"}
        log = (tmp / f"worker{procs}.log").open("wb")
        w = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "worker.app", "worker",
             f"--concurrency={procs}", "--pool=prefork", "--loglevel=WARNING", "-Q", queue,
             "-n", f"{queue}@%h", "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            warm = write_prompts(tmp / f"twarm{procs}.jsonl", 8 * procs, f"twarm{procs}")
            r = submit_job(iter_prompt_file(warm), spec, job_id=f"warm{procs}", store=store,
                           queue=queue)
            while not store.status(r.job_id).finished:
                time.sleep(0.05)
            p = write_prompts(tmp / f"tier{procs}.jsonl", n, f"tier{procs}")
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            t0 = time.perf_counter()
            r = submit_job(iter_prompt_file(p), spec, input_digest=digest, store=store,
                           queue=queue)
            submit_s[procs] = time.perf_counter() - t0
            while not (st := store.status(r.job_id)).finished:
                time.sleep(0.01)
            results[f"Celery tier, {procs} worker process(es)"] = time.perf_counter() - t0
            assert st.done == n, st
        finally:
            os.killpg(w.pid, signal.SIGTERM)
            w.wait(timeout=30)
            log.close()

    r_ = redis.Redis.from_url(REDIS_URL)
    keys = [*r_.scan_iter(f"{PREFIX}*"), *r_.scan_iter(f"_kombu.binding*{PREFIX}*")]
    if keys:
        r_.delete(*keys)

    print(f"job: {n} prompts, zero-latency demo model, normal family, horizon 16, c = 0.05 "
          f"({samples / n:.2f} samples per prompt); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    base = results["in-process, concurrency 1"]
    for name, t in results.items():
        print(f"  {name:<36} {t:7.2f} s  {n / t:8.1f} prompts/s  ({base / t:5.2f}x in-process "
              "sequential)")
    t1 = results["Celery tier, 1 worker process(es)"]
    t2 = results["Celery tier, 2 worker process(es)"]
    print(f"  tier scaling 1 -> 2 processes: {t1 / t2:.2f}x")
    print(f"  tier per-task overhead: {(t1 - base) / n * 1e3:.2f} ms per prompt "
          f"(engine alone: {base / n * 1e3:.2f} ms per prompt); of which submitting: "
          f"{submit_s[1] / n * 1e3:.2f} ms per prompt (registering keys in Redis and sending "
          "the messages, overlapping with the workers' processing)")


if __name__ == "__main__":
    main()
