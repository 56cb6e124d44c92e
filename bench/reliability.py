"""Reliability campaign (`make reliability`): a real server process on loopback under overload,
a soak, SIGTERM, hostile clients, streams dropped mid-way, injected faults and fuzzing; a report
of what was tried and what held.

    make reliability                          # the full campaign, the bundled models (~25 min)
    python -m bench.reliability --quick       # about 2 minutes: the subset .ci/run runs

Every loop is bounded in count and time. The server runs pinned to `--server-cpus` and the load
generator (`bench.loadgen`, asyncio, one connection per request) to `--client-cpus`. Checks of
correctness (every request answered, nothing lost, faults contained, no fuzzing failure) decide
the exit status in both modes; checks of time (recovery, soak p99) do in the full campaign only,
the quick run on a shared CI machine reports them. Writes bench/results/reliability[-quick].json
and, for the full campaign, the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import serverproc
from bench.loadgen import Outcome, Shot, closed_loop, fetch, open_loop, percentile, summary
from bench.serverproc import ROOT, ServerProcess
from bench.watch import Sample, metric_sum, open_fds, rss_mb, sample, watch

HOST = "127.0.0.1"
FAULTS = ROOT / "bench" / "faults"
RESULTS = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- reliability:begin -->", "<!-- reliability:end -->"
# docs/results.md keeps lines within 200 characters (tests/test_docs.py): a scenario's figures are a list item,
# wrapped; its continuation lines are indented past the item's text by 4, so none reads as a heading's underline
FIGURES_WIDTH = 190
WRAP = {"subsequent_indent": " " * 6, "break_long_words": False, "break_on_hyphens": False}


@dataclass
class Scenario:
    """One scenario's figures and checks; `timing` checks gate the full campaign only."""

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    timing: set[str] = field(default_factory=set)

    def check(self, name: str, ok: bool, timing: bool = False) -> None:
        self.checks[name] = bool(ok)
        if timing:
            self.timing.add(name)

    def failed(self, gate_timing: bool) -> list[str]:
        return [k for k, ok in self.checks.items() if not ok and (gate_timing or k not in self.timing)]


# -- the request mix ------------------------------------------------------------------------------


def texts() -> list[str]:
    rows = (ROOT / "bench" / "data" / "fidelity.jsonl").read_text().splitlines()
    return [json.loads(r)["text"] for r in rows if r.strip()]


def fitting(url: str, candidates: Sequence[str]) -> list[str]:
    """The texts every served model takes (within its token limits): the mix is answered, not refused."""
    models = served(url)
    keep = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for text in candidates:
            ok = True
            if "translation" in models:
                r = client.post("/translate", json={"texts": [text], "decode": "greedy", "max_new_tokens": 1})
                ok = r.status_code == 200
            if "classification" in models and ok:
                ok = client.post("/predict", json={"texts": [text]}).status_code == 200
            if ok:
                keep.append(text)
    if not keep:
        raise RuntimeError("no text of bench/data/fidelity.jsonl fits the served models")
    return keep


def served(url: str) -> dict[str, list[dict[str, Any]]]:
    """The serving models by task."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]:
        if m.get("status") == "ready" and m.get("current", True):
            out.setdefault(m["task"], []).append(m)
    return out


def mix(url: str, deadline_ms: int, seed: int = 0) -> list[Shot]:
    """Mixed endpoints and decode options over the fidelity texts (placeholders, lines, Unicode)."""
    models = served(url)
    pool = fitting(url, texts())
    shots: list[Shot] = []
    body: Callable[[Any], bytes] = lambda obj: json.dumps(obj).encode()  # noqa: E731
    for k in range(40):
        a, b, c = pool[k % len(pool)], pool[(3 * k + 1) % len(pool)], pool[(7 * k + 2) % len(pool)]
        if "translation" in models:
            mt = models["translation"][0]
            shots += [
                Shot(
                    "translate greedy",
                    "/translate",
                    body({"texts": [a], "decode": "greedy", "timeout_ms": deadline_ms}),
                ),
                Shot(
                    "translate beam 4", "/translate", body({"texts": [a, b], "beam_size": 4, "timeout_ms": deadline_ms})
                ),
                Shot(
                    "translate sample",
                    "/translate",
                    body({"texts": [c], "decode": "sample", "top_p": 0.9, "seed": seed + k, "timeout_ms": deadline_ms}),
                ),
                Shot(
                    "libretranslate",
                    "/libretranslate/translate",
                    body(
                        {"q": b, "source": mt.get("source_language", "en"), "target": mt.get("target_language", "de")}
                    ),
                ),
            ]
        if "classification" in models:
            clf = models["classification"][0]["name"]
            oip = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": [a, c]}]}
            shots += [
                Shot("predict", "/predict", body({"texts": [a, b, c] * (1 + k % 3)})),
                Shot("oip infer", f"/v2/models/{clf}/infer", body(oip)),
            ]
    return shots


def probe_shot(url: str) -> Shot:
    """A short greedy translation (or one classification) that tells how loaded the server is."""
    models = served(url)
    if "translation" in models:
        return Shot("probe", "/translate", json.dumps({"texts": ["Open the file."], "decode": "greedy"}).encode())
    return Shot("probe", "/predict", json.dumps({"texts": ["A fine day."]}).encode())


async def idle_latency(port: int, shot: Shot, n: int = 15) -> float:
    """The probe's median latency on an idle server (s)."""
    times = [(await fetch(HOST, port, shot, 30)).seconds for _ in range(n)]
    return percentile(times, 50)


