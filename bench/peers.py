"""The served path against the stacks users pick instead, on the same checkpoints (`make bench-peers`).

    make bench-peers                  # every comparison, an idle machine (~12 min)
    python -m bench.peers --smoke     # tiny models, 1 s per cell: the wiring only

A report, not a test. Issue 70's peers, each fed the same requests by the same load generator:

- translation: one random-weight Marian checkpoint of the same-model bench's shape
  (`bench.same_model.prepare`: saved by transformers with its SentencePiece tokenizer), imported by
  `export.import_hf` (fp32 and int8) for the project, converted by CTranslate2's
  `TransformersConverter` (as `ct2-transformers-converter`: float32, and int8 with
  `quantization="int8"`) for **LitServe 0.2.19 + CTranslate2** (`bench.peer_ct2`). Every request asks
  for the same number of new tokens (`max_new_tokens`; the random model never ends a sentence
  earlier), so both sides do the same work.
- classification: one random-weight BERT sequence classifier and one BERT cross-encoder (one label),
  saved by transformers with a WordPiece tokenizer trained here, imported by `export.import_hf` for
  the project (`/predict`, `/rerank`), exported to ONNX by Optimum (`optimum-cli export onnx`) for
  **Infinity** (`infinity_emb v2 --engine optimum`: its ONNX backend, `/classify`, `/rerank`), which
  runs from its own virtual environment (`make bench-infinity-venv`; `--no-infinity` leaves it out).

Each server runs alone, pinned to `--server-cpus` with `--threads` threads (the project's engine
threads; CTranslate2's `intra_threads`; Infinity's ONNX Runtime intra-op threads, which it does not
expose, set by `bench/peer_infinity/sitecustomize.py`), the load generator (`wrk`; the open-loop
overload: `bench.loadgen` in this process) pinned to `--client-cpus`. The cells:

1. `/translate` one sentence a request, greedy and beam 4, at 1 / 8 / 32 closed-loop connections:
   requests/s, p50, p99;
2. mixed: 4 closed-loop clients sending 8-sentence beam-4 requests without pause and one sending
   one-sentence greedy requests, pausing 0.2 s on average after each answer (someone at a screen:
   issue 70 takes the mixed-load targets so): the short request's p50/p99 and the heavy sentences/s;
3. think: 64 closed-loop clients pausing 0.2 s on average (exponential) after each answer, 80 %
   greedy and 20 % beam 4: requests/s, p50, p99;
4. overload: open-loop (Poisson) arrivals of that mix at 3× the peer's capacity (the think mix's
   closed-loop requests/s at 32 connections, estimated from cell 1) for `--seconds`, a 30 s client
   timeout (the project's request deadline): answered, refused (and how fast), timed out;
5. classification: 1 / 8 / 32 connections, 1 and 8 texts a request; reranking: a query and 8 texts
   at 8 and 32 connections, a query and 64 texts at 1 and 8; one pair a request (the project's
   `/predict` `pairs`, Infinity's `/rerank` of one document) at 1 / 8 / 32.

Beside each translation cell, the engine-alone ratio on the same checkpoint: the project's engine
÷ CTranslate2 at the same precision, tokens/s, each in a fresh process pinned to the server CPUs
(`bench.same_model`'s runners), on the cells' own sentences at the batch the cell's load makes (1,
8, 32; 8-32 for the think mix). Beside each server, its CPU seconds per answered request (the
whole process group), which tells time spent from time waited. Writes bench/results/peers.json
and prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import loadgen, same_model, serverproc
from bench.reliability import cpu_name
from bench.serverproc import ROOT
from bench.service_load import LONG, REVIEWS, SHORT, wrk, wrk_result
from bench.timing import Timing

INFINITY_VENV = ROOT / "bench" / ".venv-infinity"
SHAPE = same_model.ModelShape(vocab=8000, d_model=256, heads=4, ffn=1024, enc_layers=3, dec_layers=3)  # E1's
TINY_SHAPE = same_model.ModelShape(vocab=500, d_model=64, heads=4, ffn=128, enc_layers=1, dec_layers=1)
BERT = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
TINY_BERT = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128}
NEW_TOKENS = 24  # every translation request's max_new_tokens (E1's)
HEAVY_SENTENCES = 8
THINK_S = 0.2
OVERLOAD = 3.0
CLIENT_TIMEOUT_S = 30.0  # the project's request deadline (SERVE_REQUEST_TIMEOUT_S's default)
QUERY = "Is the battery good and the screen bright?"


# ---------------------------------------------------------------------------------------------
# Request bodies: the project's shape; each peer's own where its API differs
# ---------------------------------------------------------------------------------------------


def translate(texts: Sequence[str], decode: str) -> dict[str, Any]:
    extra = {"decode": "greedy"} if decode == "greedy" else {"beam_size": 4}
    return {"texts": list(texts), **extra, "max_new_tokens": NEW_TOKENS}


ONE = {decode: [translate([t], decode) for t in SHORT] for decode in ("greedy", "beam")}
HEAVY = [translate((SHORT[k:] + SHORT[:k])[:HEAVY_SENTENCES], "beam") for k in range(len(SHORT))]
MIX = ONE["greedy"] * 4 + ONE["beam"]  # 80 % greedy, 20 % beam 4


def classify_bodies(server: str, texts: int) -> list[dict[str, Any]]:
    groups = [(REVIEWS[k:] + REVIEWS[:k])[:texts] for k in range(len(REVIEWS))]
    return [{"input": g} if server == "infinity" else {"texts": g} for g in groups]


def rerank_bodies(server: str, documents: int = 8) -> list[dict[str, Any]]:
    docs = [((REVIEWS * (1 + documents // len(REVIEWS)))[k:] + REVIEWS[:k])[:documents] for k in range(len(REVIEWS))]
    return [{"query": QUERY, "documents": d} if server == "infinity" else {"query": QUERY, "texts": d} for d in docs]


def pair_bodies(server: str) -> list[dict[str, Any]]:
    """One (query, text) pair a request: the project's `/predict` `pairs`; Infinity scores a pair
    only through `/rerank` (a query and one document)."""
    if server == "infinity":
        return [{"query": QUERY, "documents": [t]} for t in REVIEWS]
    return [{"pairs": [[QUERY, t]]} for t in REVIEWS]


# ---------------------------------------------------------------------------------------------
# The checkpoints, each tool's form of them
# ---------------------------------------------------------------------------------------------


def wordpiece(size: int) -> dict[str, int]:
    """A WordPiece vocabulary trained here on the bench's English texts (nothing is downloaded)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    rng = random.Random(0)
    words = " ".join(SHORT + LONG + REVIEWS + [QUERY]).split()
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) for _ in range(2000)]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=size, special_tokens=specials))
    return tok.get_vocab()


