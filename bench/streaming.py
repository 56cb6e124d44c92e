"""Streaming's acceptance figures over a real server (`python -m bench.streaming`): how soon the first
event of a streamed translation arrives, and that streamed deltas add up to the whole answer.

    python -m bench.streaming                 # first event against the whole answer (~1 min)
    python -m bench.streaming --quick         # the same, fewer rounds (~20 s)
    python -m bench.streaming --equality      # every sentence of the test split and the fidelity set

First event: a 20-sentence text with beam 4, streamed and not, in alternating rounds; the time to
the first event against the time the whole answer takes (target: at most a fifth), and against the
same stream's end. Then one-sentence greedy streams: admission to first event in decoder steps
(target: at most two). The server is idle and answers one request at a time, so the difference of
its metrics before and after a request is that request's own: `inference_queue_wait_seconds`
(arrival in the queue to admission), `inference_compute_seconds{stage="encode"}` (its encoder
run), `{stage="decode"}` (its decoder runs) and `inference_stream_first_event_seconds` (arrival to
the first event). Admission to first event is the first event less the queue wait and the encoder
run (the time before the queue, reading the body and tokenizing, stays in it: an upper bound).
The step is a step's wall time (the decoder's run, the search, the publication): the idle latency's
slope over `max_new_tokens`, a long sentence answered with 1 and with 33 new tokens (both ending on
`length`), in rounds interleaved with the greedy ones. Also reported: the same in steps of the
decoder's compute alone (more of them: it leaves out the search), and the stream's mean gap between
token events (about a step when the deltas flow, far less when they come in bursts). A greedy
token is sent once the next confirms it (incremental detokenization): two steps are the floor.
Times on a busy machine scatter by whole steps, so the count that decides is exact: a second server
with the fault hook's step gate (`bench/faults`, FAULT_DECODE_STEPS) runs each one-sentence greedy
stream a decoder step at a time and, before letting each step go, waits `--settle-s` for an event:
the steps that ran before the first event (target: at most two; a late delivery counts one more).

Equality: each text, greedy and beam 4, in requests of `--chunk` texts, asked whole and streamed;
a mismatch is a text whose joined deltas, finish reason or score differ from the whole answer's.

The server runs pinned to `--server-cpus` (one thread), the client to `--client-cpus`. Writes
bench/results/streaming[-quick|-equality].json and prints the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import serverproc
from bench.reliability import cpu_name, git_commit
from bench.serverproc import ROOT

MODEL = "en-de"
FIDELITY = ROOT / "bench" / "data" / "fidelity.jsonl"
FAULTS = ROOT / "bench" / "faults"

# Twenty sentences of the kind the bundled translator learnt (software documentation), one text.
TWENTY = " ".join(
    [
        "Open the file you want to edit.",
        "The document was saved in a new folder.",
        "Select the layer and click the button below.",
        "This option cannot be changed while the program is running.",
        "Enter the name of the new user.",
        "The connection to the server was lost.",
        "Do you want to delete the selected items?",
        "The printer is not available at the moment.",
        "Choose a colour for the background of the page.",
        "The password must contain at least eight characters.",
        "Move the selected rows to the top of the table.",
        "An error occurred while reading the configuration file.",
        "Show the hidden files in this directory.",
        "The image is too large to be displayed.",
        "Restart the application to apply the changes.",
        "No matching entries were found in the database.",
        "Click here to download the latest version.",
        "The window will close after the transfer is complete.",
        "Add a new account to the list of contacts.",
        "Check the spelling of the current document.",
    ]
)
GREEDY_SENTENCES = [
    "Open the file you want to edit.",
    "The connection to the server was lost.",
    "Restart the application to apply the changes.",
    "The password must contain at least eight characters.",
    "Show the hidden files in this directory.",
]
# Long enough that greedy decoding does not end before 33 tokens (checked: finish_reason "length").
LONG_SENTENCE = (
    "When the connection to the server is lost while the document is being saved, the program keeps a copy "
    "of every change in a temporary folder and asks you, the next time it starts, whether those changes "
    "should be restored or deleted."
)
SLOPE_TOKENS = 33


# -- the wire ---------------------------------------------------------------------------------------


def events_of(lines: Iterator[str]) -> Iterator[Any]:
    """An event stream's `data:` payloads as they arrive (`[DONE]` as the string)."""
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


