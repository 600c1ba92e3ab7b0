"""The one draft-sizing rule: how many draft tokens each row verifies in the next step.

Row b's j-th draft token (j = 1, 2, ...) is accepted with probability ``acceptance[b, j - 1]``
given that the one before it was (a per-position estimate,
:func:`ngramspec.draft.acceptance.position_acceptance`), so it is emitted with probability
g_bj = acceptance[b, 0] * ... * acceptance[b, j - 1], its *gain*; gains fall with j. A step that
verifies m draft positions costs ``step_costs[m]`` (relative to any fixed unit, e.g. a one-token
forward). The rule picks the m that maximises expected emitted tokens per unit cost, against a
plain step (m = 0), which emits one token per row:

* **flattened** (one row alone, vLLM's batch: rows are concatenated, each pays only for its
  own draft): m counts all rows' draft positions together. Positions are taken in order of
  their gain (each row's gains fall with j, so this is one sort), which gives the most
  expected tokens for every m; the m kept maximises (rows + sum of the first m gains) /
  step_costs[m]. Each row's length is how many of its positions were kept.
* **padded** (a transformers batch verified as one (rows, K + 1) tensor): every row pays for K
  positions whatever its own draft, so m is K per row; row b emits 1 + g_b1 + ... + g_bmin(K,
  k_b) in expectation, and its length is min(K, k_b).

Worked example, flattened, acceptance ((0.9, 0.9, 0.9), (0.5, 0.5)), limits (3, 2),
step_costs[m] = 1 + 0.1 (2 + m - 1): gains 0.9 0.81 0.73 | 0.5 0.25 -> sorted 0.9 0.81 0.73 0.5
0.25; (2 + first m) / cost: m=0 1.82, 1 2.32, 2 2.71, 3 2.96, 4 3.08, 5 3.06 -> m=4: lengths (3, 1).

All rows of a step are sized in one compiled call (:func:`draft_lengths`'s two kernels); the plain-Python
reference is ``tests/reference_sizing.py`` (a Hypothesis test pins them together).

**The loss bound** (:class:`LossBudget`): expected value alone can buy a long draft at the full
price of a long verify before the request has shown whether it copies (a long match after a long
prompt). Each request therefore keeps a credit, in plain steps: each step is given ``max_loss``
before it runs (the first also ``first_risk``) and settles what it saved, its emitted tokens
less its cost (``costs[q] / costs[1]``, q tokens verified). A draft is cut to the longest whose verify, were
all of it refused (one token emitted), loses no more than the credit. The credit thus never goes
below 0, so a request's forwards cost at most (1 + max_loss) x its tokens + first_risk plain
steps, whatever it drafts: at least 1 / (1.02 + 0.5 / tokens) of plain speed with the defaults.
Worked example (max_loss 0.02, first_risk 0.5, costs[q] = 1 + (q - 1) / 16): credit 0.52 affords
8 tokens (cost 1.5); all refused -> credit 0.52 + 1 - 1.5 + 0.02 = 0.04 (no draft: plain steps,
+0.02 each, until a draft of 1 costs no more than the credit); all 8 kept -> credit 0.52 + 9 -
1.5 + 0.02 = 8.04, which affords the 24-token maximum. max_loss None (the default): no bound.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def draft_lengths(acceptance, limits, step_costs, padded):
    """Each row's draft length (int64) and the best value (expected tokens per unit cost).

    acceptance (rows, K) float64 in [0, 1], K >= limits.max(): each position's acceptance given
    the one before it was; limits (rows,) int64, each row's longest draft; step_costs (M + 1,)
    float64: flattened, M >= limits.sum(); padded, M >= limits.max(). The two ways are two
    kernels (:func:`padded_lengths`, :func:`flattened_lengths`) that compiled callers name
    directly: a transformers process never compiles the flattened one's sort (~1 s).
    """
    return (padded_lengths if padded else flattened_lengths)(acceptance, limits, step_costs)


@njit(cache=True)
def padded_lengths(acceptance, limits, step_costs):
    """:func:`draft_lengths`, padded. For one row it equals the flattened way (a row's gains fall
    with j, so taking its positions by gain is taking them in order), which is how a single
    request's draft is sized."""
    rows = limits.shape[0]
    lengths = np.zeros(rows, dtype=np.int64)
    if rows == 0:
        return lengths, 0.0
    best_m, best = 0, rows / step_costs[0]
    longest = 0
    for b in range(rows):  # loops, not limits.max() and np.ones: each compiles for ~0.3 s
        longest = max(longest, limits[b])
    power = np.empty(rows)
    for b in range(rows):
        power[b] = 1.0
    expected = float(rows)
    for k in range(1, longest + 1):
        for b in range(rows):
            if limits[b] >= k:
                power[b] *= acceptance[b, k - 1]
                expected += power[b]
        value = expected / step_costs[k]
        if value > best:
            best_m, best = k, value
    for b in range(rows):
        lengths[b] = min(best_m, limits[b])
    return lengths, best


