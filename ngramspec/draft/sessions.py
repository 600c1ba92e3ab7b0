"""The drafting engine: every request's drafting state in arrays, one *slot* per request, and
compiled calls that extend a slot with the tokens the target emitted and draft its next
tokens. vLLM's proposer drafts all rows of an engine step in one call (:func:`draft_row` for
each, as :func:`draft_rows` runs it); a transformers request is one slot
(:class:`~ngramspec.draft.session.SpeculationSession`).

A slot holds its token stream and n-gram table (:mod:`ngramspec.draft.index`'s arrays: one
``(stream, table)`` pair per slot in the typed list ``indexes``, grown inside the kernel; a
read of a typed list's item costs ~50 ns, so a row reads its pair once a step), a row of
``state`` (lengths, copy cursor, the pending draft), of ``evidence`` (accepted and rejected
draft positions per match-length bucket, :mod:`ngramspec.draft.acceptance`; ``pool`` the same
over every slot), of ``branches`` (where the pending draft's candidates copy from) and of the
learned edits (:mod:`ngramspec.draft.edits`).

A draft copies from the first of its candidates (copy cursor, index, fuzzy re-alignment,
history: :mod:`ngramspec.draft.candidates`). A copy from the prompt applies the request's
learned edits (``edit_recurrence``). With
``tree_branches > 1`` the other candidates join the first as branches of a token tree
(:mod:`ngramspec.draft.tree`). With ``sized``, payoff sizing picks the draft's length
(:mod:`ngramspec.draft.sizing`). ``tests/reference_session.py`` is the pure-Python reference of
one slot; ``tests/test_sessions.py`` (Hypothesis) pins drafts, trees, acceptance estimates,
cursor and edits to it.

Worked example (min_n=1, max_n=3, one row): a new slot gets ``[5 6 7 5 6]`` as its new tokens;
the suffix ``(5 6)`` last ended at position 1, so the draft copies from position 2, periodic
past the end: limit 4 gives ``[7 5 6 7]``, continuing a match of 2 tokens, estimated (2/3,
2/3, 0.8, 0.8) with no evidence yet (the priors of matches of 2-3 and 4-7 tokens,
:mod:`ngramspec.draft.acceptance`).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit, types
from numba.typed import List

from .acceptance import CONTESTED, HISTORY, OWN, fade, learn, match_length, new_evidence, position_acceptance
from .candidates import candidates, continuation, found_rows
from .edits import learn_edit, new_edits
from .index import index_extend, table_size
from .sizing import padded_lengths
from .tree import add_branch, tree_budget

# Columns of ``state`` (int64, one row per slot). PENDING: a draft awaits its verdict, of
# PENDING_LEN chain tokens from PENDING_SOURCE (acceptance.OWN, HISTORY or CONTESTED) after a
# PENDING_MATCH-token match, with BRANCHES own-stream candidates in ``branches`` and the first
# learned edit it applied (PENDING_EDIT, -1: none) at PENDING_EDIT_AT. EDIT_BREAK: the break an
# edit was last learned from; EDIT_CLOCK: edits learned so far. VERIFIED: how many tokens of
# its draft the next step verifies (-1: all); ACTIVE: it ran in the step that just finished
# (else its draft went unverified); STAMP: the caller's mark of the step it last ran in.
LENGTH, USED, PROMPT, CURSOR, LOST_AT, LOST_SOURCE, PENDING, PENDING_LEN, PENDING_MATCH, PENDING_SOURCE, \
    BRANCHES, PENDING_EDIT, PENDING_EDIT_AT, EDIT_BREAK, EDIT_CLOCK, VERIFIED, ACTIVE, FINISHED, STAMP = range(19)
COLUMNS = 19
INDEX = types.Tuple((types.int32[::1], types.uint64[::1]))  # a slot's (stream, n-gram table)
FRESH = np.array([0, 0, 0, -1, -1, -1, 0, 0, 0, 0, 0, -1, -1, -1, 0, 0, 0, 0, -1], dtype=np.int64)

# The config's drafting switches as the kernels read them (SessionTable.knobs builds it). They
# enter a compiled call packed in one float64 array, ``knob_values`` (~0.2 us to pass, where the
# namedtuple takes ~1.6 us: a step calls twice), and :func:`read_knobs` unpacks them.
Knobs = namedtuple("Knobs", "min_n max_n recent copy_cursor fuzzy edit_recurrence prior memory max_tree_tokens "
                             "fuzzy_window fuzzy_context fuzzy_ahead fuzzy_below_n tree_cost_slack explore_below "
                             "request_weight pool_prior_weight pool_window calibration_weight")


@njit(cache=True)
def read_knobs(v):
    """The Knobs packed in ``v`` (float64, in Knobs' order)."""
    return Knobs(int(v[0]), int(v[1]), v[2] != 0, v[3] != 0, v[4] != 0, v[5] != 0, v[6], v[7], int(v[8]), int(v[9]),
                 int(v[10]), int(v[11]), int(v[12]), v[13], v[14], v[15], v[16], v[17], v[18])


# inline="always" (both kernels): vLLM's row loop (draft_row) takes their bodies, not a call passing
# ~20 arrays, ~8-10% of a usual step at 16-64 rows (compiling: 17.7 s against 17.2 from a clean cache).
@njit(cache=True, inline="always")
def extend_slot(s, new, stream, table, indexes, state, evidence, pool, pending, branches, edit_tokens, edit_sizes,
                edit_stamps, knob_values):
    """Slot s (its ``stream`` and ``table``, as ``indexes[s]`` holds them) takes the tokens the
    target emitted (``new``, int32), its pending draft having had
    ``state[s, VERIFIED]`` tokens verified (-1: all): it learns how much of that draft the target
    kept, appends ``new`` and moves its copy cursor; learns an edit where a copy from the prompt
    resumed. The knobs come packed (:func:`read_knobs`). Returns the slot's stream and table
    (new arrays where they grew, stored in ``indexes`` too), which :func:`propose_slot` takes.

    One compiled entry point, not a wrapper over an inner kernel: Numba optimises and emits
    every compiled function's callees again inside it, so each level of calls adds to what a
    fresh install compiles."""
    knobs = read_knobs(knob_values)
    count = new.shape[0]
    sources = 0
    if state[s, PENDING]:
        source, match, drafted = state[s, PENDING_SOURCE], state[s, PENDING_MATCH], state[s, PENDING_LEN]
        verified = state[s, VERIFIED] if state[s, ACTIVE] else 0
        if verified >= 0:  # -1: all of it
            if verified == 0:  # not verified at all: let old evidence fade, as sizing does
                fade(evidence[s], source, match, knobs.memory)
            drafted = min(drafted, verified)
        kept = 0
        while kept < min(drafted, count) and pending[s, kept] == new[kept]:
            kept += 1
        edit = state[s, PENDING_EDIT]
        if edit >= 0 and kept == state[s, PENDING_EDIT_AT] and kept < drafted:
            edit_stamps[s, edit] = 0  # the target refused the edit here: forget it
        learn(evidence[s], pool, source, match, kept, drafted, knobs.pool_window)
        sources = state[s, BRANCHES]
        state[s, PENDING] = 0
    if count == 0:
        return stream, table
    old = state[s, LENGTH]
    sizes = stream.shape[0], table.shape[0]
    stream, table, used = index_extend(stream, table, old, state[s, USED], new, knobs.min_n, knobs.max_n)
    if stream.shape[0] != sizes[0] or table.shape[0] != sizes[1]:  # new arrays where they grew
        indexes[s] = (stream, table)
    state[s, USED], state[s, LENGTH] = used, old + count
    lost_at = state[s, LOST_AT]
    if knobs.edit_recurrence and sources and count >= 2 and lost_at != state[s, EDIT_BREAK]:
        source = branches[s, 0]  # where the chain was copied from
        if stream[source] == new[0] and stream[source + 1] == new[1]:  # the copy resumed
            if learn_edit(stream, old, source, lost_at, state[s, LOST_SOURCE], state[s, PROMPT], edit_tokens[s],
                          edit_sizes[s], edit_stamps[s], state[s, EDIT_CLOCK]):
                state[s, EDIT_BREAK] = lost_at
                state[s, EDIT_CLOCK] += 1
    # The copy cursor survives if a source it could be following (the cursor, or one the draft
    # copied from) predicted every new token; else the copy broke where the best one stopped.
    best_source, best_kept = -1, -1
    for which in range(sources + 1):
        source = state[s, CURSOR] if which == 0 else branches[s, which - 1]
        if source < 0:
            continue
        m = 0
        while m < count and stream[source + m] == new[m]:
            m += 1
        if m == count:
            state[s, CURSOR] = source + m
            return stream, table
        if m > best_kept:
            best_source, best_kept = source, m
    state[s, CURSOR] = -1
    if best_source >= 0:
        state[s, LOST_AT] = old + best_kept
        state[s, LOST_SOURCE] = best_source + best_kept
    return stream, table


@njit(cache=True)
def _best_length(own, source, match, acceptance, costs, needs_baseline, knobs):
    """Draft length in [0, len(acceptance)] maximising expected emitted tokens per unit verify
    cost, (1 + g_1 + ... + g_k) / cost(k + 1), g_j the product of the first j estimates, a plain
    step scoring 1 / cost(1) = 1 (the sizing rule for one row, :func:`draft_lengths`); costs[q]
    a forward over q tokens. ``needs_baseline``: no plain step timed at this context yet, so a
    draft expected to gain less than ``knobs.explore_below`` gives way to a plain step."""
    limit = acceptance.shape[0]
    lengths, best = padded_lengths(acceptance.copy().reshape((1, limit)), np.array([limit], dtype=np.int64),
                                   costs[1 : limit + 2].copy())
    if lengths[0] == 0:  # not drafting: let old evidence fade so such drafts are retried
        fade(own, source, match, knobs.memory)
    elif best < knobs.explore_below and needs_baseline:
        return 0  # a plain step times the one-token forward here, so costs become measured
    return lengths[0]


@njit(cache=True, inline="always")
def propose_slot(s, limit, wanted, sized, needs_baseline, costs, tree_costs, stream, table, state, evidence, pool,
                 pending, branches, edit_tokens, edit_sizes, edit_stamps, history, history_slots, history_length,
                 knob_values, out, parents, estimates, scratch, branch, found):
    """Slot s drafts up to ``limit`` tokens from up to ``wanted`` candidates (a tree where
    several add tokens), sized by ``costs`` (q -> a forward over q tokens, q up to limit + 1)
    where ``sized``, the tree by ``tree_costs`` (q up to max(max_tree_tokens, limit) + 1).
    ``stream`` and ``table``: the slot's (as :func:`extend_slot` returns them). Returns (tokens
    in ``out``, of them the chain, whether ``parents`` holds a tree, the first
    candidate's match length and start); ``estimates[:chain]`` each chain position's estimate.
    out, branch, scratch: room for max(limit, max_tree_tokens) + edit span int32; found: int64
    (:func:`~ngramspec.draft.candidates.found_rows`, 4), the candidates' work array. The knobs come
    packed (:func:`read_knobs`); one entry point, no inner kernel (see :func:`extend_slot`)."""
    knobs = read_knobs(knob_values)
    state[s, PENDING] = 0
    if limit <= 0:  # no room left for a draft: nothing to decide
        return 0, 0, False, 0, -1
    length, prompt_length = state[s, LENGTH], state[s, PROMPT]
    count = candidates(wanted, stream, length, table, state[s, CURSOR], state[s, LOST_AT], state[s, LOST_SOURCE],
                       history, history_slots, history_length, knobs, found)
    if count == 0:
        return 0, 0, False, 0, -1
    start, first_match, own, contested = found[0, 0], found[0, 1], found[0, 2], found[0, 3]
    drafted, edit, edit_at = continuation(start, own, limit, stream, length, prompt_length, history, edit_tokens[s],
                                          edit_sizes[s], edit_stamps[s], out, scratch)
    match = match_length(stream, length, start) if own else first_match
    source = HISTORY if not own else CONTESTED if contested else OWN
    position_acceptance(evidence[s], pool, knobs.prior, source, match, estimates[:drafted], knobs.request_weight,
                        knobs.pool_prior_weight, knobs.calibration_weight)
    if sized:
        limit = _best_length(evidence[s], source, match, estimates[:drafted], costs, needs_baseline, knobs)
    if limit <= 0:  # a match, but drafting would not pay: a plain step ("declined")
        return 0, 0, False, first_match, start
    chain = min(drafted, limit)
    total = chain
    budget = tree_budget(tree_costs, chain, knobs.max_tree_tokens, knobs.tree_cost_slack) if count > 1 else chain
    if budget > chain:
        for i in range(chain):
            parents[i] = i - 1
        for c in range(1, count):
            n, _, _ = continuation(found[c, 0], found[c, 2], limit, stream, length, prompt_length, history,
                                   edit_tokens[s], edit_sizes[s], edit_stamps[s], branch, scratch)
            total = add_branch(out, parents, total, branch[:n], budget)
    for i in range(chain):  # element copies: a slice assignment compiles a shape-check path (~1 s)
        pending[s, i] = out[i]
    state[s, PENDING], state[s, PENDING_LEN] = 1, chain
    state[s, PENDING_SOURCE], state[s, PENDING_MATCH] = source, match
    state[s, PENDING_EDIT], state[s, PENDING_EDIT_AT] = edit, edit_at
    sources = 0
    for c in range(count):
        if found[c, 2]:
            branches[s, sources] = found[c, 0]
            sources += 1
    state[s, BRANCHES] = sources
    return total, chain, total > chain, first_match, start


@njit(cache=True, inline="always")
def row_buffers(drafts, edit_tokens, knob_values):
    """The work arrays :func:`draft_row` takes, allocated once per step (not once per row):
    (out, scratch, found, no_costs, no_parents)."""
    width = drafts.shape[1] + edit_tokens.shape[3]
    knobs = read_knobs(knob_values)
    found = np.empty((found_rows(knobs.min_n, knobs.max_n), 4), dtype=np.int64)  # the candidates' work
    return (np.zeros(width, dtype=np.int32), np.zeros(width, dtype=np.int32), found, np.zeros(1),
            np.zeros(1, dtype=np.int32))


@njit(cache=True, inline="always")  # a body, not a call, in every row of a step
def draft_row(text, s, limit, stream, table, indexes, state, evidence, pool, pending, branches, edit_tokens,
              edit_sizes, edit_stamps, history, history_slots, history_length, knob_values, buffers, draft,
              acceptance):
    """One row of a step: slot s (``stream``, ``table``: ``indexes[s]``) learns from its pending
    draft, appends ``text[state[s, LENGTH]:]`` (``text``: the row's whole text, int32) and drafts
    a chain of up to ``limit`` tokens, unsized, into ``draft`` (each position's acceptance
    estimate in ``acceptance``). ``buffers``: :func:`row_buffers`. Returns its length."""
    out, scratch, found, no_costs, no_parents = buffers
    seen = state[s, LENGTH]
    if seen < text.shape[0]:
        stream, table = extend_slot(s, text[seen:], stream, table, indexes, state, evidence, pool, pending,
                                    branches, edit_tokens, edit_sizes, edit_stamps, knob_values)
    length = propose_slot(s, limit, 1, False, False, no_costs, no_costs, stream, table, state, evidence, pool,
                          pending, branches, edit_tokens, edit_sizes, edit_stamps, history, history_slots,
                          history_length, knob_values, out, no_parents, acceptance, scratch, scratch, found)[0]
    for i in range(length):
        draft[i] = out[i]
    return length


@njit(cache=True)
def draft_rows(token_ids, rows, ends, slots, limits, indexes, state, evidence, pool, pending, branches,
               edit_tokens, edit_sizes, edit_stamps, history, history_slots, history_length, knob_values, drafts,
               lengths, acceptance):
    """For each row r, :func:`draft_row`: slot ``slots[r]`` learns from its pending draft,
    appends ``token_ids[rows[r], state[LENGTH]:ends[r]]`` and drafts a chain of up to
    ``limits[r]`` tokens, unsized, into ``drafts[r]`` (``lengths[r]`` of them, each position's
    acceptance estimate in ``acceptance[r]``): the rows of one engine step.

    token_ids (R, L) int32: every row's text, as vLLM keeps it; rows, ends, slots, limits (A,)
    int64; drafts (A, K >= limits.max()) int32, lengths (A,) int64, acceptance (A, K) float64."""
    buffers = row_buffers(drafts, edit_tokens, knob_values)
    for r in range(rows.shape[0]):
        s = slots[r]
        stream, table = indexes[s]
        lengths[r] = draft_row(token_ids[rows[r], : ends[r]], s, limits[r], stream, table, indexes, state,
                               evidence, pool, pending, branches, edit_tokens, edit_sizes, edit_stamps, history,
                               history_slots, history_length, knob_values, buffers, drafts[r], acceptance[r])


class SessionTable:
    """Slots for requests (see the module docstring); ``config`` a SpeculatorConfig, ``history``
    the speculator's :class:`~ngramspec.draft.history.History` or None, ``pool`` its pooled
    acceptance evidence."""

    def __init__(self, config, history=None, slots: int = 16, pool=None):
        self.config, self.history = config, history
        t = config.draft_tuning
        self.knobs = Knobs(config.min_n, config.max_n, config.match == "recent", config.copy_cursor,
                           config.fuzzy_resync, config.edit_recurrence, float(config.acceptance_prior),
                           float(config.acceptance_memory), config.max_tree_tokens, t.fuzzy_window, t.fuzzy_context,
                           t.fuzzy_ahead, t.fuzzy_below_n, float(t.tree_cost_slack), float(t.explore_below),
                           float(t.request_weight), float(t.pool_prior_weight), float(t.pool_window),
                           float(t.calibration_weight))
        self.knob_values = np.array(self.knobs, dtype=np.float64)  # as compiled calls take them
        self.pool = new_evidence() if pool is None else pool  # (4, SOURCES * BUCKETS), shared by every slot
        self.indexes = List.empty_list(INDEX)  # each slot's (stream, table)
        self.state = np.zeros((0, COLUMNS), dtype=np.int64)
        self.evidence = np.zeros((0,) + self.pool.shape)
        self.pending = np.zeros((0, config.max_draft_tokens), dtype=np.int32)
        self.branches = np.zeros((0, max(config.tree_branches, 1)), dtype=np.int64)
        self.edit_tokens, self.edit_sizes, self.edit_stamps = new_edits(0, config.draft_tuning)
        self.free: list[int] = []
        self._grow(slots)

    def _grow(self, slots: int) -> None:
        added = slots - self.state.shape[0]
        self.state = np.concatenate([self.state, np.tile(FRESH, (added, 1))])
        self.evidence = np.concatenate([self.evidence, np.zeros((added,) + self.pool.shape)])
        self.pending = np.concatenate([self.pending, np.zeros((added, self.pending.shape[1]), np.int32)])
        self.branches = np.concatenate([self.branches, np.zeros((added, self.branches.shape[1]), np.int64)])
        self.edit_tokens, self.edit_sizes, self.edit_stamps = (
            np.concatenate([old, fresh])
            for old, fresh in zip(self.arrays()[6:9], new_edits(added, self.config.draft_tuning)))
        _append_slots(self.indexes, added)
        self.free.extend(range(slots - 1, slots - added - 1, -1))  # lowest slot first

    def arrays(self) -> tuple:
        """The slots' arrays in the order the kernels take them: indexes, state, evidence, pool,
        pending, branches, edit_tokens, edit_sizes, edit_stamps."""
        return (self.indexes, self.state, self.evidence, self.pool, self.pending, self.branches,
                self.edit_tokens, self.edit_sizes, self.edit_stamps)

    def new(self, prompt_length: int, capacity: int = 0) -> int:
        """An empty slot for a request whose first ``prompt_length`` tokens are its prompt (they
        arrive with the slot's first extend). ``capacity``: tokens its stream is sized for at
        once (never copied below it), where it exceeds the prompt (else the first extend sizes it); its
        n-gram table starts with room for the prompt, then grows with what the text stores (index_extend)."""
        if not self.free:
            self._grow(2 * self.state.shape[0])
        s = self.free.pop()
        if max(capacity, prompt_length) > 16:
            # Room for 1.5 n-grams a prompt token (text stores 1.05-1.6): not regrown from 16 slots.
            stream = capacity if capacity > max(prompt_length, 16) else 16
            _size_slot(self.indexes, s, stream, table_size(3 * prompt_length // 2))
        self.state[s] = FRESH
        self.state[s, PROMPT] = prompt_length
        self.evidence[s] = 0.0
        self.edit_stamps[s] = 0
        return s

    def release(self, s: int) -> None:
        """Forget slot s (its arrays shrink back, so an evicted request frees its memory)."""
        _reset_slot(self.indexes, s)
        self.state[s] = FRESH
        self.free.append(s)

    def tokens(self, s: int) -> np.ndarray:
        """Slot s's stream so far (a view)."""
        return _stream(self.indexes, s)[: self.state[s, LENGTH]]

    def finish(self, s: int) -> None:
        """The request left: its output joins the history once."""
        if self.history is not None and not self.state[s, FINISHED] and self.state[s, LENGTH] > self.state[s, PROMPT]:
            self.history.add(_stream(self.indexes, s)[self.state[s, PROMPT] : self.state[s, LENGTH]])
        self.state[s, FINISHED] = 1

    def history_arrays(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The shared history's tokens, n-gram table and length, as the kernels read them."""
        if self.history is not None and self.history.index.length:
            return self.history.index.tokens, self.history.index.slots, self.history.index.length
        return _NO_HISTORY, _NO_SLOTS, 0

    def draft(self, token_ids: np.ndarray, rows: np.ndarray, ends: np.ndarray, slots: np.ndarray,
              limits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`draft_rows` over these rows: (drafts (A, max_draft_tokens) int32, lengths (A,),
        acceptance (A, max_draft_tokens)). A slot's ``VERIFIED`` (how many of its draft the next
        step verifies) and ``ACTIVE`` (it ran in the step that just finished) are the caller's to set."""
        count = rows.shape[0]
        drafts, lengths = np.zeros((count, self.pending.shape[1]), dtype=np.int32), np.zeros(count, dtype=np.int64)
        acceptance = np.zeros(drafts.shape)
        draft_rows(np.ascontiguousarray(token_ids), rows.astype(np.int64), ends.astype(np.int64),
                   slots.astype(np.int64), np.minimum(limits, drafts.shape[1]).astype(np.int64), *self.arrays(),
                   *self.history_arrays(), self.knob_values, drafts, lengths, acceptance)
        return drafts, lengths, acceptance


# The typed lists' items, read and written from Python through compiled calls: the typed list's
# own Python accessors compile anew in every process (~0.2 s each, mid-serving the first time a
# request leaves), where these load from Numba's cache.
@njit(cache=True)
def _append_slots(indexes, count):
    for _ in range(count):
        indexes.append((np.zeros(16, dtype=np.int32), np.zeros(16, dtype=np.uint64)))


@njit(cache=True)
def _reset_slot(indexes, s):
    _size_slot(indexes, s, 16, 16)


@njit(cache=True)
def _size_slot(indexes, s, tokens, table_slots):
    indexes[s] = (np.zeros(tokens, dtype=np.int32), np.zeros(table_slots, dtype=np.uint64))


@njit(cache=True)
def _stream(indexes, s):
    return indexes[s][0]


@njit(cache=True)
def slot_index(indexes, s):
    """Slot s's (stream, table), as :func:`extend_slot` and :func:`propose_slot` take them."""
    return indexes[s]


_NO_HISTORY = np.zeros(1, dtype=np.int32)
_NO_SLOTS = np.zeros(16, dtype=np.uint64)
