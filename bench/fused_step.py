"""The decoder step before and after the fused in-place self-attention (IO contract 4 vs 5), same weights.

    python -m bench.fused_step                  # bench shape (d 256, 4 heads, FFN 1024, 3+3 layers, vocab 8000)
    python -m bench.fused_step --variant int8   # both graphs quantized as publish does (static, calibrated here)
    python -m bench.fused_step --profile        # also: where contract 5's step spends its time, by operator
    python -m bench.fused_step --tiny           # a smoke run

One random-weight `export.model.Translator` is exported twice in fp32: with contract 4's decoder
step (the step returns each row's new key and value, the caller scatters them into its cache, the
graph masks unused slots with a bias) and with contract 5's (`export.fused`: GroupQueryAttention
writes the new slot itself, the cache bound to its present output by IO binding). Each case decodes
`--steps` positions for R rows from position 0 with a cache of 32 slots and a source of 24 tokens,
exactly as `RunningBatch.step` calls the runtime (the scatter included where the graph returns new
keys); both graphs alternate within every round in this one process, on one intra-op thread, so
what else runs on the machine falls on both alike; the median round is reported, with the
log-probabilities of both graphs compared at every step.
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

from export.graphs import _export, translator_io, write_translator
from export.model import Translator, TranslatorConfig
from export.quantize import make_int8
from service.contract import graphs as io
from service.contract.manifest import TensorSpec
from service.engine.runtime import TranslatorRuntime, make_session


class _UnfusedStep(nn.Module):
    """Contract 4's decoder step: the new keys and values come out, the caller writes them."""

    def __init__(self, model: Translator) -> None:
        super().__init__()
        self.model, self.n = model, len(model.layers)

    def forward(self, input_ids: Tensor, position_ids: Tensor, encoder_attention_mask: Tensor, *kv: Tensor) -> tuple:
        cache = [(kv[2 * i], kv[2 * i + 1]) for i in range(self.n)]
        cross = [(kv[2 * self.n + 2 * i], kv[2 * self.n + 2 * i + 1]) for i in range(self.n)]
        logits, new, w = self.model.decode_step(input_ids, position_ids, cache, cross, encoder_attention_mask)
        return (torch.log_softmax(logits, -1), *[t for pair in new for t in pair], w)


def export_both(model: Translator, folder: Path) -> tuple[Path, Path, Path]:
    """(encoder, contract-4 decoder, contract-5 decoder)."""
    roles = write_translator(model, folder)
    spec = translator_io(model)["decoder"]
    n, h, dk = len(model.layers), model.config.n_heads, model.config.d_model // model.config.n_heads
    new_kv = [TensorSpec(name=x, dtype="float32", shape=["batch", h, 1, dk]) for x in io.new_kv_names(n)]
    outs = [spec.outputs[0], *new_kv]
    spec = spec.model_copy(update={"outputs": [*outs, spec.outputs[-1]]})
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
        mask = (ids != 0).long()
        cross = [t for kv in model.cross_kv(model.encode(ids, mask)) for t in kv]
        cache = [torch.zeros(2, h, 4, dk) for _ in range(2 * n)]
        args = (torch.tensor([[15], [16]]), torch.tensor([3, 2]), mask, *cache, *cross)
        _export(_UnfusedStep(model), args, spec, folder / "decoder4.onnx")
    return folder / roles["encoder"], folder / "decoder4.onnx", folder / roles["decoder"]