@njit(cache=True)
def flattened_lengths(acceptance, limits, step_costs):
    """:func:`draft_lengths`, flattened (vLLM's rows). Only the positions that can be in the
    best m are ordered (:func:`_contenders`): on an engine whose extra positions cost what they
    do on a CPU, a small part of a step's positions, and a row's gains are read only down to
    the first that cannot be."""
    rows = limits.shape[0]
    lengths = np.zeros(rows, dtype=np.int64)
    if rows == 0:
        return lengths, 0.0
    best_m, best = 0, rows / step_costs[0]
    total = limits.sum()
    floor = _floor(best, step_costs, total)  # the best m's positions gain more (_contenders)
    gains = np.empty(total)
    owner = np.empty(total, dtype=np.int64)
    at, gained = 0, 0.0
    for b in range(rows):
        g = 1.0
        for j in range(limits[b]):
            g *= acceptance[b, j]
            if not g > floor:  # a row's gains fall with j (estimates <= 1): so do the rest
                break
            gains[at], owner[at] = g, b
            gained += g
            at += 1
    if floor > -np.inf and at > 0:
        at = _contenders(gains[:at], owner[:at], rows, step_costs, max(best, (rows + gained) / step_costs[at]))
    order = _by_gain(gains[:at])
    expected = float(rows)
    for m in range(1, at + 1):
        expected += gains[order[m - 1]]
        value = expected / step_costs[m]
        if value > best:
            best_m, best = m, value
    for m in range(best_m):
        lengths[owner[order[m]]] += 1
    return lengths, best


@njit(cache=True)
def _floor(reached, step_costs, n):
    """A gain the best m's last position exceeds, if m <= n and some m reaches a value of
    ``reached`` (:func:`_contenders`): ``reached`` x the least marginal cost over 1..n; -inf
    where that or the plain step's cost is <= 0 (nothing is ruled out)."""
    least = np.inf
    for m in range(1, n + 1):
        least = min(least, step_costs[m] - step_costs[m - 1])
    if n == 0 or not (least > 0 and step_costs[0] > 0):
        return -np.inf
    return reached * least * (1.0 - 1e-9)  # (a margin far above rounding)