def build_bert(folder: Path, id2label: dict[int, str], sizes: dict[str, int], seed: int) -> None:
    """A random-weight BertForSequenceClassification with its tokenizer, as `save_pretrained` writes them."""
    import torch
    import transformers

    vocab = wordpiece(2000)
    transformers.BertTokenizer(vocab=vocab).save_pretrained(folder)
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        pad_token_id=0,
        max_position_embeddings=512,
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        **sizes,
    )
    torch.manual_seed(seed)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder)


def run_checked(cmd: Sequence[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{what} failed ({' '.join(cmd)}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def prepare(work: Path, tiny: bool, infinity: bool) -> None:
    """Every checkpoint and each tool's form of it, once per work folder (`work/ready` marks it done)."""
    if (work / "ready").exists():
        return
    t0 = time.perf_counter()
    env = same_model.offline_env()
    shape, marian = TINY_SHAPE if tiny else SHAPE, same_model.FAMILIES["marian"]
    same_model.prepare(shape, work, ("ours", "ours-int8", "ct2"), None, marian)
    import ctranslate2

    ctranslate2.converters.TransformersConverter(str(work / "hf")).convert(str(work / "ct2-int8"), quantization="int8")
    sizes = TINY_BERT if tiny else BERT
    for name, labels, seed in (("clf", {0: "negative", 1: "positive"}, 1), ("xenc", {0: "relevance"}, 2)):
        build_bert(work / name, labels, sizes, seed)
        cmd = [sys.executable, "-m", "export.import_hf", str(work / name), "--name", name]
        run_checked([*cmd, "--store", str(work / f"store-{name}"), "--version", "1"], f"importing {name}", env)
        if infinity:  # Optimum's exporter, from Infinity's environment (the user's path to its ONNX backend)
            cli = [str(INFINITY_VENV / "bin" / "optimum-cli"), "export", "onnx", "--model", str(work / name)]
            run_checked([*cli, "--task", "text-classification", str(work / f"{name}-onnx")], f"exporting {name}", env)
    (work / "ready").write_text("")
    print(f"checkpoints built, imported, converted, exported ({time.perf_counter() - t0:.0f} s)", flush=True)


# ---------------------------------------------------------------------------------------------
# The servers
# ---------------------------------------------------------------------------------------------


@dataclass
class Served:
    """A started server: its URL and the processes whose CPU time counts."""

    url: str
    pid: int
    group: bool  # the whole process group (the peers' worker processes)


def group_cpu(pid: int, group: bool) -> float:
    """User + system CPU seconds of the process, or of its whole process group, children that
    ended included (their time is added to the parent when reaped: the peers' workers live on)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if (int(fields[2]) == pid) if group else (int(stat.parent.name) == pid):  # fields[2]: process group
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


@contextlib.contextmanager
def process_group(
    cmd: list[str], log: Path, health: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Iterator[Served]:
    """A peer pinned by `cmd`'s taskset, stopped as a whole group (`serverproc.running_group`)."""
    with serverproc.running_group(cmd, log, health, env, cwd) as server:
        yield Served(server.url, server.pid, True)


@contextlib.contextmanager
def project(store: Path, args: argparse.Namespace, log: Path, variant: str | None = None) -> Iterator[Served]:
    """The project's server at its defaults, its engine threads all `--threads`."""
    n = str(args.threads)
    settings = {"threads": n, "classification_threads": n, "translation_threads": n}
    if variant:
        settings["variant"] = variant
    with serverproc.running(store, log, args.server_cpus, settings=settings, ready_timeout=300) as s:
        yield Served(s.url, s.pid, False)


@contextlib.contextmanager
def litserve_ct2(model: Path, args: argparse.Namespace, log: Path) -> Iterator[Served]:
    cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "bench.peer_ct2", "--model", str(model)]
    cmd += ["--tokenizer", str(args.work / "hf"), "--threads", str(args.threads)]
    with process_group([*cmd, "--port", str(serverproc.free_port())], log, "/health") as s:
        yield s


@contextlib.contextmanager
def infinity(model: Path, args: argparse.Namespace, log: Path) -> Iterator[Served]:
    """Infinity's ONNX backend on the exported folder; its optimized graph cached under the work folder.
    Run from inside the folder as `--model-id .`: Infinity 0.0.78 names the ONNX file by the path it
    globbed, which Optimum 2 (what `infinity-emb[optimum]` installs) only finds when it is relative
    to the model folder ("Could not find any ONNX files with target file name DIR/model.onnx").
    Without its start-up warm-up: that runs texts of 512 words, which its ONNX classifier does not
    truncate (an ONNX Runtime broadcast error past the 512 positions); `warm` warms it instead.
    Its own graph optimization fails with Optimum 2 ("OptimizationConfig.__init__() got an
    unexpected keyword argument 'optimize_with_onnxruntime_only'"; Optimum 1.x, which it was written
    for, does not import with torch 2.13): it serves the exported graph as ONNX Runtime optimizes it
    at load (every level, the attention, GELU and layer-norm fusions included)."""
    env = same_model.offline_env() | {
        "HF_HUB_CACHE": str(model.parent / f"hf-cache-{model.name}"),  # its optimized graph, per model
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
        "OMP_NUM_THREADS": str(args.threads),
        "BENCH_ORT_THREADS": str(args.threads),  # bench/peer_infinity/sitecustomize.py
        "PYTHONPATH": str(ROOT / "bench" / "peer_infinity"),
    }
    cmd = ["taskset", "-c", args.server_cpus, str(INFINITY_VENV / "bin" / "infinity_emb"), "v2"]
    cmd += ["--model-id", ".", "--engine", "optimum", "--device", "cpu", "--batch-size", "32"]
    cmd += ["--no-model-warmup", "--log-level", "warning", "--port", str(serverproc.free_port())]
    with process_group(cmd, log, "/health", env, cwd=model) as s:
        yield s


# ---------------------------------------------------------------------------------------------
# The cells
# ---------------------------------------------------------------------------------------------


def check(url: str, path: str, body: dict[str, Any]) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        for _ in range(3):
            r = c.post(path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{url}{path}: {r.status_code} {r.text[:300]}")


def warm(s: Served, path: str, bodies: Sequence[dict[str, Any]], args: argparse.Namespace) -> None:
    """A short closed-loop run at 8 connections before anything is measured (every batch shape seen)."""
    wrk_result(wrk(s.url, path, bodies, 8, min(args.seconds, 3.0), args.client_cpus))


def compute_seconds(s: Served) -> float | None:
    """The project's model compute time so far (`inference_compute_seconds_sum`, every stage);
    None for a peer (no such metric)."""
    if s.group:
        return None
    text = httpx.get(s.url + "/metrics", timeout=30).text
    lines = text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("inference_compute_seconds_sum"))


def cell(s: Served, path: str, bodies: Sequence[dict[str, Any]], conns: int, args: argparse.Namespace, **kw) -> dict:
    """One closed-loop wrk run: requests/s, p50/p99, answers other than 200; the server's CPU ms
    per request and (the project) its model compute ms per request: the rest is its HTTP path,
    scheduling and tokenization."""
    cpu, compute = group_cpu(s.pid, s.group), compute_seconds(s)
    r = wrk_result(wrk(s.url, path, bodies, conns, args.seconds, args.client_cpus, **kw))
    used, computed = group_cpu(s.pid, s.group) - cpu, compute_seconds(s)
    bad = sum(int(n) for code, n in r["codes"].items() if code != "200") + int(r["socket_errors"])
    n = max(1, r["requests"])
    out = {
        "per_s": r["per_s"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "requests": r["requests"],
        "failed": bad,
        "cpu_ms_per_request": 1000 * used / n,
    }
    if compute is not None and computed is not None:
        out["compute_ms_per_request"] = 1000 * (computed - compute) / n
    return out


def settle(url: str) -> None:
    """Waits out what wrk left in flight (the peers still run a request whose client left)."""
    httpx.post(url + "/translate", json=ONE["greedy"][0], timeout=600).raise_for_status()


def overload(s: Served, capacity: float, args: argparse.Namespace) -> dict[str, Any]:
    """Open-loop arrivals of the mix at OVERLOAD × capacity: answered, refused (how fast), timed out."""
    host, port = s.url.removeprefix("http://").split(":")
    shots = [loadgen.Shot("mix", "/translate", json.dumps(b).encode()) for b in MIX]
    rate = OVERLOAD * capacity
    outcomes = asyncio.run(loadgen.open_loop(host, int(port), shots, rate, args.seconds, timeout=CLIENT_TIMEOUT_S))
    ok = [o.seconds * 1000 for o in outcomes if o.status == 200]
    refused = [o.seconds * 1000 for o in outcomes if o.status in (429, 503)]
    return {
        "rate_per_s": rate,
        "sent": len(outcomes),
        "answered": len(ok),
        "answered_p50_ms": loadgen.percentile(ok, 50),
        "answered_p99_ms": loadgen.percentile(ok, 99),
        "refused": len(refused),
        "refused_p50_ms": loadgen.percentile(refused, 50),
        "refused_p99_ms": loadgen.percentile(refused, 99),
        "timed_out": sum(1 for o in outcomes if o.status == 0),
        "other": sum(1 for o in outcomes if o.status not in (0, 200, 429, 503)),
    }


def translation_cells(s: Served, args: argparse.Namespace) -> dict[str, Any]:
    check(s.url, "/translate", HEAVY[0])
    check(s.url, "/translate", ONE["greedy"][0])
    warm(s, "/translate", MIX, args)
    settle(s.url)
    answer = httpx.post(s.url + "/translate", json=translate(SHORT, "greedy"), timeout=120).json()
    out: dict[str, Any] = {"greedy_texts": [t["text"] for t in answer["translations"]]}
    for decode in ("greedy", "beam"):
        for conns in args.connections:
            out[f"{decode}_{conns}"] = cell(s, "/translate", ONE[decode], conns, args)
            settle(s.url)
    heavy = wrk(s.url, "/translate", HEAVY, args.heavy_clients, args.seconds, args.client_cpus)
    short = wrk(s.url, "/translate", ONE["greedy"], 1, args.seconds, args.client_cpus, rate=1 / THINK_S)
    h, sh = wrk_result(heavy), wrk_result(short)
    out["mixed"] = {
        "heavy_sentences_per_s": h["per_s"] * HEAVY_SENTENCES,
        "short_p50_ms": sh["p50_ms"],
        "short_p99_ms": sh["p99_ms"],
        "short_requests": sh["requests"],
        "failed": sum(int(n) for r in (h, sh) for c, n in r["codes"].items() if c != "200")
        + int(h["socket_errors"])
        + int(sh["socket_errors"]),
    }
    settle(s.url)
    out["think"] = cell(s, "/translate", MIX, args.think_clients, args, rate=args.think_clients / THINK_S)
    settle(s.url)
    top = max(args.connections)
    g, b = out[f"greedy_{top}"]["per_s"], out[f"beam_{top}"]["per_s"]
    capacity = 1 / (0.8 / g + 0.2 / b) if g and b else 1.0  # the mix's closed-loop requests/s
    out["overload"] = overload(s, capacity, args)
    return out


def classification_cells(s: Served, server: str, args: argparse.Namespace) -> dict[str, Any]:
    path = "/classify" if server == "infinity" else "/predict"
    check(s.url, path, classify_bodies(server, 8)[0])
    warm(s, path, classify_bodies(server, 8), args)
    out: dict[str, Any] = {}
    for texts in (1, 8):
        for conns in args.connections:
            out[f"classify_{texts}x_{conns}"] = cell(s, path, classify_bodies(server, texts), conns, args)
    return out


def rerank_cells(s: Served, server: str, args: argparse.Namespace) -> dict[str, Any]:
    """A query and 8 texts at 8 and 32 connections; a query and 64 texts at 1 and 8; one pair a
    request (the project's `/predict` pairs) at every connection count (issue 67's cells)."""
    pair_path = "/rerank" if server == "infinity" else "/predict"
    check(s.url, "/rerank", rerank_bodies(server, 64)[0])
    check(s.url, pair_path, pair_bodies(server)[0])
    warm(s, "/rerank", rerank_bodies(server), args)
    out = {f"rerank_{conns}": cell(s, "/rerank", rerank_bodies(server), conns, args) for conns in args.connections[1:]}
    for conns in args.connections[:2]:
        out[f"rerank64_{conns}"] = cell(s, "/rerank", rerank_bodies(server, 64), conns, args)
    warm(s, pair_path, pair_bodies(server), args)
    for conns in args.connections:
        out[f"pair_{conns}"] = cell(s, pair_path, pair_bodies(server), conns, args)
    return out


# ---------------------------------------------------------------------------------------------
# The engines alone: project ÷ CTranslate2 on the same checkpoint
# ---------------------------------------------------------------------------------------------


def cell_sources(work: Path, batches: Sequence[int]) -> dict[int, list[list[int]]]:
    """Per batch size, the cells' own sentences (`SHORT`, in turn) as the checkpoint's tokenizer
    gives them: the engines alone see the lengths, and so the padding, that the servers see (10
    to 39 tokens: beam 4 at 32 ran at 0.87-0.92 of CTranslate2 on them where 24 random ids gave
    0.98, before a beam step's cache copies went row by row; measured)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(work / "hf"))
    texts = [SHORT[i % len(SHORT)] for i in range(max(batches))]
    ids = [list(map(int, tokenizer(t)["input_ids"])) for t in texts]
    return {b: ids[:b] for b in batches}


def engine_ratios(args: argparse.Namespace) -> dict[str, float]:
    """Tokens/s of each engine alone (`bench.same_model`'s runners, fresh processes pinned to the
    server CPUs) on the cells' sentences at batches 1, 8 and 32 (the heavy clients' 4 x 8), greedy
    and beam 4; `ratio_{precision}_{decode}_{batch}`."""
    timing = Timing(min_runs=2, min_time=0.2) if args.smoke else Timing(min_runs=5, min_time=2.0)
    sources = cell_sources(args.work, [1, 8, 32])
    plan = same_model.Plan(str(args.work), args.threads, NEW_TOKENS, [1, 4], sources, timing, 0 if args.smoke else 2)
    plan.save(args.work / "plan.json")
    speed: dict[str, dict[tuple[int, int], float]] = {}
    pairs = [("fp32", "ours", "ct2"), ("int8", "ours-int8", "ct2-int8")]
    pairs = [pair for pair in pairs if pair[0] in args.precisions]
    for tool in (t for _, ours, ct2 in pairs for t in (ours, ct2)):
        cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "bench.same_model", "--run", tool]
        done = subprocess.run(
            [*cmd, "--plan", str(args.work / "plan.json")],
            cwd=ROOT,
            env=same_model.offline_env(),
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"engine alone, {tool}:\n{done.stderr[-3000:]}")
        cases = json.loads(done.stdout)["cases"]
        speed[tool] = {(c["beam"], c["batch"]): c["batch"] * NEW_TOKENS / c["seconds"] for c in cases}
    out: dict[str, float] = {}
    for precision, ours, ct2 in pairs:
        for (beam, batch), mine in speed[ours].items():
            decode = "greedy" if beam == 1 else "beam"
            out[f"ratio_{precision}_{decode}_{batch}"] = mine / speed[ct2][(beam, batch)]
            out[f"ours_{precision}_{decode}_{batch}_tokens_per_s"] = mine
            out[f"ct2_{precision}_{decode}_{batch}_tokens_per_s"] = speed[ct2][(beam, batch)]
    return out


def graph_speed(paths: dict[str, str], threads: int, batches: Sequence[int], seconds: float) -> dict[str, Any]:
    """Rows/s of each classifier graph alone in ONNX Runtime (this process: run it pinned), the
    same token ids (16 a row) on `threads` intra-op threads; the logits only."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    out: dict[str, Any] = {}
    for name, path in paths.items():
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        for b in batches:
            ids = np.random.default_rng(b).integers(5, 400, size=(b, 16), dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
            feed = {k: v for k, v in feed.items() if k in wanted}
            for _ in range(3):
                session.run(["logits"], feed)
            runs, t0 = 0, time.perf_counter()
            while runs < 5 or time.perf_counter() - t0 < seconds:
                session.run(["logits"], feed)
                runs += 1
            out[f"{name}_{b}"] = b * runs / (time.perf_counter() - t0)
    return out


def graph_ratios(args: argparse.Namespace) -> dict[str, float]:
    """The project's classifier and cross-encoder graphs ÷ the ones Infinity serves (Optimum's
    export), rows/s, each alone in a fresh process pinned to the server CPUs: `{model}_{batch}`."""
    out: dict[str, float] = {}
    for name in ("clf", "xenc"):
        paths = {"project": str(args.work / f"store-{name}" / name / "1" / "model.onnx")}
        paths["infinity"] = str(args.work / f"{name}-onnx" / "model.onnx")
        code = (
            "import json, sys; from bench.peers import graph_speed; "
            f"print(json.dumps(graph_speed({paths!r}, {args.threads}, [1, 8, 32], {0.3 if args.smoke else 2.0})))"
        )
        cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-c", code]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"graphs alone, {name}:\n{done.stderr[-3000:]}")
        speed = json.loads(done.stdout.strip().splitlines()[-1])
        for b in (1, 8, 32):
            out[f"{name}_{b}"] = speed[f"project_{b}"] / speed[f"infinity_{b}"]
            out[f"{name}_{b}_rows_per_s"] = speed[f"project_{b}"]
    return out


# ---------------------------------------------------------------------------------------------
# The run and its report
# ---------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """One comparison: a project server against a peer, the same cells on each."""

    name: str
    peer: str
    project: Callable[[argparse.Namespace, Path], contextlib.AbstractContextManager[Served]]
    other: Callable[[argparse.Namespace, Path], contextlib.AbstractContextManager[Served]]
    cells: Callable[[Served, str, argparse.Namespace], dict[str, Any]]
    precision: str = ""
    results: dict[str, Any] = field(default_factory=dict)


def comparisons(args: argparse.Namespace) -> list[Comparison]:
    w = args.work
    out = []
    for precision in args.precisions:
        variant, ct2 = ("int8", w / "ct2-int8") if precision == "int8" else ("fp32", w / "ct2")
        out.append(
            Comparison(
                f"translation-{precision}",
                f"LitServe 0.2.19 + CTranslate2 {precision}",
                lambda a, log, v=variant: project(w / "store", a, log, v),
                lambda a, log, m=ct2: litserve_ct2(m, a, log),
                lambda s, _server, a: translation_cells(s, a),
                precision,
            )
        )
    if args.infinity:
        for name, cells in (("clf", classification_cells), ("xenc", rerank_cells)):
            out.append(
                Comparison(
                    "classification" if name == "clf" else "rerank",
                    "Infinity (ONNX backend)",
                    lambda a, log, n=name: project(w / f"store-{n}", a, log),
                    lambda a, log, n=name: infinity(w / f"{n}-onnx", a, log),
                    cells,
                )
            )
    return out


def run(args: argparse.Namespace, log: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for comp in comparisons(args):
        for side, start in (("project", comp.project), ("peer", comp.other)):
            t0 = time.perf_counter()
            with start(args, log) as s:
                comp.results[side] = comp.cells(s, "infinity" if side == "peer" else "project", args)
            print(f"  {comp.name}, {side}: {time.perf_counter() - t0:.0f} s", flush=True)
        results[comp.name] = {"peer_name": comp.peer, **comp.results}
    return results


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "–"


def _latency_row(what: str, a: dict[str, Any], b: dict[str, Any], engine_ratio: str) -> str:
    """A closed-loop cell: each side's requests/s, p50 and p99, project ÷ peer, the engines alone."""
    sides = " | ".join(f"{x['per_s']:,.1f}; {x['p50_ms']:.0f}; {x['p99_ms']:.0f}" for x in (a, b))
    ratios = "; ".join(ratio(a[k], b[k]) for k in ("per_s", "p50_ms", "p99_ms"))
    return f"| {what}: req/s; p50; p99 ms | {sides} | {ratios} | {engine_ratio} |"


def translation_table(r: dict[str, Any], precision: str, engine: dict[str, float], conns: Sequence[int]) -> list[str]:
    p, q = r["project"], r["peer"]
    lines = [
        f"**/translate, {precision}**: the project against {r['peer_name']}; the engine-alone ratio (project ÷ "
        "CTranslate2, tokens/s, at the batch the load makes) beside each cell.",
        "",
        "| cell | project | peer | project ÷ peer | engine ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for decode in ("greedy", "beam"):
        for c in conns:
            a, b = p[f"{decode}_{c}"], q[f"{decode}_{c}"]
            e = engine.get(f"ratio_{precision}_{decode}_{min(c, 32)}", float("nan"))
            what = "greedy" if decode == "greedy" else "beam 4"
            lines.append(_latency_row(f"{what}, {c} conn.", a, b, f"{e:.2f}"))
    a, b = p["mixed"], q["mixed"]
    e32 = engine.get(f"ratio_{precision}_beam_32", float("nan"))  # 4 heavy clients' 8 sentences
    lines.append(
        f"| short greedy (0.2 s think) behind 4 heavy beam-4 clients: p50; p99 ms "
        f"| {a['short_p50_ms']:.0f}; {a['short_p99_ms']:.0f} "
        f"| {b['short_p50_ms']:.0f}; {b['short_p99_ms']:.0f} | {ratio(a['short_p50_ms'], b['short_p50_ms'])}; "
        f"{ratio(a['short_p99_ms'], b['short_p99_ms'])} | |"
    )
    lines.append(
        f"| the heavy clients: sentences/s | {a['heavy_sentences_per_s']:,.1f} | {b['heavy_sentences_per_s']:,.1f} | "
        f"{ratio(a['heavy_sentences_per_s'], b['heavy_sentences_per_s'])} | {e32:.2f} |"
    )
    a, b = p["think"], q["think"]
    # at 0.2 s think about 25 requests are in flight, in two lanes: greedy steps of 8 to 32 rows
    g8, g32 = (engine.get(f"ratio_{precision}_greedy_{n}", float("nan")) for n in (8, 32))
    lines.append(_latency_row("64 clients, 0.2 s think", a, b, f"{g8:.2f}-{g32:.2f}"))
    for side, o in (("project", p["overload"]), ("peer", q["overload"])):
        lines.append(
            f"| overload, {side}: {o['rate_per_s']:.0f} req/s for the run | answered {o['answered']} of {o['sent']} "
            f"(p50 {o['answered_p50_ms']:,.0f}, p99 {o['answered_p99_ms']:,.0f} ms); refused {o['refused']} "
            f"(p50 {o['refused_p50_ms']:.0f}, p99 {o['refused_p99_ms']:.0f} ms); timed out {o['timed_out']} | | | |"
        )
    same = sum(a == b for a, b in zip(p["greedy_texts"], q["greedy_texts"], strict=True))
    lines.append("")
    lines.append(f"Greedy translations of the {len(SHORT)} sentences, identical on both sides: {same}.")
    lines.append(cpu_line(p, q))
    return lines


def cpu_line(p: dict[str, Any], q: dict[str, Any]) -> str:
    keys = [k for k, v in p.items() if isinstance(v, dict) and "cpu_ms_per_request" in v]
    cells = []
    for k in keys:
        inside = f" ({p[k]['compute_ms_per_request']:.1f} in the model)" if "compute_ms_per_request" in p[k] else ""
        cells.append(f"{k} {p[k]['cpu_ms_per_request']:.1f}{inside} / {q[k]['cpu_ms_per_request']:.1f}")
    return "Server CPU ms per answered request, project (its model compute, wall) / peer: " + ", ".join(cells) + "."


def graph_batch(cell: str) -> int:
    """The measured batch nearest below the rows a cell's load can gather: texts × connections
    (`classify_{texts}x_{connections}`; `rerank_{connections}`: 8 pairs a request; `rerank64_`: 64;
    `pair_`: one), at most 32."""
    parts = cell.split("_")
    per_request = {"rerank": 8, "rerank64": 64, "pair": 1}
    known = parts[0] in per_request
    rows = per_request[parts[0]] * int(parts[1]) if known else int(parts[1][:-1]) * int(parts[2])
    return max(b for b in (1, 8, 32) if b <= min(rows, 32))


RERANK_TITLE = "/rerank (a query and 8 or 64 texts); one pair a request: /predict pairs against /rerank of one"


def classification_table(r: dict[str, Any], graphs: dict[str, float]) -> list[str]:
    p, q = r["project"], r["peer"]
    lines = [
        f"**{'/predict against /classify' if 'classify_1x_1' in p else RERANK_TITLE}**: "
        f"the project against {r['peer_name']}.",
        "",
        "| cell | project req/s; p50; p99 ms | peer | project ÷ peer: req/s; p99 | graph alone |",
        "|---|---:|---:|---:|---:|",
    ]
    model = "clf" if "classify_1x_1" in p else "xenc"
    for k, a in p.items():
        b = q[k]
        batch = graph_batch(k)
        g = graphs.get(f"{model}_{batch}", float("nan"))
        lines.append(
            f"| {k} | {a['per_s']:,.1f}; {a['p50_ms']:.1f}; {a['p99_ms']:.1f} | {b['per_s']:,.1f}; {b['p50_ms']:.1f}; "
            f"{b['p99_ms']:.1f} | {ratio(a['per_s'], b['per_s'])}; {ratio(a['p99_ms'], b['p99_ms'])} | "
            f"{g:.2f} (b{batch}) |"
        )
    lines += ["", cpu_line(p, q)]
    return lines


def markdown(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [results["layout"], ""]
    for name, r in results["comparisons"].items():
        if name.startswith("translation"):
            lines += translation_table(r, name.split("-")[1], results["engine"], a["connections"])
        else:
            lines += classification_table(r, results["graphs"])
        lines.append("")
    bad = {
        f"{name} {side}": sum(c.get("failed", 0) for c in r[side].values() if isinstance(c, dict))
        for name, r in results["comparisons"].items()
        for side in ("project", "peer")
    }
    if any(bad.values()):
        lines.append(f"**Closed-loop answers other than 200 or socket errors** (the load was not as stated): {bad}.")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n")[0])
    p.add_argument("--server-cpus", default="0", help="every server, each alone, and the engines alone")
    p.add_argument("--client-cpus", default="1", help="the load generators (and this process)")
    p.add_argument("--threads", type=int, default=1, help="engine threads, every server")
    p.add_argument("--seconds", type=float, default=10.0, help="per cell")
    p.add_argument("--connections", default="1,8,32")
    p.add_argument("--heavy-clients", type=int, default=4)
    p.add_argument("--think-clients", type=int, default=64)
    p.add_argument("--precisions", default="fp32,int8", help="translation: fp32, int8, both, or none")
    p.add_argument("--no-infinity", dest="infinity", action="store_false", help="leave out Infinity")
    p.add_argument("--work", type=Path, default=None, help="checkpoints folder, kept and reused (default: a new one)")
    p.add_argument("--smoke", action="store_true", help="tiny models, 1 s per cell, fewer clients")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peers.json")
    args = p.parse_args(argv)
    args.connections = [int(c) for c in args.connections.split(",")]
    args.precisions = [] if args.precisions == "none" else args.precisions.split(",")
    if args.smoke:
        args.seconds, args.heavy_clients, args.think_clients = 1.0, 2, 8
        args.connections, args.precisions = [1, 8], [p for p in args.precisions if p == "fp32"]
    if args.infinity and not (INFINITY_VENV / "bin" / "infinity_emb").exists():
        p.error(f"Infinity is not installed in {INFINITY_VENV}: `make bench-infinity-venv`, or --no-infinity")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path("/usr/bin/wrk").exists():
        print("wrk is missing: `make bench-peers` installs it (apt-get install wrk)", file=sys.stderr)
        return 1
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})  # the open-loop generator's CPUs
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-peers-"))
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "servers.log"
    layout = (
        f"Each server alone on CPU {args.server_cpus} with {args.threads} engine thread(s); wrk and the open-loop "
        f"generator on CPU {args.client_cpus}; {args.seconds:g} s per cell, one run; load average "
        f"{os.getloadavg()[0]:.2f} at the start"
    )
    print(layout, flush=True)
    prepare(args.work, args.smoke, args.infinity)
    engine = engine_ratios(args)
    print(
        "engine alone, project ÷ CTranslate2: "
        + ", ".join(f"{k[6:]} {v:.2f}" for k, v in engine.items() if k.startswith("ratio")),
        flush=True,
    )
    graphs = graph_ratios(args) if args.infinity else {}
    if graphs:
        cells = ", ".join(f"{k} {v:.2f}" for k, v in graphs.items() if not k.endswith("_per_s"))
        print(f"classifier graphs alone, project ÷ Infinity's: {cells}", flush=True)
    comps = run(args, log)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "cpu": cpu_name(), "python": sys.version.split()[0]},
        "load_average_end": os.getloadavg(),
        "layout": layout,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "new_tokens": NEW_TOKENS,
        "engine": engine,
        "graphs": graphs,
        "comparisons": comps,
    }
    results["markdown"] = markdown(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("\n" + results["markdown"] + f"\n\nwrote {args.out} (work folder and server logs: {args.work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
