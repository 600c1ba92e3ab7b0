"""Fuzzy re-alignment (``fuzzy_resync``): right after a copy broke because the model changed a
word, where in the copied span copying resumes, before ``min_n`` exact tokens match again.

Among the places c in the copied text, from just before the break to a little past it, that
follow an occurrence of the last emitted token, the one whose preceding tokens best align with
the last tokens emitted (normalised token Levenshtein similarity) wins; ties go to the place a
same-length edit would reach. An insertion resumes at the break, a substitution or deletion
past it. Worked example: the prompt copied ``a b c d e`` and the output wrote ``a X c``: the
copy broke at ``X`` (expected ``b``); ``c`` occurred at the copied span's position 2, whose
preceding tokens ``a b c`` align with ``a X c`` at 2/3, so copying resumes at ``d``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def levenshtein(a, b):
    """Edit distance of two int32 arrays (unit costs), one row of the table at a time."""
    row = np.empty(b.shape[0] + 1, dtype=np.int64)
    for j in range(row.shape[0]):  # np.arange, without compiling it (~0.1 s on a fresh install)
        row[j] = j
    for i in range(a.shape[0]):
        diagonal, row[0] = row[0], i + 1
        for j in range(b.shape[0]):
            above = row[j + 1]
            row[j + 1] = min(above + 1, row[j] + 1, diagonal + (a[i] != b[j]))
            diagonal = above
    return row[b.shape[0]]


@njit(cache=True)
def realign(stream, length, lost_at, lost_source, window, context, ahead):
    """Where copying resumes in ``stream[:length]`` (the module's rule), the copy having broken
    when the stream was ``lost_at`` long, at source position ``lost_source``; -1: nowhere.
    Tried for up to ``window`` tokens after the break, comparing the last ``context`` tokens,
    searching up to ``ahead`` tokens past the expected place (config.draft_tuning's fuzzy_*)."""
    since = length - lost_at
    if lost_at < 0 or since > window or lost_source <= 0:
        return -1
    last = stream[length - 1]
    width = min(context, length)
    expected = lost_source + since  # where a same-length substitution would resume
    best, best_similarity, best_distance = -1, 0.0, 0
    for c in range(max(1, lost_source - 2), min(expected + ahead, lost_at)):
        if stream[c - 1] != last:
            continue
        w = min(width, c)
        similarity = 1.0 - levenshtein(stream[length - w : length], stream[c - w : c]) / w
        distance = abs(c - expected)
        if best < 0 or similarity > best_similarity or (similarity == best_similarity and distance < best_distance):
            best, best_similarity, best_distance = c, similarity, distance
    return best
