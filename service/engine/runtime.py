"""ONNX Runtime: sessions, execution providers, thread count, and the translator's cached step.

With `service.engine.device` (a running batch's buffers in device memory), the only module that
imports onnxruntime. Sessions are built from bytes whose sha256 the store
(`service.store.read_pinned`) has just checked, so what runs is what the manifest pins, and an ONNX file that points at
external data cannot make the runtime read files outside the store.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.contract import graphs
from service.contract.manifest import Manifest
from service.engine.device import DeviceOps, DeviceRows, address

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    providers: tuple[str, ...] = ("cpu",)
    threads: int = 0  # 0: the CPU quota of the container
    variant: str | None = None  # None: the manifest's default variant
    device_buffers: bool | None = None  # a translator's batch in device memory; None: on CUDA only


PROVIDER_ALIASES = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def cpu_quota(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may use: the cgroup quota (a container's CPU limit), else its affinity.

    os.cpu_count() reports the host's cores, which oversubscribes a pod limited to 2 CPUs.
    """
    quota: float | None = None
    v2 = cgroup_root / "cpu.max"
    v1q, v1p = cgroup_root / "cpu" / "cpu.cfs_quota_us", cgroup_root / "cpu" / "cpu.cfs_period_us"
    try:
        if v2.is_file():
            q, p = v2.read_text().split()[:2]
            if q != "max":
                quota = int(q) / int(p)
        elif v1q.is_file() and v1p.is_file():
            q1, p1 = int(v1q.read_text()), int(v1p.read_text())
            if q1 > 0:
                quota = q1 / p1
    except (OSError, ValueError):
        quota = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if quota is None:
        return affinity
    return max(1, min(affinity, math.ceil(quota)))


def resolve_providers(requested: Sequence[str]) -> list[str]:
    """Map names like "cuda,cpu" to available ORT providers, always ending with the CPU one."""
    available = set(ort.get_available_providers())
    out: list[str] = []
    for name in requested:
        full = PROVIDER_ALIASES.get(name.strip().lower(), name.strip())
        if full in available and full not in out:
            out.append(full)
        elif full not in available:
            log.warning("execution provider %s is not available here (have %s); skipping it", full, sorted(available))
    if "CPUExecutionProvider" not in out:
        out.append("CPUExecutionProvider")
    return out


# ONNX Runtime fuses a residual Add and the LayerNormalization after it into its contrib
# `SkipLayerNormalization`, whose CPU kernel is a scalar loop (a division per element, sums that do
# not vectorise): 4.2 to 6.1x the time of the Add and LayerNormalization it replaces at 16 to 4,096
# rows of 256 (ONNX Runtime 1.32, one thread, Intel Xeon VM, 2026-12-03). The bundled encoder and
# classifier end in one such pair: kept apart, the int8 classifier at batch 32 ran 1.07x as fast and
# the int8 encoder at 32 sentences 1.04x (one thread; 1.07x and 1.02x on two). CUDA's kernel is a
# fused one; there it stays.
CPU_FUSIONS_OFF = ("SkipLayerNormFusion",)


def fusions_off(providers: Sequence[str]) -> list[str]:
    """The graph fusions ONNX Runtime must not apply for these providers (the first one runs)."""
    first = PROVIDER_ALIASES.get(providers[0].lower(), providers[0]) if providers else "CPUExecutionProvider"
    return list(CPU_FUSIONS_OFF) if first == "CPUExecutionProvider" else []


# How long a spinning session's idle intra-op threads keep spinning after a call (microseconds):
# long enough to bridge a lone sentence's Python between two decoder steps, short enough not to
# take a core from work that follows on other threads. ONNX Runtime's own default spun about 45 ms
# after each call (a 2-thread session's process used 44 ms of CPU in 0.05 to 1 s of idleness):
# the decoder session that uses every thread, called once at the end of a sharded translation
# (or for an express step), then took a core from the one-thread shards for as long. With 1 ms, 32
# same-model sentences on two threads translated 1.4x as fast greedy in int8 (65 -> 43 ms), 1.2x
# beam 4 (184 -> 143-161 ms), 1.2x fp32 greedy (89 -> 70-79 ms), one sentence as fast (Intel Xeon
# VM, 2026-12-04; measured).
SPIN_US = 1000