@njit(cache=True)
def _contenders(gains, owner, rows, step_costs, reached):
    """Move the positions that can be among the best m to the front of ``gains`` and ``owner``,
    in the order they were (row-major: ties stay in a stable sort's order), and return how
    many. ``gains`` holds the first n positions in gain order, and some m reaches a value of
    ``reached``. The best m is the first to reach the largest value V, so its last position
    (gain g) raised the value: (A + g) / c > A / p, with A = rows + the gains before it, c and
    p the costs of m and m - 1; A = V c - g gives g > V (c - p) >= reached x (the least
    marginal cost over 1..n) (:func:`_floor`). The n' positions gaining more than that are the
    first n' in gain order, m is at most n', and value(n') is reached: a smaller n and a larger
    bound to start again from (rounds while each rules out a quarter of what is left)."""
    n, cut = gains.shape[0], -np.inf  # n: the positions gaining more than cut
    for _ in range(4):
        floor = _floor(reached, step_costs, n)
        if floor == -np.inf:
            break
        kept, gained = 0, 0.0
        for i in range(gains.shape[0]):  # (no branch: vector compares)
            above = gains[i] > floor
            kept += above
            gained += gains[i] if above else 0.0
        shrank = kept < n - (n >> 2)
        n, cut = kept, floor
        if n == 0 or not shrank:
            break
        reached = max(reached, (rows + gained) / step_costs[n])
    if n < gains.shape[0]:
        at = 0
        for i in range(gains.shape[0]):
            if gains[i] > cut:
                gains[at], owner[at] = gains[i], owner[i]
                at += 1
    return n


@njit(cache=True)
def _by_gain(gains):
    """Indices of ``gains`` (non-negative floats) from the largest down, ties in index order:
    ``np.argsort(-gains, kind="stable")`` in expected linear time (a comparison sort of a
    vLLM step's 256 rows x 16 positions costs more than the rest of drafting). Positive
    floats order as their bit patterns do, so the patterns' leading bits, scaled to the range
    present, give about one bucket per gain; buckets fill in index order and an insertion sort
    by gain finishes each (equal gains, e.g. rows at the prior, are already in order)."""
    count = gains.shape[0]
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    bits = (gains + 0.0).view(np.int64)  # monotone in the value for floats >= +0.0 (-0.0 + 0.0 is +0.0)
    low, high = bits.min(), bits.max()
    shift = 0
    while (high - low) >> shift >= count:
        shift += 1
    buckets = np.zeros(((high - low) >> shift) + 2, dtype=np.int64)
    for i in range(count):
        buckets[((high - bits[i]) >> shift) + 1] += 1  # the largest gain first
    for k in range(1, buckets.shape[0]):
        buckets[k] += buckets[k - 1]  # buckets[k]: where bucket k starts
    order = np.empty(count, dtype=np.int64)
    for i in range(count):
        k = (high - bits[i]) >> shift
        order[buckets[k]] = i
        buckets[k] += 1
    start = 0
    for k in range(buckets.shape[0] - 1):  # buckets[k] is now where bucket k ends
        for a in range(start + 1, buckets[k]):
            i = order[a]
            b = a
            while b > start and gains[order[b - 1]] < gains[i]:
                order[b] = order[b - 1]
                b -= 1
            order[b] = i
        start = buckets[k]
    return order


class LossBudget:
    """One request's credit under the loss bound (module doc): ``cap`` a draft to what it can
    afford to lose, ``settle`` each step's tokens against its cost."""

    def __init__(self, max_loss: float, first_risk: float):
        self.max_loss, self.credit = max_loss, first_risk + max_loss

    def cap(self, costs) -> int:
        """The longest draft k with costs[k + 1] / costs[1] - 1 <= credit (costs[q]: a forward
        over q tokens, q >= 1; a learned table need not rise everywhere with q)."""
        longest = 0
        for k in range(1, len(costs) - 1):
            if costs[k + 1] / costs[1] - 1.0 <= self.credit:
                longest = k
        return longest

    def settle(self, emitted: int, verified: int, costs) -> None:
        """A step verified ``verified`` tokens (1 + its draft) and emitted ``emitted``."""
        self.credit += self.max_loss + emitted - costs[verified] / costs[1]


def warm_up() -> None:
    """Compile (or load from Numba's cache) the padded way, a transformers batch's (vLLM's
    proposer warms the flattened one), so no step pays the JIT."""
    padded_lengths(np.full((1, 2), 0.5), np.array([2], dtype=np.int64), np.ones(3))
