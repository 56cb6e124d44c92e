"""A rolling update through HAProxy, measured (`make bench-rolling`): what clients see while
every replica is replaced in turn under steady load.

    make bench-rolling                           # grace 0, 1 and 2 s (~3 min)
    python -m bench.rolling --grace 2 --baseline-s 10
    python -m bench.rolling --grace 2 --publish  # then a new model version under load

Two replicas (`python -m service`, SERVE_THREADS=1, nice model threads, SERVE_DRAIN_GRACE_S from
`--grace`) on their own loopback ports behind HAProxy (a config generated into a temp dir: active
health checks on /readyz, retries on connection failures and empty responses, redispatch). Eight
closed-loop clients (`bench.loadgen`, one connection per request) send /predict, greedy /translate
and beam /translate through HAProxy: a baseline period, then each replica in turn gets SIGTERM, is
waited for, restarted on the same port and waited for until its /readyz answers 200 and HAProxy
marks it up; then a tail period. Requests are classed by when they were sent (before the first
SIGTERM, until the last replica is back up, after) and reported by status, with connection errors
(status 0) and the p50/p99 latency of the answered ones. Target: no failure (no 5xx, no status 0)
and p99 during the update at most twice the baseline's.

Cores: replica k is pinned to CPU k mod the core count (its replacement too, so a starting replica
competes with whatever else runs on that core, as on a node); HAProxy and the load generator are
not pinned. With `--publish`, then: both replicas watch one copy of the store
(SERVE_WATCH_INTERVAL_S=1) and, under the same load, a new version of the classifier is published
as the exporter does (copied to a hidden `.vN`, manifest version rewritten, renamed into place):
how long until every replica answers /predict with it, and whether any request failed. Writes
bench/results/rolling.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import serverproc
from bench.loadgen import Outcome, Shot, fetch, summary
from bench.reliability import add_version, cpu_name, mix
from bench.serverproc import ROOT, ServerProcess

HOST = "127.0.0.1"
KINDS = ("predict", "translate greedy", "translate beam 4")
MODEL = "sentiment"  # the classifier --publish adds a version of


def haproxy_config(front: int, stats: int, ports: Sequence[int], args: argparse.Namespace) -> str:
    """Retries (`--retry-on`) on another replica (redispatch) when a connection failed or was
    closed before any answer: a replica closing. conn-failure means the request never reached a
    replica; empty-response means it may have, and is safe here only because inference has no side
    effects (a repeated POST /translate costs compute, changes nothing)."""
    servers = "\n".join(f"    server r{k} {HOST}:{p} check" for k, p in enumerate(ports))
    return f"""global
    maxconn 2048

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 2
    option redispatch 1
    retry-on {args.retry_on}

frontend fe
    bind {HOST}:{front}
    default_backend replicas

backend replicas
    balance {args.balance}
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter {args.inter_ms}ms fall 1 rise 2
{servers}

listen stats
    bind {HOST}:{stats}
    stats enable
    stats uri /stats
"""


@dataclass
class Replica:
    name: str
    port: int
    cpu: str
    store: Path
    settings: dict[str, str]
    server: ServerProcess | None = None

    def start(self, log: Path) -> ServerProcess:
        self.server = serverproc.start(self.store, log, self.cpu, settings=self.settings, port=self.port)
        return self.server


async def ready(port: int) -> bool:
    return (await fetch(HOST, port, Shot("readyz", "/readyz", method="GET"), 2)).status == 200


async def lb_status(stats_port: int) -> dict[str, str]:
    """HAProxy's view of each server: UP, DOWN, ..."""
    text = (await asyncio.to_thread(httpx.get, f"http://{HOST}:{stats_port}/stats;csv", timeout=2)).text
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    return {r["svname"]: r["status"] for r in rows if r.get("pxname") == "replicas"}


async def until(check: Any, timeout: float, what: str) -> float:
    """Polls the async `check` every 50 ms; seconds until it held."""
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def replace(args: argparse.Namespace, r: Replica, stats_port: int, log: Path, grace: float) -> dict[str, Any]:
    """SIGTERM, wait for the exit, start anew on the same port, wait until ready and marked up."""
    t0 = time.monotonic()
    assert r.server is not None
    r.server.proc.terminate()
    code = await asyncio.to_thread(r.server.proc.wait, args.drain_timeout_s + grace + 30)
    exited = time.monotonic()
    r.start(log)
    ready_s = await until(lambda: ready(r.port), 180, f"{r.name} ready")

    async def marked_up() -> bool:
        return (await lb_status(stats_port)).get(r.name) == "UP"

    up_s = await until(marked_up, 30, f"{r.name} marked up")
    return {
        "replica": r.name,
        "exit_code": code,
        "sigterm_to_exit_s": exited - t0,
        "start_to_ready_s": ready_s,
        "ready_to_lb_up_s": up_s,
        "total_s": time.monotonic() - t0,
    }


