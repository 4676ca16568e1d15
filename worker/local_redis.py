"""A Redis on 127.0.0.1:6379 for the tier's tests and benchmark (started as ``.ci/run`` does)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

__all__ = ["ensure_local_redis", "redis_answers"]


def redis_answers(host: str = "127.0.0.1", port: int = 6379) -> bool:
    """True when a Redis server answers PING at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def ensure_local_redis(port: int = 6379, wait_s: float = 10.0) -> None:
    """Start a throw-away ``redis-server`` on 127.0.0.1 unless one already answers.

    Raises ``RuntimeError`` when no ``redis-server`` is installed or it does not come up.
    """
    if redis_answers(port=port):
        return
    exe = shutil.which("redis-server")
    if not exe:
        raise RuntimeError(f"no Redis on 127.0.0.1:{port} and no redis-server to start one")
    subprocess.run(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--daemonize", "yes"],
        check=True,
    )  # fmt: skip
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if redis_answers(port=port):
            return
        time.sleep(0.1)
    raise RuntimeError(f"redis-server did not come up on 127.0.0.1:{port}")
