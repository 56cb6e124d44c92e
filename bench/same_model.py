"""Same model, every tool: one checkpoint decoded by this engine, CTranslate2, Optimum and transformers.

    python -m bench.engine --only same-model --tiny      # smoke run, seconds
    python -m bench.engine --only same-model-t5 --tiny   # the T5 checkpoint's
    python -m bench.engine                               # these sections first, then the rest

One random-weight checkpoint of a family (`FAMILIES`) is saved with `save_pretrained`, beside its
tokenizer made offline: `marian`, a `MarianMTModel` of the bench's shape with a MarianTokenizer (a
SentencePiece model trained here on a few words, a vocab.json of exactly `vocab` entries); `t5`, a
`T5ForConditionalGeneration` of t5-small's shape and layout with a T5 tokenizer (`bench.same_model_t5`).
Then each tool gets it the way its users would:

- ours:       `python -m export.import_hf` (fp32 + int8 variants, int8 calibrated on a few sentences of
              the tokenizer's words), TranslatorEngine.translate_ids. `ours-int8`: the int8 variant.
- ct2:        `ct2-transformers-converter` (its Marian or T5 loader), Translator.translate_batch on
              the tokens' strings: one batch on `threads` threads; `ct2-workers`: `threads`
              sub-batches, one thread each (this engine's sentence shards); `ct2-int8`: compute type int8.
- optimum:    exported by Optimum (`ORTModelForSeq2SeqLM.from_pretrained(DIR, export=True)`), run by its
              `.generate` on the CPU provider, ORT's intra-op threads and torch's (its search) set.
- hf:         `AutoModelForSeq2SeqLM.generate` (MarianMTModel, T5ForConditionalGeneration), torch threads set.

Every tool runs alone in a fresh process of its own (`python -m bench.same_model --run TOOL`), one
after another, with the same intra-op thread count, the same source ids (token ids: tokenization is
not timed), batch and beam sizes, and exactly `new_tokens` new tokens: the EOS (and <pad>) embedding
rows are zero (T5's spare rows past its tokenizer too), so their logit, 0, sits mid-vocabulary and
never wins; transformers and CTranslate2 also forbid EOS before the length (min_new_tokens =
max_new_tokens, min_decoding_length = max_decoding_length), this engine is given max_new_tokens.
The greedy tokens of the fp32 tools must be identical, sentence by sentence, before any speed is printed (`TokensDiffer`
otherwise); beam agreement and int8 agreement are reported. A runner answers its generated ids and
timings as JSON on stdout (anything the libraries print goes to stderr).

Optimum: optimum-onnx 0.1.0 (the newest) needs transformers<4.58, which this project's venv does not
have; its runner and export run with `--optimum-path` (default: `<venv>/optimum-onnx`, installed by
`make bench`) first on PYTHONPATH, an overlay holding it, optimum 2.1, transformers 4.57 and their
tokenizers and huggingface_hub.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bench import same_model_t5
from bench.timing import CONTENDED, Timing, flag, measure, own_cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
NAME = "same-model"
EOS, UNK = 0, 1  # Marian's: </s> first, <unk> second, <pad> (the decoder start) last
# fp32 tools whose greedy tokens must equal this engine's; the int8 rows are compared, not required
IDENTICAL = ("ours", "ct2", "ct2-workers", "optimum", "hf")
TOOLS = ("ours", "ct2", "ct2-workers", "optimum", "hf", "ours-int8", "ct2-int8", "ct2-int8-workers")
INT8 = {"ours-int8", "ct2-int8", "ct2-int8-workers"}
WORDS = "the a cat dog house tree red blue small big runs sleeps sees file open save close window".split()
LABELS = {
    "ours": "this engine fp32 (import_hf)",
    "ct2": "CTranslate2 fp32, 1 × {t} threads",
    "ct2-workers": "CTranslate2 fp32, {t} workers × 1 thread",
    "optimum": "Optimum ORTModelForSeq2SeqLM.generate fp32",
    "hf": "transformers generate fp32",
    "ours-int8": "this engine int8 (import_hf)",
    "ct2-int8": "CTranslate2 int8, 1 × {t} threads",
    "ct2-int8-workers": "CTranslate2 int8, {t} workers × 1 thread",
}


HOW = {
    "ours": "imported by this project",
    "ct2": "converted by ct2-transformers-converter",
    "optimum": "exported by Optimum",
    "hf": "run by transformers",
}


class TokensDiffer(Exception):
    """The tools decoded the same model to different greedy tokens: no speed of theirs is comparable."""


@dataclass(frozen=True)
class Family:
    """What of the bench depends on the checkpoint's family: how it is built and which ids a source holds."""

    name: str
    title: str  # the report's name for the checkpoint
    build: Callable[[ModelShape, Path], list[str]]  # writes the checkpoint; its tokens by id
    eos: int
    ordinary: Callable[[int], tuple[int, int]]  # vocabulary size -> the ids a source may hold, [low, high)