@contextlib.asynccontextmanager
async def fleet(
    args: argparse.Namespace, grace: float, store: Path, log: Path, **more: str
) -> AsyncIterator[tuple[list[Replica], int, int, list[Shot]]]:
    """The replicas behind HAProxy, all ready and marked up: (replicas, front port, stats port, shots)."""
    settings = {
        "threads": "1",
        "model_thread_priority": "nice",
        "drain_grace_s": str(grace),
        "drain_timeout_s": str(args.drain_timeout_s),
        **more,
    }
    ncpu = os.cpu_count() or 1
    replicas = [Replica(f"r{k}", serverproc.free_port(), str(k % ncpu), store, settings) for k in range(args.replicas)]
    servers = [r.start(log) for r in replicas]
    front, stats = serverproc.free_port(), serverproc.free_port()
    cfg = log.parent / "haproxy.cfg"
    cfg.write_text(haproxy_config(front, stats, [r.port for r in replicas], args))
    lb = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for server in servers:
            await asyncio.to_thread(serverproc.wait_ready, server)
        await until(lambda: all_up(stats, len(replicas)), 30, "all replicas up in HAProxy")
        shots = [s for s in mix(servers[0].url, 60_000) if s.kind in KINDS]
        yield replicas, front, stats, shots
    finally:
        for r in replicas:
            if r.server is not None:
                serverproc.stop(r.server)
        lb.terminate()
        lb.wait(10)


async def run_once(args: argparse.Namespace, grace: float, work: Path) -> dict[str, Any]:
    log = work / f"servers-grace{grace:g}.log"
    async with fleet(args, grace, args.store, log) as (replicas, front, stats, shots):
        return await under_load(args, grace, replicas, front, stats, shots, log)


async def all_up(stats_port: int, n: int) -> bool:
    status = await lb_status(stats_port)
    return sum(v == "UP" for v in status.values()) == n


def start_clients(
    args: argparse.Namespace, front: int, shots: list[Shot], outcomes: list[Outcome], stop: list[bool]
) -> list[asyncio.Task[None]]:
    """`args.clients` closed-loop clients through HAProxy until `stop[0]`, outcomes appended."""

    async def client(k: int) -> None:
        rng = random.Random(k)
        while not stop[0]:
            outcomes.append(await fetch(HOST, front, rng.choice(shots), args.timeout_s))

    return [asyncio.create_task(client(k)) for k in range(args.clients)]


async def under_load(
    args: argparse.Namespace,
    grace: float,
    replicas: list[Replica],
    front: int,
    stats: int,
    shots: list[Shot],
    log: Path,
) -> dict[str, Any]:
    outcomes: list[Outcome] = []
    stop = [False]
    clients = start_clients(args, front, shots, outcomes, stop)
    t_start = time.monotonic()
    await asyncio.sleep(args.baseline_s)
    t_update = time.monotonic()
    replacements, sigterms = [], []
    for r in replicas:
        sigterms.append(time.monotonic())
        replacements.append(await replace(args, r, stats, log, grace))
    t_done = time.monotonic()
    await asyncio.sleep(args.tail_s)
    stop[0] = True
    await asyncio.gather(*clients)
    t_end = time.monotonic()
    phases = {
        "before": ([o for o in outcomes if o.sent < t_update], t_update - t_start),
        "during": ([o for o in outcomes if t_update <= o.sent < t_done], t_done - t_update),
        "after": ([o for o in outcomes if o.sent >= t_done], t_end - t_done),
    }
    report = {name: summary(os_, secs) | {"seconds": secs} for name, (os_, secs) in phases.items()}
    failed = sum(o.status >= 500 or o.status == 0 for o in outcomes)
    since = [o.sent - max((t for t in sigterms if t <= o.sent), default=t_update) for o in outcomes if o.status != 200]
    p99_ratio = report["during"]["p99_ms"] / report["before"]["p99_ms"] if report["before"]["p99_ms"] else 0.0
    return {
        "grace_s": grace,
        "phases": report,
        "replacements": replacements,
        "failed": failed,
        "not_200": sum(o.status != 200 for o in outcomes),
        "failures_since_sigterm_s": [min(since, default=0.0), max(since, default=0.0)],
        "failure_examples": [
            {
                "kind": o.kind,
                "status": o.status,
                "error": o.error,
                "body": o.body[:200].decode(errors="replace"),
            }
            for o in outcomes
            if o.status != 200
        ][:10],
        "p50_ratio": report["during"]["p50_ms"] / report["before"]["p50_ms"] if report["before"]["p50_ms"] else 0.0,
        "p99_ratio": p99_ratio,
        "target_met": failed == 0 and 0 < p99_ratio <= 2.0,
    }


def answered_version(o: Outcome) -> int | None:
    if o.status != 200 or o.kind != "predict":
        return None
    return int(json.loads(o.body)["version"])


