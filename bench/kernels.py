"""Kernel choices of the decoder step, measured in ONNX Runtime on this CPU (a report, not a test).

    python -m bench.kernels [--threads 1] [--rows 1,128]

Why: at batch 32 with beam 4 (128 rows) one decoder step spends about a third of its time in
the six attentions (one query per row over at most a few dozen keys: 512 tiny GEMMs each), and
at batch 1 the step is mostly per-operator overhead. This measures the alternatives ONNX Runtime
offers on CPU, each against the graph the engine runs now, same inputs, same process:
- attention of one query per row and head (R rows, 4 heads, d_k 64, 24 keys): the exported
  composite (FusedMatMul with transposed K and scale, mask add, Softmax, MatMul) against
  com.microsoft.MultiHeadAttention with the keys given per head, and against Mul + ReduceSum;
- a weight MatMul (256 -> 1024, the FFN's first): fp32, static int8 QDQ as shipped (per-channel
  weights, a fixed activation scale), and 8-bit weight-only MatMulNBits (block 128, activations
  quantized per block at accuracy level 4).
Prints the median time of each and its ratio to the current choice (< 1: faster).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

H, D, S, E, FF = 4, 64, 24, 256, 1024
FLOAT, INT64, INT32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def session(nodes: list, inputs: list, inits: list, threads: int) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", FLOAT, None)], inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def median_us(fn: Callable[[], object], rounds: int = 5, runs: int = 200) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        times.append((time.perf_counter() - t0) / runs * 1e6)
    return statistics.median(times)


def attention_cases(r: int, threads: int, rng: np.random.Generator) -> dict[str, Callable[[], object]]:
    vi = helper.make_tensor_value_info
    q = rng.standard_normal((r, 1, E), np.float32)
    k, v = rng.standard_normal((2, r, H, S, D), np.float32)
    mask = np.ones((r, S), np.int32)
    mask[:, S - 4 :] = 0
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)
    kv = [vi("k", FLOAT, [r, H, S, D]), vi("v", FLOAT, [r, H, S, D])]
    shapes = [
        numpy_helper.from_array(np.array([r, 1, H, D], np.int64), "sq"),
        numpy_helper.from_array(np.array([r, 1, E], np.int64), "so"),
    ]
    head_q = [
        helper.make_node("Reshape", ["q", "sq"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
    ]
    head_out = [
        helper.make_node("Transpose", ["o4"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "so"], ["y"]),
    ]
    composite = session(
        [
            *head_q,
            helper.make_node("FusedMatMul", ["qt", "k"], ["sc"], domain="com.microsoft", transB=1, alpha=D**-0.5),
            helper.make_node("Add", ["sc", "b"], ["sb"]),
            helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["o4"]),
            *head_out,
        ],
        [vi("q", FLOAT, [r, 1, E]), *kv, vi("b", FLOAT, [r, 1, 1, S])],
        shapes,
        threads,
    )
    mha = session(
        [helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "m"], ["y"], domain="com.microsoft", num_heads=H)],
        [vi("q", FLOAT, [r, 1, E]), *kv, vi("m", INT32, [r, S])],
        [],
        threads,
    )
    axes = [
        numpy_helper.from_array(np.array([-1], np.int64), "a1"),
        numpy_helper.from_array(np.array([-2], np.int64), "a2"),
    ]
    reduce = session(
        [
            *head_q,
            helper.make_node("Mul", ["qt", "k"], ["qk"]),
            helper.make_node("ReduceSum", ["qk", "a1"], ["sc0"], keepdims=1),  # (R, H, S, 1)
            helper.make_node("Transpose", ["sc0"], ["sc"], perm=[0, 1, 3, 2]),
            helper.make_node("Mul", ["sc", "scale"], ["ss"]),
            helper.make_node("Add", ["ss", "b"], ["sb"]),
            helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
            helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 1, 3, 2]),
            helper.make_node("Mul", ["pt", "v"], ["pv"]),
            helper.make_node("ReduceSum", ["pv", "a2"], ["o4"], keepdims=1),  # (R, H, 1, D)
            *head_out,
        ],
        [vi("q", FLOAT, [r, 1, E]), *kv, vi("b", FLOAT, [r, 1, 1, S])],
        [*shapes, *axes, numpy_helper.from_array(np.array(D**-0.5, np.float32), "scale")],
        threads,
    )
    feed = {"q": q, "k": k, "v": v}
    ref = composite.run(None, feed | {"b": bias})[0]
    for name, got in (
        ("mha", mha.run(None, feed | {"m": mask})[0]),
        ("reduce", reduce.run(None, feed | {"b": bias})[0]),
    ):
        assert np.abs(got - ref).max() < 1e-4, f"{name} differs from the composite attention"
    return {
        "attention: composite (current)": lambda: composite.run(None, feed | {"b": bias}),
        "attention: MultiHeadAttention": lambda: mha.run(None, feed | {"m": mask}),
        "attention: Mul + ReduceSum": lambda: reduce.run(None, feed | {"b": bias}),
    }


def matmul_cases(r: int, threads: int, rng: np.random.Generator) -> dict[str, Callable[[], object]]:
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    vi = helper.make_tensor_value_info
    w = (rng.standard_normal((E, FF)) * 0.05).astype(np.float32)
    x = rng.standard_normal((r, E)).astype(np.float32)
    fp32_nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    fp32 = session(fp32_nodes, [vi("x", FLOAT, [r, E])], [numpy_helper.from_array(w, "w")], threads)
    # static QDQ as the export makes it: uint8 activations with a fixed scale, int8 weights per column
    x_scale, w_scale = np.float32(8 / 255), (np.abs(w).max(axis=0) / 127).astype(np.float32)
    w_q = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
    qdq = session(
        [
            helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
            helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=1),
            helper.make_node("MatMul", ["xd", "wd"], ["y"]),
        ],
        [vi("x", FLOAT, [r, E])],
        [
            numpy_helper.from_array(np.array(x_scale), "xs"),
            numpy_helper.from_array(np.array(128, np.uint8), "xz"),
            numpy_helper.from_array(w_q, "wq"),
            numpy_helper.from_array(w_scale, "ws"),
            numpy_helper.from_array(np.zeros(FF, np.int8), "wz"),
        ],
        threads,
    )
    graph = helper.make_graph(
        fp32_nodes, "g", [vi("x", FLOAT, [r, E])], [vi("y", FLOAT, None)], [numpy_helper.from_array(w, "w")]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    config = DefaultWeightOnlyQuantConfig(block_size=128, is_symmetric=True, accuracy_level=4, bits=8)
    quantizer = MatMulNBitsQuantizer(
        model, bits=8, block_size=128, is_symmetric=True, accuracy_level=4, algo_config=config
    )
    quantizer.process()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    nbits = ort.InferenceSession(quantizer.model.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return {
        "matmul 256x1024: fp32": lambda: fp32.run(None, {"x": x}),
        "matmul 256x1024: static int8 QDQ (current)": lambda: qdq.run(None, {"x": x}),
        "matmul 256x1024: MatMulNBits 8-bit": lambda: nbits.run(None, {"x": x}),
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,128", help="decoder rows per step (batch x beam)")
    args = p.parse_args()
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    rng = np.random.default_rng(0)
    print(f"ONNX Runtime {ort.__version__}, {args.threads} thread(s); median us per run, x the current choice")
    for r in (int(x) for x in args.rows.split(",")):
        for cases in (attention_cases(r, args.threads, rng), matmul_cases(r, args.threads, rng)):
            times = {name: median_us(fn) for name, fn in cases.items()}
            current = next(t for name, t in times.items() if name.endswith("(current)"))
            for name, t in times.items():
                print(f"rows {r:>4}  {name:<44} {t:9.1f} us  {t / current:5.2f}x")


if __name__ == "__main__":
    main()