def started(args: argparse.Namespace, log: Path, **settings: str) -> serverproc.ServerProcess:
    server = serverproc.start(args.store, log, args.server_cpus, settings={"threads": str(args.threads), **settings})
    serverproc.wait_ready(server)
    return server


# -- overload and soak ----------------------------------------------------------------------------


async def measure_capacity(port: int, shots: Sequence[Shot], seconds: float) -> float:
    """Answered requests per second of the mix at saturation (closed loop, 16 clients)."""
    outcomes = await closed_loop(HOST, port, shots, 16, seconds)
    return sum(o.status == 200 for o in outcomes) / seconds


async def overload_async(args: argparse.Namespace, server: ServerProcess, deadline_s: float) -> Scenario:
    sc = Scenario("overload")
    shots = mix(server.url, int(deadline_s * 1000))
    probe = probe_shot(server.url)
    capacity = await measure_capacity(server.port, shots, args.capacity_s)
    baseline = await idle_latency(server.port, probe)
    before = (await _one_sample(server)).rss_mb
    rate = args.overload_factor * capacity
    stop = asyncio.Event()
    sampler = asyncio.create_task(watch(HOST, server.port, server.pid, 0.5, stop))
    storm = asyncio.create_task(open_loop(HOST, server.port, shots, rate, args.overload_s, seed=1, timeout=60))
    await asyncio.sleep(args.overload_s)
    storm_end = time.monotonic()
    recovered_after = await recovery(server.port, probe, baseline, storm_end)
    outcomes = await storm
    stop.set()
    samples = await sampler
    s = summary(outcomes, args.overload_s)
    late = [o for o in outcomes if o.status == 200 and o.seconds > deadline_s + args.slack_s]
    bad = {k: v for k, v in s["statuses"].items() if k not in ("200", "429", "503")}
    sc.figures = {
        "capacity_per_s": capacity,
        "offered_per_s": s["per_s"],
        "factor": args.overload_factor,
        "seconds": args.overload_s,
        "statuses": s["statuses"],
        "by_kind": {kind: summary([o for o in outcomes if o.kind == kind], 1)["statuses"] for kind in kinds(outcomes)},
        "no_answer": s["no_answer"],
        "refused_429_p99_ms": percentile([o.seconds * 1000 for o in outcomes if o.status == 429], 99),
        "refused_503_p99_ms": percentile([o.seconds * 1000 for o in outcomes if o.status == 503], 99),
        "admitted_p99_ms": s["p99_ms"],
        "admitted_max_ms": s["max_ms"],
        "deadline_ms": deadline_s * 1000,
        "admitted_late": len(late),
        "queue_depth_max": max((x.queue_depth for x in samples), default=0),
        "rss_before_mb": before,
        "rss_max_mb": max((x.rss_mb for x in samples), default=0),
        "not_ready_samples": sum(x.ready != 200 for x in samples),
        "samples": len(samples),
        "readyz_max_ms": max((x.ready_ms for x in samples), default=0),
        "probe_idle_ms": baseline * 1000,
        "recovered_after_s": recovered_after,
    }
    sc.check("every request answered 200, 429 or 503", not bad and s["requests"] > 0)
    sc.check("admitted work finished within its deadline", not late)
    sc.check("queue bounded (max_queue)", sc.figures["queue_depth_max"] <= args.max_queue)
    sc.check("memory bounded (peak < 1.5x before)", sc.figures["rss_max_mb"] < 1.5 * before)
    sc.check("ready throughout", sc.figures["not_ready_samples"] == 0 and len(samples) > 0)
    sc.check("429 answered within 10 ms (p99)", sc.figures["refused_429_p99_ms"] <= 10, True)
    sc.check("normal latency within 5 s after the storm", recovered_after is not None and recovered_after <= 5, True)
    return sc


def kinds(outcomes: Sequence[Outcome]) -> list[str]:
    return sorted({o.kind for o in outcomes})


async def _one_sample(server: ServerProcess) -> Sample:
    return await sample(HOST, server.port, server.pid)


async def recovery(port: int, probe: Shot, baseline: float, since: float, limit: float = 30.0) -> float | None:
    """Seconds from `since` until three probes in a row take at most 1.5x the idle latency."""
    streak: list[float] = []
    while time.monotonic() - since < limit:
        o = await fetch(HOST, port, probe, 30)
        if o.status == 200 and o.seconds <= max(1.5 * baseline, baseline + 0.02):
            streak.append(o.sent)
            if len(streak) == 3:
                return streak[0] - since
        else:
            streak = []
        await asyncio.sleep(0.1)
    return None


def overload(args: argparse.Namespace, log: Path) -> Scenario:
    deadline = 5.0
    server = started(args, log, request_timeout_s=str(deadline), max_queue=str(args.max_queue))
    try:
        return asyncio.run(overload_async(args, server, deadline))
    finally:
        serverproc.stop(server)


