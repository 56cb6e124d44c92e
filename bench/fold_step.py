"""The decoder step with the cross-attention per row and folded per sentence (IO contract 5 vs 6), same weights.

    python -m bench.fold_step                   # bench shape (d 256, 4 heads, FFN 1024, 3+3 layers, vocab 8000)
    python -m bench.fold_step --variant int8    # both graphs quantized as publish does (static, calibrated here)
    python -m bench.fold_step --profile         # also: where contract 6's step spends its time, by operator
    python -m bench.fold_step --tiny            # a smoke run

One random-weight `export.model.Translator` is exported twice in fp32: with contract 5's decoder
step (every row brings its own copy of its sentence's cross-attention keys and values) and with
contract 6's (each sentence's once; its rows' queries folded into one product over them). Each case
decodes `--steps` positions for N sentences of W rows each (`--layouts NxW`) from position 0, a
cache of 32 slots and a source of 24 tokens, both graphs bound as `StepBinding` binds them (the
cache written in place); both alternate within every round in this one process, on one intra-op
thread, so what else runs on the machine falls on both alike; the median round is reported, with
the log-probabilities of both graphs compared at every step. The per-row graph also pays, outside
the step, for writing each sentence's keys once per row when it joins (not timed here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import Tensor, nn

from export.graphs import export_graph, translator_io, write_translator
from export.model import Translator, TranslatorConfig
from export.quantize import make_int8
from service.contract import graphs as io
from service.contract.manifest import TensorSpec
from service.engine.runtime import make_session

Feed = dict[str, np.ndarray]


class _PerRowStep(nn.Module):
    """Contract 5's decoder step: cross-attention K/V and source mask per row."""

    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model, self.n = model, len(model.layers)

    def forward(self, input_ids: Tensor, position_ids: Tensor, encoder_attention_mask: Tensor, *kv: Tensor) -> tuple:
        cache = [(kv[2 * i], kv[2 * i + 1]) for i in range(self.n)]
        cross = [(kv[2 * self.n + 2 * i], kv[2 * self.n + 2 * i + 1]) for i in range(self.n)]
        logits, present, w = self.model.decode_step(
            input_ids, position_ids, cache, cross, encoder_attention_mask, in_place=True
        )
        return (torch.log_softmax(logits, -1), *[t for pair in present for t in pair], w)


def export_both(model: Translator, folder: Path) -> tuple[Path, Path, Path]:
    """(encoder, contract-5 decoder, contract-6 decoder)."""
    roles = write_translator(model, folder)
    spec = translator_io(model)["decoder"]
    n, h, dk = len(model.layers), model.config.n_heads, model.config.d_model // model.config.n_heads
    per_row = [
        TensorSpec(name=t.name, dtype=t.dtype, shape=["batch", *t.shape[1:]])
        for t in spec.inputs
        if t.name not in (io.FOLD, io.UNFOLD)
    ]
    weights = TensorSpec(name=io.CROSS_ATTENTIONS, dtype="float32", shape=["batch", n, h, "source"])
    spec = spec.model_copy(update={"inputs": per_row, "outputs": [*spec.outputs[:-1], weights]})
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
        mask = (ids != 0).long()
        cross = [t for kv in model.cross_kv(model.encode(ids, mask)) for t in kv]
        cache = [torch.zeros(2, h, 4, dk) for _ in range(2 * n)]
        args = (torch.tensor([[15], [16]]), torch.tensor([3, 2]), mask, *cache, *cross)
        export_graph(_PerRowStep(model), args, spec, folder / "decoder5.onnx", contrib=True)
    return folder / roles["encoder"], folder / "decoder5.onnx", folder / roles["decoder"]


