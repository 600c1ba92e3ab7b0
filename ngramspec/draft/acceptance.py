"""The one acceptance estimate: how likely each drafted position is to be kept by the target.

A copied draft continues an earlier occurrence of the text's suffix. How long that match is
(``match``: how many tokens before the copy's source equal the last tokens of the text, capped
at MATCH_CAP; for a copy from the shared history, the n of the index's match) says how sure
the copy is, and it grows along the draft: the j-th drafted token
(j = 0, 1, ...) is reached only if the ones before it were accepted, so it continues a match of
``match + j`` tokens. The estimate for position j, given the one before it was accepted, is
therefore one function of ``match + j``, learned in buckets of doubling match length
(:func:`bucket`: 0, 1, 2-3, 4-7, ..., 64+). The pool's prior for a bucket is the largest of
``prior``, its estimate for the next shorter bucket, and L / (L + 1) for the bucket's shortest
match L (text that agreed for L tokens goes on agreeing about that often: 0.67 at 2 tokens,
0.89 at 8, 0.98 at 64, against 0.59, 0.88 and 0.997 measured). So a bucket no draft has
reached yet, such as the long matches of a copy that sizing kept short, does not start from a
flat 0.5 that would keep it short for ever. Measured over the 220 greedy traces of the default
model (unsized drafts of up to 16 tokens), acceptance of a reached position by bucket of
``match + j``: 1: 0.24, 2-3: 0.59, 4-7: 0.78, 8-15: 0.88, 16-31: 0.95, 32-63: 0.98, 64+: 0.997,
where the one rate per match kind it replaces said 0.47 for the whole of a 1-token match's draft.

Copies keep separate buckets by ``source``: OWN (the request's own text), HISTORY (the shared
history of earlier outputs: another bet after the same match) and CONTESTED (an own-text copy
found by the index whose matched n-gram's earliest and latest earlier occurrences continue
with different tokens: the text has gone both ways after it). Measured on the 100 shared
greedy traces (index copies, first drafted token kept), after a 1-token match: contested 0.19,
once-seen 0.32, uncontested 0.46; after 2-3 tokens: 0.28, 0.56, 0.71.
Evidence is counted twice, as (accepted, rejected) positions per bucket: per request, and
pooled over every request of a speculator (so a new request starts from what the model does on
this workload, not from a constant). Request evidence outweighs the pool once the request has
shown ``request_weight`` positions of that bucket; the pool starts from ``prior`` with the
weight of ``pool_prior_weight`` positions and halves its counts past ``pool_window``, so it
follows a workload that changes (config.draft_tuning holds the three).

A declined (or unverified) draft teaches nothing, and a bucket whose drafts are always
declined would never be re-tried: each decline fades the request's evidence for the first
position's bucket by ``memory`` and moves what the request borrows from the pool there toward
the bucket's prior (row DOUBT of the request's evidence: 0 trusts the pool, 1 the prior; a
verified draft resets it). Only the request's own state fades, so a batch of 256 rows that
all decline fades no faster than one row, and the pool keeps its memory.

A request that copies less than the pool's requests did shows it in every bucket, long before
any one bucket holds ``request_weight`` positions of its own, so the request calibrates what
it borrows across buckets (row CALIBRATION): each verified draft adds whether its first
position was kept (KEPT) and what the borrowed estimate predicted for it (PREDICTED), and every
borrowed estimate is scaled by min(1, (KEPT + w) / (PREDICTED + w)), w ``calibration_weight``.
Declines fade both by ``memory``. Only down: a request that copies more than predicted soon
outweighs the pool in its own buckets. Measured by replay (eval/results/calibration): the
worst of the 100 shared traces 0.94x -> 0.97x plain at the CPU curve, the worst of 13
long-prompt summaries at 128 new tokens 0.94x -> 0.98x, overall unchanged or up.

Worked example (prior 0.5, no request evidence, own text): pool bucket 0 is empty -> 0.5;
bucket 1 (match 1) holds 1 accepted, 3 rejected -> (1 + 2 x 0.5) / (4 + 2) = 0.33; bucket 2
(match 2-3) holds 6 accepted, 2 rejected -> (6 + 2 x 2/3) / (8 + 2) = 0.73; bucket 3 (match
4-7) is empty -> max(0.73, 4/5) = 0.8; bucket 4 (8-15) -> max(0.8, 8/9) = 0.89. A draft after a
1-token match is estimated (0.33, 0.73, 0.73, 0.8, 0.8, 0.8, 0.8, 0.89, ...).

Each kernel has a plain-Python reference in ``tests/reference_acceptance.py``; ``tests/test_acceptance.py``
pins them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BUCKETS = 8  # match lengths 0, 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64+
OWN, HISTORY, CONTESTED = 0, 1, 2  # where a draft is copied from: evidence columns source * BUCKETS + bucket
SOURCES = 3
ACCEPTED, REJECTED, DOUBT, CALIBRATION = 0, 1, 2, 3  # evidence rows (the pool's DOUBT, CALIBRATION unused)
KEPT, PREDICTED, PENDING_PREDICTION = 0, 1, 2  # the CALIBRATION row's columns (module doc)
MATCH_CAP = 64  # longest match measured: constant work per draft, whatever the context


@njit(cache=True)
def bucket(match):
    """The evidence bucket of a match length: its bit length, at most BUCKETS - 1."""
    b = 0
    while match > 0 and b < BUCKETS - 1:
        match >>= 1
        b += 1
    return b


@njit(cache=True)
def match_length(stream, length, start):
    """How many tokens before ``stream[start]`` equal the last tokens of ``stream[:length]``
    (at most MATCH_CAP and at most ``start``): the match a copy from ``start`` continues."""
    m = 0
    while m < MATCH_CAP and m < start and stream[start - 1 - m] == stream[length - 1 - m]:
        m += 1
    return m


@njit(cache=True)
def position_acceptance(own, pool, prior, source, match, out, request_weight, pool_prior_weight, calibration_weight):
    """Fill ``out`` (k,) float64 with the estimate for drafted positions 0..k-1 of a copy from
    ``source`` that continues a ``match``-token match. own, pool: (4, SOURCES * BUCKETS) float64
    (:func:`new_evidence`); where k > 0, the first position's borrowed estimate (before
    calibration) is kept in ``own``, for :func:`learn` to compare with what the target does."""
    j, k = 0, out.shape[0]
    pooled = prior
    calibration = 1.0  # calibration_weight 0: none
    if calibration_weight > 0:
        calibration = min(1.0, (own[CALIBRATION, KEPT] + calibration_weight)
                          / (own[CALIBRATION, PREDICTED] + calibration_weight))
    for b in range(BUCKETS):  # up to the last position's bucket (the chain needs every one below)
        if j == k:
            break
        c = source * BUCKETS + b
        shortest = 0 if b == 0 else 1 << (b - 1)  # the bucket's shortest match
        mean = max(pooled, prior, shortest / (shortest + 1.0))
        pooled = (pool[0, c] + pool_prior_weight * mean) / (pool[0, c] + pool[1, c] + pool_prior_weight)
        borrowed = (1.0 - own[DOUBT, c]) * pooled + own[DOUBT, c] * mean
        if j == 0 and bucket(match) == b:  # the first position's bucket
            own[CALIBRATION, PENDING_PREDICTION] = borrowed
        borrowed *= calibration
        estimate = (own[0, c] + request_weight * borrowed) / (own[0, c] + own[1, c] + request_weight)
        while j < k and bucket(match + j) == b:  # positions' buckets never decrease along a draft
            out[j] = estimate
            j += 1


@njit(cache=True)
def learn(own, pool, source, match, kept, verified, pool_window):
    """A draft from ``source`` continuing a ``match``-token match had ``verified`` positions
    checked and the target kept the first ``kept``: each kept position counts as accepted in
    its bucket, the first refused one (if any) as rejected; into the request's and the pool's
    evidence. Where any was verified, the first position's outcome and the pool's prediction
    for it (kept by :func:`position_acceptance` when it was drafted) join the request's
    calibration."""
    if verified > 0:
        own[CALIBRATION, KEPT] += 1.0 if kept > 0 else 0.0
        own[CALIBRATION, PREDICTED] += own[CALIBRATION, PENDING_PREDICTION]
    for j in range(kept + (kept < verified)):
        b = source * BUCKETS + bucket(match + j)
        refused = 1 if j == kept else 0
        own[refused, b] += 1.0
        own[DOUBT, b] = 0.0  # verified: the pool speaks for this bucket again
        pool[refused, b] += 1.0
        if pool[0, b] + pool[1, b] > pool_window:
            pool[0, b] *= 0.5
            pool[1, b] *= 0.5


@njit(cache=True)
def fade(own, source, match, memory):
    """A draft after a ``match``-token match was declined or not verified, so its first
    position taught nothing: the request's evidence for that bucket and its calibration fade by
    ``memory`` and its doubt in the pool grows (module doc), so drafts that once failed are
    retried."""
    b = source * BUCKETS + bucket(match)
    own[ACCEPTED, b] *= memory
    own[REJECTED, b] *= memory
    own[DOUBT, b] = 1.0 - (1.0 - own[DOUBT, b]) * memory
    own[CALIBRATION, KEPT] *= memory
    own[CALIBRATION, PREDICTED] *= memory


def new_evidence() -> np.ndarray:
    """Empty evidence per source and bucket: (4, SOURCES * BUCKETS) float64, rows ACCEPTED,
    REJECTED (positions), DOUBT and CALIBRATION (its first three columns)."""
    return np.zeros((4, SOURCES * BUCKETS))