async def soak_async(args: argparse.Namespace, server: ServerProcess) -> Scenario:
    sc = Scenario("soak")
    shots = mix(server.url, 10_000)
    capacity = await measure_capacity(server.port, shots, args.capacity_s)
    # Half the capacity: the soak looks for leaks and drift, not for the edge of capacity. This VM's
    # speed drifts by tens of percent within minutes, and at 70 % of a 10 s measurement the
    # slow minutes came near saturation: the admission rightly refused a few (18 and 87 429s).
    rate = 0.5 * capacity
    stop = asyncio.Event()
    await asyncio.sleep(2.0)  # the capacity run's connections closed
    fds_idle_before = open_fds(server.pid)
    sampler = asyncio.create_task(watch(HOST, server.port, server.pid, 5.0, stop))
    t0 = time.monotonic()
    outcomes = await open_loop(HOST, server.port, shots, rate, args.soak_s, seed=2, timeout=60)
    stop.set()
    samples = await sampler
    await asyncio.sleep(2.0)  # the soak's connections closed
    fds_idle_after = open_fds(server.pid)
    warm = min(60.0, args.soak_s / 10)
    window = min(60.0, (args.soak_s - warm) / 4)
    after = [x for x in samples if x.t - t0 >= warm]
    first = [o.seconds * 1000 for o in outcomes if o.status == 200 and warm <= o.sent - t0 < warm + window]
    last = [o.seconds * 1000 for o in outcomes if o.status == 200 and o.sent - t0 >= args.soak_s - window]
    s = summary(outcomes, args.soak_s)
    rss0, rss1 = (after[0].rss_mb, after[-1].rss_mb) if after else (0.0, 0.0)
    fds = [x.fds for x in after]
    sc.figures = {
        "capacity_per_s": capacity,
        "offered_per_s": s["per_s"],
        "seconds": args.soak_s,
        "warm_up_s": warm,
        "window_s": window,
        "statuses": s["statuses"],
        "rss_after_warm_up_mb": rss0,
        "rss_end_mb": rss1,
        "rss_growth": (rss1 - rss0) / rss0 if rss0 else 0.0,
        "fds_min": min(fds, default=0),  # under load: accepted connections come and go
        "fds_max": max(fds, default=0),
        "fds_idle_before": fds_idle_before,
        "fds_idle_after": fds_idle_after,
        "p99_first_window_ms": percentile(first, 99),
        "p99_last_window_ms": percentile(last, 99),
        # every window's p99 after the warm-up: a leak climbs, this VM's drift comes and goes
        "p99_windows_ms": [round(percentile(ms, 99)) for ms in windows(outcomes, t0 + warm, window) if ms],
    }
    sc.check("every request answered 200", set(s["statuses"]) == {"200"})
    sc.check("resident memory growth <= 5 % after warm-up", sc.figures["rss_growth"] <= 0.05)
    # Idle before against idle after: during the load the count follows the open connections.
    sc.check("open file descriptors flat", bool(fds) and fds_idle_after - fds_idle_before <= 4)
    ratio = sc.figures["p99_last_window_ms"] / max(sc.figures["p99_first_window_ms"], 1e-9)
    sc.figures["p99_ratio"] = ratio
    sc.check("p99 of the last window <= 1.2x the first", ratio <= 1.2, True)
    return sc


