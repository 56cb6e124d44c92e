"""Kernel choices of the decoder step, measured in ONNX Runtime on this CPU (a report, not a test).

    python -m bench.kernels [--threads 1] [--rows 1,128]

Why: at batch 32 with beam 4 (128 rows) one decoder step spends about a third of its time in
the six attentions (one query per row over at most a few dozen keys: 512 tiny GEMMs each), and
at batch 1 the step is mostly per-operator overhead. This measures the alternatives ONNX Runtime
offers on CPU, each against the graph the engine runs now, same inputs, same process:
- attention of one query per row and head (R rows, 4 heads, d_k 64, 24 keys): the exported
  composite (FusedMatMul with transposed K and scale, mask add, Softmax, MatMul) against
  com.microsoft.MultiHeadAttention with the keys given per head, and against Mul + ReduceSum;
- a weight MatMul (256 -> 1024, the FFN's first): fp32; static int8 as shipped (int8 weights per
  column, one calibrated activation scale, MatMulIntegerToFloat); the same with 7-bit weights;
  per-row activation scales from standard operators; and 8-bit weight-only MatMulNBits (block
  128, activations quantized per block at accuracy level 4).
Prints the median time of each and its ratio to the current choice (< 1: faster), and how far
the int8 matmul is from the exact integer product with 7- and 8-bit weights: without VNNI, ONNX
Runtime's uint8 x int8 kernel adds pairs of products into 16 bits and saturates (VPMADDUBSW).
"""

from __future__ import annotations

import argparse
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


