"""A real server for benchmarks: `python -m service` in its own process on a free loopback port,
optionally pinned to CPUs, counted as started when /readyz answers 200."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[dict[str, object]]:
        """The log's JSON lines (the service logs one JSON object a line)."""
        out = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out


def start(
    store: Path,
    log: Path,
    cpus: str | None = None,
    *,
    settings: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    root: Path = ROOT,
) -> ServerProcess:
    """Starts the server without waiting; `settings` become SERVE_* variables, `env` is added as is.
    `root`: the source tree whose `service` runs (another checkout, for A/B comparisons)."""
    port = port or free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    full |= {"SERVE_MODEL_STORE": str(store), "SERVE_PORT": str(port), "SERVE_LOG_LEVEL": "warning"}
    full |= {f"SERVE_{k.upper()}": v for k, v in (settings or {}).items()}
    full |= dict(env or {})
    cmd = [sys.executable, "-m", "service"]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus, *cmd]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=full, stdout=out, stderr=out)
    return ServerProcess(f"http://127.0.0.1:{port}", port, proc, log)


def wait_ready(server: ServerProcess, timeout: float = 180.0, path: str = "/readyz") -> None:
    """Until `path` answers 200 (another server's readiness path: a peer's for comparisons)."""
    end = time.monotonic() + timeout
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(server.url + path, timeout=2).status_code == 200:
                return
        if time.monotonic() > end:
            raise RuntimeError(f"server not ready after {timeout:.0f} s:\n{server.log_text()[-3000:]}")
        time.sleep(0.2)


def stop(server: ServerProcess, timeout: float = 60.0) -> int:
    """SIGTERM, then SIGKILL after `timeout` s; the exit code."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


@contextlib.contextmanager
def running(
    store: Path,
    log: Path,
    cpus: str | None = None,
    *,
    settings: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 180.0,
) -> Iterator[ServerProcess]:
    server = start(store, log, cpus, settings=settings, env=env)
    try:
        wait_ready(server, ready_timeout)
        yield server
    finally:
        stop(server)


@contextlib.contextmanager
def running_group(
    cmd: list[str], log: Path, health: str, env: Mapping[str, str] | None = None, cwd: Path = ROOT
) -> Iterator[ServerProcess]:
    """Another server (a peer), started by `cmd` (which names its `--port`) in its own session and
    stopped as a whole process group: LitServe's and Infinity's workers outlive a SIGTERM to the
    main process."""
    port = int(cmd[cmd.index("--port") + 1])
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=out, env=env, start_new_session=True)
    server = ServerProcess(f"http://127.0.0.1:{port}", port, proc, log)
    try:
        wait_ready(server, timeout=300, path=health)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # workers that outlived their parent


def pin_self(cpus: str) -> None:
    """This process (the load generator) on `cpus` ("1", "1,3"), those the machine has; '' or none: unpinned."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    chosen = {int(c) for c in cpus.split(",") if int(c) < (os.cpu_count() or 1)}
    if chosen:
        os.sched_setaffinity(0, chosen)