@dataclass
class Streamed:
    status: int
    first_s: float  # request sent to its first event
    done_s: float  # to [DONE] (or the stream's end)
    at: list[float]  # every event's arrival
    texts: list[str]  # each text's deltas, joined
    ends: list[dict[str, Any]]  # each text's last event
    error: dict[str, Any] | None
    body: str = ""  # a refusal's JSON


def stream(client: httpx.Client, body: dict[str, Any], n: int) -> Streamed:
    t0 = time.perf_counter()
    at: list[float] = []
    texts, ends = [""] * n, [dict[str, Any]() for _ in range(n)]
    error = None
    with client.stream("POST", "/translate", json=body | {"stream": True}) as r:
        if r.status_code != 200:
            r.read()
            return Streamed(r.status_code, 0.0, time.perf_counter() - t0, [], texts, ends, None, r.text)
        for event in events_of(r.iter_lines()):
            at.append(time.perf_counter() - t0)
            if event == "[DONE]":
                break
            if "error" in event:
                error = event
                break
            if "finish_reason" in event:
                ends[event["index"]] = event
            else:
                texts[event["index"]] += event["text"]
    done = time.perf_counter() - t0
    return Streamed(200, at[0] if at else done, done, at, texts, ends, error)


def whole(client: httpx.Client, body: dict[str, Any]) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = client.post("/translate", json=body)
    return time.perf_counter() - t0, r


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of one metric's samples whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head = line.rsplit(" ", 1)[0]
            if all(w in head for w in want):
                total += float(line.rsplit(" ", 1)[1])
    return total


def counters(client: httpx.Client) -> dict[str, float]:
    """What the per-request figures are differences of."""
    text = client.get("/metrics").text
    return {
        "queue_wait_s": metric(text, "inference_queue_wait_seconds_sum", model=MODEL),
        "admitted": metric(text, "inference_batch_size_sum", model=MODEL),
        "encode_s": metric(text, "inference_compute_seconds_sum", model=MODEL, stage="encode"),
        "decode_s": metric(text, "inference_compute_seconds_sum", model=MODEL, stage="decode"),
        "steps": metric(text, "inference_compute_seconds_count", model=MODEL, stage="decode"),
        "first_event_s": metric(text, "inference_stream_first_event_seconds_sum", endpoint="/translate"),
    }


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


# -- first event ------------------------------------------------------------------------------------


