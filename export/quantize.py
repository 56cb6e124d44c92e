"""Variants of an fp32 graph: int8 for CPUs, fp16 for GPUs. Each keeps the fp32 IO contract.

int8 is static: MatMul weights per channel, activations with one scale per tensor calibrated on
real text run through the fp32 graph. A fixed activation scale makes every row's result
independent of the other rows of its batch (dynamic quantization picks one scale per batch
tensor, so padding, beam rows and other requests changed a sentence's translation), and
ONNX Runtime fuses the QDQ pairs into integer matmuls. MatMuls of two activations (attention
scores, attention-weighted values) stay float, and so does the output head (the last node with a
weight: the translator's vocabulary projection; a classifier's label scores are a `Gemm`, which
int8 leaves float anyway, and its last layer's matmuls are quantized like the others). One calibrated
scale for every row of the head's input moved a held-out probability of the retrained
translator by 0.14 (the export's gate allows 0.10); with the head float, by 0.05. Its speed
cost is within the noise of `bench.engine` (int8 tokens/s, head float ÷ head int8, same machine
and hour: 1.04x greedy and 1.15x beam 4 at batch 1, 0.99x and 0.98x at batch 32); per-row
activation scales would let the head be int8 again.

Weights keep all 8 bits, knowingly. Without VNNI, ONNX Runtime's uint8 x int8 kernel adds pairs of
products into 16 bits and saturates (VPMADDUBSW), so an int8 matmul is off the exact integer
product there (`bench.kernels`: by 10 to 15 % of its largest output on random activations) and
exact on CPUs with VNNI. 7-bit weights (`reduce_range`) make it exact everywhere at the same
speed, but measured worse on the bundled models (`bench.quality`, int8, 2026-12-02): translator
BLEU / chrF 42.20 / 61.21 against 42.32 / 61.26, stand-in chrF 49.87 against 50.06, classifier
0.7266 against 0.7271. Per-row activation scales built from standard operators (MatMulIntegerToFloat
takes one activation scale) cost 1.27x / 1.36x the static matmul at 1 / 128 rows there.

A matmul's output stays float (requantizing it cost a pass over every output and 256 levels of
precision, the logits' included), and each weight matmul and its bias are one operator: at one
row a decoder step is mostly per-operator overhead. (A residual Add and its layer norm as one
`SkipLayerNormalization` saved 3 to 8 % at 1 and 4 rows but cost 5 % at 16 and 64; not done.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from service.contract.graphs import LOGITS, LOGPROBS

Feeds = Iterable[dict[str, np.ndarray]]


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: Feeds) -> None:
        self._it: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def float_matmuls(path: Path) -> tuple[list[str], list[str]]:
    """The nodes int8 leaves float: MatMuls between two activations, and the output head (the last
    node with a weight, in a graph that outputs scores: `logits`, `logprobs`; an encoder has none).
    A classifier's head is a `Gemm` (its input is pooled: one row per text), which int8 leaves
    float anyway; the MatMul before it is the last layer's, and is quantized like the others."""
    proto = onnx.load(str(path))
    inits = {i.name for i in proto.graph.initializer}
    weighted = [n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm") and any(x in inits for x in n.input)]
    activation_only = [n.name for n in proto.graph.node if n.op_type == "MatMul" and not set(n.input) & inits]
    scores = {o.name for o in proto.graph.output} & {LOGITS, LOGPROBS}
    return activation_only, [weighted[-1].name] if scores and weighted else []


def make_int8(src: Path, dst: Path, calibration: Feeds) -> None:
    """Static int8: weights per channel, activation scales from `calibration` feeds (MinMax); the
    output head stays float."""
    activation_only, head = float_matmuls(src)
    quantize_static(
        str(src),
        str(dst),
        _Reader(calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=activation_only + head,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"]},
    )
    proto = onnx.load(str(dst))
    fuse_integer_matmuls(proto)
    onnx.save(proto, str(dst))


MS_DOMAIN = "com.microsoft"


def fuse_integer_matmuls(model: onnx.ModelProto) -> int:
    """Each QDQ weight matmul -- DequantizeLinear of a quantized activation and of an int8 weight
    into MatMul, then an Add of a constant bias if one follows -- becomes one MatMulIntegerToFloat
    of the quantized tensors, their scales and zero points and the bias. Returns how many;
    DequantizeLinear nodes left unused are removed."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            consumers[i].append(n)
    outputs = {o.name for o in graph.output}
    replaced: dict[int, onnx.NodeProto] = {}  # id of the MatMul -> its replacement
    dropped: set[int] = set()
    for mm in graph.node:
        if mm.op_type != "MatMul":
            continue
        a_dq, w_dq = producer.get(mm.input[0]), producer.get(mm.input[1])
        if not (a_dq and w_dq and a_dq.op_type == w_dq.op_type == "DequantizeLinear" and w_dq.input[0] in inits):
            continue
        out, bias = mm.output[0], ""
        users = consumers[out]
        if out not in outputs and len(users) == 1 and users[0].op_type == "Add":
            add = users[0]
            other = add.input[1] if add.input[0] == out else add.input[0]
            if other in inits:
                out, bias = add.output[0], other
                dropped.add(id(add))
        a_in = [*a_dq.input, "", ""][:3]
        w_in = [*w_dq.input, "", ""][:3]
        replaced[id(mm)] = helper.make_node(
            "MatMulIntegerToFloat",
            [a_in[0], w_in[0], a_in[1], w_in[1], a_in[2], w_in[2], bias],
            [out],
            name=mm.name,
            domain=MS_DOMAIN,
        )
    if replaced:  # each replacement stands where its MatMul stood: the order stays topological
        nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
        used = {i for n in nodes for i in n.input} | outputs
        del graph.node[:]
        graph.node.extend(n for n in nodes if n.op_type != "DequantizeLinear" or any(o in used for o in n.output))
        if not any(o.domain == MS_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(replaced)


def make_fp16(src: Path, dst: Path, calibration: Feeds) -> None:
    """fp16 weights and activations for the GPU variant; graph inputs and outputs stay fp32 so every
    variant shares one IO contract (the casts at the edges are cheap next to the matmuls)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(proto, str(dst))


MAKERS: dict[str, Callable[[Path, Path, Feeds], None]] = {"int8": make_int8, "fp16": make_fp16}
"""Variant name -> how its graph is made from the fp32 one (and calibration feeds of that graph)."""
CALIBRATED = {"int8"}
"""Variants whose maker reads calibration feeds (real sentences through the fp32 graph)."""