def decode(
    encoder: ort.InferenceSession,
    decoder: ort.InferenceSession,
    layers: int,
    sentences: int,
    width: int,
    steps: int,
    record: list[Feed] | None = None,
) -> tuple[float, list[np.ndarray]]:
    """Seconds for `steps` decoder steps of `sentences` x `width` rows from position 0, bound as
    the service binds them (contract 5: each sentence's K/V copied into its rows), and each
    step's log-probabilities; `record` collects each step's inputs (int8 calibration)."""
    folded = io.FOLD in {i.name for i in decoder.get_inputs()}
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, size=(sentences, 24)).astype(np.int64)
    mask = np.ones_like(ids)
    cross = encoder.run(io.cross_names(layers), {io.INPUT_IDS: ids, io.ATTENTION_MASK: mask})
    rows = sentences * width
    if not folded:
        cross, mask = [np.repeat(c, width, axis=0) for c in cross], np.repeat(mask, width, axis=0)
    shape = (rows, cross[0].shape[1], 32, cross[0].shape[3])
    cache = [np.zeros(shape, np.float32) for _ in range(2 * layers)]
    tokens = np.ones((rows, 1), np.int64)
    positions = np.zeros(rows, np.int64)
    logprobs = np.zeros((rows, int(decoder.get_outputs()[0].shape[1])), np.float32)
    bound = io_binding = decoder.io_binding()
    feed: Feed = {io.INPUT_IDS: tokens, io.POSITION_IDS: positions, io.ENCODER_ATTENTION_MASK: mask}
    if folded:
        feed[io.FOLD], feed[io.UNFOLD] = io.fold_indices(range(0, rows, width), [width] * sentences)
    feed |= dict(zip(io.cross_names(layers), cross, strict=True))
    held = [ort.OrtValue.ortvalue_from_numpy(a) for a in feed.values()]
    for name, value in zip(feed, held, strict=True):
        bound.bind_ortvalue_input(name, value)
    for name, out_name, c in zip(io.cache_names(layers), io.present_names(layers), cache, strict=True):
        held.append(ort.OrtValue.ortvalue_from_numpy(c))
        io_binding.bind_ortvalue_input(name, held[-1])
        io_binding.bind_ortvalue_output(out_name, held[-1])
    held.append(ort.OrtValue.ortvalue_from_numpy(logprobs))
    io_binding.bind_ortvalue_output(io.LOGPROBS, held[-1])
    out = []
    t0 = time.perf_counter()
    for t in range(steps):
        positions[:] = t
        if record is not None:
            record.append({**feed, **{name: c.copy() for name, c in zip(io.cache_names(layers), cache, strict=True)}})
        decoder.run_with_iobinding(io_binding)
        tokens[:, 0] = logprobs.argmax(axis=1)
        out.append(logprobs.copy())
    return time.perf_counter() - t0, out


def profile(path: Path, encoder: ort.InferenceSession, layers: int, sentences: int, width: int) -> str:
    """ONNX Runtime's own profile of 24 steps: each operator type's share of the kernel time, and
    the share of the whole step that no kernel took (the runtime and Python)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.enable_profiling = 1, True
    decoder = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    wall, _ = decode(encoder, decoder, layers, sentences, width, 24)
    trace = Path(decoder.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    by_op: Counter[str] = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
    kernels = sum(by_op.values()) / 1e6
    share = 100 * kernels / wall
    head = f"{path.name}, {sentences}x{width} rows: {1000 * wall / 24:.2f} ms/step, kernels {share:.0f} %"
    return "\n".join([head, *[f"  {op:24s} {100 * us / 1e6 / wall:5.1f} %" for op, us in by_op.most_common(12)]])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--layouts", default="1x4,16x4,32x2,64x1", help="sentences x rows each")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--variant", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--profile", action="store_true", help="first, where contract 6's step spends its time")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fold_step.json")
    args = p.parse_args()
    torch.manual_seed(0)
    shape = dict(d_model=64, n_heads=4, d_ff=128, n_layers=2, n_dec_layers=2, vocab_size=500)
    if not args.tiny:
        shape = dict(d_model=256, n_heads=4, d_ff=1024, n_layers=3, n_dec_layers=3, vocab_size=8000)
    model = Translator(TranslatorConfig(**shape, max_len=64, dropout=0.0)).eval()
    layouts = [tuple(int(x) for x in layout.split("x")) for layout in args.layouts.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        enc, dec5, dec6 = export_both(model, Path(tmp))
        cpu, layers = ["CPUExecutionProvider"], len(model.layers)
        encoder = make_session(enc.read_bytes(), cpu, 1, spin=False)
        graphs = {"contract 5": dec5, "contract 6": dec6}
        if args.variant == "int8":  # static int8 as publish makes it, each graph calibrated on its own steps
            for name, path in list(graphs.items()):
                feeds: list[Feed] = []
                decode(encoder, make_session(path.read_bytes(), cpu, 1), layers, 4, 2, 8, feeds)
                graphs[name] = path.with_suffix(".int8.onnx")
                make_int8(path, graphs[name], feeds)
        decoders = {name: make_session(path.read_bytes(), cpu, 1) for name, path in graphs.items()}
        if args.profile:
            print(profile(graphs["contract 6"], encoder, layers, *max(layouts, key=lambda s: s[0] * s[1])))
        for sentences, width in layouts:
            times: dict[str, list[float]] = {name: [] for name in decoders}
            worst = 0.0
            for _ in range(args.rounds + 1):  # the first round warms up
                outs = {}
                for name, dec in decoders.items():
                    seconds, outs[name] = decode(encoder, dec, layers, sentences, width, args.steps)
                    times[name].append(seconds)
                worst = max(worst, max(float(np.abs(a - b).max()) for a, b in zip(*outs.values(), strict=True)))
            ms = {name: 1000 * statistics.median(t[1:]) / args.steps for name, t in times.items()}
            speedup = ms["contract 5"] / ms["contract 6"]
            row = {"sentences": sentences, "width": width, "ms_per_step": ms, "speedup": speedup, "max_abs_diff": worst}
            results.append(row)
            print(
                f"{sentences:3d} x {width}: contract 5 {ms['contract 5']:.3f} ms/step, "
                f"contract 6 {ms['contract 6']:.3f} ms/step, {speedup:.2f}x; log-probabilities within {worst:.1e}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"variant": args.variant, "steps": args.steps, "rounds": args.rounds, "threads": 1, "layouts": results}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
