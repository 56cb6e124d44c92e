"""Per-client limits under a noisy neighbour: one client hammers far over its request limit while a
second client, with a key of its own, sends at a modest rate; the second client's latency against
its own on the otherwise idle server, measured in the same run.

    python -m bench.limits [--path /predict] [--seconds 30] [--rate 10] [--hammers 8] [--limit 120]

The server (`python -m service`, the bundled models, pinned to `--server-cpus`) has two keys: the
hammer's gets `SERVE_CLIENT_REQUESTS_PER_MINUTE` (`--limit`), the modest client's a figure of its
own from a limits file (ten times its rate). The modest client sends open-loop (Poisson) requests
of one text to `--path`; the hammer, the same requests from another process, `--hammers`
connections in a closed loop, niced, so that the load generator's own CPU counts as little as
it can against the modest client. Phases: idle (the modest client alone), limited (with the
hammer), and for contrast probe_flood (the same hammer on `/healthz`, which no limit touches and
which does no work: the least a flood of connections costs) and unlimited (the hammer on a server
without limits). Prints and writes bench/results/limits.json: each phase's p50/p99 and their
ratios to idle, the hammer's answers by status. The target: limited p99 within 2x of idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import serverproc
from bench.loadgen import Shot, closed_loop, open_loop, summary
from bench.serverproc import ROOT, ServerProcess
from service.http.auth import key_id

HOST = "127.0.0.1"
HAMMER_KEY, MODEST_KEY = "bench-hammer-key", "bench-modest-key"
TEXTS = ["The service was quick and friendly.", "A cold meal and a long wait.", "It was fine, nothing more."]
RESULTS = ROOT / "bench" / "results" / "limits.json"


def shots(key: str, path: str) -> list[Shot]:
    auth = (("Authorization", f"Bearer {key}"),)
    return [Shot(path, path, json.dumps({"texts": [t]}).encode(), headers=auth) for t in TEXTS]


PROBE = [Shot("healthz", "/healthz", method="GET")]


def _hammer(port: int, shots: list[Shot], concurrency: int, seconds: float, cpus: set[int], out: Any) -> None:
    """The noisy client, in its own process below the modest one's priority."""
    os.sched_setaffinity(0, cpus)
    os.nice(10)
    outcomes = asyncio.run(closed_loop(HOST, port, shots, concurrency, seconds, timeout=30))
    out.put(dict(Counter(str(o.status) for o in outcomes)))


def phase(server: ServerProcess, args: argparse.Namespace, hammer: list[Shot] | None) -> dict[str, Any]:
    """The modest client for `--seconds`; with `hammer`, the hammer from a second before to after."""
    cpus = {int(c) for c in args.client_cpus.split(",")}
    os.sched_setaffinity(0, cpus)
    queue: Any = multiprocessing.Queue()
    proc = None
    if hammer:
        work = (server.port, hammer, args.hammers, args.seconds + 2, cpus, queue)
        proc = multiprocessing.Process(target=_hammer, args=work)
        proc.start()
        time.sleep(1)
    modest = shots(MODEST_KEY, args.path)
    outcomes = asyncio.run(open_loop(HOST, server.port, modest, args.rate, args.seconds, seed=1))
    out: dict[str, Any] = {"modest": summary(outcomes, args.seconds)}
    if proc is not None:
        out["hammer_statuses"] = queue.get(timeout=args.seconds + 60)
        proc.join()
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    limits_file = work / "limits.json"
    modest_limit = int(args.rate * 60 * 10)
    limits_file.write_text(json.dumps({"keys": {key_id(MODEST_KEY): {"requests_per_minute": modest_limit}}}))
    base = {
        "threads": str(args.threads),
        "api_keys": f"{HAMMER_KEY},{MODEST_KEY}",
        "model_thread_priority": args.model_thread_priority,
    }
    limited = base | {"client_requests_per_minute": str(args.limit), "limits_file": str(limits_file)}
    phases: dict[str, Any] = {}
    with serverproc.running(args.store, work / "limited.log", args.server_cpus, settings=limited) as server:
        phase(server, args, None)  # warm-up, not reported
        phases["idle"] = phase(server, args, None)
        phases["limited"] = phase(server, args, shots(HAMMER_KEY, args.path))
        if not args.skip_contrast:  # the same flood on a probe: what answering connections costs at least
            phases["probe_flood"] = phase(server, args, PROBE)
    if not args.skip_contrast:
        with serverproc.running(args.store, work / "unlimited.log", args.server_cpus, settings=base) as server:
            phase(server, args, None)
            phases["unlimited"] = phase(server, args, shots(HAMMER_KEY, args.path))
    idle = phases["idle"]["modest"]
    for p in phases.values():
        m = p["modest"]
        p["p50_ratio"] = round(m["p50_ms"] / idle["p50_ms"], 2) if idle["p50_ms"] else None
        p["p99_ratio"] = round(m["p99_ms"] / idle["p99_ms"], 2) if idle["p99_ms"] else None
    limited_p99 = phases["limited"]["p99_ratio"]
    return {
        "settings": {
            "path": args.path,
            "seconds": args.seconds,
            "rate": args.rate,
            "hammers": args.hammers,
            "hammer_limit_per_minute": args.limit,
            "modest_limit_per_minute": modest_limit,
            "threads": args.threads,
            "model_thread_priority": args.model_thread_priority,
            "server_cpus": args.server_cpus,
            "client_cpus": args.client_cpus,
        },
        "phases": phases,
        "target_p99_within_2x": limited_p99 is not None and limited_p99 <= 2.0,
        "modest_all_answered_200": all(
            set(p["modest"]["statuses"]) == {"200"} for n, p in phases.items() if n != "unlimited"
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--threads", type=int, default=1, help="the server's SERVE_THREADS")
    p.add_argument(
        "--model-thread-priority",
        default="nice",
        choices=("idle", "nice"),
        help="SERVE_MODEL_THREAD_PRIORITY: idle starves the model threads on a host shared with busy processes",
    )
    p.add_argument("--seconds", type=float, default=30.0, help="per phase")
    p.add_argument("--rate", type=float, default=10.0, help="the modest client's requests per second")
    p.add_argument("--hammers", type=int, default=8, help="the hammer's connections (closed loop)")
    p.add_argument("--limit", type=int, default=120, help="the hammer's requests per minute")
    p.add_argument("--path", default="/predict", choices=("/predict", "/translate"), help="both clients' route")
    p.add_argument("--skip-contrast", action="store_true", help="no probe flood, no server without limits")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        report = run(args, Path(tmp))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    for name, ph in report["phases"].items():
        m = ph["modest"]
        print(
            f"{name:9s} modest p50 {m['p50_ms']:7.2f} ms ({ph['p50_ratio']}x idle)  p99 {m['p99_ms']:7.2f} ms "
            f"({ph['p99_ratio']}x idle)  statuses {m['statuses']}  hammer {ph.get('hammer_statuses', '-')}"
        )
    print(f"limited p99 within 2x of idle: {report['target_p99_within_2x']}; written to {RESULTS}")


if __name__ == "__main__":
    main()
