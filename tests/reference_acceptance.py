"""Plain-Python references of ngramspec's acceptance kernels (test-only).

Each answers what its Numba kernel in ``ngramspec/draft/acceptance.py`` answers, written plainly;
``test_acceptance.py`` pins the two together with Hypothesis.
"""

from __future__ import annotations

import numpy as np

from ngramspec.draft.acceptance import BUCKETS, MATCH_CAP
from ngramspec.draft.config import DraftTuning

# The weights as the default config has them (the kernels take them from config.draft_tuning).
REQUEST_WEIGHT, POOL_PRIOR_WEIGHT, POOL_WINDOW, CALIBRATION_WEIGHT = (
    DraftTuning().request_weight, DraftTuning().pool_prior_weight, DraftTuning().pool_window,
    DraftTuning().calibration_weight)


def bucket_reference(match: int) -> int:
    return min(int(match).bit_length(), BUCKETS - 1)


def match_length_reference(stream: np.ndarray, length: int, start: int) -> int:
    before = stream[max(0, start - MATCH_CAP) : start][::-1]  # nearest first
    last = stream[length - before.shape[0] : length][::-1]
    differ = np.flatnonzero(before != last)
    return int(differ[0]) if differ.size else int(before.shape[0])


def position_acceptance_reference(own, pool, prior: float, source: int, match: int, k: int,
                                  calibration_weight: float = CALIBRATION_WEIGHT) -> list[float]:
    w = calibration_weight  # 0: no calibration
    calibration = min(1.0, (own[3][0] + w) / (own[3][1] + w)) if w else 1.0  # KEPT, PREDICTED

    def mean(b):  # the pool's prior for bucket b (module doc)
        shortest = 0 if b == 0 else 2 ** (b - 1)
        return max(prior if b == 0 else pooled(b - 1), prior, shortest / (shortest + 1))

    def pooled(b):  # the pool's estimate
        c = source * BUCKETS + b
        return (pool[0][c] + POOL_PRIOR_WEIGHT * mean(b)) / (pool[0][c] + pool[1][c] + POOL_PRIOR_WEIGHT)

    def borrowed(b):  # what the request borrows from the pool, before calibration
        c = source * BUCKETS + b
        return (1 - own[2][c]) * pooled(b) + own[2][c] * mean(b)

    def estimate(b):
        c = source * BUCKETS + b
        return (own[0][c] + REQUEST_WEIGHT * borrowed(b) * calibration) / (own[0][c] + own[1][c] + REQUEST_WEIGHT)

    if k:
        own[3][2] = borrowed(bucket_reference(match))  # PENDING_PREDICTION: the first position's
    return [estimate(bucket_reference(match + j)) for j in range(k)]


def learn_reference(own, pool, source: int, match: int, kept: int, verified: int) -> None:
    if verified:
        own[3][0] += kept > 0  # KEPT: the first position was
        own[3][1] += own[3][2]  # PREDICTED, when it was drafted
    for j in range(kept):
        _count(own, pool, source * BUCKETS + bucket_reference(match + j), 0)
    if kept < verified:
        _count(own, pool, source * BUCKETS + bucket_reference(match + kept), 1)


def _count(own, pool, b: int, refused: int) -> None:
    own[refused][b] += 1.0
    own[2][b] = 0.0
    pool[refused][b] += 1.0
    if pool[0][b] + pool[1][b] > POOL_WINDOW:
        pool[0][b] *= 0.5
        pool[1][b] *= 0.5


def fade_reference(own, source: int, match: int, memory: float) -> None:
    b = source * BUCKETS + bucket_reference(match)
    own[0][b], own[1][b] = own[0][b] * memory, own[1][b] * memory
    own[2][b] = 1 - memory * (1 - own[2][b])
    own[3][0], own[3][1] = own[3][0] * memory, own[3][1] * memory
