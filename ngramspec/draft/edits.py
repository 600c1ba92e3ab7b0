"""Edits recur (``edit_recurrence``): what the output wrote in place of a prompt span, learned
when the copy resumes after it, is drafted again wherever a later copy holds that span (a
rename, a spelling fix).

A slot's edits live in three arrays, at most ``max_edits`` of them, each side at most
``edit_span`` tokens (config.draft_tuning): ``tokens`` (max_edits, 2, edit_span) int32 (row 0
the replaced span, row 1 what replaces it), ``sizes`` (max_edits, 2) int64 (their lengths) and
``stamps`` (max_edits,) int64
(0: free; else the order learned, oldest first). An edit learned again becomes the newest; a
full store forgets its oldest; an edit the target refused where it applied is forgotten.

Worked example: the prompt holds ``... x 7 y ...`` and the output wrote ``x 8 y``: the copy broke
at 8 and resumed at ``y``, so (7,) -> (8,) is learned, and a later copy of ``7 z`` drafts ``8 z``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def new_edits(slots: int, tuning) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty edit stores for ``slots`` slots (``tuning``: a DraftTuning): (tokens, sizes,
    stamps), see the module doc."""
    count, span = tuning.max_edits, tuning.edit_span
    return (np.zeros((slots, count, 2, span), dtype=np.int32), np.zeros((slots, count, 2), dtype=np.int64),
            np.zeros((slots, count), dtype=np.int64))


@njit(cache=True)
def apply_edits(copied, limit, tokens, sizes, stamps, out):
    """Copy ``copied`` into ``out`` (room for ``limit`` + the edit span), replacing each span an edit
    replaced by what it wrote (the oldest edit first where several match). Returns (tokens
    written, at most ``limit``; the first edit applied, -1 if none; its position in ``out``)."""
    # The oldest matching edit is the live one (stamp > 0; live stamps are distinct) of least
    # stamp: a scan, not np.argsort, whose sort Numba compiles for ~1 s on a fresh install.
    j, written, first, first_at = 0, 0, -1, -1
    while j < copied.shape[0] and written < limit:
        applied = -1
        for e in range(stamps.shape[0]):
            span = sizes[e, 0]
            if stamps[e] == 0 or j + span > copied.shape[0] or (applied >= 0 and stamps[e] > stamps[applied]):
                continue
            same = True
            for i in range(span):
                if copied[j + i] != tokens[e, 0, i]:
                    same = False
                    break
            if same:
                applied = e
        if applied >= 0:
            if first < 0:
                first, first_at = applied, written
            for i in range(sizes[applied, 1]):
                out[written] = tokens[applied, 1, i]
                written += 1
            j += sizes[applied, 0]
        else:
            out[written] = copied[j]
            written += 1
            j += 1
    return min(written, limit), first, first_at


@njit(cache=True)
def learn_edit(stream, old_length, source, lost_at, lost_source, prompt_length, tokens, sizes, stamps, clock):
    """The copy resumed at prompt position ``source`` with ``stream[:old_length]`` emitted,
    after it broke at ``lost_at`` (source position ``lost_source``): store what the output
    wrote instead of the prompt's tokens, less their common ends, as the newest edit with
    stamp ``clock + 1``. Returns True when an edit was stored."""
    span = tokens.shape[2]
    if lost_at < 0 or not 0 < old_length - lost_at <= span:
        return False
    if not 0 <= source - lost_source <= span or source > prompt_length:
        return False
    b0, b1, a0, a1 = lost_source, source, lost_at, old_length  # replaced [b0, b1), written [a0, a1)
    while b1 > b0 and a1 > a0 and stream[b1 - 1] == stream[a1 - 1]:
        b1 -= 1
        a1 -= 1
    while b1 > b0 and a1 > a0 and stream[b0] == stream[a0]:
        b0 += 1
        a0 += 1
    if b1 == b0:  # nothing replaced (an insertion in the output is no edit of the prompt)
        return False
    free, oldest = -1, 0
    for e in range(stamps.shape[0]):
        if stamps[e] and sizes[e, 0] == b1 - b0 and _same(tokens[e, 0], stream, b0, b1):
            stamps[e] = 0  # learned again: it becomes the newest
        if stamps[e] == 0:
            if free < 0:
                free = e
        elif stamps[e] < stamps[oldest] or stamps[oldest] == 0:
            oldest = e
    if free < 0:  # full: the oldest goes
        free = oldest
    # Element loops, not slice assignments: those compile a shape-mismatch error path (~1 s).
    for i in range(b1 - b0):
        tokens[free, 0, i] = stream[b0 + i]
    for i in range(a1 - a0):
        tokens[free, 1, i] = stream[a0 + i]
    sizes[free, 0], sizes[free, 1] = b1 - b0, a1 - a0
    stamps[free] = clock + 1
    return True


@njit(cache=True)
def _same(span, stream, start, end):
    """Whether ``span[: end - start]`` equals ``stream[start:end]`` (np.array_equal without its
    compile time)."""
    for i in range(end - start):
        if span[i] != stream[start + i]:
            return False
    return True
