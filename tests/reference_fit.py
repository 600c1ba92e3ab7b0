"""Plain-numpy reference of the step-cost line fit (test-only): ``line_scale`` written with
numpy's sort and cumulative sum; ``test_costmodel.py`` pins the two together.
"""

from __future__ import annotations

import numpy as np

WEIGHT_TOTAL = 2.0**61


def line_scale_reference(x, seconds, min_steps: int, min_spread: float) -> float:
    """:func:`line_scale` in numpy."""
    x, seconds = np.asarray(x, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if len(x) < min_steps:
        return -1.0
    spread = x.max() - x.min()
    if spread < min_spread or spread == 0.0:
        return -1.0
    i, j = np.triu_indices(len(x), 1)
    apart = np.abs(x[j] - x[i]) > min_spread / 10
    slopes = (seconds[j] - seconds[i])[apart] / (x[j] - x[i])[apart]
    weights = np.floor(np.abs(x[j] - x[i])[apart] * (WEIGHT_TOTAL / (spread * len(i)))).astype(np.int64)
    slope = weighted_median_reference(slopes, weights)
    plain = float(np.median(seconds - slope * x))
    if plain <= 0:
        return -1.0
    return min(max(slope / plain, 0.0), 50.0)


def weighted_median_reference(values, weights) -> float:
    """:func:`weighted_median` by sorting: the first value, in order, where twice the
    cumulative weight reaches the total."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(2 * cumulative, cumulative[-1])])