def first_event(client: httpx.Client, rounds: int) -> dict[str, Any]:
    """The 20-sentence text, beam 4: streamed and whole in alternating rounds (one warm-up each)."""
    body = {"texts": [TWENTY], "beam_size": 4}
    whole(client, body), stream(client, body, 1)  # warm-up
    rows: list[dict[str, Any]] = []
    answer = ""
    for k in range(rounds):
        pair: dict[str, Any] = {}
        for kind in ("whole", "streamed") if k % 2 == 0 else ("streamed", "whole"):
            before = counters(client)
            if kind == "whole":
                seconds, r = whole(client, body)
                r.raise_for_status()
                answer = r.json()["translations"][0]["text"]
                pair["whole_s"] = seconds
            else:
                s = stream(client, body, 1)
                if s.status != 200 or s.error:
                    raise RuntimeError(f"stream failed: {s.status} {s.body or s.error}")
                pair |= {"first_s": s.first_s, "streamed_s": s.done_s, "events": len(s.at), "at_s": s.at}
                pair["equal"] = s.texts[0] == answer if answer else None
            d = difference(counters(client), before)
            pair[f"{kind}_sentences"] = d["admitted"]
            if kind == "streamed":
                pair["server_first_event_s"] = d["first_event_s"]
        rows.append(pair)
    first, whole_s = median([r["first_s"] for r in rows]), median([r["whole_s"] for r in rows])
    return {
        "text_sentences": median([r["whole_sentences"] for r in rows]),
        "beam_size": 4,
        "rounds": rounds,
        "first_event_s": first,
        "whole_answer_s": whole_s,
        "streamed_answer_s": median([r["streamed_s"] for r in rows]),
        "first_over_whole": first / whole_s,
        "first_over_whole_per_round": [r["first_s"] / r["whole_s"] for r in rows],
        # the same stream's first event over its own end: one request, so the machine's drift between
        # the two requests of a round does not enter
        "first_over_streamed": median([r["first_s"] / r["streamed_s"] for r in rows]),
        "streamed_over_whole": median([r["streamed_s"] for r in rows]) / whole_s,
        "events_per_stream": median([r["events"] for r in rows]),
        "streamed_equals_whole": all(r["equal"] for r in rows if r["equal"] is not None),
        "rounds_detail": rows,
    }


def greedy_round(client: httpx.Client, text: str) -> dict[str, Any]:
    """One one-sentence greedy stream on the idle server: arrival to first event, and its parts."""
    before = counters(client)
    s = stream(client, {"texts": [text], "decode": "greedy"}, 1)
    d = difference(counters(client), before)
    if s.status != 200 or s.error or d["steps"] < 1:
        raise RuntimeError(f"greedy stream failed: {s.status} {s.body or s.error} {d}")
    deltas = s.at[:-2]  # the token deltas: the last two are the text's end and [DONE]
    return {
        "text": text,
        "client_first_s": s.first_s,
        "server_first_event_s": d["first_event_s"],
        "queue_wait_s": d["queue_wait_s"],
        "encode_s": d["encode_s"],
        "decode_steps": d["steps"],
        "decode_compute_s": d["decode_s"] / d["steps"],
        "admission_to_first_s": d["first_event_s"] - d["queue_wait_s"] - d["encode_s"],
        # steady streaming: about a step; far less: the deltas came in bursts
        "event_gap_s": (deltas[-1] - deltas[0]) / (len(deltas) - 1) if len(deltas) > 1 else 0.0,
        "events": len(s.at),
    }


def slope_round(client: httpx.Client) -> dict[int, float]:
    """The long sentence's latency at 1 and at 33 new tokens (both must end on `length`)."""
    out = {}
    for n in (SLOPE_TOKENS, 1):
        seconds, r = whole(client, {"texts": [LONG_SENTENCE], "decode": "greedy", "max_new_tokens": n})
        r.raise_for_status()
        if r.json()["translations"][0]["finish_reason"] != "length":
            raise RuntimeError(f"the long sentence ended before {n} tokens: {r.text}")
        out[n] = seconds
    return out


def greedy_first_token(client: httpx.Client, rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Greedy one-sentence streams and the decoder step's wall time, in interleaved rounds (the
    machine's drift enters both alike), after a warm-up of each. The step: the idle per-token
    latency, (latency at 33 new tokens - at 1) / 32; one token is one decoder step of one row, so
    this is a step's wall time (the decoder's run, the search, the publication), which the compute
    metric's decoder time leaves out."""
    greedy_round(client, GREEDY_SENTENCES[0]), slope_round(client)  # warm-up
    rows, times = [], []
    for k in range(rounds):
        rows.append(greedy_round(client, GREEDY_SENTENCES[k % len(GREEDY_SENTENCES)]))
        times.append(slope_round(client))
    one, many = median([t[1] for t in times]), median([t[SLOPE_TOKENS] for t in times])
    greedy = {
        "rounds": rounds,
        "client_first_event_s": median([r["client_first_s"] for r in rows]),
        "server_first_event_s": median([r["server_first_event_s"] for r in rows]),
        "queue_wait_s": median([r["queue_wait_s"] for r in rows]),
        "encode_s": median([r["encode_s"] for r in rows]),
        "admission_to_first_s": median([r["admission_to_first_s"] for r in rows]),
        "admission_to_first_max_s": max(r["admission_to_first_s"] for r in rows),
        "decode_compute_s": median([r["decode_compute_s"] for r in rows]),
        "event_gap_s": median([r["event_gap_s"] for r in rows]),
        "rounds_detail": rows,
    }
    slope = {"latency_1_s": one, "latency_33_s": many, "per_token_s": (many - one) / (SLOPE_TOKENS - 1)}
    return greedy, slope


