"""Variants of an fp32 graph: int8 for CPUs, fp16 for GPUs. Each keeps the fp32 IO contract."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx


def make_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights (activations stay float): the CPU variant."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])


def make_fp16(src: Path, dst: Path) -> None:
    """fp16 weights and activations for the GPU variant; graph inputs and outputs stay fp32 so every
    variant shares one IO contract (the casts at the edges are cheap next to the matmuls)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(proto, str(dst))


MAKERS: dict[str, Callable[[Path, Path], None]] = {"int8": make_int8, "fp16": make_fp16}
"""Variant name -> how its graph is made from the fp32 one."""
