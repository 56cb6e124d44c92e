"""Variants of an fp32 graph: int8 for CPUs, fp16 for GPUs. Each keeps the fp32 IO contract.

int8 is static: MatMul weights per channel, activations with one scale per tensor calibrated on
real text run through the fp32 graph. A fixed activation scale makes every row's result
independent of the other rows of its batch (dynamic quantization picks one scale per batch
tensor, so padding, beam rows and other requests changed a sentence's translation), and
ONNX Runtime fuses the QDQ pairs into integer matmuls. MatMuls of two activations (attention
scores, attention-weighted values) stay float. The output head (the last node with a weight) is
left out of the static pass: one calibrated scale for every row of the head's input moved a
held-out probability of the retrained translator by 0.14 (the export's gate allows 0.10). A
translator's vocabulary projection is then quantized with each row's own scale (`quantize_rows`,
as CTranslate2 quantizes every activation): the bundled en-de's largest difference 0.032 (float head:
0.027), and its decoder step 1.3x (16, 64 rows) to 1.4-1.8x (1, 4 rows) as fast as with the float head,
one thread on the AVX-512 VNNI VM (`bench.engine`'s shape; the head was a third of the step's kernel
time at 16 rows). A classifier's label scores are a `Gemm` over the pooled text (one row per text),
which int8 leaves float; its last layer's matmuls are quantized like the others. Per-row scales
for every matmul, not only the head, gave the bundled en-de the same quality but a slower encoder
(1.19-1.27x) and decoder step (1.01-1.22x) on that VM (four more operators per matmul), so the rest
stays static (`docs/export.md`).

Weights keep all 8 bits, knowingly. Without VNNI, ONNX Runtime's uint8 x int8 kernel adds pairs of
products into 16 bits and saturates (VPMADDUBSW), so an int8 matmul is off the exact integer
product there (`bench.kernels`: by 10 to 15 % of its largest output on random activations) and
exact on CPUs with VNNI. 7-bit weights (`reduce_range`) make it exact everywhere at the same
speed, but measured worse on the bundled models (`bench.quality`, int8, 2026-12-02): translator
BLEU / chrF 42.20 / 61.21 against 42.32 / 61.26, stand-in chrF 49.87 against 50.06, classifier
0.7266 against 0.7271. Where the kernel saturates (the AVX2 VM, 2026-12-04) the bundled 8-bit graphs gave
42.04 / 61.34 and 0.7333 (42.16 / 61.54 and 0.7330 with VNNI); their weights rounded again to 7 bits (a
pessimistic stand-in for `reduce_range`: two roundings) 42.10 / 61.43 and 0.7334: within a tenth either way.

A matmul's output stays float (requantizing it cost a pass over every output and 256 levels of
precision, the logits' included), so does what float operators read (`float_uses_read_float`),
and each weight matmul and its bias are one operator: at one row a decoder step is mostly
per-operator overhead. (A residual Add and its layer norm as one
`SkipLayerNormalization` saved 3 to 8 % at 1 and 4 rows but cost 5 % at 16 and 64; not done.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
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
    float_uses_read_float(proto)
    for name in head:  # a classifier's head is a Gemm: left float
        quantize_rows(proto, name)
    onnx.save(proto, str(dst))


MS_DOMAIN = "com.microsoft"
ROW_WEIGHT_LEVELS = 63
"""The row-quantized head's weights are 7-bit: its activations use their row's whole uint8 range, where a
pair of 8-bit products can pass the 16-bit sum of the kernel CPUs without VNNI run (255 x 63 x 2 < 32767:
exact everywhere). Measured as good as 8 bits (`bench.quality`, bundled en-de, int8, AVX-512 VNNI VM:
BLEU / chrF 42.16 / 61.54 against 42.04 / 61.39, stand-in 52.54 against 52.56; the float head 41.95 / 61.33, 52.61)."""


def _bias_add(
    out: str, consumers: dict[str, list[onnx.NodeProto]], inits: set[str], outputs: set[str]
) -> onnx.NodeProto | None:
    """The Add of a constant bias that alone reads a matmul's output `out`, if there is one."""
    users = consumers.get(out, [])
    if out in outputs or len(users) != 1 or users[0].op_type != "Add":
        return None
    return users[0] if _bias_of(users[0], out) in inits else None


def _bias_of(add: onnx.NodeProto, out: str) -> str:
    return add.input[1] if add.input[0] == out else add.input[0]


def _use_contrib_domain(model: onnx.ModelProto) -> None:
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            consumers[i].append(n)
    return consumers


