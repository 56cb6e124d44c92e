"""Evaluation metrics: classification accuracy / macro-F1 (numpy), translation BLEU / chrF (sacreBLEU)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accuracy(gold: Sequence[int], pred: Sequence[int]) -> float:
    g, p = np.asarray(gold), np.asarray(pred)
    return float((g == p).mean()) if len(g) else 0.0


def macro_f1(gold: Sequence[int], pred: Sequence[int], num_labels: int) -> float:
    """Unweighted mean of per-class F1, so the rare neutral class counts as much as the others."""
    g, p = np.asarray(gold), np.asarray(pred)
    f1s = []
    for c in range(num_labels):
        tp = float(((g == c) & (p == c)).sum())
        fp = float(((g != c) & (p == c)).sum())
        fn = float(((g == c) & (p != c)).sum())
        denom = 2 * tp + fp + fn
        f1s.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(f1s))


def classification_report(
    gold: Sequence[int], pred: Sequence[int], sources: Sequence[str], num_labels: int
) -> dict[str, dict[str, float]]:
    """Accuracy and macro-F1 overall and per data source."""
    report = {"all": {"n": len(gold), "accuracy": accuracy(gold, pred), "macro_f1": macro_f1(gold, pred, num_labels)}}
    for src in sorted(set(sources)):
        idx = [i for i, s in enumerate(sources) if s == src]
        g = [gold[i] for i in idx]
        p = [pred[i] for i in idx]
        report[src] = {"n": len(idx), "accuracy": accuracy(g, p), "macro_f1": macro_f1(g, p, num_labels)}
    return report


def bleu_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    import sacrebleu

    bleu = sacrebleu.corpus_bleu(list(hypotheses), [list(references)])
    chrf = sacrebleu.corpus_chrf(list(hypotheses), [list(references)])
    return {"bleu": round(float(bleu.score), 2), "chrf": round(float(chrf.score), 2)}