def windows(outcomes: Sequence[Outcome], start: float, window: float) -> list[list[float]]:
    """The answered requests' latencies (ms) in consecutive windows from `start`, by sending time."""
    out: list[list[float]] = []
    for o in outcomes:
        k = int((o.sent - start) // window)
        if o.status == 200 and k >= 0:
            out.extend([] for _ in range(k + 1 - len(out)))
            out[k].append(o.seconds * 1000)
    return out


def soak(args: argparse.Namespace, log: Path) -> Scenario:
    server = started(args, log)
    try:
        return asyncio.run(soak_async(args, server))
    finally:
        serverproc.stop(server)


# -- SIGTERM under load ---------------------------------------------------------------------------


ACCEPT_MARGIN_S = 0.05  # see sigterm_async


async def sigterm_async(args: argparse.Namespace, server: ServerProcess, drain_s: float) -> Scenario:
    sc = Scenario("sigterm")
    shots = mix(server.url, 20_000)
    outcomes: list[Outcome] = []
    signalled = [0.0]

    async def client(k: int) -> None:
        rng = random.Random(k)
        while server.proc.poll() is None or time.monotonic() - signalled[0] < 0.5:
            outcomes.append(await fetch(HOST, server.port, rng.choice(shots), 60))
            if time.monotonic() - (signalled[0] or time.monotonic()) > drain_s + 10:
                break

    clients = [asyncio.create_task(client(k)) for k in range(8)]
    await asyncio.sleep(args.sigterm_load_s)
    signalled[0] = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    while server.proc.poll() is None and time.monotonic() - signalled[0] < drain_s + 10:
        await asyncio.sleep(0.05)
    exit_s = time.monotonic() - signalled[0]
    await asyncio.gather(*clients)
    # A request sent in the last ACCEPT_MARGIN_S before the signal may still wait in the listen
    # backlog, or be accepted but not yet read, when the listener and idle connections close (the
    # default grace is 0): refused like one sent after the signal, never admitted. Those are
    # reported apart; lost counts the requests sent earlier, which the server had taken.
    admitted_by = signalled[0] - ACCEPT_MARGIN_S
    before = [o for o in outcomes if o.sent < admitted_by]
    at_signal = [o for o in outcomes if admitted_by <= o.sent < signalled[0]]
    after = [o for o in outcomes if o.sent >= signalled[0]]
    lost = [o for o in before if o.status not in (200, 503)]
    sc.figures = {
        "in_flight_at_signal": sum(o.sent < signalled[0] < o.sent + o.seconds for o in outcomes),
        "before_signal": summary(before, 1)["statuses"],
        "within_margin": summary(at_signal, 1)["statuses"],
        "after_signal": summary(after, 1)["statuses"],
        "lost": len(lost),
        "lost_detail": [f"{o.error} sent {1000 * (signalled[0] - o.sent):.0f} ms before" for o in lost],
        "exit_code": server.proc.returncode,
        "exit_s": exit_s,
        "drain_timeout_s": drain_s,
    }
    sc.check("no admitted request lost", not lost and len(before) > 0)
    sc.check("later requests refused (503 or connection refused)", all(o.status in (0, 503) for o in after))
    sc.check("exit 0 within the drain timeout", server.proc.returncode == 0 and exit_s <= drain_s + 2)
    return sc


def sigterm(args: argparse.Namespace, log: Path) -> Scenario:
    drain = 20.0
    server = started(args, log, drain_timeout_s=str(drain))
    try:
        return asyncio.run(sigterm_async(args, server, drain))
    finally:
        serverproc.stop(server)


# -- hostile clients ------------------------------------------------------------------------------


async def closed_after(reader: asyncio.StreamReader, limit: float) -> float | None:
    """Seconds until the server closes the connection (EOF or reset), None if not within `limit`."""
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic() - t0


async def disconnect_storm(server: ServerProcess, n: int) -> dict[str, Any]:
    """n clients send a long beam translation and hang up at once: their rows must be freed."""
    metrics = (await fetch(HOST, server.port, Shot("m", "/metrics", method="GET"), 10)).body.decode()
    cancelled0 = metric_sum(metrics, "inference_cancelled_sentences_total")
    pool = sorted(fitting(server.url, texts()), key=len)[-16:]  # the longest texts the model takes
    shot = Shot("storm", "/translate", json.dumps({"texts": pool, "beam_size": 8}).encode())

    async def hang_up() -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(shot.wire(HOST))
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.close()

    t0 = time.monotonic()
    await asyncio.gather(*(hang_up() for _ in range(n)), return_exceptions=True)
    freed_after = None
    while time.monotonic() - t0 < 60:
        text = (await fetch(HOST, server.port, Shot("m", "/metrics", method="GET"), 10)).body.decode()
        busy = metric_sum(text, "inference_active_sequences") + metric_sum(text, "inference_queue_depth")
        if busy == 0:
            freed_after = time.monotonic() - t0
            break
        await asyncio.sleep(0.1)
    cancelled = metric_sum(text, "inference_cancelled_sentences_total") - cancelled0
    return {"clients": n, "cancelled_sentences": cancelled, "rows_freed_after_s": freed_after}


async def slow_clients(server: ServerProcess, n: int, limit: float) -> dict[str, Any]:
    """Slowloris: n clients send headers a byte every 0.2 s; n others send half a body and stall;
    n more connect and say nothing. All must be cut off by the timeouts."""

    async def slow_headers() -> float | None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        t0 = time.monotonic()
        try:
            for byte in b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)
                if time.monotonic() - t0 > limit:
                    return None
        except OSError:
            return time.monotonic() - t0
        finally:
            writer.close()
        return None

    async def slow_body() -> int:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        writer.write(head + b'{"texts": ["a')
        await writer.drain()
        try:
            async with asyncio.timeout(limit):
                line = await reader.readline()
            return int(line.split()[1]) if line else 0
        except (TimeoutError, OSError, IndexError, ValueError):
            return 0
        finally:
            writer.close()

    async def idle() -> float | None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        try:
            return await closed_after(reader, limit)
        finally:
            writer.close()

    probe = probe_shot(server.url)
    idle_probe = await idle_latency(server.port, probe, 5)
    attack = asyncio.gather(
        asyncio.gather(*(slow_headers() for _ in range(n))),
        asyncio.gather(*(slow_body() for _ in range(n))),
        asyncio.gather(*(idle() for _ in range(n))),
    )
    during = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.0:
        during.append(await fetch(HOST, server.port, probe, 30))
    headers, bodies, idles = await attack
    return {
        "clients_each": n,
        "slow_headers_cut_after_max_s": max((x for x in headers if x is not None), default=None),
        "slow_headers_not_cut": sum(x is None for x in headers),
        "slow_bodies_408": sum(x == 408 for x in bodies),
        "idle_closed_after_max_s": max((x for x in idles if x is not None), default=None),
        "idle_not_closed": sum(x is None for x in idles),
        "probe_idle_ms": idle_probe * 1000,
        "probe_during_p50_ms": percentile([o.seconds * 1000 for o in during if o.status == 200], 50),
        "probes_failed_during": sum(o.status != 200 for o in during),
    }