def decode(
    rt: TranslatorRuntime, rows: int, steps: int, source: int, slots: int, record: list[dict] | None = None
) -> tuple[float, list[np.ndarray]]:
    """Seconds for `steps` decoder steps of `rows` rows from position 0, and each step's
    log-probabilities; `record` collects each step's inputs (int8 calibration)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, size=(rows, source)).astype(np.int64)
    mask = np.ones_like(ids)
    cross = rt.encode(ids, mask)
    cache = [np.zeros((rows, rt.heads, slots, rt.d_k), np.float32) for _ in range(2 * rt.n_layers)]
    binding = rt.binding()
    tokens = np.full(rows, 1, np.int64)
    every = np.arange(rows)
    out = []
    t0 = time.perf_counter()
    for t in range(steps):
        positions = np.full(rows, t, np.int64)
        if record is not None:
            feed = {io.INPUT_IDS: tokens[:, None], io.POSITION_IDS: positions, io.ENCODER_ATTENTION_MASK: mask}
            feed.update({name: c.copy() for name, c in zip(rt.cache_names, cache, strict=True)})
            record.append({**feed, **dict(zip(rt.cross_names, cross, strict=True))})
        step = rt.decode(tokens, positions, mask, cache, cross, binding=binding)
        if not step.written:
            for buf, new in zip(cache, step.new_kv, strict=True):
                buf[every, :, positions] = new[:, :, 0]
        tokens = step.logprobs.argmax(axis=1).astype(np.int64)
        out.append(step.logprobs.copy())
    return time.perf_counter() - t0, out


def profile(path: Path, encoder: ort.InferenceSession, layers: int, rows: int) -> str:
    """ONNX Runtime's own profile of 24 steps of `rows` rows: each operator type's share of the
    kernel time, and the share of the whole step that no kernel took (the runtime and Python)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.enable_profiling = 1, True
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    rt = TranslatorRuntime(encoder, ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]), layers)
    wall, _ = decode(rt, rows, 24, 24, 32)
    trace = Path(rt.decoder.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    by_op: Counter[str] = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
    kernels = sum(by_op.values()) / 1e6
    lines = [f"{path.name}, {rows} rows: {1000 * wall / 24:.2f} ms per step, kernels {100 * kernels / wall:.0f} %"]
    lines += [f"  {op:24s} {100 * us / 1e6 / wall:5.1f} %" for op, us in by_op.most_common(12)]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--rows", default="1,32")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--variant", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--profile", action="store_true", help="first, where contract 5's step spends its time, by operator")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fused_step.json")
    args = p.parse_args()
    torch.manual_seed(0)
    shape = dict(d_model=64, n_heads=4, d_ff=128, n_layers=2, n_dec_layers=2, vocab_size=500)
    if not args.tiny:
        shape = dict(d_model=256, n_heads=4, d_ff=1024, n_layers=3, n_dec_layers=3, vocab_size=8000)
    model = Translator(TranslatorConfig(**shape, max_len=64, dropout=0.0)).eval()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        enc, dec4, dec5 = export_both(model, Path(tmp))
        cpu, layers = ["CPUExecutionProvider"], len(model.layers)
        encoder = make_session(enc.read_bytes(), cpu, 1, spin=False)
        graphs = {"contract 4": dec4, "contract 5": dec5}
        if args.variant == "int8":  # static int8 as publish makes it, calibrated on this bench's own steps
            feeds: list[dict] = []
            decode(TranslatorRuntime(encoder, make_session(dec5.read_bytes(), cpu, 1), layers), 8, 8, 24, 32, feeds)
            for name, path in list(graphs.items()):
                graphs[name] = path.with_suffix(".int8.onnx")
                make_int8(path, graphs[name], feeds)
        runtimes = {
            name: TranslatorRuntime(encoder, make_session(path.read_bytes(), cpu, 1), layers)
            for name, path in graphs.items()
        }
        if args.profile:
            print(profile(graphs["contract 5"], encoder, layers, max(int(r) for r in args.rows.split(","))))
        for rows in [int(r) for r in args.rows.split(",")]:
            times: dict[str, list[float]] = {name: [] for name in runtimes}
            worst = 0.0
            for _ in range(args.rounds + 1):  # the first round warms up
                outs = {}
                for name, rt in runtimes.items():
                    seconds, outs[name] = decode(rt, rows, args.steps, 24, 32)
                    times[name].append(seconds)
                worst = max(worst, max(float(np.abs(a - b).max()) for a, b in zip(*outs.values(), strict=True)))
            ms = {name: 1000 * statistics.median(t[1:]) / args.steps for name, t in times.items()}
            speedup = ms["contract 4"] / ms["contract 5"]
            row = {"rows": rows, "ms_per_step": ms, "speedup": speedup, "max_abs_diff": worst}
            results.append(row)
            print(
                f"rows {rows:3d}: contract 4 {ms['contract 4']:.3f} ms/step, "
                f"contract 5 {ms['contract 5']:.3f} ms/step, {speedup:.2f}x; log-probabilities within {worst:.1e}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"variant": args.variant, "steps": args.steps, "rounds": args.rounds, "threads": 1, "rows": results}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
