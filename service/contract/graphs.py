"""The ONNX graphs' IO contract: tensor names, special token ids, the batch layout, its version.

Classifier `model.onnx`: input_ids, attention_mask (batch, sequence) -> logits (batch, labels),
attentions (batch, heads, sequence, sequence): the last layer's self-attention weights.

Translator `encoder.onnx`: input_ids, attention_mask (batch, source) -> last_hidden_state,
cross_key_values.{i}.key/value (batch, heads, source, d_k).

Translator `decoder.onnx` (IO contract 2), one token for each of R rows that may stand at
different positions, so sentences can join and leave a running batch at any step:
  input_ids (R, 1), position_ids (R,) the position of each row's token,
  row_index (R,) the row of past_key_values each row continues (beam reorder, rows leaving),
  past_attention_mask (R, past) 1 where a row's own cached key is, 0 on padding,
  encoder_attention_mask (R, source), past_key_values.{i}.key/value (R_before, heads, past, d_k),
  cross_key_values.{i}.key/value (R, heads, source, d_k)
  -> logprobs (R, vocab), present.{i}.key/value (R, heads, past + 1, d_k): the gathered past
  with the new key appended (the new key is always attended), cross_attentions (R, layers, heads,
  source): the weights each row's token gives the source, per layer and head.
Attention weights are outputs of the serving graphs rather than of extra graphs: they are
computed anyway, a caller fetches them only when asked, and extra graphs would carry a second
copy of every weight (the bundled store has a size budget).
Contract 1 (before step-level batching) had no position_ids, row_index or past_attention_mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IO_CONTRACT_VERSION = 2
"""Bumped whenever a graph's inputs or outputs change meaning; the service refuses other versions."""

SPECIAL_IDS = {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3, "mask_id": 4}
"""Fixed across every model of the project (the tokenizer trainer checks it)."""

INPUT_IDS, ATTENTION_MASK, LOGITS = "input_ids", "attention_mask", "logits"
LAST_HIDDEN_STATE, ENCODER_ATTENTION_MASK, LOGPROBS = "last_hidden_state", "encoder_attention_mask", "logprobs"
POSITION_IDS, ROW_INDEX, PAST_ATTENTION_MASK = "position_ids", "row_index", "past_attention_mask"
ATTENTIONS, CROSS_ATTENTIONS = "attentions", "cross_attentions"


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