async def oversized_and_pipelined(server: ServerProcess) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection(HOST, server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
    try:
        await writer.drain()
        async with asyncio.timeout(10):
            line = await reader.readline()
        oversized = int(line.split()[1]) if line else 0
    except (OSError, TimeoutError, IndexError, ValueError):
        oversized = 0  # closed without an answer
    writer.close()
    reader, writer = await asyncio.open_connection(HOST, server.port)
    body = json.dumps({"texts": ["A good day."]}).encode()
    requests = b""
    for k in range(5):
        requests += (
            f"POST /predict HTTP/1.1\r\nHost: x\r\nX-Request-ID: pipe-{k}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
    writer.write(requests)
    await writer.drain()
    ids = []
    try:
        async with asyncio.timeout(30):
            for _ in range(5):
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                rid = re.search(rb"(?im)^x-request-id:\s*(\S+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                ids.append(rid.group(1).decode() if rid else "")
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass
    writer.close()
    return {"oversized_header_status": oversized, "pipelined_answers_in_order": ids == [f"pipe-{k}" for k in range(5)]}


async def hostile_async(args: argparse.Namespace, server: ServerProcess, timeout_s: float) -> Scenario:
    sc = Scenario("hostile")
    storm = await disconnect_storm(server, args.storm_clients)
    slow = await slow_clients(server, args.slow_clients, timeout_s + 5)
    other = await oversized_and_pipelined(server)
    after = await fetch(HOST, server.port, probe_shot(server.url), 30)
    sc.figures = {"timeouts_s": timeout_s, **storm, **slow, **other, "served_after": after.status}
    sc.check("disconnected clients' rows freed", storm["rows_freed_after_s"] is not None)
    sc.check("disconnects cancelled their sentences", storm["cancelled_sentences"] > 0)
    sc.check("slow headers cut off", slow["slow_headers_not_cut"] == 0)
    sc.check("stalled bodies answered 408", slow["slow_bodies_408"] == args.slow_clients)
    sc.check("idle connections closed", slow["idle_not_closed"] == 0)
    sc.check("serving went on during the attack", slow["probes_failed_during"] == 0)
    sc.check("oversized headers refused", other["oversized_header_status"] in (0, 400, 413, 431))
    sc.check("pipelined requests answered in order", other["pipelined_answers_in_order"])
    sc.check("served after it all", after.status == 200)
    return sc


def hostile(args: argparse.Namespace, log: Path) -> Scenario:
    t = 2.0
    server = started(args, log, header_timeout_s=str(t), body_timeout_s=str(t), keepalive_timeout_s=str(t))
    try:
        return asyncio.run(hostile_async(args, server, t))
    finally:
        serverproc.stop(server)


# -- hostile streams ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dropped:
    """A stream a client opened and left: its status, the events it read, whether it saw the end."""

    status: int  # 0: no answer
    events: int
    done: bool
    seconds: float


def stream_shots(url: str) -> list[Shot]:
    """Streamed translations that run long: two of the longest texts, beam 4 (a sentence's event when
    its beams end) or sampled (an event a token), alternately. A hundred of them at once stay within
    the queue's 512 sentences: every stream is admitted."""
    pool = sorted(fitting(url, texts()), key=len)[-8:]
    shots = []
    for k in range(8):
        two = [pool[(k + j) % len(pool)] for j in range(2)]
        options: dict[str, Any] = {"beam_size": 4} if k % 2 == 0 else {"decode": "sample", "seed": k, "top_p": 0.95}
        body = json.dumps({"texts": two, "stream": True, **options}).encode()
        shots.append(Shot("beam 4" if k % 2 == 0 else "sample", "/translate", body))
    return shots


async def open_and_drop(port: int, shot: Shot, events: int, reset: bool, limit: float = 30.0) -> Dropped:
    """Opens a stream, reads `events` events (fewer when it ends first), then hangs up: a close, or
    a reset (`reset`: no FIN, the socket aborted)."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection(HOST, port)
    status, read, buf = 0, 0, b""
    try:
        async with asyncio.timeout(limit):
            writer.write(shot.wire(HOST))
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            while status == 200 and buf.count(b"data: ") < events and b"data: [DONE]" not in buf:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                buf += chunk
            read = buf.count(b"data: ")
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
        pass
    finally:
        if reset:
            writer.transport.abort()
        else:
            writer.close()
    return Dropped(status, read, b"data: [DONE]" in buf, time.monotonic() - t0)


def threads(pid: int) -> int:
    """The process's thread count (/proc): a leaked worker or executor thread shows here."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


async def busy(port: int) -> dict[str, float]:
    """The gauges a dropped stream must leave at 0, and the disconnect cancellations so far."""
    text = (await fetch(HOST, port, Shot("m", "/metrics", method="GET"), 10)).body.decode()
    disconnects = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inference_cancelled_sentences_total{") and 'reason="disconnect"' in line
    )
    return {
        "streams": metric_sum(text, "inference_streams_in_flight"),
        "sentences": metric_sum(text, "inference_active_sequences"),
        "rows": metric_sum(text, "inference_active_rows"),
        "queued": metric_sum(text, "inference_queue_depth"),
        "cancelled": disconnects,
    }


async def until_idle(port: int, limit: float) -> tuple[float | None, dict[str, float]]:
    """Seconds until no stream, sentence, row or queued item is left (None: not within `limit`)."""
    t0 = time.monotonic()
    while True:
        now = await busy(port)
        if now["streams"] + now["sentences"] + now["rows"] + now["queued"] == 0:
            return time.monotonic() - t0, now
        if time.monotonic() - t0 > limit:
            return None, now
        await asyncio.sleep(0.05)


async def drop_storm(port: int, shots: Sequence[Shot], n: int) -> list[Dropped]:
    """n clients at once, each on one of `shots`: read the first event or two, then close or reset."""
    return list(
        await asyncio.gather(*(open_and_drop(port, shots[k % len(shots)], 1 + k % 2, k % 4 >= 2) for k in range(n)))
    )


async def streams_async(args: argparse.Namespace, server: ServerProcess) -> Scenario:
    sc = Scenario("streams")
    shots = stream_shots(server.url)
    probe = probe_shot(server.url)
    # Storms before the measured one bring the process to the working set of a full batch of these
    # shapes (allocator arenas, the runtime's buffers): on the bundled translator its resident memory
    # climbed over the first three or four storms, then stayed within 380-435 MB over 24 of them (each
    # storm leaves it anywhere in that band), while 24 storms of the same requests unstreamed, left
    # after 50 ms, went from 258 to 280 MB. Growth counts from the highest of the warm-ups.
    rss_start = rss_mb(server.pid)
    warm_rss = []
    for _ in range(args.stream_warm_ups):
        await drop_storm(server.port, shots, args.stream_clients)
        await until_idle(server.port, 30)
        await asyncio.sleep(0.5)
        warm_rss.append(rss_mb(server.pid))
    idle = await idle_latency(server.port, probe)
    await asyncio.sleep(0.5)
    before = await busy(server.port)
    rss0, threads0, fds0 = max(warm_rss, default=rss_mb(server.pid)), threads(server.pid), open_fds(server.pid)
    log_mark = len(server.log.read_bytes())
    t0 = time.monotonic()
    dropped = await drop_storm(server.port, shots, args.stream_clients)
    storm_s = time.monotonic() - t0
    freed_after, after = await until_idle(server.port, 30)
    next_ones = [await fetch(HOST, server.port, probe, 30) for _ in range(5)]
    await asyncio.sleep(1.0)  # the dropped connections closed
    rss1, threads1, fds1 = rss_mb(server.pid), threads(server.pid), open_fds(server.pid)
    errors = [
        line
        for line in server.log.read_bytes()[log_mark:].decode(errors="replace").splitlines()
        if '"level": "error"' in line or "Traceback" in line or "Task was destroyed" in line
    ]
    opened = [d for d in dropped if d.status == 200 and d.events > 0]
    mid_way = [d for d in opened if not d.done]
    sentences = sum(len(json.loads(s.body)["texts"]) for s in shots) / len(shots)
    ok = [o.seconds for o in next_ones if o.status == 200]
    sc.figures = {
        "clients": len(dropped),
        "statuses": dict(sorted(Counter(str(d.status) for d in dropped).items())),
        "opened": len(opened),
        "dropped_mid_way": len(mid_way),
        "events_read": sum(d.events for d in dropped),
        "storm_s": storm_s,
        "cancelled_sentences": after["cancelled"] - before["cancelled"],
        "texts_sent": sentences * len(dropped),
        "freed_after_s": freed_after,
        "left_busy": {k: v for k, v in after.items() if k != "cancelled"},
        "probe_idle_ms": idle * 1000,
        "next_ms": ok[0] * 1000 if ok else None,
        "next_p50_ms": percentile(ok, 50) * 1000,
        "rss_start_mb": rss_start,
        "rss_warm_ups_mb": [round(x) for x in warm_rss],
        "rss_before_mb": rss0,
        "rss_after_mb": rss1,
        "rss_growth": (rss1 - rss0) / rss0 if rss0 else 0.0,
        "threads_before": threads0,
        "threads_after": threads1,
        "fds_before": fds0,
        "fds_after": fds1,
        "log_errors": len(errors),
    }
    if errors:
        sc.figures["first_log_error"] = errors[0][:300]
    sc.check("every stream opened (200 and a first event)", len(opened) == len(dropped))
    sc.check("streams dropped mid-way", len(mid_way) >= 0.9 * len(dropped))
    sc.check("rows freed: no stream, sentence, row or queued item left", freed_after is not None)
    # each client that left mid-way had at least one sentence running or queued
    sc.check("the cancellations counted (disconnect)", sc.figures["cancelled_sentences"] >= len(mid_way))
    sc.check("threads and file descriptors back where they were", threads1 <= threads0 and fds1 <= fds0 + 2)
    # 10 %: the band a storm leaves after the warm-ups reaches 5 % over their highest. A leak of the
    # dropped rows' caches would exceed it in one storm: a full step of 128 rows of this translator
    # holds ~6 KB a cache token (3 layers x key and value x 256 x 4 B), ~75 MB at ~100 tokens a row.
    sc.check("resident memory growth <= 10 % of the warm-ups' highest", sc.figures["rss_growth"] <= 0.10)
    sc.check("no error in the server log", not errors)
    sc.check("served after it all", len(ok) == len(next_ones))
    sc.check(
        "the next requests within 2x the idle latency (p50 of 5)",
        bool(ok) and percentile(ok, 50) <= 2 * idle,
        True,
    )
    return sc


def streams(args: argparse.Namespace, log: Path) -> Scenario:
    # The admission refuses (429) what it could not finish within the deadline at the throughput it
    # measured; this scenario is about streams admitted and then left, so the deadline is long enough
    # for a hundred at once on a busy machine (each stream is left after its first events anyway).
    server = started(args, log, request_timeout_s="300")
    try:
        return asyncio.run(streams_async(args, server))
    finally:
        serverproc.stop(server)


# -- faults ---------------------------------------------------------------------------------------


def add_version(model_dir: Path, source: Path, version: int, damage: Callable[[Path], None] | None) -> None:
    """A new version as the exporter publishes one (built hidden, renamed into place), damaged."""
    tmp = model_dir / f".v{version}"
    shutil.copytree(source, tmp)
    manifest = json.loads((tmp / "manifest.json").read_text())
    manifest["version"] = version
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    if damage:
        damage(tmp)
    tmp.rename(model_dir / str(version))


def model_file(version_dir: Path, variant: str) -> Path:
    files = sorted(version_dir.glob(f"*.{variant}.onnx")) or sorted(version_dir.glob("*.onnx"))
    return next((f for f in files if f.name.startswith("decoder")), files[0])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))


async def files_async(server: ServerProcess, store: Path, pristine: Path, step_s: float) -> dict[str, Any]:
    """Damage the store under load: the serving version's file on disk, then three new versions
    (truncated, replaced, sound). Requests must all be answered by a sound version."""
    model = served(server.url)["translation"][0]
    name, variant = model["name"], model.get("variant", "fp32")
    model_dir = store / name
    shots = mix(server.url, 20_000)
    load = asyncio.create_task(closed_loop(HOST, server.port, shots, 4, 6 * step_s, timeout=60))

    def truncate(d: Path) -> None:
        f = model_file(d, variant)
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    def replace(d: Path) -> None:
        f = model_file(d, variant)
        other = next(p for p in sorted(d.glob("*.onnx")) if p != f)
        shutil.copyfile(other, f)

    await asyncio.sleep(step_s)
    flip(model_file(model_dir / str(model["version"]), variant))  # the serving version's file, on disk
    await asyncio.sleep(step_s)
    for version, damage in ((2, truncate), (3, replace), (4, None)):
        add_version(model_dir, pristine / name / str(model["version"]), version, damage)
        await asyncio.sleep(step_s)
    outcomes = await load
    return {"load": summary(outcomes, 6 * step_s), "versions": await settled_versions(server.url, name)}


async def settled_versions(url: str, name: str, timeout_s: float = 60) -> dict[int, str]:
    """The model's versions and their states once none is loading any more (a busy machine loads
    slower; what counts is the state a version settles in, not how fast)."""
    deadline = time.monotonic() + timeout_s
    while True:
        models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
        versions = {m["version"]: m["status"] for m in models if m["name"] == name}
        if "loading" not in versions.values() or time.monotonic() > deadline:
            return versions
        await asyncio.sleep(0.2)


def faults(args: argparse.Namespace, log: Path) -> Scenario:
    sc = Scenario("faults")
    work = Path(tempfile.mkdtemp(prefix="reliability-store-"))
    store, pristine = work / "store", work / "pristine"
    shutil.copytree(args.store, store)
    shutil.copytree(args.store, pristine)
    server = serverproc.start(
        store, log, args.server_cpus, settings={"threads": str(args.threads), "watch_interval_s": "0.5"}
    )
    try:
        serverproc.wait_ready(server)
        damaged = asyncio.run(files_async(server, store, pristine, args.fault_step_s))
    finally:
        serverproc.stop(server)
    sc.figures["store_damage"] = damaged
    statuses = damaged["load"]["statuses"]
    sc.check("damaged files on disk: every request answered 200", set(statuses) == {"200"})
    sc.check(
        "truncated and replaced versions refused, the sound one serves",
        damaged["versions"].get(2) == "refused"
        and damaged["versions"].get(3) == "refused"
        and damaged["versions"].get(4) == "ready",
    )
    sc.figures["decoder_fault"] = decoder_fault(args, log)
    f = sc.figures["decoder_fault"]
    sc.check("failing decoder call: a clear 500 for its own batch only", f["contained"])
    sc.check("failing decoder call: serving goes on", f["served_after"] == 200)
    sc.figures["unreadable_store"] = start_failure(args, work, {"FAULT_UNREADABLE": str(store)}, store)
    sc.check("unreadable store: one clear line, non-zero exit", sc.figures["unreadable_store"]["clear"])
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        sc.figures["port_in_use"] = start_failure(args, work, {}, store, port)
    sc.check("port in use: one clear line, non-zero exit", sc.figures["port_in_use"]["clear"])
    shutil.rmtree(work, ignore_errors=True)
    return sc


def decoder_fault(args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """Every 40th decoder call fails (bench/faults), ten times: only the requests in that step's
    batch fail, and serving goes on after the last fault."""
    env = {"PYTHONPATH": f"{FAULTS}{os.pathsep}{ROOT}", "FAULT_DECODE_EVERY": "40", "FAULT_DECODE_LIMIT": "10"}
    mark = len(log.read_bytes()) if log.exists() else 0
    server = serverproc.start(args.store, log, args.server_cpus, settings={"threads": str(args.threads)}, env=env)
    try:
        serverproc.wait_ready(server)
        shot = Shot("greedy", "/translate", json.dumps({"texts": ["Open the file."], "decode": "greedy"}).encode())
        clients = 4
        outcomes = asyncio.run(closed_loop(HOST, server.port, [shot], clients, args.fault_load_s, timeout=60))
        after = asyncio.run(fetch(HOST, server.port, probe_shot(server.url), 30))
    finally:
        serverproc.stop(server)
    injected = log.read_bytes()[mark:].count(b"FAULT injected")
    failed = [o for o in outcomes if o.status != 200]
    clear = all(o.status == 500 and b'"type"' in o.body for o in failed)
    return {
        "requests": len(outcomes),
        "injected": injected,
        "failed": len(failed),
        "statuses": summary(outcomes, 1)["statuses"],
        "served_after": after.status,
        "contained": injected > 0 and 0 < len(failed) <= injected * clients and clear,
    }


def start_failure(
    args: argparse.Namespace, work: Path, env: dict[str, str], store: Path, port: int | None = None
) -> dict[str, Any]:
    """A server that cannot start: how it says so."""
    env = {"PYTHONPATH": f"{FAULTS}{os.pathsep}{ROOT}", **env}
    log = work / "start.log"
    log.write_bytes(b"")
    t0 = time.monotonic()
    server = serverproc.start(store, log, args.server_cpus, env=env, port=port)
    try:
        code = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        serverproc.stop(server)
        code = None
    text = log.read_text(errors="replace").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return {
        "exit_code": code,
        "seconds": time.monotonic() - t0,
        "output": lines[-1][-300:] if lines else "",
        "lines": len(lines),
        "clear": code not in (None, 0) and len(lines) == 1 and "Traceback" not in text,
    }


# -- fuzzing --------------------------------------------------------------------------------------


def fuzz(args: argparse.Namespace, log: Path) -> Scenario:
    sc = Scenario("fuzz")
    server = started(args, log)
    # the repository API included: model control is closed with the default settings (403)
    cmd = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(ROOT / "bench/schemathesis.toml")]
    cmd += ["run", server.url + "/openapi.json", "--checks", "all", "-n", str(args.fuzz_examples), "--workers", "1"]
    cmd += ["--max-time", str(args.fuzz_s), "--seed", "1"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.fuzz_s + 120)
    finally:
        serverproc.stop(server)
    out = done.stdout + done.stderr
    generated = re.search(r"(\d+) generated", out)
    failures = re.search(r"(\d+) unique failures?", out)
    server_errors = len(re.findall(r"\[5\d\d\]", out))
    sc.figures = {
        "cases": int(generated.group(1)) if generated else 0,
        "failures": int(failures.group(1)) if failures else 0,
        "server_errors": server_errors,
        "exit_code": done.returncode,
        "tail": out.strip().splitlines()[-1] if out.strip() else "",
    }
    if "FAILURES" in out:
        sc.figures["first_failure"] = out.split("FAILURES", 1)[1].split("WARNINGS")[0].strip()[:2000]
    sc.check("schemathesis: no failure", done.returncode == 0 and sc.figures["failures"] == 0)
    sc.check("schemathesis: no 5xx", server_errors == 0)
    sc.check(f"at least {args.fuzz_min_cases} cases", sc.figures["cases"] >= args.fuzz_min_cases)
    if not args.quick:
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_service_fuzz.py"],  # -q: addopts
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        passed = re.search(r"(\d+) passed", tests.stdout)
        sc.figures["hypothesis_tests_passed"] = int(passed.group(1)) if passed else 0
        sc.check("hypothesis tests pass", tests.returncode == 0)
    return sc


# -- report ---------------------------------------------------------------------------------------

SCENARIOS: dict[str, Callable[[argparse.Namespace, Path], Scenario]] = {
    "overload": overload,
    "soak": soak,
    "sigterm": sigterm,
    "hostile": hostile,
    "streams": streams,
    "faults": faults,
    "fuzz": fuzz,
}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in value.items())
    return str(value)


