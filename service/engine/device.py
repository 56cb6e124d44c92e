"""A running batch's buffers in the decoder's device memory (CUDA): the cache never crosses to the host.

On CPU the running batch keeps its buffers in numpy and binds them to the decoder as they are
(`runtime.StepBinding`). On a GPU that binding would copy the whole cache and the cross-attention
keys and values to the device and back at every step. Here they live on the device instead: the
decoder writes each row's new key and value in place (since IO contract 5), and what the batch does
to its buffers between steps (a sentence's keys written when it joins, beam rows taking their parent's
cache, blocks and sentence slots moving up when sentences leave, buffers growing) runs as tiny ONNX
graphs on the decoder's own provider. Per step only the token ids, positions and source mask go to the device and the
log-probabilities come back.

Nothing here is CUDA-specific but the device name: the same code runs on the CPU provider, which is
how the tests check it against the numpy buffers, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

_OPSET = 17
_IR_VERSION = 8  # what every supported ONNX Runtime reads
FLOAT = np.float32


@dataclass(frozen=True)
class DeviceRows:
    """The leading `rows` rows of a device buffer: what a decoder input or output is bound to."""

    value: ort.OrtValue
    rows: int
    device: str  # ONNX Runtime's name for it, as binding takes it ("cuda", "cpu")

    @property
    def shape(self) -> list[int]:
        return [self.rows, *self.value.shape()[1:]]


@cache
def _model(kind: str, n: int) -> bytes:
    """`n` buffers through one graph: "copy" (Identity), "gather" (rows by index), "fit" (axis 2
    cut or zero-padded to a length) or "zeros" (of a shape, made on the device: no host array of
    the size of a cache): one run for every buffer of a batch, not one per layer."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(f"x{i}", f, None) for i in range(n if kind != "zeros" else 0)]
    outputs = [helper.make_tensor_value_info(f"y{i}", f, None) for i in range(n)]
    constants = []
    if kind == "zeros":
        inputs.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [4]))
        zero = helper.make_tensor("zero", f, [1], [0.0])
        nodes = [helper.make_node("ConstantOfShape", ["shape"], [f"y{i}"], value=zero) for i in range(n)]
    elif kind == "gather":
        inputs.append(helper.make_tensor_value_info("index", TensorProto.INT64, ["n"]))
        nodes = [helper.make_node("Gather", [f"x{i}", "index"], [f"y{i}"], axis=0) for i in range(n)]
    elif kind == "copy":
        nodes = [helper.make_node("Identity", [f"x{i}"], [f"y{i}"]) for i in range(n)]
    else:  # fit: y = x[:, :, :end] padded with `pads` zeros
        inputs += [helper.make_tensor_value_info(name, TensorProto.INT64, [k]) for name, k in (("end", 1), ("pads", 8))]
        constants = [
            helper.make_tensor("start", TensorProto.INT64, [1], [0]),
            helper.make_tensor("axis", TensorProto.INT64, [1], [2]),
        ]
        nodes = []
        for i in range(n):
            nodes.append(helper.make_node("Slice", [f"x{i}", "start", "end", "axis"], [f"s{i}"]))
            nodes.append(helper.make_node("Pad", [f"s{i}", "pads"], [f"y{i}"]))
    graph = helper.make_graph(nodes, kind, inputs, outputs, constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR_VERSION)
    return bytes(model.SerializeToString())