# ---------------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    d_model: int
    heads: int
    ffn: int
    enc_layers: int
    dec_layers: int


def vocabulary(pieces: Sequence[str], size: int) -> list[str]:
    """Marian's layout: </s>, <unk>, the SentencePiece pieces, fillers up to `size` - 1, <pad> last."""
    tokens = ["</s>", "<unk>", *(p for p in pieces if p not in ("</s>", "<unk>", "<pad>"))]
    if len(tokens) >= size:
        raise ValueError(f"vocabulary of {size} cannot hold {len(tokens)} SentencePiece pieces")
    tokens += [f"▁w{i}" for i in range(size - 1 - len(tokens))] + ["<pad>"]
    return tokens


def sentences(words: Sequence[str], n: int) -> list[str]:
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 6)) for i in range(n)]


def sentencepiece_model(words: Sequence[str]) -> bytes:
    """A tiny SentencePiece model trained in-process (the tokenizer files a Marian checkpoint ships)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences(words, 64)),
        model_writer=buf,
        vocab_size=48,
        model_type="unigram",
        normalization_rule_name="identity",
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return buf.getvalue()


# Random weights: standard deviation gain / sqrt(fan-in) (the embedding's fan-in: d_model); at the
# bench's shape embeddings N(0, 0.1), attention N(0, 0.05), fc1 N(0, 0.02), fc2 N(0, 2). Biases N(0, 0.02).
INIT_GAIN = {"embedding": 1.6, "attention": 0.8, "fc1": 0.32, "fc2": 64.0}


def init_weights(model: object, seed: int = 0) -> None:
    """Random weights that decode to varied tokens with a margin fp32 rounding cannot cross.

    A random Marian model is easily degenerate or ill-conditioned. Large attention weights make
    the softmax nearly hard: the tokens vary, but rounding errors grow 10-300× per layer, and two
    fp32 implementations (or fp32 and fp64) pick different tokens in a third of the sentences.
    Small attention weights with a large FFN output (fc2) keep attention soft and make each step
    a smooth random map of the previous token, its position and (through the cross-attention) the
    source: at the bench's shape about 17-21 distinct tokens in 24, and the top-2 logit gap stays
    well above (over 10×) the largest fp32-vs-fp64 logit difference. The EOS and <pad> embedding
    rows (tied to the output projection) are zero: their logit is 0, mid-vocabulary, never chosen.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # type: ignore[attr-defined]
            if name.endswith("shared.weight"):  # tied: both embeddings and the output projection
                p.normal_(0.0, INIT_GAIN["embedding"] / p.shape[1] ** 0.5, generator=g)
                p[EOS] = 0.0
                p[-1] = 0.0  # <pad>, the decoder start
            elif p.dim() == 2:
                kind = "fc1" if ".fc1" in name else "fc2" if ".fc2" in name else "attention"
                p.normal_(0.0, INIT_GAIN[kind] / p.shape[1] ** 0.5, generator=g)
            elif "layer_norm" not in name:
                p.normal_(0.0, 0.02, generator=g)


