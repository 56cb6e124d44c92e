"""Service load benchmark (`make bench-service`): the real server under a compiled load generator.

    make bench-service                          # the bundled models in model_store/
    python -m bench.service_load --smoke        # seconds-long run of every part, for a check

A report, not a test. The server (`python -m service`) and the load generator (Debian's `wrk`
with a Lua script, outside the server's Python) run pinned to different CPUs (`--server-cpus`,
`--client-cpus`; 0 and 1 by default, so on a 2-core machine each has one core), and the engine
offline is measured in a process pinned to the server's CPUs with the same thread count, on
the same texts. Parts:

1. scheduling (`/translate`): a mix of short and long texts, 80 % greedy and 20 % beam 4. The
   saturation throughput of the step scheduler is measured with closed-loop connections; then
   arrivals at 25/50/75/100 % of it (each connection waits an exponential time after each
   answer, many connections: close to Poisson arrivals while answers are fast) against the step
   scheduler and the request-level batcher (`SERVE_SCHEDULER=request`) in the same run.
   Short greedy requests and the rest run as two wrk processes, so each has its own latency
   percentiles.
2. HTTP path: served ÷ offline throughput at 32 connections, one text per request (/predict,
   /translate beam 4) and 8 texts per request (/predict); the added latency of HTTP + queueing
   at one connection (p50 served latency - the engine's time for that text alone).
Writes bench/results/service.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import serverproc
from bench.serverproc import ROOT

SHORT = [
    "Open file",
    "Save the document before closing the window.",
    "Could not find the requested package.",
    "Print the current page",
    "Select a folder to import the photos from.",
    "Delete all selected items?",
    "Show hidden files",
    "Rename the layer",
    "Press any key to continue.",
    "Close all other tabs",
]
LONG = [
    "The update failed because the disk is full. Free some space and try again. "
    "If the problem persists, check the log file for details.",
    "An error occurred while reading the configuration file. The default settings are used instead. "
    "You can change them in the preferences dialog.",
    "The new version is faster and uses less memory than the old one. It also supports more file formats. "
    "Your documents are converted when you open them.",
    "Insert a table with three columns and two rows. Then select the first row and make it bold. "
    "Save the document when you are done.",
]
REVIEWS = [
    "The movie was great, I loved every minute of it.",
    "This is the worst service I have ever used.",
    "The battery lasts all day and the screen is bright.",
    "I am not sure how I feel about the ending.",
    "Absolutely fantastic, would buy again!",
    "The food was cold and the waiter was rude.",
    "It works, but the setup took far too long.",
    "Nothing special, just an average product.",
]

LUA = """
local bodies = {BODIES}
local path = "{PATH}"
local mean_delay = {DELAY}
local headers = {{["Content-Type"] = "application/json"}}
codes = {{}}
local threads = {{}}

