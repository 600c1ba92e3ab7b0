"""The step-cost line fit: a robust, weighted line through an engine's timed steps, read as how
much dearer extra positions are than the prior says (:meth:`OnlineCost.step_scale
<ngramspec.cost.costmodel.OnlineCost.step_scale>`). One compiled kernel and the weighted median
it takes (a selection, not a sort: a fit over a full window's 8,128 slopes takes ~0.04 ms, where
with a radix sort it took ~0.17 ms and with Numba's own sorts ~0.6); its numpy reference is
``tests/reference_fit.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

WEIGHT_TOTAL = 2.0**61  # integer weights of a fit sum to at most this: 2x their sum fits an int64


@njit(cache=True)
def line_scale(x, seconds, min_steps, min_spread):
    """b / a of the line seconds = a + b x through the points (x (n,), seconds (n,)): b the
    median of the pairwise slopes weighted by how far apart the pair is in x (Sievers-Scholz;
    pairs at least min_spread / 10 apart), then a the median intercept. -1.0 where there are
    fewer than ``min_steps`` points, less than ``min_spread`` spread in x (or none), or no
    positive a; else clipped to [0, 50].

    Why weighted: an engine's steps crowd at small drafts, where a step costs about as much as
    a plain one, and a true cost curve can be more convex than the prior it is scaled from. The
    plain Theil-Sen median is then a slope between two near-equal small drafts: one request
    at a time, vLLM on 2 cores, 1-4 token drafts cost +0-10% and 24 tokens +110%, and the plain
    median read a scale of 0.0-0.2 (long drafts "free", drafts grew to 9 tokens for the same
    accepted tokens); weighting by the spread lets the pairs that span the sizes speak. The
    weights are integers (the spread in units of WEIGHT_TOTAL / (spread * pairs)), so their
    sums are exact in any order and the median is one slope, however it is found. (n = 128
    gives 8,128 pairs, refitted every step_refit steps: ~0.04 ms.) Reference: ``tests/reference_fit.py``."""
    n = x.shape[0]
    if n < min_steps:
        return -1.0
    spread = x.max() - x.min()
    if spread < min_spread or spread == 0.0:
        return -1.0
    pairs = n * (n - 1) // 2
    unit = WEIGHT_TOTAL / (spread * pairs)
    slopes = np.empty(pairs)
    weights = np.empty(pairs, dtype=np.int64)
    k = 0
    for i in range(n):
        for j in range(i + 1, n):
            apart = abs(x[j] - x[i])
            if apart > min_spread / 10:
                slopes[k] = (seconds[j] - seconds[i]) / (x[j] - x[i]) + 0.0  # -0.0 -> 0.0: they are equal
                weights[k] = np.int64(np.floor(apart * unit))
                k += 1
    slope = weighted_median(slopes[:k], weights[:k])  # k >= 1: the pair of x's least and greatest
    plain = np.median(seconds - slope * x)
    if plain <= 0:
        return -1.0
    return min(max(slope / plain, 0.0), 50.0)


@njit(cache=True)
def weighted_median(values, weights):
    """The least v of ``values`` (n >= 1, no NaN) whose weight, with every smaller value's,
    reaches half of all: ``2 * weights[values <= v].sum() >= weights.sum()`` (int64 weights,
    >= 0, summing to < 2**62). Quickselect: each round splits the range still in play into
    values below, at and above the middle of three, and keeps the side where the median lies;
    ~3n comparisons expected. Reorders both arrays.

    Example: values [3, 1, 2], weights [1, 1, 5]: the total is 7; up to 1 weighs 1 (2 < 7), up
    to 2 weighs 6 (12 >= 7): 2."""
    total = weights.sum()
    if total == 0:
        return values.min()  # every value reaches half of nothing: the least
    lo, hi, below = 0, values.shape[0], 0  # values[lo:hi] in play; `below`: weight of those under them
    while True:
        a, b, c = values[lo], values[(lo + hi) // 2], values[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))  # the middle of the three
        # Three-way partition of [lo, hi): [lo, less) < pivot, [less, i) == pivot, [more, hi) > pivot.
        less, i, more = lo, lo, hi
        weight_less, weight_equal = 0, 0
        while i < more:
            v = values[i]
            if v < pivot:
                values[i], values[less] = values[less], v
                weights[i], weights[less] = weights[less], weights[i]
                weight_less += weights[less]
                less += 1
                i += 1
            elif v > pivot:
                more -= 1
                values[i], values[more] = values[more], v
                weights[i], weights[more] = weights[more], weights[i]
            else:
                weight_equal += weights[i]
                i += 1
        # 2 * below < total holds throughout, so the side kept is never empty.
        if 2 * (below + weight_less) >= total:
            hi = less
        elif 2 * (below + weight_less + weight_equal) >= total:
            return pivot
        else:
            below += weight_less + weight_equal
            lo = more
