"""Peer comparison (`make bench-peer`): the project's server against LitServe 0.2.19 serving the
same engines (`bench/peer_litserve.py`).

    make bench-peer                   # 5 rounds, 30 s per scenario; an idle machine
    python -m bench.peer --smoke      # 1 round, 3 s per scenario, fewer clients: the wiring only

A report, not a test. Each server runs alone, in its own process, pinned to `--server-cpus`
with `--threads` ONNX Runtime threads per engine (the project: SERVE_THREADS,
SERVE_CLASSIFICATION_THREADS and SERVE_TRANSLATION_THREADS all N; LitServe: `LoadOptions(threads=N)`
in each inference worker), both on the newest version of each model in `--store`, everything
else at its defaults (the project's step budget SERVE_STEP_MAX_ROWS 128 and express share 0.5, other
values through `--project-setting step_express_share=S`; LitServe batching 32 requests / 2 ms for
/predict, 16 / 5 ms for /translate). The load generator (Debian's `wrk`,
`bench.service_load.wrk`) runs pinned to `--client-cpus`. Rounds alternate which server goes
first; in each round each server is started, warmed and measured on three scenarios:

1. predict: /predict, one text a request, 32 closed-loop connections: requests/s, p50/p99. The
   engine offline at batch 32 in a fresh process pinned like the servers (before and after the
   rounds, the faster taken) gives two denominators: tokenizer + graph (`bench.service_load`'s)
   and the graph without its tokenizer; served ÷ offline is reported against both.
2. mixed: 4 closed-loop clients sending beam-4 /translate requests of 8 sentences, and one
   closed-loop client sending one-sentence greedy requests: heavy sentences/s, the short p50/p99.
   With `--short-rate R` the short client pauses a random 1/R s on average after each answer (a
   person reading it) instead of sending the next request at once.
3. beam64: 64 closed-loop clients sending one-sentence beam-4 /translate requests: sentences/s,
   p50/p99.

Ratios are project ÷ LitServe, the median of the per-round ratios (each round's pair ran minutes
apart) with their range. Writes bench/results/peer.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import serverproc, service_load
from bench.reliability import cpu_name
from bench.serverproc import ROOT
from bench.service_load import REVIEWS, SHORT, translate_bodies, wrk, wrk_result

HEAVY_SENTENCES = 8
HEAVY = [{"texts": (SHORT[k:] + SHORT[:k])[:HEAVY_SENTENCES], "beam_size": 4} for k in range(len(SHORT))]
GREEDY = translate_bodies("greedy", SHORT)  # one sentence a request
BEAM = translate_bodies("beam", SHORT)
SERVERS = ("project", "litserve")

# (key, what, target ratio project ÷ LitServe from the issue, or "")
FIGURES = [
    ("predict_per_s", "/predict, {predict} connections: requests/s", ""),
    ("predict_p50_ms", "/predict: p50 ms", ""),
    ("predict_p99_ms", "/predict: p99 ms", ""),
    ("mixed_heavy_per_s", "mixed, {heavy} heavy beam-4 clients: heavy sentences/s", "≥ 1.0"),
    ("mixed_short_p50_ms", "mixed: short greedy request p50 ms", "≤ 0.1"),
    ("mixed_short_p99_ms", "mixed: short greedy request p99 ms", ""),
    ("beam_per_s", "{beam} one-sentence beam-4 clients: sentences/s", ""),
    ("beam_p50_ms", "{beam} beam-4 clients: p50 ms", ""),
    ("beam_p99_ms", "{beam} beam-4 clients: p99 ms", "≤ 1.0"),
]


@contextlib.contextmanager
def project(args: argparse.Namespace, log: Path) -> Iterator[str]:
    n = str(args.threads)
    extra = dict(kv.split("=", 1) for kv in args.project_setting)
    with service_load.server(
        args.store, args.server_cpus, args.threads, log, classification_threads=n, translation_threads=n, **extra
    ) as url:
        yield url


@contextlib.contextmanager
def litserve(args: argparse.Namespace, log: Path) -> Iterator[str]:
    """`bench.peer_litserve` in its own session: LitServe's worker processes outlive a SIGTERM to
    the main one, so the whole process group is stopped."""
    port = serverproc.free_port()
    cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "bench.peer_litserve", "--store", str(args.store)]
    cmd += ["--threads", str(args.threads), "--port", str(port)]
    with serverproc.running_group(cmd, log, "/health") as server:
        yield server.url


START: dict[str, Callable[[argparse.Namespace, Path], contextlib.AbstractContextManager[str]]] = {
    "project": project,
    "litserve": litserve,
}


def warm(url: str) -> None:
    """A few requests of each kind, answered 200, before anything is measured."""
    bodies = [("/predict", {"texts": [REVIEWS[0]]}), ("/translate", HEAVY[0]), *[("/translate", GREEDY[0])] * 3]
    with httpx.Client(base_url=url, timeout=120) as c:
        for path, body in bodies * 2:
            r = c.post(path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{url}{path}: {r.status_code} {r.text[:300]}")


def failed(*results: dict[str, Any]) -> int:
    """Answers other than 200 and socket errors: the load was not the load the figures claim."""
    refused = sum(int(n) for r in results for code, n in r["codes"].items() if code != "200")
    return refused + sum(int(r["socket_errors"]) for r in results)


def settle(url: str) -> None:
    """Waits out the requests wrk left in flight (LitServe still runs a request whose client left):
    one greedy request, behind them in the same queue."""
    httpx.post(url + "/translate", json=GREEDY[0], timeout=600).raise_for_status()


def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    """The three scenarios against one server; wrk on the client CPUs."""
    out: dict[str, float] = {}
    one = [{"texts": [t]} for t in REVIEWS]
    r = wrk_result(wrk(url, "/predict", one, args.predict_connections, args.seconds, args.client_cpus))
    out |= {"predict_per_s": r["per_s"], "predict_p50_ms": r["p50_ms"], "predict_p99_ms": r["p99_ms"]}
    heavy = wrk(url, "/translate", HEAVY, args.heavy_clients, args.seconds, args.client_cpus)
    short = wrk(url, "/translate", GREEDY, 1, args.seconds, args.client_cpus, args.short_rate)
    h, s = wrk_result(heavy), wrk_result(short)
    out |= {"mixed_heavy_per_s": h["per_s"] * HEAVY_SENTENCES, "mixed_heavy_p50_ms": h["p50_ms"]}
    out |= {"mixed_short_p50_ms": s["p50_ms"], "mixed_short_p99_ms": s["p99_ms"], "mixed_short_requests": s["requests"]}
    settle(url)
    b = wrk_result(wrk(url, "/translate", BEAM, args.beam_clients, args.seconds, args.client_cpus))
    out |= {"beam_per_s": b["per_s"], "beam_p50_ms": b["p50_ms"], "beam_p99_ms": b["p99_ms"]}
    out["failed"] = failed(r, h, s, b)
    return out


def offline(args: argparse.Namespace) -> dict[str, float]:
    """The classifier alone at batch 32, in a fresh process pinned like the servers."""
    cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "bench.offline", "--store", str(args.store)]
    cmd += ["--threads", str(args.threads), "--seconds", str(args.offline_seconds), "--parts", "predict,predict-graph"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"offline measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(rounds: list[dict[str, dict[str, float]]], off: dict[str, float]) -> dict[str, Any]:
    """Per figure: each server's median over the rounds and the median (range) of the paired ratios."""
    out: dict[str, Any] = {}
    for key, _, target in FIGURES:
        ratios = [r["project"][key] / r["litserve"][key] if r["litserve"][key] else float("nan") for r in rounds]
        out[key] = {name: statistics.median(r[name][key] for r in rounds) for name in SERVERS}
        out[key] |= {"ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
        out[key]["target"] = target
    for name in SERVERS:
        served = out["predict_per_s"][name]
        out[f"{name}_served_over_offline"] = {
            "engine": served / off["predict_texts_per_s"],
            "graph": served / off["predict_graph_texts_per_s"],
        }
    return out


def markdown(results: dict[str, Any]) -> str:
    s, a, off = results["summary"], results["args"], results["offline"]
    lines = [
        f"{results['layout']}; {a['rounds']} round(s) of {a['seconds']:.0f} s per scenario, alternating.",
        "",
        "| figure | project | LitServe 0.2.19 | project ÷ LitServe (range) | target |",
        "|---|---:|---:|---:|---|",
    ]
    counts = {"predict": a["predict_connections"], "heavy": a["heavy_clients"], "beam": a["beam_clients"]}
    for key, what, _ in FIGURES:
        f = s[key]
        lines.append(
            f"| {what.format(**counts)} | {f['project']:,.1f} | {f['litserve']:,.1f} | "
            f"{f['ratio']:.2f} ({f['ratio_min']:.2f}–{f['ratio_max']:.2f}) | {f['target']} |"
        )
    ratios = {name: s[f"{name}_served_over_offline"] for name in SERVERS}
    lines.append(
        f"\nThe classifier offline at batch 32 (the faster of before and after): {off['predict_texts_per_s']:,.0f} "
        f"texts/s with its tokenizer (`bench.service_load`'s denominator), {off['predict_graph_texts_per_s']:,.0f} "
        "without. /predict served ÷ offline, against each: "
        + "; ".join(f"{name} {r['engine']:.2f} and {r['graph']:.2f}" for name, r in ratios.items())
        + "."
    )
    bad = {name: sum(r[name]["failed"] for r in results["rounds"]) for name in SERVERS}
    if any(bad.values()):
        lines.append(f"\n**Answers other than 200 or socket errors** (the load was not as stated): {bad}.")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--server-cpus", default="0", help="both servers, each alone, and the offline engine")
    p.add_argument("--client-cpus", default="1", help="the load generator")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per engine, both servers")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=30.0, help="per scenario")
    p.add_argument("--offline-seconds", type=float, default=10.0)
    p.add_argument("--predict-connections", type=int, default=32)
    p.add_argument("--heavy-clients", type=int, default=4)
    p.add_argument("--beam-clients", type=int, default=64)
    p.add_argument(
        "--short-rate",
        type=float,
        default=0.0,
        help="mixed: the short client pauses exp(1 / rate) s after each answer, as a person would (0: none)",
    )
    p.add_argument("--smoke", action="store_true", help="1 round, 3 s per scenario, fewer clients")
    p.add_argument(
        "--project-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the project's server besides the defaults, e.g. step_express_share=0.5 (repeatable)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peer.json")
    args = p.parse_args(argv)
    if any("=" not in kv for kv in args.project_setting):
        p.error("--project-setting takes NAME=VALUE")
    if args.smoke:
        args.rounds, args.seconds, args.offline_seconds = 1, 3.0, 1.0
        args.predict_connections, args.heavy_clients, args.beam_clients = 8, 2, 8
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path("/usr/bin/wrk").exists():
        print("wrk is missing: `make bench-peer` installs it (apt-get install wrk)", file=sys.stderr)
        return 1
    log = Path(tempfile.mkdtemp(prefix="bench-peer-")) / "server.log"
    layout = (
        f"servers (each alone) on CPU {args.server_cpus} with {args.threads} ONNX Runtime thread(s) per engine "
        f"(LitServe: 1 HTTP process and 1 inference worker process per API, all on those CPUs); wrk on CPU "
        f"{args.client_cpus}; the offline engine in a fresh process on CPU {args.server_cpus}"
    )
    if args.short_rate:
        layout += f"; the short client pausing 1/{args.short_rate:g} s on average after each answer"
    for name, value in (kv.split("=", 1) for kv in args.project_setting):
        layout += f"; the project with SERVE_{name.upper()}={value}"
    print(layout, flush=True)
    before = offline(args)
    rounds: list[dict[str, dict[str, float]]] = []
    for k in range(args.rounds):
        order = SERVERS if k % 2 == 0 else SERVERS[::-1]
        rounds.append({})
        for name in order:
            with START[name](args, log) as url:
                warm(url)
                rounds[-1][name] = measure(url, args)
            r = rounds[-1][name]
            print(
                f"  round {k + 1} {name}: /predict {r['predict_per_s']:,.0f}/s p99 {r['predict_p99_ms']:.1f} ms; "
                f"mixed heavy {r['mixed_heavy_per_s']:.1f} sentences/s, short p50 {r['mixed_short_p50_ms']:.0f} ms; "
                f"beam {r['beam_per_s']:.1f}/s p99 {r['beam_p99_ms']:.0f} ms",
                flush=True,
            )
    after = offline(args)
    off = {k: max(v, after[k]) for k, v in before.items() if k.endswith("_per_s")}
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "cpu": cpu_name(), "python": sys.version.split()[0]},
        "layout": layout,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "offline": off,
        "offline_runs": [before, after],
        "rounds": rounds,
        "summary": summarize(rounds, off),
    }
    results["markdown"] = markdown(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("\n" + results["markdown"] + f"\n\nwrote {args.out} (server logs {log})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
