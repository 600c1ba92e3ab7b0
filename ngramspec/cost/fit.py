"""The step-cost line fit: a robust, weighted line through an engine's timed steps, read as how
much dearer extra positions are than the prior says (:meth:`OnlineCost.step_scale
<ngramspec.cost.costmodel.OnlineCost.step_scale>`). One compiled kernel and the stable sort
it takes (a radix sort: Numba's own sorts take ~0.47 ms for a full window's 8,128 slopes, this
one ~0.17 ms); its numpy reference is ``tests/reference_fit.py``.
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
    128 gives 8,128 pairs, refitted every STEP_REFIT steps: ~0.23 ms.) Reference: ``tests/reference_fit.py``."""
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
                slopes[k] = (seconds[j] - seconds[i]) / (x[j] - x[i]) + 0.0  # -0.0 -> 0.0: they are equal
                weights[k] = apart
                k += 1
    order = stable_argsort(slopes[:k])
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


RADIX_BITS = 11  # a pass sorts by 11 bits: 2,048 counters, 6 passes for 64 bits


@njit(cache=True)
def stable_argsort(keys):
    """``np.argsort(keys, kind="stable")`` for float64 keys with no NaN and no -0.0: a
    least-significant-digit radix sort of their bits, ordered as unsigned integers (negative
    keys' bits flipped, the sign bit set on the others). On 8,128 slopes ~0.17 ms, where
    Numba's sorts take ~0.47 ms, and stable by construction; a pass where every key has the
    same digit is skipped."""
    n = keys.shape[0]
    bits = np.empty(n, dtype=np.uint64)
    sign = np.uint64(1) << np.uint64(63)
    raw = keys.view(np.uint64)
    for i in range(n):
        bits[i] = ~raw[i] if raw[i] & sign else raw[i] | sign
    order, other = np.arange(n), np.empty(n, dtype=np.int64)
    other_bits = np.empty(n, dtype=np.uint64)  # the keys move with their indices: every read in order
    counts = np.empty(1 << RADIX_BITS, dtype=np.int64)
    mask = np.uint64((1 << RADIX_BITS) - 1)
    for shift in range(0, 64, RADIX_BITS):
        counts[:] = 0
        for i in range(n):
            counts[(bits[i] >> np.uint64(shift)) & mask] += 1
        if n == 0 or counts[(bits[0] >> np.uint64(shift)) & mask] == n:
            continue  # every key has this digit: the order stands
        at = 0
        for d in range(counts.shape[0]):  # each digit's first place
            at, counts[d] = at + counts[d], at
        for i in range(n):
            d = (bits[i] >> np.uint64(shift)) & mask
            other[counts[d]], other_bits[counts[d]] = order[i], bits[i]
            counts[d] += 1
        order, other, bits, other_bits = other, order, other_bits, bits
    return order
