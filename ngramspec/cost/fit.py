"""The step-cost line fit: a robust, weighted line through an engine's timed steps, read as how
much dearer extra positions are than the prior says (:meth:`OnlineCost.step_scale
<ngramspec.cost.costmodel.OnlineCost.step_scale>`). One compiled kernel; its numpy reference
is ``tests/reference_fit.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def line_scale(x, seconds, min_steps, min_spread):
    """b / a of the line seconds = a + b x through the points (x (n,), seconds (n,)): b the
    median of the pairwise slopes weighted by how far apart the pair is in x (Sievers-Scholz;
    pairs at least min_spread / 10 apart), then a the median intercept. -1.0 where there are
    fewer than ``min_steps`` points, less than ``min_spread`` spread in x, or no positive a;
    else clipped to [0, 50].

    Why weighted: an engine's steps crowd at small drafts, where a step costs about as much as
    a plain one, and a true cost curve can be more convex than the prior it is scaled from. The
    plain Theil-Sen median is then a slope between two near-equal small drafts: one request
    at a time, vLLM on 2 cores, 1-4 token drafts cost +0-10% and 24 tokens +110%, and the plain
    median read a scale of 0.0-0.2 (long drafts "free", drafts grew to 9 tokens for the same
    accepted tokens); weighting by the spread lets the pairs that span the sizes speak. (n =
    128 gives 8,128 pairs, refitted every STEP_REFIT steps.) Reference: ``tests/reference_fit.py``."""
    n = x.shape[0]
    if n < min_steps or x.max() - x.min() < min_spread:
        return -1.0
    slopes = np.empty(n * (n - 1) // 2)
    weights = np.empty(n * (n - 1) // 2)
    k = 0
    for i in range(n):
        for j in range(i + 1, n):
            apart = abs(x[j] - x[i])
            if apart > min_spread / 10:
                slopes[k] = (seconds[j] - seconds[i]) / (x[j] - x[i])
                weights[k] = apart
                k += 1
    order = np.argsort(slopes[:k], kind="mergesort")
    half = 0.0
    for i in order:  # summed in slope order, as the reference does
        half += weights[i]
    half, total, slope = 0.5 * half, 0.0, 0.0
    for i in order:  # the weighted median: the first slope past half the total weight
        total += weights[i]
        slope = slopes[i]
        if total >= half:
            break
    plain = np.median(seconds - slope * x)
    if plain <= 0:
        return -1.0
    return min(max(slope / plain, 0.0), 50.0)
