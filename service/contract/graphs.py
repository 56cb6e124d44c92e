"""The ONNX graphs' IO contract: tensor names, special token ids, the batch layout, its version.

Classifier `model.onnx`: input_ids, attention_mask (batch, sequence) -> logits (batch, labels),
attentions (batch, heads, sequence, sequence): the last layer's self-attention weights.
Contract 7 adds, where the family has segments (BERT), a token_type_ids input (batch, sequence):
0 for a single text and a pair's first part, 1 for its second part, 0 on padding; the graph spec
in the manifest says whether a graph takes it. The manifest's `pair` framing says how two texts
are joined (`[CLS] a [SEP] b [SEP]`, `<s> a </s></s> b </s>`); no `pair`: the model takes single
texts only. A single-logit classifier is a scorer: its probability is the logit's sigmoid.
Translator graphs are those of contract 6; a contract 6 classifier (no pair framing) loads as before.

Translator `encoder.onnx`: input_ids, attention_mask (batch, source) -> last_hidden_state,
cross_key_values.{i}.key/value (batch, heads, source, d_k).

Translator `decoder.onnx` (IO contract 3), one token for each of R rows that may stand at
different positions, so sentences can join and leave a running batch at any step:
  input_ids (R, 1), position_ids (R,) the position of each row's token = how many keys of the
  row are cached, encoder_attention_mask (R, source),
  cache.{i}.key/value (R, heads, slots, d_k): each row's cached keys in slots 0 .. position-1,
  whatever is in the slots after them is never attended (masked inside the graph),
  cross_key_values.{i}.key/value (R, heads, source, d_k)
  -> logprobs (R, vocab),
  new_key_values.{i}.key/value (R, heads, 1, d_k): the token's key and value, which the caller
  writes into the row's slot `position` (the cache is the caller's, kept in place: the graph
  never copies it); cross_attentions (R, layers, heads, source): the weights each row's token
  gives the source, per layer and head.
Attention weights are outputs of the serving graphs rather than of extra graphs: they are
computed anyway, a caller fetches them only when asked, and extra graphs would carry a second
copy of every weight (the bundled store has a size budget).
Contract 6 folds the cross-attention: the decoder takes each sentence's source once, whatever its
number of rows (beams): encoder_attention_mask (N, source) and cross_key_values.{i}.key/value
(N, heads, source, d_k) for N sentences, with fold (N, M): the rows of each sentence's queries
(M: the widest sentence's rows; a sentence with fewer repeats one of its rows) and unfold (R,):
each row's place in the folded (N * M) queries (`fold_indices`); cross_attentions come folded
too, (N, layers, heads, M, source) (`unfold_rows`). The scores are one product of a sentence's
M queries with its keys; the weighted values one product per query, the sentence's values
broadcast to it (MatMul over (N, heads, M, 1, source) and (N, heads, 1, source, d_k)): keys and
values are read from memory once for all its beams and never copied per beam, and a query's
result is the same bit for bit whatever M, N or its slot, and as a row of contract 5. (The values
as one product of M queries too took about half the time again at beam 4, but one query alone
takes another kernel path there and differs in the last bit; padded to two, a greedy batch of 64
rows stepped 1.1 to 1.2x slower; measured, `bench.fold_step`. The scores' product keeps the bit.)
Contract 5 (the decoder's self-attention fused, `export.fused`) returns, instead of
new_key_values, present.{i}.key/value (R, heads, slots, d_k): the cache with each row's new key and
value written into its slot `position`. A caller that binds each cache input and its present output
to the same memory (ONNX Runtime's IO binding) gets the slot written in place and nothing else
copied; a plain call gets a copy of the cache (`new_kv_from_present` reads the new slot from it).
Contract 5's cross-attention inputs were per row (a beam's sentence copied once per beam).
Contract 4 (imported checkpoints) keeps contract 3's graphs and adds to the manifest what differs
between models: special ids (`decoder_start_id`, the first step's input, defaults to `bos_id`),
each source language's framing, each target language's forced first tokens, decoding defaults.
Its log-probabilities may hold -inf: suppressed ids (Marian's pad), never renormalised, as in
transformers' logits processors. The service reads contract 6 only: a version of 3 to 5 is
refused with the command that re-exports it.
Contract 1 (before step-level batching) had no position_ids; contract 2 returned the grown
cache (the past gathered by a row_index input, the new key appended), which copied every row's
cache twice per step. The candidates of a beam are ranked by the caller, for all rows at once:
ONNX Runtime's TopK and ReduceLogSumExp took 4x and 10x the time of the LogSoftmax (measured).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IO_CONTRACT_VERSION = 7
"""Bumped whenever a graph's inputs or outputs change meaning; the service refuses other versions."""
READABLE_IO_CONTRACTS = (6, 7)  # 3 and 4 copy the cache each step, 5 the cross K/V per beam: re-export

