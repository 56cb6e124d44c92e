"""Service load benchmark: the real server under concurrent clients against the engine offline.

    make bench-service                                         # default models in model_store/
    python bench/service_load.py --store model_store --fallback-store /tmp/store --smoke

A report, not a test. The script starts `python -m service` as a subprocess on a free loopback
port, then for /predict and /translate drives it with async httpx clients at each concurrency
(1, 8, 32, 64 by default; one text per request, a bounded number of requests per level) and
records throughput and p50/p95/p99 latency. In the same run it loads the same model in this
process with the same thread count and measures, on the same texts and decode parameters:

- offline batch throughput: the texts in batches of SERVE_MAX_BATCH_SIZE, straight into the engine;
- compute latency of each text alone (batch of 1), the floor for a request at concurrency 1.

Targets: served throughput at 32 clients >= 0.8x offline; p50 of (request latency - that text's
compute latency) <= 2 ms at concurrency 1. Client and server share this machine's cores, so the
client's own CPU time counts against the server: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.engines import load_engine
from service.engine import runtime
from service.engine.classifier import ClassifierEngine
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.errors import InputTooLong

ROOT = Path(__file__).resolve().parents[1]

# Built-in English texts (reviews and UI strings, short to long) when --texts is not given.
TEXTS = [
    "Open file",
    "Save the document before closing the window.",
    "The movie was great, I loved every minute of it.",
    "This is the worst service I have ever used.",
    "Could not find the requested package.",
    "Print the current page",
    "The battery lasts all day and the screen is bright.",
    "Select a folder to import the photos from.",
    "I am not sure how I feel about the ending.",
    "Delete all selected items?",
    "The update failed because the disk is full.",
    "Absolutely fantastic, would buy again!",
    "Show hidden files",
    "The food was cold and the waiter was rude.",
    "Connect to the network and try again.",
    "It works, but the setup took far too long.",
    "Rename the layer",
    "An error occurred while reading the configuration file.",
    "What a boring and predictable film.",
    "Press any key to continue.",
    "The new version is faster and uses less memory than the old one.",
    "Insert a table with three columns and two rows.",
    "Nothing special, just an average product.",
    "Close all other tabs",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# -- the store, the texts and the offline reference ------------------------------------------------


def pick_store(store: Path, fallback: Path | None) -> Path:
    def usable(p: Path) -> bool:
        return p.is_dir() and any(e.manifest is not None for e in store.scan(p))

    if usable(store):
        return store
    if fallback is not None and usable(fallback):
        print(f"{store}: no usable model; using the fallback store {fallback}")
        return fallback
    raise SystemExit(f"no usable model in {store}" + (f" or {fallback}" if fallback else ""))


def load_texts(path: Path | None, n: int) -> list[str]:
    texts = TEXTS
    if path is not None:
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
        texts = [json.loads(ln).get("text", "") if ln.startswith("{") else ln for ln in lines]
    return [texts[i % len(texts)] for i in range(n)]


def fitting(engine: ClassifierEngine | TranslatorEngine, texts: list[str]) -> list[str]:
    """Texts within the model's source limit (the server would answer 413 for the others)."""
    out = []
    for t in texts:
        with contextlib.suppress(InputTooLong):
            engine.encode([t])
            out.append(t)
    return out


def offline(
    engine: ClassifierEngine | TranslatorEngine, texts: list[str], params: DecodeParams | None, batch: int, reps: int
) -> dict[str, Any]:
    """Batch throughput (texts/s, best of `reps`) and each text's compute latency alone (median of reps)."""

    def run(chunk: list[str]) -> None:
        ids = engine.encode(chunk)
        if isinstance(engine, ClassifierEngine):
            engine.classify_ids(ids)
        else:
            assert params is not None
            engine.translate_ids(ids, params)

    run(texts[:batch])  # warm
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(0, len(texts), batch):
            run(texts[i : i + batch])
        best = min(best, time.perf_counter() - t0)
    alone: dict[str, float] = {}
    for t in dict.fromkeys(texts):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run([t])
            times.append(time.perf_counter() - t0)
        alone[t] = statistics.median(times)
    return {"throughput": len(texts) / best, "alone_s": alone}


# -- the server and the clients -------------------------------------------------------------------


@contextlib.contextmanager
def server(store: Path, args: argparse.Namespace, log: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
    env |= {
        "SERVE_MODEL_STORE": str(store),
        "SERVE_PORT": str(port),
        "SERVE_THREADS": str(args.threads),
        "SERVE_MAX_BATCH_SIZE": str(args.batch),
        "SERVE_MAX_WAIT_MS": str(args.max_wait_ms),
        "SERVE_MAX_QUEUE": str(max(512, 4 * max(args.concurrency))),
        "SERVE_LOG_LEVEL": args.server_log_level,
    }
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        end = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            if time.monotonic() > end:
                raise SystemExit(f"the server was not ready after 120 s:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def drive(
    url: str, path: str, bodies: list[dict[str, Any]], concurrency: int, time_limit: float
) -> dict[str, Any]:
    """Sends every body once (fewer if `time_limit` passes) from `concurrency` clients."""
    latencies: list[float] = [float("nan")] * len(bodies)
    errors: dict[str, int] = {}
    next_index = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        for body in bodies[: min(len(bodies), concurrency)]:  # warm connections and the path
            await client.post(path, json=body)
        stop_at = time.perf_counter() + time_limit

        async def worker() -> None:
            nonlocal next_index
            while next_index < len(bodies) and time.perf_counter() < stop_at:
                i = next_index
                next_index += 1
                t0 = time.perf_counter()
                r = await client.post(path, json=bodies[i])
                latencies[i] = time.perf_counter() - t0
                if r.status_code != 200:
                    errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    done = [x for x in latencies if x == x]
    return {"latencies": latencies, "requests": len(done), "wall_s": wall, "errors": errors}


# -- the run --------------------------------------------------------------------------------------


def bench_endpoint(
    url: str,
    endpoint: str,
    engine: ClassifierEngine | TranslatorEngine,
    texts: list[str],
    params: DecodeParams | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    ref = offline(engine, texts, params, args.batch, args.offline_reps)
    extra: dict[str, Any] = {}
    if params is not None:
        extra = {"beam_size": params.beam_size, "max_new_tokens": params.max_new_tokens}
    model = engine.manifest.name
    rows = []
    for c in args.concurrency:
        n = max(args.requests, 2 * c)
        bodies = [{"texts": [texts[i % len(texts)]], "model": model, **extra} for i in range(n)]
        out = asyncio.run(drive(url, endpoint, bodies, c, args.time_limit))
        lat = [x for x in out["latencies"] if x == x]
        throughput = out["requests"] / out["wall_s"]  # one text per request
        row = {
            "concurrency": c,
            "requests": out["requests"],
            "errors": out["errors"],
            "throughput": throughput,
            "vs_offline": throughput / ref["throughput"],
            "p50_ms": percentile(lat, 50) * 1e3,
            "p95_ms": percentile(lat, 95) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3,
        }
        if c == 1:
            overhead = [x - ref["alone_s"][bodies[i]["texts"][0]] for i, x in enumerate(out["latencies"]) if x == x]
            row["p50_overhead_ms"] = percentile(overhead, 50) * 1e3
            row["p50_compute_ms"] = statistics.median(ref["alone_s"].values()) * 1e3
        rows.append(row)
        print(f"  {endpoint} c={c}: {throughput:.1f} texts/s, p50 {row['p50_ms']:.2f} ms", flush=True)
    targets: dict[str, Any] = {}
    at32 = next((r for r in rows if r["concurrency"] == 32), None)
    at1 = next((r for r in rows if r["concurrency"] == 1), None)
    if at32:
        targets["throughput_32_vs_offline>=0.8"] = at32["vs_offline"] >= 0.8
    if at1:
        targets["p50_overhead_1<=2ms"] = at1["p50_overhead_ms"] <= 2.0
    return {
        "endpoint": endpoint,
        "model": f"{model}/{engine.manifest.version}",
        "variant": engine.variant,
        "decode": extra or None,
        "offline_throughput": ref["throughput"],
        "rows": rows,
        "targets": targets,
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        "| endpoint | clients | texts/s | x offline | p50 ms | p95 ms | p99 ms | p50 overhead ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for ep in results["endpoints"]:
        for r in ep["rows"]:
            over = f"{r['p50_overhead_ms']:.2f}" if "p50_overhead_ms" in r else ""
            lines.append(
                f"| {ep['endpoint']} | {r['concurrency']} | {r['throughput']:.1f} | {r['vs_offline']:.2f} | "
                f"{r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['p99_ms']:.2f} | {over} | {r['errors'] or ''} |"
            )
        offline = f"{ep['endpoint']} offline (batch {results['batch']})"
        lines.append(f"| {offline} | | {ep['offline_throughput']:.1f} | 1.00 | | | | | |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    store = pick_store(args.store, args.fallback_store)
    entries = store.newest(store.scan(store))
    options = LoadOptions(threads=args.threads)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "store": str(store),
        "threads": args.threads,
        "batch": args.batch,
        "max_wait_ms": args.max_wait_ms,
        "endpoints": [],
    }
    engines: dict[str, tuple[ClassifierEngine | TranslatorEngine, DecodeParams | None]] = {}
    for entry in entries.values():  # the first classifier and the first translator of the store
        if entry.manifest is None:
            continue
        endpoint = "/predict" if entry.manifest.task == "classification" else "/translate"
        if endpoint.lstrip("/") not in args.endpoints or endpoint in engines:
            continue
        engine = load_engine(entry, options)
        params = None
        if isinstance(engine, TranslatorEngine):
            limit = min(args.max_new_tokens or engine.max_new_tokens, engine.max_new_tokens)
            params = DecodeParams(beam_size=args.beam_size, max_new_tokens=limit)
        engines[endpoint] = (engine, params)
    with tempfile.TemporaryDirectory() as tmp, server(store, args, Path(tmp) / "server.log") as url:
        for endpoint, (engine, params) in engines.items():
            engine.warmup()
            texts = fitting(engine, load_texts(args.texts, args.offline_texts))
            print(
                f"{endpoint}: {engine.manifest.name}/{engine.manifest.version} ({engine.variant}), {len(texts)} texts"
            )
            results["endpoints"].append(bench_endpoint(url, endpoint, engine, texts, params, args))
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/service_load.py", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--fallback-store", type=Path, default=None, help="used when --store holds no usable model")
    p.add_argument("--endpoints", default="predict,translate")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--requests", type=int, default=400, help="requests per level (at least 2x its clients)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per level, at most")
    p.add_argument("--threads", type=int, default=runtime.cpu_quota(), help="server and offline engine threads")
    p.add_argument("--batch", type=int, default=32, help="SERVE_MAX_BATCH_SIZE and the offline batch")
    p.add_argument("--max-wait-ms", type=float, default=1.0, help="SERVE_MAX_WAIT_MS")
    p.add_argument("--beam-size", type=int, default=4, help="translation decode (same offline and served)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: the model's limit")
    p.add_argument("--texts", type=Path, default=None, help="a text file (one per line) or JSON lines with 'text'")
    p.add_argument("--offline-texts", type=int, default=128, help="texts in the offline measurement")
    p.add_argument("--offline-reps", type=int, default=3)
    p.add_argument("--server-log-level", default="info", help="SERVE_LOG_LEVEL (access logs are at info)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: proves the script works, measures nothing")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "service.json")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c]
    args.endpoints = {e.strip().lstrip("/") for e in args.endpoints.split(",")}
    if args.smoke:
        args.requests, args.time_limit, args.offline_texts, args.offline_reps = 16, 10.0, 16, 1
    return args


def main(argv: Sequence[str] | None = None, log: Callable[[str], None] = print) -> int:
    args = parse_args(argv)
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    log(table(results))
    for ep in results["endpoints"]:
        for name, ok in ep["targets"].items():
            log(f"{ep['endpoint']} {name}: {'met' if ok else 'NOT met'}")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
