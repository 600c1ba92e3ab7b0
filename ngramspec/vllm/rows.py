"""Rows of vLLM's persistent batch -> ngramspec session slots: :class:`RowSessions`, and the
compiled spot checks that a row still holds its slot's request (O(1) per row, never by
reading the whole context). References of the kernels: ``tests/reference_rows.py``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from numba import njit

from ..draft.sessions import ACTIVE, LENGTH, STAMP, SessionTable
from ..draft.speculator import NgramSpeculator

# Spot checks that a row still holds a session's request: its first HEAD tokens, the last
# TAIL tokens the session has seen, and PROBES positions drawn anew each step (a hash of the
# step and the slot, :func:`draw_probes`). Together
# they cost O(1) per row, yet a session never drafts for a row whose text it does not prefix
# for long (a random probe catches any persistent difference sooner or later).
HEAD, TAIL, PROBES = 16, 32, 8


@njit(cache=True, inline="always")
def _mix(h, token):
    # splitmix64-style finaliser over (previous hash, token): cheap and well spread.
    z = (h ^ np.uint64(token)) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class RowSessions:
    """Rows of vLLM's persistent batch -> slots of a :class:`~ngramspec.draft.sessions.SessionTable`.

    Each step, a row keeps the slot it had if the spot checks pass (one compiled call checks
    every row); otherwise it takes the moved or idle slot whose text it continues (looked up by
    its first tokens), or a new slot indexes its whole text once (a new request, or one whose
    slot was evicted). Slots no row took go idle: their output joins the speculator's history
    (if enabled) and a preempted request comes back to its slot. At most ``max_idle`` idle
    slots holding ``max_idle_tokens`` tokens in all are kept, oldest evicted first, so memory
    stays bounded under a server that runs for months.
    """

    def __init__(self, speculator: NgramSpeculator, max_idle: int = 64, max_idle_tokens: int = 1_000_000):
        self.speculator = speculator
        self.table = SessionTable(speculator.config, speculator.history, pool=speculator.pool)
        self.max_idle, self.max_idle_tokens = max_idle, max_idle_tokens
        self.idle_tokens = 0
        self.rows = np.zeros(0, dtype=np.int64)  # row index -> its slot in the last step (-1: none)
        self.active = np.zeros(0, dtype=np.int64)  # the last step's slots
        self.idle: OrderedDict[int, None] = OrderedDict()  # idle slots, oldest first
        self.created = 0  # slots built from a row's whole text
        self.steps = 0
        self.continued = 0  # rows of the latest step that also ran in the one before (see step)
        self._left = np.zeros(0, dtype=np.int64)  # slots no row took in the last step (see retire)

    def length(self, slot: int) -> int:
        """Tokens slot ``slot`` has indexed."""
        return int(self.table.state[slot, LENGTH])

    def step(self, token_ids: np.ndarray, rows: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Match every decoding row (``rows`` (A,) indices into ``token_ids``, row r's text
        ``token_ids[rows[r], :ends[r]]``) to a slot; returns the slots (A,). The slots extend
        with their rows' new tokens when they draft (:func:`propose_rows`); then :meth:`retire`."""
        count = rows.shape[0]
        self.steps += 1
        # 1. Each row keeps its slot, or takes a moved or idle one whose text it continues: one
        #    compiled call for all rows (-1: none, a new request).
        candidates = np.concatenate([self.active, np.fromiter(self.idle, dtype=np.int64, count=len(self.idle))])
        had, slots = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.int64)
        match_rows(token_ids, rows, ends, self.rows, candidates, self.table.indexes, self.table.state, self.steps,
                   had, slots)
        # 2. New requests index their whole text in their first extend; a preempted one is back.
        for r in np.flatnonzero((slots != had) | (slots < 0)).tolist():
            slot = int(slots[r])
            if slot < 0:
                slots[r] = self.table.new(int(ends[r]))
                self.created += 1
            elif slot in self.idle:
                del self.idle[slot]
                self.idle_tokens -= self.length(slot)
        state = self.table.state  # (new slots may have grown it)
        continued = int(state[slots, ACTIVE].sum())  # its last draft was verified unless it was idle
        state[slots, STAMP] = self.steps
        # 3. Slots no row took: finished (or preempted: it may come back), retired after this
        #    step's drafts (:meth:`retire`).
        self._left = self.active[state[self.active, STAMP] != self.steps]
        self.rows = np.full(int(rows.max(initial=-1)) + 1, -1, dtype=np.int64)
        self.rows[rows] = slots
        # Rows that ran in the last step with the slot they have now, when no row left.
        self.continued = continued if self.active.shape[0] == count else 0
        self.active = slots
        return slots

    def retire(self) -> None:
        """After the drafts of a :meth:`step`: the slots no row took go idle and their output
        joins the history. Not before: every row drafts once a step, and the rows that
        drafted before the step matched them (:func:`propose_rows`) drafted from the history
        as it was."""
        state = self.table.state
        for s in self._left.tolist():
            self.table.finish(s)  # its output joins the history once, however often it goes idle
            state[s, ACTIVE] = 0
            self.idle[s] = None
            self.idle_tokens += self.length(s)
        self._left = self._left[:0]
        while self.idle and (len(self.idle) > self.max_idle or self.idle_tokens > self.max_idle_tokens):
            s, _ = self.idle.popitem(last=False)
            self.idle_tokens -= self.length(s)
            self.table.release(s)

    def same_rows(self, continued: int) -> None:
        """A step in which every row kept its slot and no slot left (the proposer's usual step,
        matched, stamped and drafted in one compiled call): what :meth:`step` notes of it."""
        self.steps += 1
        self.continued = continued


