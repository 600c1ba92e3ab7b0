"""Plain-Python reference of the draft-sizing rule (test-only): every m tried, the first best
kept; ``test_sizing.py`` pins it to the compiled ``draft_lengths``.
"""

from __future__ import annotations

import math

import numpy as np


def draft_lengths_reference(acceptance, limits, step_costs, padded) -> tuple[np.ndarray, float]:
    """:func:`draft_lengths` written plainly: try every m, keep the first best."""
    candidates = candidates_reference(acceptance, limits, step_costs, padded)
    if not candidates:
        return np.zeros(0, dtype=np.int64), 0.0
    best = max(range(len(candidates)), key=lambda m: (candidates[m][1], -m))
    return np.array(candidates[best][0], dtype=np.int64), candidates[best][1]


def candidates_reference(acceptance, limits, step_costs, padded) -> list[tuple[list[int], float]]:
    """(lengths, value) for every m, in order of m (empty for no rows)."""
    rows = len(limits)
    if rows == 0:
        return []

    def gain(b, j):  # row b's j-th draft token is emitted
        return math.prod(acceptance[b, :j].tolist())

    def expected(lengths):
        return sum(sum(gain(b, j) for j in range(k + 1)) for b, k in enumerate(lengths))

    if padded:
        candidates = [[min(k, int(limit)) for limit in limits] for k in range(int(max(limits)) + 1)]
    else:
        gains = sorted(((gain(b, j), b) for b, limit in enumerate(limits) for j in range(1, int(limit) + 1)),
                       key=lambda g: -g[0])  # stable, as above
        candidates = []
        for m in range(len(gains) + 1):
            lengths = [0] * rows
            for _, b in gains[:m]:
                lengths[b] += 1
            candidates.append(lengths)
    return [(c, expected(c) / step_costs[m]) for m, c in enumerate(candidates)]
