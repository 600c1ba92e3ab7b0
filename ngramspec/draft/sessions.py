"""Many requests' drafting state in arrays, and one compiled call that extends and drafts for
every row of a step: vLLM's proposer sees hundreds of rows per engine step, where a Python
call per row (``SpeculationSession.extend`` + ``propose``, ~15 us) would cost more than the
step's forward on a GPU machine.

A *slot* holds one request: its token stream and n-gram table (:mod:`ngramspec.draft.index`'s
arrays, one per slot in a typed list, grown inside the kernel), and a row of ``state``
(lengths, copy cursor, the pending draft's match and start) and ``evidence`` (accepted and
rejected draft positions per match-length bucket, :mod:`ngramspec.draft.acceptance`; with ``pool``,
the same pooled over every slot). :func:`draft_rows` does, for each row, exactly
what one :class:`~ngramspec.draft.session.SpeculationSession` does for a chain draft with
``sized=False``: learn from the pending draft (``verified`` of its tokens were checked), append
the row's new tokens, move the copy cursor, then draft from the cursor, the index, fuzzy
re-alignment or the shared history (first where it matches a longer context than the index).
``SpeculationSession`` is the reference: ``tests/test_sessions.py`` (Hypothesis) pins drafts,
acceptance estimates and cursor state to it.

Worked example (min_n=1, max_n=3, one row): a new slot gets ``[5 6 7 5 6]`` as its new tokens;
the suffix ``(5 6)`` last ended at position 1, so the draft copies from position 2, periodic
past the end: limit 4 gives ``[7 5 6 7]``, continuing a match of 2 tokens, estimated (2/3,
2/3, 0.8, 0.8) with no evidence yet (the priors of matches of 2-3 and 4-7 tokens,
:mod:`ngramspec.draft.acceptance`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import List

from .acceptance import CONTESTED, HISTORY, OWN, fade, learn, match_length, new_evidence, position_acceptance
from .history import SEPARATOR
from .index import index_extend, index_find
from .proposal import FUZZY_AHEAD, FUZZY_BELOW_N, FUZZY_CONTEXT, FUZZY_WINDOW

# Columns of ``state`` (int64, one row per slot).
# VERIFIED: how many tokens of its draft the next step verifies; ACTIVE: it ran in the step
# that just finished; STAMP: the caller's mark of the step it last ran in; PENDING_SOURCE: the
# pending draft's source (acceptance.OWN, HISTORY or CONTESTED).
LENGTH, USED, PROMPT, CURSOR, LOST_AT, LOST_SOURCE, PENDING_LEN, PENDING_MATCH, PENDING_START, VERIFIED, \
    ACTIVE, FINISHED, STAMP, PENDING_SOURCE = range(14)
COLUMNS = 14
FRESH = np.array([0, 0, 0, -1, -1, -1, 0, 0, -1, 0, 0, 0, -1, 0], dtype=np.int64)  # a new slot's state row


@njit(cache=True)
def _levenshtein(a, b):
    """Edit distance of two int32 arrays (unit costs), one row of the table at a time."""
    row = np.arange(b.shape[0] + 1)
    for i in range(a.shape[0]):
        diagonal, row[0] = row[0], i + 1
        for j in range(b.shape[0]):
            above = row[j + 1]
            row[j + 1] = min(above + 1, row[j] + 1, diagonal + (a[i] != b[j]))
            diagonal = above
    return row[b.shape[0]]


@njit(cache=True)
def _realign(stream, length, lost_at, lost_source):
    """``SpeculationSession._realign`` over arrays: where copying resumes after the copy broke
    (best normalised similarity of the last FUZZY_CONTEXT tokens, ties to the place a
    same-length edit reaches), or -1."""
    since = length - lost_at
    if lost_at < 0 or since > FUZZY_WINDOW or lost_source <= 0:
        return -1
    last = stream[length - 1]
    width = min(FUZZY_CONTEXT, length)
    expected = lost_source + since
    best, best_similarity, best_distance = -1, 0.0, 0
    for c in range(max(1, lost_source - 2), min(expected + FUZZY_AHEAD, lost_at)):
        if stream[c - 1] != last:
            continue
        w = min(width, c)
        similarity = 1.0 - _levenshtein(stream[length - w : length], stream[c - w : c]) / w
        distance = abs(c - expected)
        if best < 0 or similarity > best_similarity or (similarity == best_similarity and distance < best_distance):
            best, best_similarity, best_distance = c, similarity, distance
    return best


@njit(cache=True)
def _extend(s, new, streams, tables, state, evidence, pool, pending, min_n, max_n, memory):
    """``SpeculationSession.extend(new, verified)`` for slot s (new: int32 array, non-empty)."""
    count = new.shape[0]
    branch = -1
    if state[s, PENDING_LEN] > 0:  # learn how much of the last draft the target kept
        source, match = state[s, PENDING_SOURCE], state[s, PENDING_MATCH]
        verified = state[s, VERIFIED] if state[s, ACTIVE] else 0
        drafted = min(state[s, PENDING_LEN], verified)
        if verified == 0:
            fade(evidence[s], source, match, memory)
        kept = 0
        while kept < min(drafted, count) and pending[s, kept] == new[kept]:
            kept += 1
        learn(evidence[s], pool, source, match, kept, drafted)
        branch = state[s, PENDING_START]
        state[s, PENDING_LEN] = 0
    old = state[s, LENGTH]
    stream, table, used = index_extend(streams[s], tables[s], old, state[s, USED], new, min_n, max_n)
    streams[s], tables[s] = stream, table  # new arrays where they grew
    state[s, USED], state[s, LENGTH] = used, old + count
    # The copy cursor survives if the source it follows (or the draft's) predicted every token.
    cursor = state[s, CURSOR]
    best_source, best_kept = -1, -1
    for which in range(2):
        source = cursor if which == 0 else branch
        if source < 0:
            continue
        m = 0
        while m < count and stream[source + m] == new[m]:
            m += 1
        if m == count:
            state[s, CURSOR] = source + m
            return
        if m > best_kept:
            best_source, best_kept = source, m
    state[s, CURSOR] = -1
    if best_source >= 0:
        state[s, LOST_AT] = old + best_kept
        state[s, LOST_SOURCE] = best_source + best_kept


@njit(cache=True)
def _propose(s, limit, streams, tables, state, evidence, pool, pending, history, history_slots, history_length,
             min_n, max_n, recent, copy_cursor, fuzzy, prior, out, estimates):
    """``SpeculationSession.propose(limit, sized=False, tree=False)`` for slot s: the draft
    into ``out`` (its length returned) and each position's acceptance estimate into
    ``estimates``."""
    state[s, PENDING_LEN] = 0
    if limit <= 0:
        return 0
    stream, length = streams[s], state[s, LENGTH]
    start, own, match, contested = -1, True, 0, False
    cursor = state[s, CURSOR]
    if copy_cursor and 0 <= cursor < length:
        start = cursor
    else:
        n, found, other = index_find(stream, stream[:length], min_n, max_n, recent, tables[s])
        if fuzzy and n < FUZZY_BELOW_N:
            start = _realign(stream, length, state[s, LOST_AT], state[s, LOST_SOURCE])
        if start < 0 and n > 0:
            start = found
            contested = stream[found] != stream[other]  # (both continue before the stream's end)
        if history_length > 0 and n < max_n:  # a longer match in earlier outputs wins
            hn, found, _ = index_find(history, stream[max(0, length - max_n) : length], min_n, max_n, True,
                                      history_slots)
            if hn > n and found < history_length and history[found] != SEPARATOR:
                start, own, match, contested = found, False, hn, False
    if start < 0:
        return 0
    drafted = 0
    if own:  # periodic past the end of the stream, as np.resize repeats
        period = length - start
        for j in range(limit):
            out[j] = stream[start + j % period]
        drafted = limit
    else:  # a history copy stops where that output ended
        while drafted < limit and start + drafted < history.shape[0] and history[start + drafted] != SEPARATOR:
            out[drafted] = history[start + drafted]
            drafted += 1
    if own:
        match = match_length(stream, length, start)
    source = HISTORY if not own else CONTESTED if contested else OWN
    position_acceptance(evidence[s], pool, prior, source, match, estimates[:drafted])
    pending[s, :drafted] = out[:drafted]
    state[s, PENDING_LEN] = drafted
    state[s, PENDING_SOURCE], state[s, PENDING_MATCH] = source, match
    state[s, PENDING_START] = start if own else -1
    return drafted


@njit(cache=True)
def draft_rows(token_ids, rows, ends, slots, limits, streams, tables, state, evidence, pool, pending,
               history, history_slots, history_length, min_n, max_n, recent, copy_cursor, fuzzy, prior, memory,
               drafts, lengths, acceptance):
    """For each row r: slot ``slots[r]`` learns from its pending draft, appends
    ``token_ids[rows[r], state[LENGTH]:ends[r]]`` and drafts up to ``limits[r]`` tokens into
    ``drafts[r]`` (``lengths[r]`` of them, each position's acceptance estimate in
    ``acceptance[r]``).

    token_ids (R, L) int32: every row's text, as vLLM keeps it; rows, ends, slots, limits (A,)
    int64; drafts (A, >= limits.max()) int32, lengths (A,) int64, acceptance (A, >= limits.max())
    float64; evidence (slots, 3, SOURCES * BUCKETS), pool (3, SOURCES * BUCKETS) float64
    (acceptance.new_evidence)."""
    for r in range(rows.shape[0]):
        s = slots[r]
        seen = state[s, LENGTH]
        if seen < ends[r]:
            _extend(s, token_ids[rows[r], seen : ends[r]], streams, tables, state, evidence, pool, pending,
                    min_n, max_n, memory)
        lengths[r] = _propose(s, limits[r], streams, tables, state, evidence, pool, pending, history,
                              history_slots, history_length, min_n, max_n, recent, copy_cursor, fuzzy, prior,
                              drafts[r], acceptance[r])


class SessionTable:
    """Slots for requests (see the module docstring); ``config`` a SpeculatorConfig, ``history``
    the speculator's :class:`~ngramspec.draft.history.History` or None."""

    def __init__(self, config, history=None, slots: int = 16, pool=None):
        self.config, self.history = config, history
        self.pool = new_evidence() if pool is None else pool  # (3, SOURCES * BUCKETS), shared by every slot
        self.streams = List.empty_list(types.int32[::1])
        self.tables = List.empty_list(types.uint64[::1])
        self.state = np.zeros((0, COLUMNS), dtype=np.int64)
        self.evidence = np.zeros((0,) + self.pool.shape)
        self.pending = np.zeros((0, config.max_draft_tokens), dtype=np.int32)
        self.free: list[int] = []
        self._grow(slots)

    def _grow(self, slots: int) -> None:
        old = self.state.shape[0]
        self.state = np.concatenate([self.state, np.tile(FRESH, (slots - old, 1))])
        self.evidence = np.concatenate([self.evidence, np.zeros((slots - old,) + self.pool.shape)])
        self.pending = np.concatenate([self.pending, np.zeros((slots - old, self.pending.shape[1]), np.int32)])
        _append_slots(self.streams, self.tables, slots - old)
        self.free.extend(range(slots - 1, old - 1, -1))  # lowest slot first

    def new(self, prompt_length: int) -> int:
        """An empty slot for a request whose first ``prompt_length`` tokens are its prompt (they
        arrive with the slot's first :meth:`draft` call)."""
        if not self.free:
            self._grow(2 * self.state.shape[0])
        s = self.free.pop()
        self.state[s] = FRESH
        self.state[s, PROMPT] = prompt_length
        self.evidence[s] = 0.0
        return s

    def release(self, s: int) -> None:
        """Forget slot s (its arrays shrink back, so an evicted request frees its memory)."""
        _reset_slot(self.streams, self.tables, s)
        self.state[s] = FRESH
        self.free.append(s)

    def tokens(self, s: int) -> np.ndarray:
        """Slot s's stream so far (a view)."""
        return _stream(self.streams, s)[: self.state[s, LENGTH]]

    def finish(self, s: int) -> None:
        """The request left: its output joins the history once (``SpeculationSession.finish``)."""
        if self.history is not None and not self.state[s, FINISHED] and self.state[s, LENGTH] > self.state[s, PROMPT]:
            self.history.add(_stream(self.streams, s)[self.state[s, PROMPT] : self.state[s, LENGTH]])
        self.state[s, FINISHED] = 1

    def history_arrays(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The shared history's tokens, n-gram table and length, as :func:`draft_rows` reads them."""
        if self.history is not None and self.history.index.length:
            return self.history.index.tokens, self.history.index.slots, self.history.index.length
        return _NO_HISTORY, _NO_SLOTS, 0

    def draft(self, token_ids: np.ndarray, rows: np.ndarray, ends: np.ndarray, slots: np.ndarray,
              limits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`draft_rows` over these rows: (drafts (A, max_draft_tokens) int32, lengths (A,),
        acceptance (A, max_draft_tokens)). A slot's ``VERIFIED`` (how many of its draft the next step verifies)
        and ``ACTIVE`` (it ran in the step that just finished) are the caller's to set."""
        c = self.config
        count = rows.shape[0]
        drafts = np.zeros((count, self.pending.shape[1]), dtype=np.int32)
        lengths = np.zeros(count, dtype=np.int64)
        acceptance = np.zeros(drafts.shape)
        history, history_slots, history_length = self.history_arrays()
        draft_rows(np.ascontiguousarray(token_ids), rows.astype(np.int64), ends.astype(np.int64),
                   slots.astype(np.int64), np.minimum(limits, drafts.shape[1]).astype(np.int64), self.streams,
                   self.tables, self.state, self.evidence, self.pool, self.pending, history, history_slots,
                   history_length, c.min_n, c.max_n, c.match == "recent", c.copy_cursor, c.fuzzy_resync,
                   c.acceptance_prior, c.acceptance_memory, drafts, lengths, acceptance)
        return drafts, lengths, acceptance


# The typed lists' items, read and written from Python through compiled calls: the typed list's
# own Python accessors compile anew in every process (~0.2 s each, mid-serving the first time a
# request leaves), where these load from Numba's cache.
@njit(cache=True)
def _append_slots(streams, tables, count):
    for _ in range(count):
        streams.append(np.zeros(16, dtype=np.int32))
        tables.append(np.zeros(16, dtype=np.uint64))


@njit(cache=True)
def _reset_slot(streams, tables, s):
    streams[s] = np.zeros(16, dtype=np.int32)
    tables[s] = np.zeros(16, dtype=np.uint64)


@njit(cache=True)
def _stream(streams, s):
    return streams[s]


_NO_HISTORY = np.zeros(1, dtype=np.int32)
_NO_SLOTS = np.zeros(16, dtype=np.uint64)