class DeviceOps:
    """The buffer operations of one device, each a small graph run with IO binding: inputs and
    outputs are bound by address, so a buffer's rows are read and written where they lie."""

    def __init__(self, device: str, providers: Sequence[str]) -> None:
        self.device, self.providers = device, list(providers)
        self._sessions: dict[tuple[str, int], ort.InferenceSession] = {}

    def zeros(self, shape: Sequence[int], n: int) -> list[ort.OrtValue]:
        """`n` new buffers of zeros."""
        values = [ort.OrtValue.ortvalue_from_shape_and_type(list(shape), FLOAT, self.device, 0) for _ in range(n)]
        session, dims = self._session("zeros", n), np.array(shape, np.int64)  # held until the run
        io = session.io_binding()
        io.bind_cpu_input("shape", dims)
        for i, value in enumerate(values):
            io.bind_ortvalue_output(f"y{i}", value)
        session.run_with_iobinding(io)
        return values

    def upload(self, arrays: Sequence[np.ndarray], into: Sequence[ort.OrtValue], row: int) -> None:
        """Host arrays written into each buffer from `row` on."""
        session = self._session("copy", len(arrays))
        io = session.io_binding()
        held = [np.ascontiguousarray(a, FLOAT) for a in arrays]  # bound by address: alive until the run
        for i, (a, buf) in enumerate(zip(held, into, strict=True)):
            io.bind_cpu_input(f"x{i}", a)
            self._bind(io.bind_output, f"y{i}", buf, row, a.shape)
        session.run_with_iobinding(io)

    def permute(self, buffers: Sequence[ort.OrtValue], index: np.ndarray, rows: int, at: int = 0) -> None:
        """Rows `at`, `at`+1, .. of each buffer take the rows `index` of its leading `rows` (through
        a copy: source and destination may overlap)."""
        shapes = [[len(index), *b.shape()[1:]] for b in buffers]
        temps = [ort.OrtValue.ortvalue_from_shape_and_type(s, FLOAT, self.device, 0) for s in shapes]
        session = self._session("gather", len(buffers))
        io, order = session.io_binding(), np.ascontiguousarray(index, np.int64)  # held until the run
        io.bind_cpu_input("index", order)
        for i, (buf, temp) in enumerate(zip(buffers, temps, strict=True)):
            self._bind(io.bind_input, f"x{i}", buf, 0, [rows, *buf.shape()[1:]])
            io.bind_ortvalue_output(f"y{i}", temp)
        session.run_with_iobinding(io)
        session = self._session("copy", len(buffers))
        io = session.io_binding()
        for i, (buf, temp, shape) in enumerate(zip(buffers, temps, shapes, strict=True)):
            io.bind_ortvalue_input(f"x{i}", temp)
            self._bind(io.bind_output, f"y{i}", buf, at, shape)
        session.run_with_iobinding(io)

    def fit(self, old: Sequence[ort.OrtValue], new: Sequence[ort.OrtValue], rows: int) -> None:
        """The leading `rows` rows of each old buffer into the new one, axis 2 cut or zero-padded to its length."""
        if not rows or not old:
            return
        length = new[0].shape()[2]
        kept = min(length, old[0].shape()[2])
        session = self._session("fit", len(old))
        io = session.io_binding()
        end, pads = np.array([kept], np.int64), np.array([0, 0, 0, 0, 0, 0, length - kept, 0], np.int64)
        io.bind_cpu_input("end", end)  # held until the run
        io.bind_cpu_input("pads", pads)
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            self._bind(io.bind_input, f"x{i}", a, 0, [rows, *a.shape()[1:]])
            self._bind(io.bind_output, f"y{i}", b, 0, [rows, *b.shape()[1:]])
        session.run_with_iobinding(io)

    def _bind(self, bind: Callable[..., None], name: str, buf: ort.OrtValue, row: int, shape: Sequence[int]) -> None:
        """Binds the rows of `buf` from `row` on (as many as `shape` says) by their address."""
        bind(name, self.device, 0, FLOAT, list(shape), address(buf, row))

    def _session(self, kind: str, n: int) -> ort.InferenceSession:
        key = (kind, n)
        if key not in self._sessions:
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            opts.intra_op_num_threads = 1
            self._sessions[key] = ort.InferenceSession(_model(kind, n), opts, providers=self.providers)
        return self._sessions[key]


