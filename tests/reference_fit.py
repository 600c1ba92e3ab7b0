"""Plain-numpy reference of the step-cost line fit (test-only): ``line_scale`` written with
numpy's sort and cumulative sum; ``test_costmodel.py`` pins the two together.
"""

from __future__ import annotations

import numpy as np


def line_scale_reference(x, seconds, min_steps: int, min_spread: float) -> float:
    """:func:`line_scale` in numpy."""
    x, seconds = np.asarray(x, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if len(x) < min_steps or x.max() - x.min() < min_spread:
        return -1.0
    i, j = np.triu_indices(len(x), 1)
    apart = np.abs(x[j] - x[i]) > min_spread / 10
    slopes = (seconds[j] - seconds[i])[apart] / (x[j] - x[i])[apart]
    weights = np.abs(x[j] - x[i])[apart]
    order = np.argsort(slopes, kind="stable")
    cumulative = np.cumsum(weights[order])
    slope = float(slopes[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])])
    plain = float(np.median(seconds - slope * x))
    if plain <= 0:
        return -1.0
    return min(max(slope / plain, 0.0), 50.0)