def session_options(threads: int, spin: bool, arena: bool) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = arena
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    opts.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_US))
    return opts


def make_session(
    model: bytes, providers: Sequence[str], threads: int, spin: bool = True, arena: bool = True
) -> ort.InferenceSession:
    """`spin`: the intra-op threads spin a while (`SPIN_US`) after each call, waiting for the next (fast for
    a session called in a loop, the decoder; a session called now and then, the encoder, would
    only take those cores from the one that is looping). `arena`: ONNX Runtime's memory arena,
    whose lock calls of one session on several threads at once contend on (the sharded decoder:
    two int8 calls of 16 rows ran 1.76x one call's speed with it, 1.93x without; measured)."""
    opts = session_options(threads, spin, arena)
    return ort.InferenceSession(model, opts, providers=list(providers), disabled_optimizers=fusions_off(providers))


def uses_cuda(session: ort.InferenceSession) -> bool:
    return session.get_providers()[0] == "CUDAExecutionProvider"


def _classifier_feeds(ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> dict[str, np.ndarray]:
    """A classifier graph's inputs; token types only for a graph that takes them (IO contract 7)."""
    feeds = {graphs.INPUT_IDS: ids, graphs.ATTENTION_MASK: mask}
    return feeds if types is None else feeds | {graphs.TOKEN_TYPE_IDS: types}


def run_classifier(
    session: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None = None
) -> np.ndarray:
    return session.run([graphs.LOGITS], _classifier_feeds(ids, mask, types))[0]


def classifier_attention(
    session: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None = None
) -> np.ndarray:
    """(B, H, S, S) self-attention weights of the classifier's last layer."""
    return session.run([graphs.ATTENTIONS], _classifier_feeds(ids, mask, types))[0]


@dataclass(frozen=True)
class DecoderStep:
    """One decoder step's outputs for R rows (`service.contract.graphs`)."""

    logprobs: np.ndarray  # (R, V)
    new_kv: list[np.ndarray]  # 2L arrays (R, H, 1, d_k): the step's keys and values; empty when written in place
    attention: np.ndarray | None = None  # (R, L, H, S) cross-attention weights, when asked for

    @property
    def written(self) -> bool:
        """The graph wrote the new keys into the caller's cache itself (IO contract 5, bound)."""
        return not self.new_kv


Rows = np.ndarray | DeviceRows  # a buffer's leading rows: host memory, or device memory (`service.engine.device`)


class StepBinding:
    """One caller's buffers bound to one decoder session (IO contract 6), kept across steps: the
    cache, cross-attention K/V and source mask are rebound only when their memory or row count
    changes (a resize, rows joining or leaving), the log-probabilities land in a buffer of this
    binding's own, and each cache input shares its memory with its present output, so the fused
    attention writes the new slot in place and nothing else of the cache moves. The step's token
    ids and positions are copied into bound buffers of its own too: a step's Python then costs a
    few copies, not a binding per input. Not thread-safe: one per caller thread (each shard of a
    sharded batch has its own). The cache and cross-attention K/V are host arrays, or device
    buffers (`DeviceRows`, on CUDA): then only the ids, positions, mask and log-probabilities cross."""

    def __init__(self, rt: TranslatorRuntime) -> None:
        self.rt = rt
        self.io = rt.decoder.io_binding()
        self._key: tuple[int, ...] = ()
        self._owners: list[object] = []  # the bound arrays' owners (their ids are the key)
        self._held: list[ort.OrtValue] = []  # the bound values (each keeps its numpy memory alive)
        self._logprobs = np.zeros((0, rt.vocab), np.float32)
        self._ids = np.zeros((0, 1), np.int64)
        self._positions = np.zeros(0, np.int64)
        self._fold = np.zeros((0, 0), np.int64)
        self._unfold = np.zeros(0, np.int64)

    def run(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        enc_mask: np.ndarray,
        cache: Sequence[Rows],
        cross: Sequence[Rows],
        folding: tuple[np.ndarray, np.ndarray],
    ) -> np.ndarray:
        """One step; returns the log-probabilities (R, V), a view valid until the next call. The
        arrays are the leading R rows (N sentences) of the caller's buffers (views or the buffers
        themselves): the binding holds while the same buffers come with the same R, N and fold width."""
        r, fold = len(tokens), folding[0]
        owners: list[object] = [_owner(a) for a in (enc_mask, *cache, *cross)]
        key = (r, *fold.shape, *map(id, owners))
        if key != self._key:
            self._bind(r, fold.shape, enc_mask, cache, cross)
            self._key, self._owners = key, owners  # held: an id stays theirs while the key holds
        self._ids[:r, 0] = tokens
        self._positions[:r] = positions
        self._fold[...] = fold
        self._unfold[:r] = folding[1]
        self.rt.decoder.run_with_iobinding(self.io)
        return self._logprobs[:r]

    def _bind(
        self, r: int, fold: tuple[int, ...], enc_mask: np.ndarray, cache: Sequence[Rows], cross: Sequence[Rows]
    ) -> None:
        rt, io = self.rt, self.io
        held = []
        for name, out_name, a in zip(rt.cache_names, rt.present_names, cache, strict=True):
            if isinstance(a, DeviceRows):  # by address: the same device memory in and out
                for bind, bound in ((io.bind_input, name), (io.bind_output, out_name)):
                    bind(bound, a.device, 0, np.float32, a.shape, address(a.value))
                continue
            value = ort.OrtValue.ortvalue_from_numpy(a)  # shares a's memory (a contiguous leading-row view)
            io.bind_ortvalue_input(name, value)
            io.bind_ortvalue_output(out_name, value)
            held.append(value)
        if self._logprobs.shape[0] < r:
            grown = max(r, 2 * self._logprobs.shape[0])
            self._logprobs = np.zeros((grown, rt.vocab), np.float32)
            self._ids, self._positions = np.zeros((grown, 1), np.int64), np.zeros(grown, np.int64)
            self._unfold = np.zeros(grown, np.int64)
        self._fold = np.zeros(fold, np.int64)
        inputs: list[tuple[str, Rows]] = [
            *zip(rt.cross_names, cross, strict=True),
            (graphs.ENCODER_ATTENTION_MASK, enc_mask),
            (graphs.INPUT_IDS, self._ids[:r]),
            (graphs.POSITION_IDS, self._positions[:r]),
            (graphs.FOLD, self._fold),
            (graphs.UNFOLD, self._unfold[:r]),
        ]
        for name, a in inputs:
            if isinstance(a, DeviceRows):
                io.bind_input(name, a.device, 0, np.float32, a.shape, address(a.value))
                continue
            held.append(ort.OrtValue.ortvalue_from_numpy(a))  # host memory: a device session copies it in
            io.bind_ortvalue_input(name, held[-1])
        held.append(ort.OrtValue.ortvalue_from_numpy(self._logprobs[:r]))
        io.bind_ortvalue_output(graphs.LOGPROBS, held[-1])
        self._held = held


def _owner(a: Rows) -> object:
    """What a bound buffer's memory belongs to (kept alive, and its id compared, while bound)."""
    if isinstance(a, DeviceRows):
        return a.value
    return a if a.base is None else a.base


class TranslatorRuntime:
    """The translator's two graphs behind plain numpy calls (`service.contract.graphs`).
    `device_buffers`: a running batch keeps its buffers in the decoder's device memory
    (`service.engine.device`); the default does so on CUDA, where host buffers would cross to the
    device and back at every step."""

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        n_layers: int,
        device_buffers: bool | None = None,
    ) -> None:
        self.encoder, self.decoder, self.n_layers = encoder, decoder, n_layers
        self.cache_names = graphs.cache_names(n_layers)
        self.cross_names = graphs.cross_names(n_layers)
        self.present_names = graphs.present_names(n_layers)
        outputs = {o.name: o for o in decoder.get_outputs()}
        self.in_place = self.present_names[0] in outputs  # IO contract 5
        self.outputs = [graphs.LOGPROBS, *(self.present_names if self.in_place else graphs.new_kv_names(n_layers))]
        shape = next(i for i in decoder.get_inputs() if i.name == self.cache_names[0]).shape  # (R, H, slots, d_k)
        self.heads, self.d_k = int(shape[1]), int(shape[3])
        self.vocab = int(outputs[graphs.LOGPROBS].shape[1])
        on_device = uses_cuda(decoder) if device_buffers is None else device_buffers
        self.device_ops = None
        if on_device and self.in_place:
            self.device_ops = DeviceOps("cuda" if uses_cuda(decoder) else "cpu", decoder.get_providers())

    def binding(self) -> StepBinding | None:
        """A binding for one caller's steps where the graph writes its cache in place, else None.
        On CUDA only over device buffers: bound to host memory, the whole cache would cross each step."""
        host_bound_on_cuda = self.device_ops is None and uses_cuda(self.decoder)
        return StepBinding(self) if self.in_place and not host_bound_on_cuda else None

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
        """Cross-attention K/V of every decoder layer: 2L arrays (B, H, S, d_k), once per sentence."""
        feed = {graphs.INPUT_IDS: ids, graphs.ATTENTION_MASK: mask}
        return list(self.encoder.run(self.cross_names, feed))

    def decode(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        enc_mask: np.ndarray,
        cache: Sequence[Rows],
        cross: Sequence[Rows],
        folding: tuple[np.ndarray, np.ndarray] | None = None,
        attention: bool = False,
        binding: StepBinding | None = None,
    ) -> DecoderStep:
        """One step for R rows of N sentences: row r's token at `positions[r]`, its keys in cache
        slots 0 .. positions[r]-1 (2L arrays (R, H, slots, d_k), contiguous: leading rows of a
        buffer, with a slot for the new key too); each sentence's source mask (N, S) and
        cross-attention K/V (2L arrays (N, H, S, d_k)); `folding`: which rows are whose
        (`graphs.fold_indices`; None: sentence r is row r). With a `binding`, the new keys are
        written into `cache` in place; without, they are returned for the caller to write."""
        folding = folding if folding is not None else graphs.per_row_folding(len(tokens))
        if binding is not None and not attention:
            return DecoderStep(binding.run(tokens, positions, enc_mask, cache, cross, folding), [])
        feed: dict[str, Rows] = {  # host arrays: device buffers are only ever bound
            graphs.INPUT_IDS: tokens.reshape(-1, 1),
            graphs.POSITION_IDS: positions,
            graphs.ENCODER_ATTENTION_MASK: enc_mask,
            graphs.FOLD: folding[0],
            graphs.UNFOLD: folding[1],
        }
        feed.update(zip(self.cache_names, cache, strict=True))
        feed.update(zip(self.cross_names, cross, strict=True))
        outs = self.decoder.run(self.outputs + ([graphs.CROSS_ATTENTIONS] if attention else []), feed)
        weights = graphs.unfold_rows(outs.pop(), folding[1]) if attention else None
        new_kv = graphs.new_kv_from_present(outs[1:], positions) if self.in_place else outs[1:]
        return DecoderStep(outs[0], new_kv, weights)


def choose_variant(manifest: Manifest, requested: str | None) -> str:
    """The requested variant when the version ships it, else the manifest's default (logged)."""
    if requested and requested in manifest.variants:
        return requested
    if requested:
        log.warning(
            "%s/%s has no %s variant; serving %s", manifest.name, manifest.version, requested, manifest.default_variant
        )
    return manifest.default_variant