@njit(cache=True)
def match_rows(token_ids, rows, ends, row_slots, candidates, indexes, state, stamp, had, slots):
    """Each decoding row r's slot (``rows`` (A,) into ``token_ids``, its text ``token_ids[rows[r],
    :ends[r]]``): the slot it had (``row_slots[rows[r]]``, -1: none; written to ``had[r]``) where
    the spot checks pass, else the first of ``candidates`` whose text it continues and no other
    row took (:func:`find_slot`), else -1: a new request. Writes ``slots`` (A,). Probes are drawn
    for step ``stamp`` (:func:`draw_probes`). Reference: ``tests/reference_rows.py``."""
    taken = np.zeros(state.shape[0], dtype=np.bool_)
    probes = np.empty(PROBES)
    for r in range(rows.shape[0]):
        i = rows[r]
        s = row_slots[i] if i < row_slots.shape[0] else -1
        had[r], slots[r] = s, -1
        if s >= 0 and not taken[s]:  # (a slot is one request's: never two rows')
            draw_probes(stamp, s, probes)
            if spot_check(indexes[s][0], token_ids[i, : ends[r]], state[s, LENGTH], probes):
                slots[r] = s
                taken[s] = True
    for r in range(rows.shape[0]):  # after every kept slot is taken: a moved row never takes one
        if slots[r] < 0:
            draw_probes(stamp, state.shape[0] + r, probes)  # a stream of its own
            s = find_slot(token_ids[rows[r], : ends[r]], candidates, had[r], taken, indexes, state, probes)
            if s >= 0:
                slots[r] = s
                taken[s] = True


@njit(cache=True)
def draw_probes(stamp, seed, out):
    """Fill ``out`` with uniforms in [0, 1) for step ``stamp`` and ``seed`` (a slot): a splitmix
    hash of them, new every step (np.random.random costs ~9 ns a draw, eight per row per step;
    a hash ~1)."""
    h = _mix(np.uint64(stamp), seed)
    for k in range(out.shape[0]):
        h = _mix(h, k)
        out[k] = (h >> np.uint64(11)) * (1.0 / 9007199254740992.0)  # the top 53 bits / 2**53


@njit(cache=True)
def find_slot(row, candidates, excluded, taken, indexes, state, uniforms):
    """The first slot of ``candidates`` whose text ``row`` continues (:func:`spot_check`, and
    the same first HEAD tokens, as many of them), skipping ``excluded`` (the slot the row just
    failed its check against: it would fail again) and slots marked in ``taken``; -1 if none.
    Reference: ``tests/reference_rows.py``."""
    head = min(HEAD, row.shape[0])
    for s in candidates:
        if s != excluded and not taken[s] and min(HEAD, state[s, LENGTH]) == head \
                and spot_check(indexes[s][0], row, state[s, LENGTH], uniforms):
            return s
    return -1


@njit(cache=True, inline="always")  # a body, not a call, in every row of a step (sessions.extend_slot)
def spot_check(stream, row, seen, uniforms):
    """Do ``stream[:seen]`` and ``row`` agree on the first HEAD and last TAIL positions of
    ``stream[:seen]`` and at ``int(u * seen)`` for each u in ``uniforms``? (One compiled call per
    row: numpy would take a few calls and microseconds each.) False where ``stream`` holds no
    tokens or more than ``row``. Reference: ``tests/reference_rows.py``."""
    if seen == 0 or seen > row.shape[0]:
        return False
    for k in range(min(HEAD, seen)):
        if stream[k] != row[k]:
            return False
    for k in range(max(0, seen - TAIL), seen):
        if stream[k] != row[k]:
            return False
    for u in uniforms:
        k = min(int(u * seen), seen - 1)
        if stream[k] != row[k]:
            return False
    return True