function setup(thread) table.insert(threads, thread) end
function init(args) math.randomseed(os.time() + {SEED}) end
function request() return wrk.format("POST", path, headers, bodies[math.random(#bodies)]) end
function delay()
  if mean_delay <= 0 then return 0 end
  return -math.log(1 - math.random()) * mean_delay
end
function response(status, h, body)
  local k = tostring(status)
  codes[k] = (codes[k] or 0) + 1
end
function done(summary, latency, requests)
  local all = {{}}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("codes")) do all[k] = (all[k] or 0) + v end
  end
  local parts = {{}}
  for k, v in pairs(all) do table.insert(parts, string.format('"%s": %d', k, v)) end
  io.write(string.format('WRKJSON {{"requests": %d, "seconds": %.3f, "p50_ms": %.3f, "p90_ms": %.3f, ' ..
    '"p99_ms": %.3f, "mean_ms": %.3f, "socket_errors": %d, "codes": {{%s}}}}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e3, latency:percentile(90) / 1e3,
    latency:percentile(99) / 1e3, latency.mean / 1e3,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    table.concat(parts, ", ")))
end
"""


def lua_string(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a valid Lua string literal for these texts


def wrk(
    url: str, path: str, bodies: Sequence[dict[str, Any]], connections: int, seconds: float, cpus: str, rate: float = 0
) -> subprocess.Popen[str]:
    """Starts one wrk process; `rate` > 0: each connection waits exp(connections / rate) after each answer."""
    delay_ms = 1000.0 * connections / rate if rate > 0 else 0.0
    script = LUA.format(
        BODIES="{" + ", ".join(lua_string(json.dumps(b)) for b in bodies) + "}",
        PATH=path,
        DELAY=f"{delay_ms:.3f}",
        SEED=os.getpid() % 1000 + connections,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    cmd = ["taskset", "-c", cpus, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "60s"]
    return subprocess.Popen([*cmd, "-s", f.name, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wrk_result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate()
    for line in out.splitlines():
        if line.startswith("WRKJSON "):
            result: dict[str, Any] = json.loads(line[len("WRKJSON ") :])
            result["per_s"] = result["requests"] / result["seconds"] if result["seconds"] else 0.0
            return result
    raise RuntimeError(f"wrk gave no result:\n{out[-2000:]}")


@contextlib.contextmanager
def server(store: Path, cpus: str, threads: int, log: Path, **settings: str) -> Iterator[str]:
    base = {"threads": str(threads), "max_queue": "100000", "request_timeout_s": "120"}
    with serverproc.running(store, log, cpus, settings=base | settings) as s:
        yield s.url


def offline(args: argparse.Namespace) -> dict[str, Any]:
    """The engine alone, in a process pinned like the server: its throughput and single-text latency."""
    cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "bench.offline", "--store", str(args.store)]
    cmd += ["--threads", str(args.threads), "--seconds", str(args.offline_seconds)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"offline measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def translate_bodies(decode: str, texts: Sequence[str]) -> list[dict[str, Any]]:
    extra = {"decode": "greedy"} if decode == "greedy" else {"beam_size": 4}
    return [{"texts": [t], **extra} for t in texts]


def scheduling(args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """Part 1: the step scheduler against request-level batches, open-loop arrivals of the mix."""
    short_greedy = translate_bodies("greedy", SHORT)
    rest = translate_bodies("greedy", LONG) * 3 + translate_bodies("beam", SHORT + LONG)  # 2 of 5 short greedy
    share = 0.5  # the short greedy requests' share of the arrivals (80 % greedy, half of the texts short)
    out: dict[str, Any] = {"mix": "short and long texts, 80 % greedy and 20 % beam 4", "levels": {}}
    with server(args.store, args.server_cpus, args.threads, log) as url:
        sat = wrk_result(wrk(url, "/translate", short_greedy + rest, 64, args.seconds, args.client_cpus))
    capacity = sat["per_s"]
    out["capacity_per_s"] = capacity
    for scheduler in ("step", "request"):
        with server(args.store, args.server_cpus, args.threads, log, scheduler=scheduler) as url:
            closed = wrk_result(wrk(url, "/translate", short_greedy + rest, 64, args.seconds, args.client_cpus))
            out.setdefault("saturation_per_s", {})[scheduler] = closed["per_s"]
            for level in args.levels:
                rate = level * capacity
                conns = max(8, min(256, int(rate * 2)))
                a = wrk(url, "/translate", short_greedy, conns, args.seconds, args.client_cpus, rate * share)
                b = wrk(url, "/translate", rest, conns, args.seconds, args.client_cpus, rate * (1 - share))
                ra, rb = wrk_result(a), wrk_result(b)
                out["levels"].setdefault(str(level), {})[scheduler] = {"short_greedy": ra, "rest": rb}
                print(
                    f"  {scheduler:<8} {level:.0%}: short greedy p50 {ra['p50_ms']:.0f} p99 {ra['p99_ms']:.0f} ms, "
                    f"rest p99 {rb['p99_ms']:.0f} ms, {ra['per_s'] + rb['per_s']:.1f} req/s",
                    flush=True,
                )
    return out


def http_path(args: argparse.Namespace, off: dict[str, Any], log: Path) -> dict[str, Any]:
    """Part 2: served ÷ offline at 32 connections, and the added latency at one connection."""
    out: dict[str, Any] = {}
    one = [{"texts": [t]} for t in REVIEWS]
    eight = [{"texts": REVIEWS}]
    beam = translate_bodies("beam", SHORT)
    with server(args.store, args.server_cpus, args.threads, log) as url:
        cases = {
            "predict_1_text": ("/predict", one, 32, off["predict_texts_per_s"], 1),
            "predict_8_texts": ("/predict", eight, 32, off["predict_texts_per_s"], 8),
            "translate_beam4_1_text": ("/translate", beam, 32, off["translate_beam4_texts_per_s"], 1),
        }
        for name, (path, bodies, conns, offline_rate, texts) in cases.items():
            r = wrk_result(wrk(url, path, bodies, conns, args.seconds, args.client_cpus))
            served = r["per_s"] * texts
            out[name] = {
                "served_texts_per_s": served,
                "offline_texts_per_s": offline_rate,
                "ratio": served / offline_rate,
            }
            out[name] |= {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "codes": r["codes"]}
            print(f"  {name}: {served:.0f} texts/s served, {served / offline_rate:.2f}x offline", flush=True)
        r = wrk_result(wrk(url, "/predict", one, 1, args.seconds, args.client_cpus))
        out["predict_one_connection"] = {
            "p50_ms": r["p50_ms"],
            "engine_single_ms": off["predict_single_ms"],
            "added_p50_ms": r["p50_ms"] - off["predict_single_ms"],
        }
        print(f"  /predict at 1 connection: p50 {r['p50_ms']:.2f} ms, engine {off['predict_single_ms']:.2f} ms")
    return out


def markdown(results: dict[str, Any]) -> str:
    s = results.get("scheduling")
    lines = []
    if s:
        lines += [
            f"Scheduling, /translate ({s['mix']}); capacity {s['capacity_per_s']:.1f} requests/s "
            f"(step scheduler, closed loop); saturation: step {s['saturation_per_s']['step']:.1f}, "
            f"request-level {s['saturation_per_s']['request']:.1f} requests/s.",
            "",
            "| load | scheduler | short greedy p50 ms | short greedy p99 ms | rest p99 ms | requests/s |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for level, by in s["levels"].items():
            for name, r in by.items():
                a, b = r["short_greedy"], r["rest"]
                lines.append(
                    f"| {float(level):.0%} | {name} | {a['p50_ms']:.0f} | {a['p99_ms']:.0f} | {b['p99_ms']:.0f} | "
                    f"{a['per_s'] + b['per_s']:.1f} |"
                )
    h = results.get("http")
    if h:
        lines += ["", "| HTTP path | texts/s served | offline | served ÷ offline |", "|---|---:|---:|---:|"]
        for name in ("predict_1_text", "predict_8_texts", "translate_beam4_1_text"):
            r = h[name]
            lines.append(
                f"| {name} | {r['served_texts_per_s']:,.0f} | {r['offline_texts_per_s']:,.0f} | {r['ratio']:.2f} |"
            )
        p = h["predict_one_connection"]
        lines.append(f"\n/predict at one connection: p50 {p['p50_ms']:.2f} ms, added {p['added_p50_ms']:.2f} ms.")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.service_load", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--threads", type=int, default=1, help="the server's CPU threads (SERVE_THREADS) and the engine's")
    p.add_argument("--seconds", type=float, default=30.0, help="per measured load")
    p.add_argument("--offline-seconds", type=float, default=10.0)
    p.add_argument("--levels", default="0.25,0.5,0.75,1.0")
    p.add_argument("--parts", default="scheduling,http")
    p.add_argument("--smoke", action="store_true", help="a few seconds per part")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "service.json")
    args = p.parse_args(argv)
    args.levels = [float(x) for x in args.levels.split(",")]
    if args.smoke:
        args.seconds, args.offline_seconds, args.levels = 2.0, 1.0, [0.5]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path("/usr/bin/wrk").exists():
        print("wrk is missing: `make bench-service` installs it (apt-get install wrk)", file=sys.stderr)
        return 1
    log = Path(tempfile.mkdtemp(prefix="bench-service-")) / "server.log"
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "cpus": {"server": args.server_cpus, "client (wrk)": args.client_cpus, "threads": args.threads},
        "store": str(args.store),
    }
    parts = args.parts.split(",")
    off = offline(args)
    results["offline"] = off
    if "scheduling" in parts:
        results["scheduling"] = scheduling(args, log)
    if "http" in parts:
        results["http"] = http_path(args, off, log)
    results["markdown"] = markdown(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("\n" + results["markdown"] + f"\n\nwrote {args.out} (server log {log})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