def fuse_integer_matmuls(model: onnx.ModelProto) -> int:
    """Each QDQ weight matmul -- DequantizeLinear of a quantized activation and of an int8 weight
    into MatMul, then an Add of a constant bias if one follows -- becomes one MatMulIntegerToFloat
    of the quantized tensors, their scales and zero points and the bias. Returns how many;
    DequantizeLinear nodes left unused are removed."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = _consumers(graph)
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
        if add := _bias_add(out, consumers, inits, outputs):
            out, bias = add.output[0], _bias_of(add, out)
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
        _use_contrib_domain(model)
    return len(replaced)


def float_uses_read_float(model: onnx.ModelProto) -> int:
    """Float readers of a quantized activation read the float tensor instead. QDQ quantizes a
    tensor for all its readers: in a post-norm translator (Marian, BART) a layer norm's output
    feeds the next matmul and the residual Add, so the residual stream went through 8 bits at
    every layer (and a DequantizeLinear ran for it at every step), and an encoder's
    `last_hidden_state`, read by the cross-attention's matmuls, was returned through 8 bits too.
    The matmuls keep their quantized input. Returns how many DequantizeLinear nodes were dropped."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    floats: dict[str, str] = {}  # a dequantized activation -> the float tensor it was quantized from
    for n in graph.node:
        q = producer.get(n.input[0]) if n.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in outputs:
            floats[n.output[0]] = q.input[0]
    # A graph output keeps its name: the float tensor takes it.
    renamed = {f: dq for dq, f in floats.items() if dq in outputs}
    kept = [n for n in graph.node if not (n.op_type == "DequantizeLinear" and n.output[0] in floats)]
    for n in kept:
        for i, name in enumerate(n.input):
            source = floats.get(name, name)
            n.input[i] = renamed.get(source, source)
        for i, name in enumerate(n.output):
            n.output[i] = renamed.get(name, name)
    del graph.node[:]
    graph.node.extend(kept)
    return len(floats)


def quantize_rows(model: onnx.ModelProto, name: str) -> bool:
    """The MatMul `name` (a constant weight; an Add of a constant bias after it is taken in) as int8
    with each row's own activation scale, CTranslate2's way: s = max|x| / 127 of that row, the row
    divided by s, quantized at scale 1, multiplied by s after MatMulIntegerToFloat, the bias added
    last. No row's scale depends on another row, so the result is batch-invariant, and unlike one
    calibrated scale it keeps the whole range of every row. False where `name` is no such MatMul."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    mm = next((n for n in graph.node if n.name == name and n.op_type == "MatMul"), None)
    if mm is None or mm.input[1] not in inits:
        return False
    out, bias = mm.output[0], ""
    if add := _bias_add(out, _consumers(graph), set(inits), {o.name for o in graph.output}):
        out, bias = add.output[0], _bias_of(add, out)
    w = numpy_helper.to_array(inits[mm.input[1]]).astype(np.float32)  # (K, N)
    w_scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / ROW_WEIGHT_LEVELS  # per output column
    w_q = np.clip(np.round(w / w_scale), -ROW_WEIGHT_LEVELS, ROW_WEIGHT_LEVELS).astype(np.int8)
    p = f"{name}/rows"
    consts = {
        f"{p}/w": w_q,
        f"{p}/w_scale": w_scale.astype(np.float32),
        f"{p}/w_zero": np.zeros_like(w_scale, np.int8),
        f"{p}/tiny": np.array(1e-12, np.float32),
        f"{p}/inv127": np.array(1 / 127, np.float32),
        f"{p}/one": np.array(1.0, np.float32),
        f"{p}/x_zero": np.array(128, np.uint8),
    }
    x = mm.input[0]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    if opset >= 18:  # ReduceMax takes its axes as an input from opset 18
        consts[f"{p}/axes"] = np.array([-1], np.int64)
        reduce_max = helper.make_node("ReduceMax", [f"{p}/abs", f"{p}/axes"], [f"{p}/max"], name=f"{p}/max", keepdims=1)
    else:
        reduce_max = helper.make_node("ReduceMax", [f"{p}/abs"], [f"{p}/max"], name=f"{p}/max", axes=[-1], keepdims=1)
    nodes = [
        helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/abs"),
        reduce_max,
        helper.make_node("Max", [f"{p}/max", f"{p}/tiny"], [f"{p}/max1"], name=f"{p}/max1"),
        helper.make_node("Mul", [f"{p}/max1", f"{p}/inv127"], [f"{p}/scale"], name=f"{p}/scale"),
        helper.make_node("Div", [x, f"{p}/scale"], [f"{p}/x1"], name=f"{p}/x1"),
        helper.make_node("QuantizeLinear", [f"{p}/x1", f"{p}/one", f"{p}/x_zero"], [f"{p}/xq"], name=f"{p}/xq"),
        helper.make_node(
            "MatMulIntegerToFloat",
            [f"{p}/xq", f"{p}/w", f"{p}/one", f"{p}/w_scale", f"{p}/x_zero", f"{p}/w_zero"],
            [f"{p}/y"],
            name=name,
            domain=MS_DOMAIN,
        ),
        helper.make_node("Mul", [f"{p}/y", f"{p}/scale"], [f"{p}/ys" if bias else out], name=f"{p}/ys"),
    ]
    if bias:
        nodes.append(helper.make_node("Add", [f"{p}/ys", bias], [out], name=f"{p}/bias"))
    kept: list[onnx.NodeProto] = []
    for n in graph.node:  # the new nodes stand where the MatMul stood: the order stays topological
        if n is mm:
            kept.extend(nodes)
        elif n is not add:
            kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    used = {i for n in graph.node for i in n.input}
    if mm.input[1] not in used:  # the float weight, unless something else reads it (a tied embedding)
        graph.initializer.remove(inits[mm.input[1]])
    _use_contrib_domain(model)
    return True


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