def git_commit() -> str | None:
    """The checkout's short commit, for the report's header; None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def markdown(report: dict[str, Any]) -> str:
    at_commit = f" at `{report['commit']}`" if report.get("commit") else ""
    lines = [
        f"Reliability campaign, {report['date'][:10]}{at_commit} (`{report['command']}`), "
        f"{report['machine']['cores']} cores "
        f"({report['machine']['cpu']}): server on CPU {report['cpus']['server']}, load generator on CPU "
        f"{report['cpus']['client']}, store {report['store']}.",
        "",
        "| scenario | checks held | not held (each check: the console, bench/results/) |",
        "|---|---|---|",
    ]
    for name, sc in report["scenarios"].items():
        missed = [check for check, ok in sc["checks"].items() if not ok]
        held = f"{len(sc['checks']) - len(missed)} of {len(sc['checks'])}"
        lines.append(f"| {name} | {held} | {'; '.join(f'**{m}**' for m in missed) or '—'} |")
    lines += ["", "Figures measured:", ""]
    for name, sc in report["scenarios"].items():
        figures = "; ".join(f"{key} {fmt(value)}" for key, value in sc["figures"].items())
        item = f"- {name}: {figures}"
        lines += textwrap.wrap(item, FIGURES_WIDTH, **WRAP)
    return "\n".join(lines)


def write_results(table: str) -> None:
    """Replaces the campaign's part of docs/results.md (between its markers)."""
    if not RESULTS.exists():
        return
    text = RESULTS.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        RESULTS.write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.reliability", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--quick", action="store_true", help="about 2 minutes, no soak: the CI subset")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    full = not args.quick
    args.capacity_s = 10.0 if full else 4.0
    args.overload_factor = 4.0
    args.overload_s = 60.0 if full else 10.0
    args.slack_s = 1.0
    args.max_queue = 512
    args.soak_s = 600.0
    args.sigterm_load_s = 3.0 if full else 1.5
    args.storm_clients = 100 if full else 30
    args.slow_clients = 50 if full else 10
    args.stream_clients = 100
    args.stream_warm_ups = 3
    args.fault_step_s = 2.0 if full else 1.0
    args.fault_load_s = 10.0 if full else 4.0
    args.fuzz_examples = 60 if full else 6
    args.fuzz_s = 300 if full else 30
    args.fuzz_min_cases = 1000 if full else 100
    if args.quick and args.scenarios == ",".join(SCENARIOS):
        args.scenarios = "overload,sigterm,hostile,streams,faults,fuzz"  # streams: ~18 s on a busy machine
    args.out = args.out or ROOT / "bench" / "results" / ("reliability.json" if full else "reliability-quick.json")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    serverproc.pin_self(args.client_cpus)
    log = Path(tempfile.mkdtemp(prefix="reliability-")) / "server.log"
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.reliability" + (" --quick" if args.quick else ""),
        "commit": git_commit(),
        "machine": {"cores": os.cpu_count(), "cpu": cpu_name(), "python": platform.python_version()},
        "cpus": {"server": args.server_cpus, "client": args.client_cpus, "threads": args.threads},
        "store": args.store.name,
        "scenarios": {},
    }
    failed: list[str] = []
    for name in args.scenarios.split(","):
        t0 = time.monotonic()
        print(f"{name} ...", flush=True)
        sc = SCENARIOS[name](args, log)
        report["scenarios"][name] = {"figures": sc.figures, "checks": sc.checks, "seconds": time.monotonic() - t0}
        for check, ok in sc.checks.items():
            print(f"  {'ok ' if ok else 'NO '} {check}", flush=True)
        failed += [f"{name}: {c}" for c in sc.failed(gate_timing=not args.quick)]
    report["markdown"] = markdown(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if not args.quick and args.scenarios == ",".join(SCENARIOS):
        write_results(report["markdown"])
    print("\n" + report["markdown"] + f"\n\nwrote {args.out} (server log {log})")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
