"""Where a draft comes from: the candidate continuations of one slot's text, best first, and
the tokens each one copies (compiled, for :mod:`ngramspec.draft.sessions`).

In order of preference (each behind a config switch):

1. the **copy cursor**: while the output keeps copying one earlier span, the next tokens of
   that span (the cursor follows every emitted token and breaks on the first that differs);
2. the **index**: the longest earlier occurrence of the text's suffix (n in [min_n, max_n]);
   for a tree, every matching length's latest and earliest occurrence;
3. **fuzzy re-alignment** right after the copy broke (:mod:`ngramspec.draft.realign`);
4. the shared **history** of earlier outputs: first where its match is longer than the
   index's, else one more branch.

Worked example (min_n=1, max_n=3, no cursor): text ``[5 6 7 5 6]``: the suffix ``(5 6)`` last
ended at position 1, so the one candidate starts at 2 with a 2-token match; its continuation
for limit 4 is periodic past the text's end, ``[7 5 6 7]``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .edits import apply_edits
from .history import SEPARATOR
from .index import index_find, index_matches
from .realign import realign


@njit(cache=True)
def found_rows(min_n, max_n):
    """Rows of the ``found`` work array :func:`candidates` takes: up to two candidates per matching
    length, fuzzy, cursor and history (2k + 3, k = max_n - min_n + 1), and k rows of scratch for the
    index's matches (a caller allocates it once, not once per draft)."""
    return 3 * (max_n - min_n + 1) + 3


@njit(cache=True, inline="always")  # a body, not a call, in every row of a step (sessions.extend_slot)
def candidates(wanted, stream, length, table, cursor, lost_at, lost_source, history, history_slots, history_length,
               knobs, found):
    """Up to ``wanted`` distinct continuations of ``stream[:length]`` (its n-gram ``table``),
    best first (the module's order), into ``found`` rows (start, match_len, own, contested;
    :func:`found_rows` rows, its last k scratch); returns how many. ``cursor``: the copy cursor
    (-1: none); ``lost_at``, ``lost_source``: where the last copy broke. With one wanted (a
    chain), the search stops at the first source that applies."""
    max_n = knobs.max_n
    count = 0
    if knobs.copy_cursor and 0 <= cursor < length:
        found[0, 0], found[0, 1], found[0, 2], found[0, 3] = cursor, max_n, 1, 0
        count = 1
        if wanted == 1:
            return 1
    following = count  # the copy cursor stays first
    # (n, earliest, latest, -), longest first: found's last k rows, below any candidate written
    matches = found[found.shape[0] - (max_n - knobs.min_n + 1) :]
    if wanted == 1:
        n, start, other = index_find(stream, stream[:length], knobs.min_n, max_n, knobs.recent, table)
        rows = 1 if n > 0 else 0
        earliest, latest = (other, start) if knobs.recent else (start, other)
        matches[0, 0], matches[0, 1], matches[0, 2] = n, earliest, latest
    else:
        rows = index_matches(stream, length, knobs.min_n, max_n, table, matches)
    longest = matches[0, 0] if rows else 0
    if knobs.fuzzy and count == 0 and longest < knobs.fuzzy_below_n:
        start = realign(stream, length, lost_at, lost_source, knobs.fuzzy_window, knobs.fuzzy_context,
                        knobs.fuzzy_ahead)
        if start >= 0:
            found[count, 0], found[count, 1], found[count, 2], found[count, 3] = start, 0, 1, 0
            count += 1
    for i in range(rows):
        n, earliest, latest = matches[i, 0], matches[i, 1], matches[i, 2]
        contested = 1 if stream[earliest] != stream[latest] else 0
        found[count, 0], found[count, 1], found[count, 2], found[count, 3] = \
            latest if knobs.recent else earliest, n, 1, contested
        count += 1
        if earliest != latest and wanted > 1:
            found[count, 0], found[count, 1], found[count, 2], found[count, 3] = \
                earliest if knobs.recent else latest, n, 1, contested
            count += 1
    if history_length > 0 and longest < max_n:
        # Earlier outputs win where they match a longer context than this request's own text
        # does (a longer match predicts better); otherwise they are one more branch.
        # np.bool_(True), not True: a literal argument compiles index_find a second time.
        n, start, _ = index_find(history, stream[max(0, length - max_n) : length], knobs.min_n, max_n,
                                 np.bool_(True), history_slots)
        if n > 0 and start < history_length and history[start] != SEPARATOR:
            at = following if n > longest else count
            for i in range(count - 1, at - 1, -1):  # rows at.. move down one (element copies: a slice
                for k in range(4):  # assignment's shape-check path compiles for ~1 s)
                    found[i + 1, k] = found[i, k]
            found[at, 0], found[at, 1], found[at, 2], found[at, 3] = start, n, 0, 0
            count += 1
    unique = 0
    for i in range(count):
        seen = False
        for j in range(unique):
            seen = seen or (found[j, 2] == found[i, 2] and found[j, 0] == found[i, 0])
        if not seen:
            for k in range(4):
                found[unique, k] = found[i, k]
            unique += 1
            if unique == wanted:
                break
    return unique


@njit(cache=True, inline="always")  # a body, not a call passing 12 arrays, in every row of a step
def continuation(start, own, limit, stream, length, prompt_length, history, edit_tokens, edit_sizes, edit_stamps,
                 out, scratch):
    """Up to ``limit`` tokens copied from ``start`` (of ``stream[:length]`` where ``own``, else
    of the history) into ``out`` (room for limit + the edit span), with the learned edits (one
    slot's arrays, :mod:`ngramspec.draft.edits`) applied to a copy from the prompt. Returns
    (tokens, the first edit applied or -1, its position)."""
    if not own:  # a history copy stops where that output ended
        n = 0
        while n < limit and start + n < history.shape[0] and history[start + n] != SEPARATOR:
            out[n] = history[start + n]
            n += 1
        return n, -1, -1
    # The copied span may run into the suffix itself: the text is then periodic with period
    # length - start, and the draft continues the period (a run "a b a b a" drafts "b a b a ...").
    edited = start < prompt_length and _any_edit(edit_stamps)
    copied = scratch if edited else out
    at = start
    for j in range(limit):  # stream[start + j % (length - start)], without a division per token
        copied[j] = stream[at]
        at += 1
        if at == length:
            at = start
    if edited:
        return apply_edits(copied[:limit], limit, edit_tokens, edit_sizes, edit_stamps, out)
    return limit, -1, -1


@njit(cache=True)
def _any_edit(stamps):
    """Whether any edit is stored (a stamp above 0): a loop, where ``stamps.max()`` compiles NumPy's
    reduction (~0.4 s on a fresh install)."""
    for e in range(stamps.shape[0]):
        if stamps[e] > 0:
            return True
    return False