def read_int(path: Path) -> int:
    try:
        return int(path.read_text() or "0")
    except FileNotFoundError:
        return 0


def write_int(path: Path, n: int) -> None:
    """Replaces the file whole: the server's hook never reads half a number."""
    tmp = path.with_name(path.name + ".w")
    tmp.write_text(str(n))
    os.replace(tmp, path)


def wait_for(path: Path, n: int, or_else: threading.Event, limit: float = 30.0) -> bool:
    """Until the file holds n (True), or `or_else` is set first (False)."""
    end = time.monotonic() + limit
    while read_int(path) != n:
        if or_else.is_set():
            return False
        if time.monotonic() > end:
            raise RuntimeError(f"{path} never reached {n}")
        time.sleep(0.002)
    return True


def stepped_first_event(url: str, gate: Path, text: str, settle: float) -> dict[str, Any]:
    """One greedy stream run a decoder step at a time (the fault hook's FAULT_DECODE_STEPS): before
    each step is let go, `settle` seconds to see whether the steps so far sent an event. The count
    is exact whatever else the machine runs; a late delivery only counts a step more."""
    held, done = gate.with_name(gate.name + ".held"), gate.with_name(gate.name + ".done")
    start = read_int(done)
    write_int(gate, start)  # every decoder call from now on waits for its turn
    first, ended = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                body = {"texts": [text], "decode": "greedy", "stream": True}
                with client.stream("POST", "/translate", json=body) as r:
                    for event in events_of(r.iter_lines()):
                        if not first.is_set():
                            result["first"] = event
                            result["steps"] = read_int(done) - start
                            first.set()
        finally:
            ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        k = 0
        while wait_for(held, start + k + 1, ended):  # the request's step k + 1 is held: k ran
            if first.wait(settle):
                break
            k += 1
            write_int(gate, start + k)
        first.wait(settle)
    finally:
        gate.unlink()  # the rest runs freely
        reader.join(120)
    steps = {"steps_before_first_event": k, "steps_done_at_first_event": result.get("steps")}
    return {"text": text, **steps, "first_event": result.get("first")}


