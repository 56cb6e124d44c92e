"""Paired A/B of the served throughput: this tree against a git revision, runs alternating.

    python -m bench.ab_http --base HEAD~1 [--path /predict] [--pairs 6] [--threads 1] [--setting KEY=VALUE ...]
    python -m bench.ab_http --base HEAD --sink [--env OTEL_TRACES_SAMPLER=traceidratio --env OTEL_TRACES_SAMPLER_ARG=0]

A tool for performance work, not a report. This VM's speed drifts by tens of percent within
minutes, so two separate `bench.service_load` runs cannot tell a 10 % change from noise. Here the
revision `--base` (checked out into a temporary git worktree) and this tree each run a server
(`python -m service`, the bundled models), both started once and pinned to the same CPU; `wrk`
(on the other CPU, 32 connections, one text per request) loads one of them at a time, A B then
B A, short runs, so both see the same drift. `--setting` applies SERVE_* settings to this tree's
server only (the same code under another setting), `--env` variables to its environment;
`--sink` exports its traces to an OTLP/HTTP sink run here (tracing's cost: `--base HEAD`, B traced,
A not). Prints each pair's B / A and their median, and the server's CPU time per request (user +
system, all its threads, from /proc) and the event loop's alone (its main thread): less swayed by
a slow minute than the rate, as long as the server has its CPU to itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench import serverproc
from bench.serverproc import ROOT, stop, wait_ready
from bench.service_load import REVIEWS, SHORT, translate_bodies, wrk, wrk_result

BASE_SETTINGS = {"threads": "1", "max_queue": "100000", "request_timeout_s": "120"}


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ab-http-") as tmp:
        path = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(path), revision], cwd=ROOT, check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time of a process, all its threads (or one: the event loop's is `pid`)."""
    stat = Path(f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def otlp_sink() -> str:
    """An OTLP/HTTP endpoint on loopback that takes every export and keeps nothing (a collector
    that keeps up): tracing's cost in the server alone."""

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab_http", description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="git revision for A")
    p.add_argument("--path", default="/predict", choices=["/predict", "/translate"])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--texts", type=int, default=1, help="/predict: texts per request")
    p.add_argument("--seconds", type=float, default=8.0, help="per run")
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--threads", type=int, default=1, help="both servers' model threads (2: sharded translation)")
    p.add_argument("--setting", action="append", default=[], help="KEY=VALUE for B's server only")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE: B's server's environment only (OTEL_*)")
    p.add_argument("--sink", action="store_true", help="B exports its traces to an OTLP/HTTP sink run here")
    args = p.parse_args(argv)
    extra = dict(s.split("=", 1) for s in args.setting)
    env = dict(s.split("=", 1) for s in args.env)
    if args.sink:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_sink()
    settings = BASE_SETTINGS | {"threads": str(args.threads)}
    if args.path == "/translate":
        bodies = translate_bodies("beam", SHORT)
    elif args.texts == 1:
        bodies = [{"texts": [t]} for t in REVIEWS]
    else:
        bodies = [{"texts": (REVIEWS * args.texts)[i : i + args.texts]} for i in range(len(REVIEWS))]
    logs = Path(tempfile.mkdtemp(prefix="ab-http-logs-"))
    with worktree(args.base) as base:
        a = serverproc.start(args.store, logs / "a.log", args.server_cpus, settings=settings, root=base)
        b = serverproc.start(args.store, logs / "b.log", args.server_cpus, settings=settings | extra, env=env)
        try:
            wait_ready(a)
            wait_ready(b)
            for server in (a, b):  # warm-up
                wrk_result(wrk(server.url, args.path, bodies, args.connections, 3, args.client_cpus))
            ratios, cpu_ratios, loop_ratios = [], [], []
            for i in range(args.pairs):
                rates, cpu, loop, p50 = {}, {}, {}, {}
                for server in (a, b) if i % 2 == 0 else (b, a):
                    used, looped = cpu_seconds(server.pid), cpu_seconds(server.pid, server.pid)
                    run = wrk(server.url, args.path, bodies, args.connections, args.seconds, args.client_cpus)
                    result = wrk_result(run)
                    rates[server.port], p50[server.port] = result["per_s"], result["p50_ms"]
                    cpu[server.port] = (cpu_seconds(server.pid) - used) / max(1, result["requests"])
                    loop[server.port] = (cpu_seconds(server.pid, server.pid) - looped) / max(1, result["requests"])
                ratios.append(rates[b.port] / rates[a.port])
                cpu_ratios.append(cpu[b.port] / cpu[a.port])
                loop_ratios.append(loop[b.port] / loop[a.port])
                print(
                    f"A {rates[a.port]:8.1f}  B {rates[b.port]:8.1f} requests/s  B/A {ratios[-1]:.3f}   "
                    f"CPU per request A {cpu[a.port] * 1e6:6.0f}  B {cpu[b.port] * 1e6:6.0f} us  "
                    f"B/A {cpu_ratios[-1]:.3f}   event loop A {loop[a.port] * 1e6:5.0f}  "
                    f"B {loop[b.port] * 1e6:5.0f} us  B/A {loop_ratios[-1]:.3f}   "
                    f"p50 A {p50[a.port]:.2f}  B {p50[b.port]:.2f} ms",
                    flush=True,
                )
            print(
                f"median B/A over {args.pairs} pairs: requests/s {statistics.median(ratios):.3f}, "
                f"CPU per request {statistics.median(cpu_ratios):.3f}, the event loop's "
                f"{statistics.median(loop_ratios):.3f} (logs in {logs})"
            )
        finally:
            stop(a)
            stop(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
