"""A translator runtime with exact arithmetic, for the batch and scheduler tests.

Its "K/V cache" stores the tokens each row has seen (heads 1, d_k 1: the new key of a step is
its token) and its "cross-attention" (one per sentence, IO contract 6) stores the sentence's
first source id, so the log-probabilities of a row depend only on what `RunningBatch` fed it: the
sentence it belongs to
and the prefix its cache slots hold. Wrong row bookkeeping (a bad reorder, a slot written in the
wrong place, an unmasked padding column, a moved block) gives wrong prefixes, and results that
differ from decoding the sentence alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from service.contract.graphs import per_row_folding
from service.engine.runtime import DecoderStep

BOS, EOS, PAD = 1, 2, 0


@cache
def table_logprobs(seed: int, sentence: int, prefix: tuple[int, ...], vocab: int, eos_bias: float = 0.0) -> np.ndarray:
    """A fixed random log-softmax per (sentence, prefix); EOS likelier as the prefix grows (and by
    `eos_bias` from the start: a model that wants to end early)."""
    logits = np.random.default_rng([seed, sentence, *prefix]).normal(size=vocab) * 2.0
    logits[EOS] += 0.4 * len(prefix) - 2.0 + eos_bias
    logits[[PAD, BOS]] = -30.0
    return (logits - np.logaddexp.reduce(logits)).astype(np.float32)


class FakeRuntime:
    """`TranslatorRuntime`'s interface over `table_logprobs`. `gate`, when set, pauses each step
    until released; `steps` counts decoder calls, `rows` records each call's row count."""

    n_layers, heads, d_k = 1, 1, 1
    device_ops = None  # host buffers

    def __init__(self, seed: int = 0, vocab: int = 12, eos_bias: float = 0.0) -> None:
        self.seed, self.vocab, self.eos_bias = seed, vocab, eos_bias
        self.steps = 0
        self.rows: list[int] = []
        self.gate: threading.Event | None = None
        self.fail: Callable[[], bool] = lambda: False

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
        cross = np.zeros((ids.shape[0], 1, ids.shape[1], 1), np.float32)
        # the sentence: its first source id, in every real column; padding: a value no sentence has
        cross[:, 0, :, 0] = np.where(mask == 1, ids[:, :1], -1.0)
        return [cross, cross]

    def binding(self) -> None:
        """No IO binding: the fake returns each step's keys for the batch to write (contract 4)."""

    def decode(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        enc_mask: np.ndarray,
        cache: Sequence[np.ndarray],
        cross: Sequence[np.ndarray],
        folding: tuple[np.ndarray, np.ndarray] | None = None,
        attention: bool = False,
        binding: None = None,
    ) -> DecoderStep:
        if self.gate is not None:
            self.gate.wait(20)
        if self.fail():
            raise RuntimeError("simulated runtime failure")
        self.steps += 1
        self.rows.append(len(tokens))
        fold, unfold = folding if folding is not None else per_row_folding(len(tokens))
        assert len(unfold) == len(tokens) and len(fold) == len(enc_mask) == len(cross[0])
        out = np.zeros((len(tokens), self.vocab), np.float32)
        for r in range(len(tokens)):
            valid = cache[0][r, 0, : positions[r], 0].astype(int).tolist()  # the row's own slots
            n, j = divmod(int(unfold[r]), fold.shape[1])  # the row's sentence, as the graph folds it
            assert fold[n, j] == r, "unfold must name the place fold gives the row"
            sentence = cross[0][n, 0, enc_mask[n] == 1, 0]
            assert len(set(sentence.tolist())) == 1, "a row must see exactly its own sentence"
            fed = (*valid, int(tokens[r]))
            assert fed[0] == BOS, "slot 0 must hold the row's BOS"
            out[r] = table_logprobs(self.seed, int(sentence[0]), fed[1:], self.vocab, self.eos_bias)
        new = tokens.reshape(-1, 1, 1, 1).astype(np.float32)
        return DecoderStep(out, [new, new])


class Observer:
    """A step scheduler's observer that records what the tests assert: cancellations by reason, sentences
    admitted, the compute stages timed."""

    def __init__(self) -> None:
        self.cancelled_by: dict[str, int] = {}
        self.admitted = 0
        self.stages: list[str] = []

    def queue_depth(self, depth: int) -> None:
        pass

    def batch_started(self, size: int, queue_waits: Sequence[float]) -> None:
        self.admitted += size

    def compute_time(self, stage: str, seconds: float) -> None:
        self.stages.append(stage)

    def generated(self, tokens: int) -> None:
        pass

    def active(self, sentences: int, rows: int) -> None:
        pass

    def cancelled(self, reason: str, sentences: int) -> None:
        self.cancelled_by[reason] = self.cancelled_by.get(reason, 0) + sentences