def address(buf: ort.OrtValue, row: int = 0) -> int:
    """Where row `row` of a buffer starts (rows are its first axis, the buffer is contiguous)."""
    shape = buf.shape()
    return int(buf.data_ptr()) + row * int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(FLOAT).itemsize


class SourceSlots:
    """What both buffer layouts keep on the host, and do to it alike: the source mask, one row
    per sentence slot (sentence capacity, source columns)."""

    mask: np.ndarray

    @property
    def sentence_capacity(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    def _resized_mask(self, n: int, capacity: int, columns: int) -> np.ndarray:
        """A mask of this size holding the first `n` sentences' (as many columns as fit)."""
        mask = np.zeros((capacity, columns), np.int64)
        keep = min(columns, self.columns)
        mask[:n, :keep] = self.mask[:n, :keep]
        return mask

    def _mark(self, slot: int, length: int) -> None:
        """A joining sentence sees its `length` source columns and nothing beyond."""
        self.mask[slot, :length] = 1
        self.mask[slot, length:] = 0


class DeviceBuffers(SourceSlots):
    """`running._Buffers` in device memory: the cross-attention K/V and the self-attention cache as
    device values with spare capacity; the source mask stays on the host (a few bytes a sentence,
    bound as a host input each step)."""

    def __init__(self, ops: DeviceOps) -> None:
        self.ops = ops
        self.cross: list[ort.OrtValue] = []  # 2L values (sentence capacity, H, S_cap, d_k)
        self.cache: list[ort.OrtValue] = []  # 2L values (capacity, H, slots, d_k)
        self.mask = np.zeros((0, 0), np.int64)  # (sentence capacity, S_cap)

    @property
    def capacity(self) -> int:
        return self.cache[0].shape()[0] if self.cache else 0

    @property
    def slots(self) -> int:
        return self.cache[0].shape()[2] if self.cache else 0

    def resize_rows(self, rows: int, capacity: int, slots: int, heads: int, d_k: int, layers2: int) -> None:
        cache = self.ops.zeros((capacity, heads, slots, d_k), layers2)
        self.ops.fit(self.cache, cache, rows)
        self.cache = cache

    def resize_sources(self, n: int, capacity: int, columns: int, heads: int, d_k: int, layers2: int) -> None:
        cross = self.ops.zeros((capacity, heads, columns, d_k), layers2)
        self.ops.fit(self.cross, cross, n)
        self.cross, self.mask = cross, self._resized_mask(n, capacity, columns)

    def move(self, src: int, dst: int, width: int, slots: int) -> None:
        """Whole rows, in one device gather (`slots`, which bounds the host buffers' copy, is not used here)."""
        self.ops.permute(self.cache, np.arange(src, src + width), src + width, dst)

    def move_sentence(self, src: int, dst: int) -> None:
        self.ops.permute(self.cross, np.array([src]), src + 1, dst)
        self.mask[dst] = self.mask[src]

    def write(self, slot: int, cross: Sequence[np.ndarray], length: int) -> None:
        """A joining sentence's cross-attention K/V (2L arrays (H, length, d_k)) into its slot,
        zeros beyond `length`; its source mask."""
        rows = []
        for c in cross:
            block = np.zeros((1, c.shape[0], self.columns, c.shape[2]), FLOAT)
            block[0, :, :length] = c
            rows.append(block)
        self.ops.upload(rows, self.cross, slot)
        self._mark(slot, length)

    def reorder(self, moved: np.ndarray, parents: np.ndarray, needed: int, slots: np.ndarray | None = None) -> None:
        """Every row takes its parent's cache (rows that keep their own copy themselves: one gather)."""
        self.ops.permute(self.cache, parents, len(parents))

    def leading(self, rows: int, sentences: int) -> tuple[list[DeviceRows], list[DeviceRows]]:
        """The cache's leading rows and the cross-attention buffers' leading sentences, as the decoder binds them."""
        device = self.ops.device
        return [DeviceRows(c, rows, device) for c in self.cache], [DeviceRows(c, sentences, device) for c in self.cross]
