"""GPU check: fp16 against fp32 on the CUDA provider, for the bundled models (parity, then speed).

    python bench/gpu_check.py [--store model_store] [--out bench/results/gpu_check.json]

    # in the GPU image, with this file mounted (the image carries no bench/):
    docker run --rm --gpus all -v "$PWD/bench:/bench:ro" transformer-serve:gpu \
        python /bench/gpu_check.py --store /app/model_store --out /tmp/gpu_check.json

Without an NVIDIA GPU and onnxruntime-gpu it prints why it could not run and exits 0. With them,
for each model:

- parity against a CPU-provider reference: fp32 when the store ships it, else fp16 (the bundled
  store ships int8 + fp16 only, so there the check compares the same fp16 graph on CUDA and CPU;
  for fp16-against-fp32 parity point --store at an export with fp32 too, e.g.
  `python -m export.publish runs/en-de --name en-de --store STORE --variants fp32,int8,fp16`).
  Classifier probabilities and labels; translator first-step log-probs and whole greedy and beam-4
  token sequences (the beam path exercises the cache reorder), for CUDA fp32 (when
  shipped) and CUDA fp16. A bound missed -> exit 1.
- throughput: texts/s and generated tokens/s at batch 1 and 32, reference included.
- where a translator's running batch keeps its cache (`cache_on_gpu`): on CUDA it must stay in
  GPU memory (`service.engine.device`), not cross to the host every step; a failure otherwise.

`--device cpu` runs the same code on the CPU provider only (a smoke test of this script, used by
tests/test_deploy.py; its numbers say nothing about GPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.engines import newest
from service.contract.graphs import pad
from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.device import DeviceBuffers
from service.engine.running import RunningBatch
from service.engine.translator import TranslatorEngine, load_translator
from service.errors import InputTooLong
from service.store import StoreEntry

Engine = ClassifierEngine | TranslatorEngine

# Bounds against the CPU reference, by the variant on the device. fp32 on CUDA differs only by
# kernel summation order; fp16 carries a 10-bit mantissa, so a near-tie may flip an argmax and
# change the rest of a sentence.
BOUNDS = {
    "fp32": {
        "prob_max_abs": 1e-4,
        "label_agree": 1.0,
        "logprob_max_abs": 1e-3,
        "greedy_exact": 0.99,
        "beam4_exact": 0.99,
    },
    "fp16": {
        "prob_max_abs": 2e-2,
        "label_agree": 0.98,
        "logprob_max_abs": 5e-2,
        "greedy_exact": 0.85,
        "beam4_exact": 0.8,
    },
}

TEXTS = [
    "What a wonderful, moving film.",
    "The update broke everything and support never answered.",
    "It was fine, nothing special.",
    "Open the file.",
    "Save the document as PDF.",
    "Close all windows and quit the application.",
    "The printer is not connected.",
    "Do you want to overwrite the existing file?",
    "Select a folder to import the pictures from.",
    "I loved the soundtrack but the story dragged on forever.",
    "Cannot read the configuration file.",
    "The download finished in under a minute.",
    "Show hidden files",
    "Please enter a valid e-mail address.",
    "This is the worst purchase I have ever made.",
    "Remove the selected items from the list?",
]


@dataclass(frozen=True)
class Setup:
    label: str  # "cpu-fp32", "cuda-fp32", "cuda-fp16"
    providers: tuple[str, ...]
    variant: str


def unavailable_reason(device: str) -> str | None:
    """Why the check cannot run here, or None."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return f"onnxruntime is not importable ({exc})"
    if device == "cpu":
        return None
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        return (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (providers: {', '.join(available)}); "
            "install onnxruntime-gpu instead of onnxruntime (the GPU image has it)"
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("model_store"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu_check.json"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per timed case")
    parser.add_argument("--repeat", type=int, default=4, help="copies of the built-in texts per parity batch")
    args = parser.parse_args(argv)

    reason = unavailable_reason(args.device)
    if reason is not None:
        print(f"gpu_check: could not run: {reason}. Nothing was checked; exiting 0.")
        return 0

    from service import store

    accel = ("cuda", "cpu") if args.device == "cuda" else ("cpu",)
    entries = newest(store.scan(args.store))
    if not entries:
        print(f"gpu_check: FAILED: no model in {args.store}")
        return 1
    models: dict[str, object] = {}
    failures: list[str] = []
    for name, entry in sorted(entries.items()):
        if entry.manifest is None:
            failures.append(f"{name}: not loadable: {entry.error}")
            continue
        setups = plan(entry.manifest.variants, args.device, accel)
        if setups is None:
            failures.append(f"{name}/{entry.version}: no fp16 variant (the GPU image and overlay serve fp16)")
            continue
        engines = load_all(entry, setups, need_cuda=args.device == "cuda")
        if engines is None:
            print("gpu_check: could not run: the CUDA provider did not initialise (no usable GPU?); exiting 0.")
            return 0
        ref = engines[setups[0].label]
        seqs = fitting(ref, TEXTS) * args.repeat
        if not seqs:
            failures.append(f"{name}: none of the built-in texts fits its max_source_tokens")
            continue
        print(f"{name}/{entry.version} ({ref.manifest.task}), {len(seqs)} texts, reference {setups[0].label}")
        results = compare(engines, setups, seqs, args.min_time)
        for s in setups[1:]:
            failures += check(f"{name} {s.label}", results[s.label], BOUNDS[s.variant])
            if (device := buffers_device(engines[s.label])) is not None:
                results[s.label]["cache_on_gpu"] = device == "cuda"
                if args.device == "cuda" and device != "cuda":
                    failures.append(
                        f"{name} {s.label}: the running batch's cache is in {device} memory (crosses every step)"
                    )
        models[name] = {"version": entry.version, "texts": len(seqs), "reference": setups[0].label, **results}

    report = {"device": args.device, "store": str(args.store), "bounds": BOUNDS, "models": models, "failures": failures}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for f in failures:
        print(f"FAIL {f}")
    print(f"gpu_check: {'FAILED' if failures else 'passed'} ({args.device}); report: {args.out}")
    return 1 if failures else 0


def plan(variants: Collection[str], device: str, accel: tuple[str, ...]) -> list[Setup] | None:
    """The reference (CPU, fp32 when shipped, else fp16: the bundled store ships int8 + fp16), then
    every fp32/fp16 variant on the device; None without fp16."""
    if "fp16" not in variants:
        return None
    ref_variant = "fp32" if "fp32" in variants else "fp16"
    ref = Setup(f"cpu-{ref_variant}", ("cpu",), ref_variant)
    others = [Setup(f"{device}-{v}", accel, v) for v in ("fp32", "fp16") if v in variants]
    return [ref, *(s for s in others if s.label != ref.label)]


def load_all(entry: StoreEntry, setups: Sequence[Setup], need_cuda: bool) -> dict[str, Engine] | None:
    """One engine per setup; None when a CUDA setup silently fell back to the CPU provider."""
    from service.engine import runtime
    from service.engine.runtime import LoadOptions

    engines: dict[str, Engine] = {}
    for s in setups:
        load = load_classifier if entry.require_manifest().task == "classification" else load_translator
        engine: Engine = load(entry, LoadOptions(providers=s.providers, variant=s.variant))
        session = engine.session if isinstance(engine, ClassifierEngine) else engine.rt.decoder
        if need_cuda and "cuda" in s.providers and not runtime.uses_cuda(session):
            return None
        engines[s.label] = engine
    return engines


def compare(
    engines: dict[str, Engine], setups: Sequence[Setup], seqs: list[list[int]], min_s: float
) -> dict[str, dict[str, float]]:
    """Parity against the first setup (CPU fp32), then throughput, for every other setup."""

    ref = engines[setups[0].label]
    out: dict[str, dict[str, float]] = {}
    if isinstance(ref, ClassifierEngine):
        out[setups[0].label] = report_line(setups[0].label, {}, throughput(ClassifyRun(ref), seqs, min_s))
        p_ref = ref.classify_ids(seqs)
        for s in setups[1:]:
            clf = engines[s.label]
            assert isinstance(clf, ClassifierEngine)
            p = clf.classify_ids(seqs)
            parity = {
                "prob_max_abs": float(np.abs(p - p_ref).max()),
                "label_agree": float((p.argmax(1) == p_ref.argmax(1)).mean()),
            }
            out[s.label] = report_line(s.label, parity, throughput(ClassifyRun(clf), seqs, min_s))
        return out
    assert isinstance(ref, TranslatorEngine)
    out[setups[0].label] = report_line(setups[0].label, {}, throughput(TranslateRun(ref, 1), seqs, min_s))
    runs = {name: TranslateRun(ref, beam) for name, beam in (("greedy", 1), ("beam4", 4))}
    refs = {name: run.best(seqs) for name, run in runs.items()}
    step_ref = first_step(ref, seqs)
    for s in setups[1:]:
        mt = engines[s.label]
        assert isinstance(mt, TranslatorEngine)
        parity = {"logprob_max_abs": float(np.abs(first_step(mt, seqs) - step_ref).max())}
        for name, run in runs.items():
            got = TranslateRun(mt, run.params.beam_size).best(seqs)
            parity[f"{name}_exact"] = float(np.mean([a == b for a, b in zip(got, refs[name], strict=True)]))
        out[s.label] = report_line(s.label, parity, throughput(TranslateRun(mt, 1), seqs, min_s))
    return out


def buffers_device(engine: Engine) -> str | None:
    """Where a translator's running batch keeps its cache after a step ("cuda": it never crosses
    to the host; "host": numpy buffers), None for a classifier."""
    if not isinstance(engine, TranslatorEngine):
        return None
    batch = engine.new_batch()
    try:
        batch.join([[5, 6, engine.eos_id]], [engine.search(TranslateRun(engine, 4).params)], [0])
        batch.step()
        if isinstance(batch, RunningBatch) and isinstance(batch.buf, DeviceBuffers):  # sharded: CPU, host buffers
            return batch.buf.ops.device
        return "host"
    finally:
        batch.close()


@dataclass(frozen=True)
class ClassifyRun:
    engine: ClassifierEngine

    def __call__(self, chunk: list[list[int]]) -> int:
        return len(self.engine.classify_ids(chunk))  # texts


class TranslateRun:
    def __init__(self, engine: TranslatorEngine, beam_size: int) -> None:
        from service.engine.decoding import DecodeParams

        self.engine = engine
        self.params = DecodeParams(beam_size=beam_size, max_new_tokens=min(64, engine.max_new_tokens))

    def best(self, chunk: list[list[int]]) -> list[tuple[int, ...]]:
        return [h[0].tokens for h in self.engine.translate_ids(chunk, self.params)]

    def __call__(self, chunk: list[list[int]]) -> int:
        return sum(len(t) + 1 for t in self.best(chunk))  # generated tokens, EOS included


def throughput(run: ClassifyRun | TranslateRun, seqs: list[list[int]], min_s: float) -> dict[str, float]:
    """texts/s at batch 1 and 32 (and generated tokens/s for a translator), median of timed runs."""
    speed = {}
    for batch in (1, 32):
        chunk = (seqs * 32)[:batch]
        run(chunk)  # warm-up
        times: list[float] = []
        count, start = 0, time.perf_counter()
        while len(times) < 3 or time.perf_counter() - start < min_s:
            t = time.perf_counter()
            count = run(chunk)
            times.append(time.perf_counter() - t)
        sec = float(np.median(times))
        speed[f"batch{batch}_texts_per_s"] = round(batch / sec, 1)
        if isinstance(run, TranslateRun):
            speed[f"batch{batch}_tokens_per_s"] = round(count / sec, 1)
    return speed


def report_line(label: str, parity: dict[str, float], speed: dict[str, float]) -> dict[str, float]:
    print(f"  {label}: {fmt(parity) or 'reference'} | {fmt(speed)}")
    return {**parity, **speed}


def fitting(engine: Engine, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of the texts this model accepts (a tiny test model takes fewer tokens)."""
    out: list[list[int]] = []
    for text in texts:
        with contextlib.suppress(InputTooLong):
            out += engine.encode([text])
    return out


def first_step(engine: TranslatorEngine, seqs: list[list[int]]) -> np.ndarray:
    """(B, V) log-probs of the first decoder step after BOS: the logits-level comparison."""
    rt, n = engine.rt, len(seqs)
    ids, mask = pad(seqs, engine.pad_id)
    cross = rt.encode(ids, mask)
    cache = [np.zeros((n, rt.heads, 1, rt.d_k), np.float32)] * (2 * rt.n_layers)  # one slot, unused at position 0
    bos, first = np.full(n, engine.bos_id, dtype=np.int64), np.zeros(n, dtype=np.int64)
    return np.asarray(rt.decode(bos, first, mask, cache, cross).logprobs, dtype=np.float64)


def check(what: str, values: dict[str, float], bounds: dict[str, float]) -> list[str]:
    out = []
    for key, bound in bounds.items():
        if key not in values:
            continue
        value = values[key]
        if value > bound if key.endswith("max_abs") else value < bound:
            out.append(f"{what}: {key} = {value:.4g}, bound {bound}")
    return out


def fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in values.items())


if __name__ == "__main__":
    sys.exit(main())
