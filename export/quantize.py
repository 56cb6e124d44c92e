"""Variants of an fp32 graph: int8 for CPUs, fp16 for GPUs. Each keeps the fp32 IO contract.

int8 is static: MatMul weights per channel, activations with one scale per tensor calibrated on
real text run through the fp32 graph. A fixed activation scale makes every row's result
independent of the other rows of its batch (dynamic quantization picks one scale per batch
tensor, so padding, beam rows and other requests changed a sentence's translation), and
ONNX Runtime fuses the QDQ pairs into integer matmuls. MatMuls of two activations (attention
scores, attention-weighted values) stay float.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

Feeds = Iterable[dict[str, np.ndarray]]


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: Feeds) -> None:
        self._it: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def weight_matmuls(path: Path) -> tuple[list[str], list[str]]:
    """Names of the MatMul nodes with a constant (weight) input, and of those between two activations."""
    proto = onnx.load(str(path))
    inits = {i.name for i in proto.graph.initializer}
    mm = [n for n in proto.graph.node if n.op_type == "MatMul"]
    with_weight = [n.name for n in mm if any(x in inits for x in n.input)]
    return with_weight, [n.name for n in mm if n.name not in with_weight]


def make_int8(src: Path, dst: Path, calibration: Feeds) -> None:
    """Static int8: weights per channel, activation scales from `calibration` feeds (MinMax)."""
    _, activation_only = weight_matmuls(src)
    quantize_static(
        str(src),
        str(dst),
        _Reader(calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=activation_only,
        calibrate_method=CalibrationMethod.MinMax,
    )


def make_fp16(src: Path, dst: Path, calibration: Feeds) -> None:
    """fp16 weights and activations for the GPU variant; graph inputs and outputs stay fp32 so every
    variant shares one IO contract (the casts at the edges are cheap next to the matmuls)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(proto, str(dst))


MAKERS: dict[str, Callable[[Path, Path, Feeds], None]] = {"int8": make_int8, "fp16": make_fp16}
"""Variant name -> how its graph is made from the fp32 one (and calibration feeds of that graph)."""