async def publish_once(args: argparse.Namespace, grace: float, work: Path) -> dict[str, Any]:
    """A new version of the classifier published, as the exporter does, into the one store copy
    that every replica watches (SERVE_WATCH_INTERVAL_S=1), under load: how long until each replica
    answers with it, and whether any request failed meanwhile."""
    store = work / "store"
    shutil.copytree(args.store, store)
    log = work / "servers-publish.log"
    probe = Shot("predict", "/predict", b'{"texts": ["A fine day."]}')
    async with fleet(args, grace, store, log, watch_interval_s="1") as (replicas, front, _, shots):
        outcomes: list[Outcome] = []
        stop = [False]
        clients = start_clients(args, front, shots, outcomes, stop)
        await asyncio.sleep(args.tail_s)
        old = max(int(p.name) for p in (store / MODEL).iterdir() if p.name.isdigit())
        t_pub = time.monotonic()
        add_version(store / MODEL, store / MODEL / str(old), old + 1, None)

        async def serves_new(port: int) -> bool:
            return answered_version(await fetch(HOST, port, probe, 10)) == old + 1

        per_replica = await asyncio.gather(
            *(until(lambda p=r.port: serves_new(p), 120, "new version") for r in replicas)
        )
        await asyncio.sleep(args.tail_s)
        stop[0] = True
        await asyncio.gather(*clients)
    after = [o for o in outcomes if o.sent >= t_pub]
    last_old = [o.sent + o.seconds - t_pub for o in after if answered_version(o) == old]
    first_new = [o.sent + o.seconds - t_pub for o in outcomes if answered_version(o) == old + 1]
    return {
        "model": MODEL,
        "published": old + 1,
        "replica_serves_new_s": dict(zip([r.name for r in replicas], per_replica, strict=True)),
        "every_replica_s": max(per_replica),
        "first_new_answer_s": min(first_new, default=None),
        "last_old_answer_s": max(last_old, default=None),
        "load": summary(outcomes, max(o.sent + o.seconds for o in outcomes) - outcomes[0].sent),
        "failed": sum(o.status >= 500 or o.status == 0 for o in outcomes),
    }


def table(runs: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| grace s | phase | requests | statuses | conn. errors | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for name, ph in run["phases"].items():
            statuses = ", ".join(f"{k}: {v}" for k, v in ph["statuses"].items())
            errors = ", ".join(f"{k}: {v}" for k, v in ph["no_answer"].items()) or "0"
            lines.append(
                f"| {run['grace_s']:g} | {name} ({ph['seconds']:.1f} s) | {ph['requests']} | {statuses} | {errors} "
                f"| {ph['p50_ms']:.0f} | {ph['p99_ms']:.0f} |"
            )
    lines += ["", "| grace s | failed | p50 during/before | p99 during/before | replacements (s: exit, ready, up) |"]
    lines.append("|---|---|---|---|---|")
    for run in runs:
        reps = "; ".join(
            f"{r['replica']}: {r['sigterm_to_exit_s']:.1f}, {r['start_to_ready_s']:.1f}, {r['ready_to_lb_up_s']:.1f}"
            for r in run["replacements"]
        )
        lines.append(
            f"| {run['grace_s']:g} | {run['failed']} | {run['p50_ratio']:.2f} | {run['p99_ratio']:.2f} | {reps} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.rolling", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--grace", default="0,1,2", help="SERVE_DRAIN_GRACE_S values, one run each")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--inter-ms", type=int, default=500, help="HAProxy health check interval")
    p.add_argument("--balance", default="leastconn", choices=("leastconn", "roundrobin"))
    p.add_argument("--retry-on", default="conn-failure empty-response", help="HAProxy retry-on ('none': no retry)")
    p.add_argument("--baseline-s", type=float, default=15.0)
    p.add_argument("--tail-s", type=float, default=5.0)
    p.add_argument("--drain-timeout-s", type=float, default=30.0)
    p.add_argument("--timeout-s", type=float, default=60.0, help="client timeout per request")
    p.add_argument("--publish", action="store_true", help="then publish a new classifier version under load")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rolling.json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("haproxy") is None:
        print("haproxy is not installed (make bench-rolling installs it)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="rolling-"))
    runs = []
    for grace in (float(g) for g in args.grace.split(",")):
        print(f"grace {grace:g} s ...", flush=True)
        runs.append(asyncio.run(run_once(args, grace, work)))
        run = runs[-1]
        lo, hi = run["failures_since_sigterm_s"]
        when = f" ({lo * 1000:.0f}-{hi * 1000:.0f} ms after a SIGTERM)" if run["not_200"] else ""
        print(f"  failed {run['failed']}{when}, p99 during/before {run['p99_ratio']:.2f}", flush=True)
    publish = None
    if args.publish:
        print(f"publish a new {MODEL} version (grace {runs[-1]['grace_s']:g} s) ...", flush=True)
        publish = asyncio.run(publish_once(args, runs[-1]["grace_s"], work))
        print(f"  every replica serves it after {publish['every_replica_s']:.1f} s, failed {publish['failed']}")
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.rolling " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cores": os.cpu_count(), "cpu": cpu_name(), "python": platform.python_version()},
        "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.split("\n")[0],
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": runs,
        "publish": publish,
    }
    report["markdown"] = markdown = table(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + markdown + f"\n\nwrote {args.out} (server logs in {work})")
    return 0 if all(r["target_met"] for r in runs) and not (publish and publish["failed"]) else 1


if __name__ == "__main__":
    sys.exit(main())