def _int8_weights(w: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights per output column in -qmax .. qmax, and their scales."""
    scale = (np.abs(w).max(axis=0) / qmax).astype(np.float32)
    return np.clip(np.round(w / scale), -qmax, qmax).astype(np.int8), scale


def _integer_matmul(
    x: np.ndarray, qmax: int, rng: np.random.Generator, threads: int
) -> tuple[Callable[[], object], float]:
    """The int8 graphs' weight matmul (uint8 activations at one calibrated scale around 128, int8
    weights per column in -qmax .. qmax, a bias): its run, and how far ONNX Runtime's result is
    from the exact integer product, as a share of the largest output (0 where the kernel is exact)."""
    vi = helper.make_tensor_value_info
    w_q, w_scale = _int8_weights((rng.standard_normal((E, FF)) * 0.05).astype(np.float32), qmax)
    x_scale = np.float32(np.abs(x).max() / 127)  # MinMax calibration on these rows
    sess = session(
        [
            helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            helper.make_node(
                "MatMulIntegerToFloat", ["xq", "wq", "xs", "ws", "xz", "", "b"], ["y"], domain="com.microsoft"
            ),
        ],
        [vi("x", FLOAT, [x.shape[0], E])],
        [
            numpy_helper.from_array(np.array(x_scale), "xs"),
            numpy_helper.from_array(np.array(128, np.uint8), "xz"),
            numpy_helper.from_array(w_q, "wq"),
            numpy_helper.from_array(w_scale, "ws"),
            numpy_helper.from_array(np.zeros(FF, np.float32), "b"),
        ],
        threads,
    )
    x_q = np.clip(np.round(x / x_scale), -128, 127)
    exact = (x_q @ w_q.astype(np.float64)) * x_scale * w_scale
    got = sess.run(None, {"x": x})[0]
    return (lambda: sess.run(None, {"x": x})), float(np.abs(got - exact).max() / np.abs(exact).max())


def _row_scaled(x: np.ndarray, rng: np.random.Generator, threads: int) -> Callable[[], object]:
    """Per-row activation scales (each row's own maximum, as CTranslate2 quantizes), built from
    standard operators: MatMulIntegerToFloat takes one activation scale, so the row is divided by
    its scale before quantizing and the float result multiplied by it after, the bias added then."""
    vi = helper.make_tensor_value_info
    w_q, w_scale = _int8_weights((rng.standard_normal((E, FF)) * 0.05).astype(np.float32), 64)
    sess = session(
        [
            helper.make_node("Abs", ["x"], ["ax"]),
            helper.make_node("ReduceMax", ["ax"], ["mx"], axes=[-1], keepdims=1),
            helper.make_node("Max", ["mx", "tiny"], ["mx1"]),
            helper.make_node("Mul", ["mx1", "inv127"], ["rs"]),  # (R, 1) the rows' scales
            helper.make_node("Div", ["x", "rs"], ["xn"]),
            helper.make_node("QuantizeLinear", ["xn", "one", "xz"], ["xq"]),
            helper.make_node("MatMulIntegerToFloat", ["xq", "wq", "one", "ws", "xz"], ["y0"], domain="com.microsoft"),
            helper.make_node("Mul", ["y0", "rs"], ["y1"]),
            helper.make_node("Add", ["y1", "b"], ["y"]),
        ],
        [vi("x", FLOAT, [x.shape[0], E])],
        [
            numpy_helper.from_array(np.array(1e-12, np.float32), "tiny"),
            numpy_helper.from_array(np.array(1 / 127, np.float32), "inv127"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(128, np.uint8), "xz"),
            numpy_helper.from_array(w_q, "wq"),
            numpy_helper.from_array(w_scale, "ws"),
            numpy_helper.from_array(np.zeros(FF, np.float32), "b"),
        ],
        threads,
    )
    return lambda: sess.run(None, {"x": x})


def _nbits(x: np.ndarray, rng: np.random.Generator, threads: int, block: int = 128) -> Callable[[], object]:
    """8-bit weight-only MatMulNBits (symmetric blocks of `block` weights; activations quantized per
    block of each row at accuracy level 4), built by hand in the operator's layout."""
    vi = helper.make_tensor_value_info
    w = (rng.standard_normal((E, FF)) * 0.05).astype(np.float32)
    blocks = w.T.reshape(FF, E // block, block)
    scale = np.abs(blocks).max(axis=2, keepdims=True) / 127
    packed = (np.clip(np.round(blocks / scale), -127, 127) + 128).astype(np.uint8)  # zero point 128
    sess = session(
        [
            helper.make_node(
                "MatMulNBits",
                ["x", "B", "S"],
                ["y"],
                domain="com.microsoft",
                K=E,
                N=FF,
                bits=8,
                block_size=block,
                accuracy_level=4,
            )
        ],
        [vi("x", FLOAT, [x.shape[0], E])],
        [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scale.reshape(-1).astype(np.float32), "S")],
        threads,
    )
    return lambda: sess.run(None, {"x": x})


def matmul_cases(r: int, threads: int, rng: np.random.Generator) -> dict[str, Callable[[], object]]:
    vi = helper.make_tensor_value_info
    w = (rng.standard_normal((E, FF)) * 0.05).astype(np.float32)
    x = rng.standard_normal((r, E)).astype(np.float32)
    fp32 = session(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", FLOAT, [r, E])],
        [numpy_helper.from_array(w, "w")],
        threads,
    )
    seven, off7 = _integer_matmul(x, 64, rng, threads)
    full, off8 = _integer_matmul(x, 127, rng, threads)
    print(f"rows {r:>4}  int8 matmul off the exact integer product: 7-bit weights {off7:.4f}, 8-bit {off8:.4f}")
    return {
        "matmul 256x1024: fp32": lambda: fp32.run(None, {"x": x}),
        "matmul 256x1024: static int8 (current)": full,
        "matmul 256x1024: static int8, 7-bit weights": seven,
        "matmul 256x1024: per-row activation scales": _row_scaled(x, rng, threads),
        "matmul 256x1024: MatMulNBits 8-bit": _nbits(x, rng, threads),
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,128", help="decoder rows per step (batch x beam)")
    args = p.parse_args()
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