SPECIAL_IDS = {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3, "mask_id": 4}
"""Fixed across every model of the project (the tokenizer trainer checks it)."""

INPUT_IDS, ATTENTION_MASK, LOGITS = "input_ids", "attention_mask", "logits"
LAST_HIDDEN_STATE, ENCODER_ATTENTION_MASK, POSITION_IDS = "last_hidden_state", "encoder_attention_mask", "position_ids"
LOGPROBS, ATTENTIONS, CROSS_ATTENTIONS = "logprobs", "attentions", "cross_attentions"
FOLD, UNFOLD = "fold", "unfold"
TOKEN_TYPE_IDS = "token_type_ids"


def kv_names(prefix: str, n_layers: int) -> list[str]:
    """``{prefix}.{i}.key``, ``{prefix}.{i}.value`` for every layer, in that order."""
    return [f"{prefix}.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]


def cache_names(n_layers: int) -> list[str]:
    return kv_names("cache", n_layers)


def new_kv_names(n_layers: int) -> list[str]:
    return kv_names("new_key_values", n_layers)


def cross_names(n_layers: int) -> list[str]:
    return kv_names("cross_key_values", n_layers)


def present_names(n_layers: int) -> list[str]:
    return kv_names("present", n_layers)


def new_kv_from_present(present: Sequence[np.ndarray], positions: np.ndarray) -> list[np.ndarray]:
    """Each row's new key and value, (R, heads, 1, d_k), from contract 5's present outputs (R,
    heads, slots, d_k): the slot at the row's position (for callers that keep their own caches)."""
    rows = np.arange(len(positions))
    return [p[rows, :, positions][:, :, None] for p in present]


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


def fold_indices(starts: Sequence[int], widths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Contract 6's fold (N, M) and unfold (R,) for N sentences, sentence n holding the rows
    starts[n] .. starts[n] + widths[n] - 1 (R rows in all, each in one sentence): M is the widest
    sentence's rows; a sentence's spare query places repeat its last row."""
    start, width = np.asarray(starts, np.int64), np.asarray(widths, np.int64)
    m = max(widths, default=1)
    fold = start[:, None] + np.minimum(np.arange(m, dtype=np.int64), width[:, None] - 1)  # (N, M)
    offset = np.arange(int(width.sum()), dtype=np.int64) - np.repeat(np.cumsum(width) - width, width)  # in its sentence
    unfold = np.empty(len(offset), np.int64)
    unfold[np.repeat(start, width) + offset] = np.repeat(np.arange(len(width), dtype=np.int64) * m, width) + offset
    return fold, unfold


def per_row_folding(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """`fold_indices` of `rows` sentences of one row each (row r is sentence r)."""
    return fold_indices(range(rows), [1] * rows)


def unfold_rows(folded: np.ndarray, unfold: np.ndarray) -> np.ndarray:
    """Contract 6's folded cross-attention weights (N, layers, heads, M, source) per row: (R,
    layers, heads, source)."""
    n, layers, heads, m, source = folded.shape
    return folded.transpose(0, 3, 1, 2, 4).reshape(n * m, layers, heads, source)[unfold]
