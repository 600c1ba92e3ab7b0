"""One engine step's drafting in one compiled call, :func:`propose_rows`: every row's spot
check, extend and draft, and the sizing of all drafts together (the proposer's usual step).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..draft.borrowed import borrowed
from ..draft.sessions import ACTIVE, LENGTH, STAMP, VERIFIED, draft_row
from ..draft.sizing import flattened_lengths
from .rows import PROBES, draw_probes, spot_check

ROWS, SLOTS, LIMITS, LENGTHS, OFFSETS = range(5)  # rows of propose_rows' work array


@njit(cache=True)
def propose_rows(token_ids, ends, sampled, expected, check, stamp, first, step_costs, row_slots, indexes, state,
                 evidence, pool, pending, branches, edit_tokens, edit_sizes, edit_stamps, history, history_slots,
                 history_length, knob_values, settings, work, drafts, acceptance, kept, buffers):
    """One engine step's drafting, all rows in one call. Returns (live, matched, continued,
    context, drafted): the decoding rows (``rows[:live]``), whether every one held its slot, how
    many of those slots ran in the step before, the rows' mean length, and how many rows, from
    the first, extended and drafted (all of them where matched).

    token_ids (>= R, L) int32 and ends (>= R,) int32: row i's text is ``token_ids[i, :ends[i]]``;
    sampled (R,) int64: > 0 where row i emitted tokens this step (0: still prefilling). row_slots: row
    -> slot (-1: none). With ``check``, each decoding row must hold the slot it had (spot
    checks) and there must be ``expected`` of them, else matched is False (the caller matches
    rows to slots and calls again without ``check``, passing ``drafted`` as ``first``: the rows
    before it have extended and drafted already, and matching keeps their slots). Then every row
    extends and drafts
    (:func:`ngramspec.draft.sessions.draft_row`), all drafts are sized together
    (:func:`ngramspec.draft.sizing.draft_lengths`, flattened; step_costs[m] prices a step over the
    rows' last tokens and m draft tokens) and the slots note what the next step verifies.
    ``stamp`` marks the slots' STAMP. The slots' arrays and ``knob_values`` are the
    :class:`~ngramspec.draft.sessions.SessionTable`'s; settings (int64): payoff, max_draft,
    max_model_len. The arguments from ``row_slots`` on stay the same from one usual step to the
    next (the caller passes them as one tuple). Out:
    work (5, >= R + 1) int64: the rows, their slots, limits and sized draft lengths, and where
    each row i's draft starts in ``kept`` (OFFSETS, i = 0..R: row i's draft is ``kept[offsets[i]
    : offsets[i + 1]]``, empty for a row that does not decode); acceptance (A, K) and drafts
    (A, K), unsized; kept: the sized drafts one after another, in row order; buffers: the rows'
    work arrays (:func:`ngramspec.draft.sessions.row_buffers`)."""
    # Views with no owner (module ngramspec.draft.borrowed): no atomic reference counts per row.
    token_ids, ends, sampled, step_costs, row_slots = (borrowed(token_ids), borrowed(ends), borrowed(sampled),
                                                       borrowed(step_costs), borrowed(row_slots))
    state, evidence, pool, pending, branches = (borrowed(state), borrowed(evidence), borrowed(pool),
                                                borrowed(pending), borrowed(branches))
    edit_tokens, edit_sizes, edit_stamps = borrowed(edit_tokens), borrowed(edit_sizes), borrowed(edit_stamps)
    history, history_slots, knob_values = borrowed(history), borrowed(history_slots), borrowed(knob_values)
    settings, work, drafts, acceptance, kept = (borrowed(settings), borrowed(work), borrowed(drafts),
                                                borrowed(acceptance), borrowed(kept))
    rows, slots, limits, lengths = work[ROWS], work[SLOTS], work[LIMITS], work[LENGTHS]
    payoff, max_draft, max_model_len = settings[0] != 0, settings[1], settings[2]
    # 1. Rows that decode this step.
    live, total = 0, 0
    for i in range(sampled.shape[0]):
        if sampled[i] > 0 and ends[i] < max_model_len - 1:
            rows[live] = i
            live += 1
            total += ends[i]
    context = total // max(live, 1)
    if check and live != expected:
        return live, False, 0, context, 0
    # 2. Each row: its slot (the one it had, if the spot checks say it still holds it; or as
    #    the caller matched), then it extends with its new tokens and drafts, unsized. A row
    #    reads its slot's (stream, table) once: ~50 ns a read.
    probes = np.empty(PROBES)  # each row's random probe positions (one buffer: an allocation per row costs)
    out, scratch, found, no_costs, no_parents = buffers
    buffers = borrowed(out), borrowed(scratch), borrowed(found), borrowed(no_costs), borrowed(no_parents)
    continued = 0
    for r in range(live):
        i = rows[r]
        s = row_slots[i] if i < row_slots.shape[0] else -1
        if s < 0:
            if check:
                return live, False, 0, context, r
            raise ValueError("a decoding row has no slot")  # the caller matches every row first
        stream, table = indexes[s]
        text = token_ids[i, : ends[i]]
        if check:
            draw_probes(stamp, s, probes)
            if not spot_check(stream, text, state[s, LENGTH], probes):
                return live, False, 0, context, r
        # Drafted by the call before this one (matching gave it the slot it had there: the
        # same spot checks, with the same probes).
        drafted = r < first
        slots[r] = s
        continued += state[s, ACTIVE]  # its last draft was verified unless it was idle
        state[s, STAMP] = stamp
        limits[r] = max(min(max_draft, max_model_len - np.int64(ends[i]) - 1, drafts.shape[1]), 0)
        if not drafted:
            lengths[r] = draft_row(text, s, limits[r], stream, table, indexes, state, evidence, pool, pending,
                                   branches, edit_tokens, edit_sizes, edit_stamps, history, history_slots,
                                   history_length, knob_values, buffers, drafts[r], acceptance[r])
    # 3. One length per row, for all rows together (the step's total token count).
    if payoff and lengths[:live].sum() >= step_costs.shape[0]:
        raise ValueError("step_costs must price every total the drafts could add")
    if payoff:
        lengths[:live] = flattened_lengths(acceptance[:live], lengths[:live], step_costs)[0]
    # 4. The next step verifies these; the sized drafts one after another, in row order.
    offsets = work[OFFSETS]
    at, r = 0, 0
    for i in range(sampled.shape[0]):
        offsets[i] = at
        if r < live and rows[r] == i:
            s, n = slots[r], lengths[r]
            state[s, VERIFIED], state[s, ACTIVE] = n, 1
            kept[at : at + n] = drafts[r, :n]
            at += n
            r += 1
    offsets[sampled.shape[0]] = at
    return live, True, continued, context, live