def greedy_steps(args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """The first event of one-sentence greedy streams, counted in decoder steps after admission."""
    gate = Path(tempfile.mkdtemp(prefix="streaming-steps-")) / "gate"
    env = {"PYTHONPATH": f"{FAULTS}{os.pathsep}{ROOT}", "FAULT_DECODE_STEPS": str(gate)}
    settings = {"threads": str(args.threads)}
    with serverproc.running(args.store, log, args.server_cpus or None, settings=settings, env=env) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            stream(client, {"texts": [GREEDY_SENTENCES[0]], "decode": "greedy"}, 1)  # warm-up
        rows = [stepped_first_event(server.url, gate, text, args.settle_s) for text in GREEDY_SENTENCES]
    steps = [r["steps_before_first_event"] for r in rows]
    return {"settle_s": args.settle_s, "steps": steps, "max_steps": max(steps), "rounds_detail": rows}


def in_steps(greedy: dict[str, Any], slope: dict[str, Any]) -> dict[str, float]:
    """The greedy first event in decoder steps: of the step's wall time (the slope: the gate), of the
    decoder's compute alone (more steps: a lower bound of the step), and of the stream's event gaps."""
    after, arrival = greedy["admission_to_first_s"], greedy["server_first_event_s"]
    return {
        "admission_to_first_steps": after / slope["per_token_s"],
        "admission_to_first_max_steps": greedy["admission_to_first_max_s"] / slope["per_token_s"],
        "arrival_to_first_steps": arrival / slope["per_token_s"],
        "admission_to_first_compute_steps": after / greedy["decode_compute_s"],
        "admission_to_first_event_gaps": after / greedy["event_gap_s"] if greedy["event_gap_s"] else 0.0,
    }


# -- equality ---------------------------------------------------------------------------------------


def test_split(data_dir: Path) -> list[str]:
    path = data_dir / "translation" / "test.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} is missing: build the data first (make data, or --data-dir)")
    return [json.loads(line)["en"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def fidelity_set() -> list[str]:
    lines = FIDELITY.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def compare(client: httpx.Client, texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """One request's texts asked whole and streamed; a refused request is asked text by text."""
    body = {"texts": texts, "return_scores": True, **options}
    _, r = whole(client, body)
    s = stream(client, body, len(texts))
    if r.status_code != 200:
        if len(texts) > 1:
            parts = [compare(client, [t], options) for t in texts]
            return {
                k: sum(p[k] for p in parts) if k != "mismatches" else [m for p in parts for m in p[k]] for k in parts[0]
            }
        alike = s.status == r.status_code and s.body == r.text
        bad = [] if alike else [{"text": texts[0], "whole": r.text, "streamed": s.body or s.status}]
        return {"texts": 1, "compared": 0, "refused_alike": int(alike), "mismatches": bad}
    answer = r.json()["translations"]
    bad = []
    if s.status != 200 or s.error:
        bad = [{"texts": texts, "whole": answer, "streamed": s.body or s.error}]
    else:
        for text, got, end, want in zip(texts, s.texts, s.ends, answer, strict=True):
            same = got == want["text"] and end.get("finish_reason") == want["finish_reason"]
            if not same or end.get("score") != want.get("score"):
                bad.append({"text": text, "whole": want, "streamed": got, "end": end})
    return {"texts": len(texts), "compared": len(texts), "refused_alike": 0, "mismatches": bad}


def equality(url: str, sets: dict[str, list[str]], chunk: int, clients: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    options = {"greedy": {"decode": "greedy"}, "beam 4": {"decode": "beam", "beam_size": 4}}
    for set_name, texts in sets.items():
        for name, opts in options.items():
            chunks = [texts[k : k + chunk] for k in range(0, len(texts), chunk)]
            t0 = time.monotonic()

            def run(part: list[str], opts: dict[str, Any] = opts) -> dict[str, Any]:
                with httpx.Client(base_url=url, timeout=300) as client:
                    return compare(client, part, opts)

            with ThreadPoolExecutor(clients) as pool:
                parts = list(pool.map(run, chunks))
            result = {
                "texts": sum(p["texts"] for p in parts),
                "compared": sum(p["compared"] for p in parts),
                "refused_alike": sum(p["refused_alike"] for p in parts),
                "mismatches": sum(len(p["mismatches"]) for p in parts),
                "seconds": time.monotonic() - t0,
                "first_mismatches": [m for p in parts for m in p["mismatches"]][:20],
            }
            out[f"{set_name}, {name}"] = result
            print(
                f"{set_name}, {name}: {result['compared']} of {result['texts']} texts compared "
                f"({result['refused_alike']} refused alike), {result['mismatches']} mismatches, "
                f"{result['seconds']:.0f} s",
                flush=True,
            )
    return out


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--server-cpus", default="0", help="taskset's CPU list; '' for no pinning")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="fewer rounds (~20 s)")
    p.add_argument("--rounds", type=int, help="rounds of each measurement (default 10, quick 3)")
    p.add_argument("--settle-s", type=float, default=0.3, help="stepped run: the wait for an event before each step")
    p.add_argument("--step-max-rows", type=int, help="the server's SERVE_STEP_MAX_ROWS (default: its own)")
    p.add_argument("--equality", action="store_true", help="streamed == whole on the test split and fidelity set")
    p.add_argument("--data-dir", type=Path, default=ROOT / "data", help="where the test split is (make data)")
    p.add_argument("--chunk", type=int, default=16, help="texts a request (equality)")
    p.add_argument("--clients", type=int, default=2, help="requests at a time (equality)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 10)
    suffix = "-equality" if args.equality else "-quick" if args.quick else ""
    args.out = args.out or ROOT / "bench" / "results" / f"streaming{suffix}.json"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    serverproc.pin_self(args.client_cpus)
    sets = {"test split": test_split(args.data_dir), "fidelity set": fidelity_set()} if args.equality else {}
    log = Path(tempfile.mkdtemp(prefix="streaming-")) / "server.log"
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.streaming " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(),
        "machine": {"cores": os.cpu_count(), "cpu": cpu_name(), "load_1min_before": os.getloadavg()[0]},
        "cpus": {"server": args.server_cpus, "client": args.client_cpus, "threads": args.threads},
        "store": args.store.name,
    }
    failed: list[str] = []
    settings = {"threads": str(args.threads)}
    if args.step_max_rows:
        settings["step_max_rows"] = str(args.step_max_rows)
    report["settings"] = settings
    with serverproc.running(args.store, log, args.server_cpus or None, settings=settings) as server:
        if args.equality:
            report["equality"] = equality(server.url, sets, args.chunk, args.clients)
            failed += [k for k, v in report["equality"].items() if v["mismatches"]]
        else:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                fe = report["first_event"] = first_event(client, args.rounds)
                g, sl = greedy_first_token(client, args.rounds)
                report["greedy"], report["step_by_slope"] = g, sl
            steps = report["greedy_in_steps"] = in_steps(g, sl)
            print(
                f"20 sentences, beam 4: first event {fe['first_event_s'] * 1000:.0f} ms, whole answer "
                f"{fe['whole_answer_s'] * 1000:.0f} ms: first / whole {fe['first_over_whole']:.3f} (target <= 0.2); "
                f"first / the stream's end {fe['first_over_streamed']:.3f}; "
                f"streamed / whole {fe['streamed_over_whole']:.3f}; "
                f"{fe['events_per_stream']:.0f} events"
            )
            print(
                f"one sentence, greedy: first event {g['server_first_event_s'] * 1000:.1f} ms from arrival "
                f"(queue {g['queue_wait_s'] * 1000:.2f} ms, encoder {g['encode_s'] * 1000:.2f} ms); decoder step "
                f"{sl['per_token_s'] * 1000:.2f} ms (slope over max_new_tokens; decoder compute "
                f"{g['decode_compute_s'] * 1000:.2f} ms, event gap {g['event_gap_s'] * 1000:.2f} ms): admission to "
                f"first event {steps['admission_to_first_steps']:.2f} steps (slowest round "
                f"{steps['admission_to_first_max_steps']:.2f}; target <= 2), arrival to first event "
                f"{steps['arrival_to_first_steps']:.2f} steps"
            )
            if fe["first_over_whole"] > 0.2:
                failed.append("first event within a fifth of the whole answer")
            if not fe["streamed_equals_whole"]:
                failed.append("the 20-sentence text streamed == whole")
    if not args.equality:
        stepped = report["greedy_stepped"] = greedy_steps(args, log)
        print(
            f"one sentence, greedy, a decoder step at a time: first event after {stepped['steps']} steps (target <= 2)"
        )
        if stepped["max_steps"] > 2:
            failed.append("first token within two decoder steps of admission (stepped)")
    report["machine"]["load_1min_after"] = os.getloadavg()[0]
    report["failed"] = failed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    print(f"wrote {args.out} (server log {log})")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
