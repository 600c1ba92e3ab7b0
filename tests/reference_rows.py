"""Plain-Python references of the vLLM proposer's row checks (test-only): ``spot_check`` and
``find_slot`` written plainly; ``test_vllm_proposer.py`` pins them to the compiled kernels.
"""

from __future__ import annotations

import numpy as np

from ngramspec.draft.sessions import LENGTH
from ngramspec.vllm.rows import HEAD, TAIL


def find_slot_reference(row, candidates, excluded, taken, streams, state, uniforms) -> int:
    """:func:`find_slot` in plain Python, each slot's text compared by its first tokens."""
    for s in candidates.tolist():
        seen = int(state[s, LENGTH])
        if s != excluded and not taken[s] and streams[s][: min(HEAD, seen)].tolist() == row[:HEAD].tolist() \
                and spot_check_reference(streams[s], row, seen, uniforms):
            return s
    return -1


def spot_check_reference(stream, row, seen, uniforms) -> bool:
    """:func:`spot_check` in plain numpy."""
    if seen == 0 or seen > row.shape[0]:
        return False
    head, tail = min(HEAD, seen), max(0, seen - TAIL)
    probes = np.minimum((np.asarray(uniforms) * seen).astype(np.int64), seen - 1)
    return bool(np.array_equal(stream[:head], row[:head]) and np.array_equal(stream[tail:seen], row[tail:seen])
                and np.array_equal(stream[probes], row[probes]))


def match_rows_reference(token_ids, rows, ends, row_slots, candidates, streams, state, probes_for) -> tuple:
    """:func:`match_rows` in plain Python: (had, slots). ``probes_for(seed)``: the uniforms the
    kernel draws for that seed (a slot, or the number of slots plus the row) at this step."""
    count = len(rows)
    had = [int(row_slots[i]) if i < len(row_slots) else -1 for i in rows.tolist()]
    taken = np.zeros(state.shape[0], dtype=np.bool_)
    slots = [-1] * count
    for r in range(count):
        s = had[r]
        row = token_ids[rows[r], : ends[r]]
        if s >= 0 and not taken[s] and spot_check_reference(streams[s], row, int(state[s, LENGTH]), probes_for(s)):
            slots[r] = s
            taken[s] = True
    for r in range(count):
        if slots[r] < 0:
            s = find_slot_reference(token_ids[rows[r], : ends[r]], candidates, had[r], taken, streams, state,
                                    probes_for(state.shape[0] + r))
            if s >= 0:
                slots[r], taken[s] = s, True
    return had, slots
