"""ONNX Runtime: sessions, execution providers, thread count, and the translator's cached step.

The only module that imports onnxruntime. Sessions are built from bytes whose sha256 the registry
has just checked, so what runs is what the manifest pins, and an ONNX file that points at
external data cannot make the runtime read files outside the store.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.contract import graphs
from service.contract.manifest import Manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    providers: tuple[str, ...] = ("cpu",)
    threads: int = 0  # 0: the CPU quota of the container
    variant: str | None = None  # None: the manifest's default variant


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


def make_session(model: bytes, providers: Sequence[str], threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=list(providers))


def uses_cuda(session: ort.InferenceSession) -> bool:
    return session.get_providers()[0] == "CUDAExecutionProvider"


def _is_identity(rows: np.ndarray, n: int) -> bool:
    return len(rows) == n and bool((rows == np.arange(n)).all())


def run_classifier(session: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return session.run([graphs.LOGITS], {graphs.INPUT_IDS: ids, graphs.ATTENTION_MASK: mask})[0]


@dataclass
class DecoderState:
    """KV cache and encoder outputs of the live rows, passed explicitly in and out of each step.

    `sent` maps every live row to its sentence in the encoder batch. Cross-attention K/V and the
    source mask are gathered from the encoder outputs only when that mapping changes (beams
    expand after step one; sentences leave when done), never recomputed.
    """

    past: list[np.ndarray]  # 2L arrays (R, H, P, d_k)
    sent: np.ndarray  # (R,) sentence index of each live row
    enc_cross: list[np.ndarray]  # 2L arrays (B, H, S, d_k), as the encoder produced them
    enc_mask: np.ndarray  # (B, S)
    cross: list[np.ndarray] = field(default_factory=list)  # enc_cross gathered by `sent`
    mask: np.ndarray | None = None
    device_past: list[ort.OrtValue] | None = None  # CUDA: present K/V kept on the device
    device_cross: list[ort.OrtValue] | None = None  # CUDA: `cross` copied to the device once


class TranslatorRuntime:
    """Encoder and cached decoder step for one model; a `StepFn` for service.decoding."""

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, n_layers: int) -> None:
        self.encoder, self.decoder, self.n_layers = encoder, decoder, n_layers
        self.past_names = graphs.past_names(n_layers)
        self.cross_names = graphs.cross_names(n_layers)
        self.present_names = graphs.present_names(n_layers)
        shape = decoder.get_inputs()[2].shape  # (batch, heads, past, d_k)
        self.heads, self.d_k = int(shape[1]), int(shape[3])
        self.cuda = uses_cuda(decoder)

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> DecoderState:
        """Runs the encoder once per batch: cross-attention K/V for every decoder layer."""
        feed = {graphs.INPUT_IDS: ids, graphs.ATTENTION_MASK: mask}
        outs = self.encoder.run([graphs.LAST_HIDDEN_STATE, *self.cross_names], feed)
        b = ids.shape[0]
        empty = np.zeros((b, self.heads, 0, self.d_k), dtype=np.float32)
        return DecoderState(past=[empty] * len(self.past_names), sent=np.arange(b), enc_cross=outs[1:], enc_mask=mask)

    def step(self, tokens: np.ndarray, state: DecoderState, rows: np.ndarray) -> tuple[np.ndarray, DecoderState]:
        sent = state.sent[rows]
        if state.mask is None or not np.array_equal(sent, state.sent) or not state.cross:
            cross = [np.ascontiguousarray(a[sent]) for a in state.enc_cross]  # (R, H, S, d_k)
            mask = state.enc_mask[sent]
        else:
            cross, mask = state.cross, state.mask
        if self.cuda:
            return self._step_cuda(tokens, state, rows, sent, cross, mask)
        past = state.past if _is_identity(rows, len(state.sent)) else [np.take(p, rows, axis=0) for p in state.past]
        feed = {graphs.INPUT_IDS: tokens.reshape(-1, 1).astype(np.int64), graphs.ENCODER_ATTENTION_MASK: mask}
        feed.update(zip(self.past_names, past, strict=True))
        feed.update(zip(self.cross_names, cross, strict=True))
        outs = self.decoder.run([graphs.LOGPROBS, *self.present_names], feed)
        new = DecoderState(outs[1:], sent, state.enc_cross, state.enc_mask, cross, mask)
        return outs[0], new

    def _step_cuda(
        self,
        tokens: np.ndarray,
        state: DecoderState,
        rows: np.ndarray,
        sent: np.ndarray,
        cross: list[np.ndarray],
        mask: np.ndarray,
    ) -> tuple[np.ndarray, DecoderState]:
        """IO binding: present K/V stay on the GPU and feed the next step without a host copy.

        A beam reorder (rows not the identity) copies the cache to the host, gathers and binds it
        back: the log-probs are needed on the host each step anyway for the numpy search.
        """
        binding = self.decoder.io_binding()
        binding.bind_cpu_input(graphs.INPUT_IDS, tokens.reshape(-1, 1).astype(np.int64))
        binding.bind_cpu_input(graphs.ENCODER_ATTENTION_MASK, mask)
        device_cross = state.device_cross if cross is state.cross else None
        if device_cross is None:
            device_cross = [ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0) for arr in cross]
        for name, value in zip(self.cross_names, device_cross, strict=True):
            binding.bind_ortvalue_input(name, value)
        if state.device_past is not None and _is_identity(rows, len(state.sent)):
            for name, value in zip(self.past_names, state.device_past, strict=True):
                binding.bind_ortvalue_input(name, value)
        else:
            host = [v.numpy() for v in state.device_past] if state.device_past is not None else state.past
            for name, arr in zip(self.past_names, host, strict=True):
                binding.bind_cpu_input(name, np.ascontiguousarray(np.take(arr, rows, axis=0)))
        binding.bind_output(graphs.LOGPROBS, "cpu")
        for name in self.present_names:
            binding.bind_output(name, "cuda")
        self.decoder.run_with_iobinding(binding)
        outs = binding.get_outputs()
        new = DecoderState([], sent, state.enc_cross, state.enc_mask, cross, mask, list(outs[1:]), device_cross)
        return outs[0].numpy(), new


def choose_variant(manifest: Manifest, requested: str | None) -> str:
    """The requested variant when the version ships it, else the manifest's default (logged)."""
    if requested and requested in manifest.variants:
        return requested
    if requested:
        log.warning(
            "%s/%s has no %s variant; serving %s", manifest.name, manifest.version, requested, manifest.default_variant
        )
    return manifest.default_variant