def build_checkpoint(s: ModelShape, folder: Path, seed: int = 0) -> list[str]:
    """A random-weight Marian checkpoint (`init_weights`) with its tokenizer files, as
    `save_pretrained` writes them; its tokens by id (vocab.json's)."""
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    sp_model = sentencepiece_model(WORDS)
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(sp_model)
    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    tokens = vocabulary([sp.id_to_piece(i) for i in range(sp.get_piece_size())], s.vocab)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    pad = s.vocab - 1
    cfg = MarianConfig(
        vocab_size=s.vocab,
        decoder_vocab_size=s.vocab,
        d_model=s.d_model,
        encoder_layers=s.enc_layers,
        decoder_layers=s.dec_layers,
        encoder_attention_heads=s.heads,
        decoder_attention_heads=s.heads,
        encoder_ffn_dim=s.ffn,
        decoder_ffn_dim=s.ffn,
        activation_function="swish",  # Marian's (opus-mt checkpoints)
        scale_embedding=True,
        max_position_embeddings=256,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=EOS,
        forced_eos_token_id=None,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    init_weights(model, seed)
    model.save_pretrained(folder)
    tok = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"))
    tok.save_pretrained(folder)
    return tokens


def build_t5(s: ModelShape, folder: Path, seed: int = 0) -> list[str]:
    return same_model_t5.build_checkpoint(folder, sentences(WORDS, 64), **asdict(s), seed=seed)


FAMILIES = {
    "marian": Family("marian", "Marian", build_checkpoint, EOS, lambda vocab: (UNK + 1, vocab - 1)),
    "t5": Family(
        "t5",
        "T5 1.0 (t5-small's layout: ReLU, relative position buckets, tied head scaled)",
        build_t5,
        same_model_t5.EOS,
        lambda vocab: (same_model_t5.UNK + 1, same_model_t5.pieces(vocab)),  # no sentinel or spare row
    ),
}


def source_ids(
    vocab: int, batches: Sequence[int], src_len: int, seed: int = 0, family: str = "marian"
) -> dict[int, list[list[int]]]:
    """Per batch size, sentences of src_len ids: random ordinary tokens, then EOS (as Marian's and
    T5's tokenizers end them)."""
    f = FAMILIES[family]
    low, high = f.ordinary(vocab)
    rng = np.random.default_rng(seed)
    out = {}
    for b in batches:
        ids = rng.integers(low, high, size=(b, src_len - 1))
        out[b] = np.concatenate([ids, np.full((b, 1), f.eos)], axis=1).tolist()
    return out


# ---------------------------------------------------------------------------------------------
# What every runner gets
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Written once by the parent, read by every runner: the same inputs, threads and timing rule."""

    # the checkpoint is work/hf (its tokens by id: work/tokens.json), the imported store work/store,
    # CTranslate2's work/ct2, Optimum's work/onnx
    work: str
    threads: int
    new_tokens: int
    beams: list[int]
    sources: dict[int, list[list[int]]]  # batch size -> source ids
    timing: Timing
    retries: int

    @property
    def folder(self) -> Path:
        return Path(self.work)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Plan:
        raw = json.loads(path.read_text())
        raw["sources"] = {int(b): ids for b, ids in raw["sources"].items()}
        raw["timing"] = Timing(**raw["timing"])
        return cls(**raw)


Decode = Callable[[list[list[int]], int], list[list[int]]]  # (source ids, beam) -> best hypothesis' ids


def decode_ours(plan: Plan, variant: str) -> Decode:
    from bench.engines import newest
    from service import store
    from service.engine.decoding import DecodeParams
    from service.engine.runtime import LoadOptions
    from service.engine.translator import load_translator

    entry = newest(store.scan(plan.folder / "store"))[NAME]
    # the sequence-to-sequence engine whatever task the import published it as (translation, text-to-text)
    engine = load_translator(entry, LoadOptions(providers=("cpu",), threads=plan.threads, variant=variant))

    def decode(src: list[list[int]], beam: int) -> list[list[int]]:
        hyps = engine.translate_ids(src, DecodeParams(beam_size=beam, max_new_tokens=plan.new_tokens))
        return [list(h[0].tokens) for h in hyps]

    return decode


def check_ct2_vocabulary(tokens: Sequence[str], converted: Sequence[str]) -> None:
    """CTranslate2's vocabulary must name every id as the checkpoint does, up to one it leaves out or
    adds: Marian's converter drops <pad> (the last id: its decoder starts from a zero embedding);
    T5's names the spare rows past the tokenizer (<extra_id_0..27> again). Neither row ever wins."""
    common = min(len(tokens), len(converted))
    if list(converted[:common]) != list(tokens[:common]) or common < len(tokens) - 1:
        raise RuntimeError("CTranslate2's vocabulary does not begin with the checkpoint's tokens")


def decode_ct2(plan: Plan, compute_type: str, workers: bool) -> Decode:
    import ctranslate2

    tokens = json.loads((plan.folder / "tokens.json").read_text())
    check_ct2_vocabulary(tokens, json.loads((plan.folder / "ct2" / "shared_vocabulary.json").read_text()))
    index = {t: i for i, t in enumerate(tokens)}
    translator = ctranslate2.Translator(
        str(plan.folder / "ct2"),
        device="cpu",
        compute_type=compute_type,
        inter_threads=plan.threads if workers else 1,
        intra_threads=1 if workers else plan.threads,
    )

    def decode(src: list[list[int]], beam: int) -> list[list[int]]:
        res = translator.translate_batch(
            [[tokens[i] for i in row] for row in src],
            beam_size=beam,
            num_hypotheses=1,
            min_decoding_length=plan.new_tokens,
            max_decoding_length=plan.new_tokens,
            max_batch_size=-(-len(src) // plan.threads) if workers else 0,
        )
        return [[index[t] for t in r.hypotheses[0]] for r in res]

    return decode


def _generate(model: object, plan: Plan, src: list[list[int]], beam: int) -> list[list[int]]:
    import torch

    ids = torch.tensor(src, dtype=torch.long)
    with torch.inference_mode():
        out = model.generate(  # type: ignore[attr-defined]
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            num_beams=beam,
            do_sample=False,
            min_new_tokens=plan.new_tokens,
            max_new_tokens=plan.new_tokens,
            use_cache=True,
        )
    return out[:, 1:].tolist()  # without the decoder start token


def decode_optimum(plan: Plan) -> Decode:
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    torch.set_num_threads(plan.threads)  # generate's search runs in torch
    options = ort.SessionOptions()
    options.intra_op_num_threads = plan.threads
    options.inter_op_num_threads = 1
    model = ORTModelForSeq2SeqLM.from_pretrained(
        plan.folder / "onnx", provider="CPUExecutionProvider", session_options=options, use_cache=True
    )
    return partial(_generate, model, plan)


def decode_hf(plan: Plan) -> Decode:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    torch.set_num_threads(plan.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(plan.folder / "hf").eval()
    return partial(_generate, model, plan)


RUNNERS: dict[str, Callable[[Plan], Decode]] = {
    "ours": partial(decode_ours, variant="fp32"),
    "ours-int8": partial(decode_ours, variant="int8"),
    "ct2": partial(decode_ct2, compute_type="float32", workers=False),
    "ct2-workers": partial(decode_ct2, compute_type="float32", workers=True),
    "ct2-int8": partial(decode_ct2, compute_type="int8", workers=False),
    "ct2-int8-workers": partial(decode_ct2, compute_type="int8", workers=True),
    "optimum": decode_optimum,
    "hf": decode_hf,
}
PACKAGES = {
    "ours": ("onnxruntime",),
    "ct2": ("ctranslate2",),
    "optimum": ("optimum-onnx", "onnxruntime", "transformers", "torch"),
    "hf": ("transformers", "torch"),
}


def run_tool(tool: str, plan: Plan) -> dict[str, object]:
    """One tool's cases in this (fresh) process: each timed, with the ids its last call generated
    (rounds check them alike) and the CPU seconds this process used per call (its threads' work,
    spinning included: on a shared machine the wall time also counts the others' turns)."""
    from importlib.metadata import version

    t0 = time.perf_counter()
    decode = RUNNERS[tool](plan)
    load = time.perf_counter() - t0
    cases = []
    for beam in plan.beams:
        for b, src in plan.sources.items():
            last: list[list[list[int]]] = []

            def call(src: list[list[int]] = src, beam: int = beam, last: list[list[list[int]]] = last) -> None:
                last.append(decode(src, beam))

            cpu0 = own_cpu_seconds()
            sec, runs, others = measure(call, plan.timing, plan.retries)
            cpu = (own_cpu_seconds() - cpu0) / len(last)
            case = {"batch": b, "beam": beam, "ids": last[-1], "seconds": sec, "runs": runs, "others_cpu": others}
            cases.append(case | {"cpu_seconds": cpu})
    family = tool.split("-")[0]
    return {
        "tool": tool,
        "load_seconds": load,
        "versions": {p: version(p) for p in PACKAGES[family]},
        "cases": cases,
    }


# ---------------------------------------------------------------------------------------------
# The parent: prepare once, every tool in a fresh process per round, tokens checked, medians
# ---------------------------------------------------------------------------------------------


def optimum_env(optimum_path: Path | None) -> dict[str, str]:
    env = offline_env()
    if optimum_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(optimum_path), env.get("PYTHONPATH", "")) if p)
    return env


def offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def default_optimum_path() -> Path | None:
    """The overlay `make bench` installs optimum-onnx into, when it is there."""
    if env := os.environ.get("BENCH_OPTIMUM_PATH"):
        return Path(env)
    path = Path(sys.prefix) / "optimum-onnx"
    return path if path.is_dir() else None


def prepare(s: ModelShape, work: Path, tools: Sequence[str], optimum_path: Path | None, family: Family) -> None:
    """The checkpoint, then each tool's own form of it made by the tool's own command (side by side:
    nothing is timed yet)."""
    t0 = time.perf_counter()
    (work / "tokens.json").write_text(json.dumps(family.build(s, work / "hf"), ensure_ascii=False))
    hf, families = str(work / "hf"), {t.split("-")[0] for t in tools}
    steps: dict[str, tuple[list[str], dict[str, str]]] = {}
    if "ours" in families:
        cmd = [sys.executable, "-m", "export.import_hf", hf, "--name", NAME, "--store", str(work / "store")]
        cmd += ["--version", "1", "--variants", "fp32"]
        if "ours-int8" in tools:  # static int8: activation scales from a few sentences of the tokenizer's words
            (work / "calibration.txt").write_text("\n".join(sentences(WORDS, 32)) + "\n")
            cmd[-1] = "fp32,int8"
            cmd += ["--calibration", str(work / "calibration.txt")]
        steps["export.import_hf"] = (cmd, offline_env())
    if "ct2" in families:
        converter = str(Path(sys.executable).parent / "ct2-transformers-converter")
        out = ["--output_dir", str(work / "ct2"), "--quantization", "float32"]
        steps["ct2-transformers-converter"] = ([converter, "--model", hf, *out], offline_env())
    if "optimum" in families:
        cmd = [sys.executable, "-m", "bench.same_model", "--export-optimum", str(work)]
        steps["Optimum's export"] = (cmd, optimum_env(optimum_path))
    running = {}
    for i, (what, (cmd, env)) in enumerate(steps.items()):
        log = (work / f"prepare-{i}.log").open("w")
        running[what] = (cmd, log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    failed = []
    for what, (cmd, log, proc) in running.items():
        proc.wait()
        log.close()
        if proc.returncode != 0:
            failed.append(f"{what} failed ({' '.join(cmd)}):\n{Path(log.name).read_text()[-4000:]}")
    if failed:
        raise RuntimeError("\n".join(failed))
    print(f"same model: checkpoint built, imported, converted, exported ({time.perf_counter() - t0:.1f} s)", flush=True)


def export_optimum(work: Path) -> None:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    ORTModelForSeq2SeqLM.from_pretrained(work / "hf", export=True, use_cache=True).save_pretrained(work / "onnx")


def in_fresh_process(tool: str, plan_path: Path, optimum_path: Path | None) -> dict[str, object]:
    cmd = [sys.executable, "-m", "bench.same_model", "--run", tool, "--plan", str(plan_path)]
    env = optimum_env(optimum_path) if tool == "optimum" else offline_env()
    done = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"same-model runner {tool} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def reference(tools: Sequence[str]) -> str:
    """The tool every other is compared with: this engine fp32, else the first fp32 tool there is."""
    return next(t for t in (*IDENTICAL, *tools) if t in tools)


def compare(ids: dict[str, dict[tuple[int, int], list[list[int]]]], new_tokens: int) -> list[dict[str, object]]:
    """Every tool's ids against the reference tool's: raises TokensDiffer when an fp32 tool's greedy
    tokens differ or a tool's lengths are not new_tokens; returns, per other tool and case, how
    many sentences are identical."""
    base = reference(list(ids))
    ref = ids[base]
    problems: list[str] = []
    agreement: list[dict[str, object]] = []
    for tool, cases in ids.items():
        for (b, beam), rows in cases.items():
            if bad := [i for i, r in enumerate(rows) if len(r) != new_tokens]:
                problems.append(f"{tool} batch {b} beam {beam}: sentences {bad[:5]} are not {new_tokens} tokens long")
            if tool == base:
                continue
            same = [r == o for r, o in zip(rows, ref[(b, beam)], strict=True)]
            agreement.append({"tool": tool, "batch": b, "beam": beam, "identical": sum(same), "sentences": len(same)})
            if beam == 1 and tool in IDENTICAL and not all(same):
                i = same.index(False)
                at = first_difference(rows[i], ref[(b, beam)][i])
                problems.append(
                    f"{tool} batch {b} greedy: {same.count(False)} of {len(same)} sentences differ from {base}; "
                    f"sentence {i} from step {at}: {base} {ref[(b, beam)][i][at : at + 6]}, "
                    f"{tool} {rows[i][at : at + 6]}"
                )
    if problems:
        raise TokensDiffer("greedy tokens are not identical across the tools:\n  " + "\n  ".join(problems))
    return agreement


def run(
    s: ModelShape,
    *,
    threads: int,
    batches: Sequence[int],
    beams: Sequence[int],
    src_len: int,
    new_tokens: int,
    timing: Timing,
    retries: int,
    rounds: int,
    work: Path,
    tools: Sequence[str] = TOOLS,
    optimum_path: Path | None = None,
    family: str = "marian",
) -> dict[str, object]:
    """The section's results: checkpoint, agreement, per (tool, batch, beam) the median over rounds."""
    prepare(s, work, tools, optimum_path, FAMILIES[family])
    sources = source_ids(s.vocab, batches, src_len, family=family)
    plan = Plan(str(work), threads, new_tokens, list(beams), sources, timing, retries)
    plan.save(work / "plan.json")
    samples: dict[tuple[str, int, int], list[dict[str, object]]] = {}
    versions: dict[str, dict[str, str]] = {}
    agreement: list[dict[str, object]] = []
    first: dict[str, dict[tuple[int, int], list[list[int]]]] = {}
    for r in range(rounds):
        print(f"same model, round {r + 1} of {rounds}", flush=True)
        outs = [in_fresh_process(t, work / "plan.json", optimum_path) for t in tools]
        ids = {str(o["tool"]): {(c["batch"], c["beam"]): c["ids"] for c in o["cases"]} for o in outs}  # type: ignore[attr-defined]
        agreement = compare(ids, new_tokens)  # before any speed is printed
        if r == 0:
            first = ids
            print(f"same model: greedy tokens identical across {', '.join(t for t in tools if t in IDENTICAL)}")
        elif ids != first:
            raise TokensDiffer(f"round {r + 1} decoded other tokens than round 1: a tool is not deterministic")
        for o in outs:
            versions[str(o["tool"])] = o["versions"]  # type: ignore[assignment]
            for c in o["cases"]:  # type: ignore[attr-defined]
                samples.setdefault((str(o["tool"]), c["batch"], c["beam"]), []).append(c)
                what = "greedy" if c["beam"] == 1 else f"beam {c['beam']}"
                print(
                    f"  {o['tool']:<12} batch {c['batch']:>3} {what:<7}: {c['seconds'] * 1e3:9.2f} ms "
                    f"({c['runs']} runs, {c['cpu_seconds']:.2f} CPU s a call){flag(c['others_cpu'])}",
                    flush=True,
                )
    rows = []
    for (tool, b, beam), cs in samples.items():
        sec = statistics.median(float(c["seconds"]) for c in cs)  # type: ignore[arg-type]
        shares = [float(c["others_cpu"]) for c in cs if c["others_cpu"] is not None]  # type: ignore[arg-type]
        rows.append(
            {
                "tool": tool,
                "batch": b,
                "beam": beam,
                "seconds": sec,
                "tokens_per_s": b * new_tokens / sec,
                "round_seconds": [c["seconds"] for c in cs],
                "cpu_seconds": statistics.median(float(c["cpu_seconds"]) for c in cs),  # type: ignore[arg-type]
                "others_cpu": statistics.median(shares) if shares else None,
            }
        )
    distinct = [len(set(r)) for (_, beam), rs in first[tools[0]].items() if beam == 1 for r in rs]
    return {
        "family": family,
        "shape": asdict(s),
        "src_len": src_len,
        "new_tokens": new_tokens,
        "threads": threads,
        "tools": list(tools),
        "rounds": rounds,
        "method": f"one random-weight {FAMILIES[family].title} checkpoint; each tool alone in a fresh process of its "
        "own, one after another, the same source ids, thread count, batch and beam sizes and exactly new_tokens new "
        "tokens (EOS never wins: its embedding row is zero; transformers min_new_tokens = max_new_tokens, "
        "CTranslate2 min_decoding_length = max_decoding_length, this engine max_new_tokens); "
        "warm-up, then the median of timed runs; repeated for each round, the median over rounds reported; greedy "
        "tokens of the fp32 tools checked identical before any speed is printed",
        "threading": {
            "ours": f"load_engine(threads={threads}): a batch as {threads} sentence shards on one-thread ORT sessions",
            "ct2": f"intra_threads={threads}, inter_threads=1",
            "ct2-workers": f"inter_threads={threads} × intra_threads=1, max_batch_size ⌈batch/{threads}⌉",
            "ct2-int8": "as ct2",
            "ct2-int8-workers": "as ct2-workers",
            "optimum": f"ORT intra_op_num_threads={threads}, torch.set_num_threads({threads})",
            "hf": f"torch.set_num_threads({threads})",
        },
        "versions": versions,
        "reference": reference(tools),
        "greedy_identical": [t for t in tools if t in IDENTICAL],
        "agreement": agreement,
        "distinct_tokens_per_sentence": statistics.median(distinct) if distinct else 0,
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def markdown(section: dict[str, object], cpu: str, cores: int | None) -> str:
    s = ModelShape(**section["shape"])  # type: ignore[arg-type]
    rows: list[dict] = section["rows"]  # type: ignore[assignment]
    threads = section["threads"]
    by = {(r["tool"], r["batch"], r["beam"]): r for r in rows}
    cases = sorted({(r["beam"], r["batch"]) for r in rows})
    head = [f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {b}" for beam, b in cases]
    tools: list[str] = section["tools"]  # type: ignore[assignment]
    how = [v for k, v in HOW.items() if any(t.split("-")[0] == k for t in tools)]
    out = [
        f"Same model, every tool: one random-weight {FAMILIES[str(section.get('family', 'marian'))].title} "
        f"checkpoint (d_model {s.d_model}, {s.heads} heads, "
        f"FFN {s.ffn}, {s.enc_layers}+{s.dec_layers} layers, vocabulary {s.vocab}) {', '.join(how)}. Greedy tokens "
        f"identical across {', '.join(section['greedy_identical'])} (checked before timing); "  # type: ignore[arg-type]
        f"{section['src_len']} source and {section['new_tokens']} new tokens per sentence.",
        f"Tokens/s (output tokens of the best hypothesis; in brackets this engine's tokens/s ÷ the tool's, at the "
        f"same precision); {threads} threads per tool, each tool alone in a fresh process of its own, one after "
        f"another, on {cores} cores ({cpu}); median of {section['rounds']} rounds.",
        "",
        "| tool | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for tool in (t for t in TOOLS if t in tools):
        ref_tool = "ours-int8" if tool in INT8 else "ours"
        cells = []
        for beam, b in cases:
            r, ref = by.get((tool, b, beam)), by.get((ref_tool, b, beam))
            if r is None:
                cells.append("–")
                continue
            ratio = f" ({ref['tokens_per_s'] / r['tokens_per_s']:.2f}×)" if ref and tool != ref_tool else ""
            dagger = " †" if any(x and (x.get("others_cpu") or 0) > CONTENDED for x in (r, ref)) else ""
            cells.append(f"{r['tokens_per_s']:,.0f}{ratio}{dagger}")
        out.append(f"| {LABELS[tool].format(t=threads)} | " + " | ".join(cells) + " |")
    out += layout_ratios(rows)
    if threads == 1:
        out += cpu_ratios(rows)
    out += agreement_notes(section)
    threading: dict[str, str] = section["threading"]  # type: ignore[assignment]
    out += ["", "Threads: " + "; ".join(f"{t}: {v}" for t, v in threading.items() if t in tools) + "."]
    if any((r.get("others_cpu") or 0) > CONTENDED for r in rows):
        out += ["", f"† measured while other processes used over {CONTENDED:.0%} of the CPUs: not a clean number."]
    return "\n".join(out)


CT2_LAYOUTS = {"fp32": ("ct2", "ct2-workers"), "int8": ("ct2-int8", "ct2-int8-workers")}


def layout_ratios(rows: list[dict]) -> list[str]:
    """The headline ratios: this engine ÷ CTranslate2 at whichever of its thread layouts was faster in
    that case, per precision; and int8 ÷ fp32 for each side (CTranslate2 at its faster layouts)."""
    speed = {(r["tool"], r["batch"], r["beam"]): r["tokens_per_s"] for r in rows}
    cases = sorted({(r["beam"], r["batch"]) for r in rows})

    def name(beam: int, b: int) -> str:
        return f"{'greedy' if beam == 1 else f'beam {beam}'} b{b}"

    def best(tools: Sequence[str], beam: int, b: int) -> float | None:
        found = [speed[(t, b, beam)] for t in tools if (t, b, beam) in speed]
        return max(found) if found else None

    out = []
    for precision, ours in (("fp32", "ours"), ("int8", "ours-int8")):
        cells = []
        for beam, b in cases:
            mine, theirs = speed.get((ours, b, beam)), best(CT2_LAYOUTS[precision], beam, b)
            if mine and theirs:
                cells.append(f"{name(beam, b)} {mine / theirs:.2f}×")
        if cells:
            out.append(f"This engine ÷ the faster CTranslate2 layout, {precision}: " + ", ".join(cells) + ".")
    for label, fp32, int8 in (
        ("this engine", ("ours",), ("ours-int8",)),
        ("CTranslate2 (faster layouts)", CT2_LAYOUTS["fp32"], CT2_LAYOUTS["int8"]),
    ):
        cells = []
        for beam, b in cases:
            f, i = best(fp32, beam, b), best(int8, beam, b)
            if f and i:
                cells.append(f"{name(beam, b)} {i / f:.2f}×")
        if cells:
            out.append(f"int8 ÷ fp32, {label}: " + ", ".join(cells) + ".")
    return ["", " ".join(out)] if out else []


def cpu_ratios(rows: list[dict]) -> list[str]:
    """On one thread the CPU seconds a process used per call are its work, however busy the machine
    was (no thread waits for another): this engine ÷ CTranslate2 in calls per CPU second, per precision."""
    cpu = {(r["tool"], r["batch"], r["beam"]): r.get("cpu_seconds") for r in rows}
    cases = sorted({(r["beam"], r["batch"]) for r in rows})
    out = []
    for precision, ours, theirs in (("fp32", "ours", "ct2"), ("int8", "ours-int8", "ct2-int8")):
        cells = [
            f"{'greedy' if beam == 1 else f'beam {beam}'} b{b} {t / m:.2f}×"
            for beam, b in cases
            if (m := cpu.get((ours, b, beam))) and (t := cpu.get((theirs, b, beam)))
        ]
        if cells:
            out.append(f"This engine ÷ CTranslate2 in CPU seconds a call, {precision}: " + ", ".join(cells) + ".")
    return ["", " ".join(out)] if out else []


def agreement_notes(section: dict[str, object]) -> list[str]:
    """Beam and int8 agreement with the reference tool, sentences counted over every batch size."""
    base = section["reference"]
    counts: dict[tuple[str, int], list[int]] = {}
    for a in section["agreement"]:  # type: ignore[attr-defined]
        n = counts.setdefault((a["tool"], a["beam"]), [0, 0])
        n[0] += a["identical"]
        n[1] += a["sentences"]
    out = []
    for beam in sorted({beam for _, beam in counts if beam > 1}):
        fp32 = {t: n for (t, k), n in counts.items() if k == beam and t not in INT8}
        same = [t for t, (i, n) in fp32.items() if i == n]
        parts = [f"identical to {base} for {', '.join(same)}"] if same else []
        parts += [f"{t} {i} of {n} sentences" for t, (i, n) in fp32.items() if i != n]
        if parts:
            out.append(f"Beam {beam}, best hypothesis: " + "; ".join(parts) + ".")
    int8 = [f"{t} {i} of {n} ({'greedy' if k == 1 else f'beam {k}'})" for (t, k), (i, n) in counts.items() if t in INT8]
    if int8:
        out.append(
            f"int8 rows, sentences whose tokens equal {base} fp32 (not required: quantization error against a "
            "random model's small logit margins): " + ", ".join(int8) + "."
        )
    return ["", " ".join(out)] if out else []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/same_model.py", description="internal: bench.engine's same-model mode")
    p.add_argument("--run", choices=TOOLS, help="decode and time every case of --plan, answer JSON on stdout")
    p.add_argument("--plan", type=Path)
    p.add_argument("--export-optimum", type=Path, metavar="WORK", help="export WORK/hf with Optimum to WORK/onnx")
    args = p.parse_args(argv)
    if args.export_optimum:
        export_optimum(args.export_optimum)
        return 0
    if not args.run or not args.plan:
        p.error("--run TOOL --plan FILE, or --export-optimum WORK")
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the libraries print goes to stderr; stdout carries the JSON answer only
    result = run_tool(args.run, Plan.load(args.plan))
    answer.write(json.dumps(result))
    answer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
