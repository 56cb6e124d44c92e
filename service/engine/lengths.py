"""Runs of similar length: a padded batch costs its rows times its longest row, so texts of very
different lengths are cheaper in several runs (the translator's encoder, the classifier)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def length_groups(lengths: Sequence[int], call_tokens: int) -> list[list[int]]:
    """Indices of `lengths` in groups of similar length, one graph run each: the grouping with
    the least cost, a run costing its rows times its longest length plus `call_tokens` (its fixed
    cost in tokens' worth). Found exactly over the sorted lengths (a group is a run of them)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ordered = np.array([lengths[i] for i in order], np.int64)
    best = np.zeros(len(order) + 1, np.int64)  # best[j]: the cost of the j shortest
    cut = np.zeros(len(order) + 1, np.int64)  # where the group ending at j starts
    for j in range(1, len(order) + 1):
        cost = best[:j] + (j - np.arange(j)) * ordered[j - 1] + call_tokens
        cut[j] = int(np.argmin(cost))
        best[j] = cost[cut[j]]
    groups, j = [], len(order)
    while j:
        groups.append(order[cut[j] : j])
        j = int(cut[j])
    return groups[::-1]
