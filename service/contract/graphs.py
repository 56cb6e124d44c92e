"""The ONNX graphs' IO contract: tensor names, special token ids, the batch layout, its version.

Classifier `model.onnx`: input_ids, attention_mask (batch, sequence) -> logits (batch, labels).
Translator `encoder.onnx`: input_ids, attention_mask (batch, source) -> last_hidden_state,
cross_key_values.{i}.key/value (batch, heads, source, d_k). `decoder.onnx`: input_ids (batch, 1),
encoder_attention_mask (batch, source), past_key_values.{i}.key/value (batch, heads, past, d_k),
cross_key_values.{i}.key/value -> logprobs (batch, vocab), present.{i}.key/value (batch, heads,
past + 1, d_k).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IO_CONTRACT_VERSION = 1
"""Bumped whenever a graph's inputs or outputs change meaning; the service refuses other versions."""

SPECIAL_IDS = {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3, "mask_id": 4}
"""Fixed across every model of the project (the tokenizer trainer checks it)."""

INPUT_IDS, ATTENTION_MASK, LOGITS = "input_ids", "attention_mask", "logits"
LAST_HIDDEN_STATE, ENCODER_ATTENTION_MASK, LOGPROBS = "last_hidden_state", "encoder_attention_mask", "logprobs"


def kv_names(prefix: str, n_layers: int) -> list[str]:
    """``{prefix}.{i}.key``, ``{prefix}.{i}.value`` for every layer, in that order."""
    return [f"{prefix}.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]


def past_names(n_layers: int) -> list[str]:
    return kv_names("past_key_values", n_layers)


def present_names(n_layers: int) -> list[str]:
    return kv_names("present", n_layers)


def cross_names(n_layers: int) -> list[str]:
    return kv_names("cross_key_values", n_layers)


def pad(seqs: Sequence[Sequence[int]], pad_id: int = SPECIAL_IDS["pad_id"]) -> tuple[np.ndarray, np.ndarray]:
    """The batch layout every graph takes: int64 ids right-padded to this batch's longest row, and
    the 1/0 attention mask; never padded to the model maximum."""
    n = max(len(s) for s in seqs)
    ids = np.full((len(seqs), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), n), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask
