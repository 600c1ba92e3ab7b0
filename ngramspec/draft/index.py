"""Incremental n-gram index over a growing token stream (Numba kernels).

The index answers one question per decode step: *the text ends in some n-gram; where did that
n-gram occur before, and what followed it?* It keeps an open-addressing hash table that maps
every n-gram (n in [min_n, max_n]) to the end position of its earliest and latest occurrence.

An n-gram is inserted only once the token after it exists, so every stored occurrence has a
continuation and the current suffix never matches itself. Appending one token therefore
inserts the ``max_n - min_n + 1`` n-grams that end just before it: O(max_n) hashing plus
O(max_n) token comparisons per probe (none once a shorter one proved new: a longer one cannot
be stored either), independent of how long the text already is (the table
grows 1.5x past 70% load, an amortised O(1)). A query probes the suffixes ending at the last
token from the shortest up and stops at the first that never occurred (nor did any longer one):
O(max_n^2), also independent of the text length.

Memory: one 8-byte slot per stored n-gram at up to 70% load, plus 4 bytes per token. Random
text, the worst case, stores nearly every n-gram: with min_n=1, max_n=6 that is 73 bytes per
token where the index was sized for its text (a session's ``capacity``), 75 where a long prompt
came at once (sized to it and 1/32 more, :func:`_grown`), and 73-110 while a text grows a few
tokens at a time; a repetitive text stores fewer. Growing holds the old and the new array at
once: a text grown by decoding peaks at 2.5 times the table it outgrew (up to ~180 bytes per
token; 116 at 1M tokens), a prompt indexed at once at its size. Peak RSS per token of context
and the step time (~12 us per propose + extend at 128k and at 1M tokens of context on a 2-core
CPU): ``python -m eval drafter --memory``.

Worked example, min_n=1, max_n=3, tokens ``[5 6 7 5 6]`` (positions 0..4)::

    stored (n-gram -> end positions):  (5)->0,3  (6)->1  (7)->2  (5 6)->1  (6 7)->2
                                       (7 5)->3  (5 6 7)->2  (6 7 5)->3
    query: suffix (6)? ends at 1.  (5 6)? ends at 1.  (7 5 6)? absent: stop.
           the longest, (5 6), ended at 1 -> continuation starts at 2: [7 5 6]
    result: match_len=2, start=2 (the latest and the earliest occurrence agree here)

Kernels are pure functions over int32/int64 arrays, compiled with ``cache=True`` so a new
process loads them from disk instead of re-running the JIT. Their slow, obviously-correct
reference (a dict of tuples) is ``tests/reference_index.py``; a Hypothesis test
(``tests/test_index.py``) pins every kernel, through :class:`NgramIndex`, to it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# One table slot is one uint64: n (7 bits; 0 = empty) | first end position (28 bits) | last end
# position (28 bits). No hash is stored: a probe compares the stored n and then the tokens
# themselves (at the slot's last occurrence), which also rules out hash collisions. 8 bytes a
# slot at a load of at most MAX_LOAD keep the table at 11.4-18 bytes per stored n-gram (grown
# 1.5x past it, _grown); random text stores about max_n - min_n + 1 of them per token.
EMPTY = np.uint64(0)
N_BITS, POS_BITS = 7, 28
N_MASK, POS_MASK = np.uint64((1 << N_BITS) - 1), np.uint64((1 << POS_BITS) - 1)
MAX_POSITIONS = 1 << POS_BITS  # tokens one index can hold (268M)
MAX_LOAD = 0.7  # linear probing: ~2 slots read per hit, ~6 per miss, in one or two cache lines
GROWTH = 1.5
HEADROOM = 32  # past what a long append needs: 1/32 of it more, and ROOM tokens (_grown)
ROOM = 256


@njit(cache=True, inline="always")
def _mix(h, token):
    # splitmix64-style finaliser over (previous hash, token): cheap and well spread.
    z = (h ^ np.uint64(token)) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def _grow_key(key, token):
    # An n-gram's key from its last n - 1 tokens' key and the token before them: one multiply-add,
    # not a chain of n mixes for the index's loops to wait on; _home spreads each key on its own.
    return key * np.uint64(0x9E3779B97F4A7C15) + np.uint64(token) + np.uint64(1)


@njit(cache=True, inline="always")
def _home(key, size):
    # The slot a key starts probing at: the key spread (a multiply and two xor-shifts), its top
    # 32 bits scaled to [0, size) (any table size).
    z = (key ^ (key >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(32)
    return np.int64(((z >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32))


@njit(cache=True, inline="always")
def _pack(n, first, last):
    return np.uint64(n) | (np.uint64(first) << np.uint64(N_BITS)) | (np.uint64(last) << np.uint64(N_BITS + POS_BITS))


@njit(cache=True, inline="always")
def _n(slot):
    return np.int64(slot & N_MASK)


@njit(cache=True, inline="always")
def _first(slot):
    return np.int64((slot >> np.uint64(N_BITS)) & POS_MASK)


@njit(cache=True, inline="always")
def _last(slot):
    return np.int64(slot >> np.uint64(N_BITS + POS_BITS))


@njit(cache=True)
def _same_ngram(tokens, end_a, key, end_b, n):
    for k in range(n):
        if tokens[end_a - k] != key[end_b - k]:
            return False
    return True


@njit(cache=True)
def _insert(tokens, end, n, h, slots):
    """Record that the n-gram ending at ``end`` occurred there. Returns 1 if it used a new slot."""
    size = slots.shape[0]
    i = _home(h, size)
    while True:
        slot = slots[i]
        if slot == EMPTY:
            slots[i] = _pack(n, end, end)
            return 1
        if _n(slot) == n and _same_ngram(tokens, _last(slot), tokens, end, n):
            slots[i] = _pack(n, _first(slot), end)
            return 0
        i += 1
        if i == size:
            i = 0


@njit(cache=True)
def _place(end, n, h, slots):
    """Record the first occurrence of an n-gram known to be absent (ending at ``end``): the
    first empty slot from its home, with no comparison on the way."""
    size = slots.shape[0]
    i = _home(h, size)
    while slots[i] != EMPTY:
        i += 1
        if i == size:
            i = 0
    slots[i] = _pack(n, end, end)


@njit(cache=True)
def index_append(tokens, length, new_tokens, min_n, max_n, slots):
    """Append ``new_tokens`` to ``tokens[:length]`` and index the n-grams they complete.

    ``tokens`` must have room for ``length + len(new_tokens)`` tokens and the table room for
    ``len(new_tokens) * (max_n - min_n + 1)`` new slots below MAX_LOAD (the caller checks).
    Returns the number of slots newly used.
    """
    used = 0
    for t in range(new_tokens.shape[0]):
        pos = length + t
        tokens[pos] = new_tokens[t]
        end = pos - 1  # the n-grams ending here just gained a continuation
        h = np.uint64(0)
        absent = False  # an n-gram ending here occurred nowhere before: nor did any longer one
        for n in range(1, max_n + 1):
            start = end - n + 1
            if start < 0:
                break
            h = _grow_key(h, tokens[start])
            if n < min_n:
                continue
            if absent:  # its probe would compare tokens all the way to an empty slot
                _place(end, n, h, slots)
                used += 1
            else:
                absent = _insert(tokens, end, n, h, slots) == 1
                used += absent
    return used


@njit(cache=True, inline="always")  # a body, not a call, in every row of a step (sessions.extend_slot)
def index_extend(tokens, slots, length, used, new_tokens, min_n, max_n):
    """:func:`index_append`, first growing the stream (to fit) and the table (past MAX_LOAD) to
    :func:`_grown` sizes. ``used``: slots in use. Returns ``(tokens, slots, used)``: the arrays,
    new ones where they grew, and the slots now in use."""
    count = new_tokens.shape[0]
    if length + count > MAX_POSITIONS:
        raise ValueError("an n-gram index holds at most 268,435,456 tokens")
    if length + count > tokens.shape[0]:
        grown = np.zeros(min(_grown(tokens.shape[0], length + count, ROOM), MAX_POSITIONS), dtype=np.int32)
        for i in range(length):  # not a slice assignment, whose shape-check path compiles for ~1.5 s
            grown[i] = tokens[i]
        tokens = grown
    per_token = max_n - min_n + 1
    worst = used + count * per_token
    if worst > MAX_LOAD * slots.shape[0]:
        grown_slots = np.zeros(max(int(GROWTH * slots.shape[0]), table_size(_grown(0, worst, ROOM * per_token))),
                               dtype=np.uint64)
        index_rehash(tokens, slots, grown_slots)
        slots = grown_slots
    return tokens, slots, used + index_append(tokens, length, new_tokens, min_n, max_n, slots)


@njit(cache=True)
def _grown(size, needed, room):
    """The new size of an array of ``size`` that must hold ``needed``: GROWTH times the old size
    (an amortised O(1) per token while a text grows a few tokens at a time), or, where a long
    append outgrows that, what it needs plus 1/HEADROOM of it and ``room`` (so a prompt indexed
    at once decodes HEADROOM-th of its length, at least ROOM tokens, before the first rehash,
    and costs ~3% over its size, where GROWTH would cost 50%)."""
    return max(int(GROWTH * size), needed + needed // HEADROOM + room)


@njit(cache=True)
def _suffix_hashes(key, top):
    """hashes[n] = hash of the last n tokens of ``key``, n = 1..top (built from the end)."""
    hashes = np.empty(top + 1, dtype=np.uint64)
    h = np.uint64(0)
    for n in range(1, top + 1):
        h = _grow_key(h, key[key.shape[0] - n])
        hashes[n] = h
    return hashes


@njit(cache=True)
def _probe(tokens, key, n, h, slots):
    """The slot holding the n-gram that ends ``key`` (hash h), or EMPTY if it never occurred."""
    size = slots.shape[0]
    i = _home(h, size)
    last = key.shape[0] - 1
    while slots[i] != EMPTY:
        slot = slots[i]
        if _n(slot) == n and _same_ngram(tokens, _last(slot), key, last, n):
            return slot
        i += 1
        if i == size:
            i = 0
    return EMPTY


@njit(cache=True)
def index_find(tokens, key, min_n, max_n, prefer_recent, slots):
    """Longest n in [min_n, max_n] whose last n tokens of ``key`` (1-D int32) occurred in the
    indexed stream. Returns ``(n, start, other)``: the match length, the position where the
    continuation of the chosen earlier occurrence starts, and that of the other one kept (the
    earliest where the latest is chosen, and the reverse; ``start`` itself where the n-gram
    occurred once); ``(0, -1, -1)`` when none did. ``key`` may be the stream itself (see
    :func:`index_longest_match`) or another request's text (a shared history answers such
    queries in O(max_n^2), whatever its size).

    The suffixes are probed from the shortest up, each hash extending the last, and the first
    that never occurred ends the search: a longer suffix contains it, so it never occurred
    either (and no hash array is allocated)."""
    last = key.shape[0] - 1
    h, best, best_n = np.uint64(0), EMPTY, 0
    for n in range(1, min(max_n, key.shape[0]) + 1):
        h = _grow_key(h, key[last - n + 1])
        if n < min_n:
            continue
        slot = _probe(tokens, key, n, h, slots)
        if slot == EMPTY:
            break
        best, best_n = slot, n
    if best_n == 0:
        return 0, -1, -1
    if prefer_recent:
        return best_n, _last(best) + 1, _first(best) + 1
    return best_n, _first(best) + 1, _last(best) + 1


@njit(cache=True)
def index_longest_match(tokens, length, min_n, max_n, prefer_recent, slots):
    """Longest suffix of ``tokens[:length]`` (n in [min_n, max_n]) that occurred earlier.

    Returns ``(n, start, other)``: the match length, the position where the continuation of
    the chosen earlier occurrence starts (``tokens[start]`` followed the n-gram there) and that
    of the other occurrence kept (:func:`index_find`); ``(0, -1, -1)`` when no suffix of at
    least ``min_n`` tokens occurred before. (The suffix itself is never indexed yet, since its
    next token does not exist: no self-match.)
    """
    return index_find(tokens, tokens[:length], min_n, max_n, prefer_recent, slots)


@njit(cache=True)
def index_matches(tokens, length, min_n, max_n, slots, out):
    """Every suffix match, longest first: row i of ``out`` gets ``(n, earliest_start,
    latest_start)`` for the i-th matching suffix length n (continuation starts of its earliest
    and latest earlier occurrence). Returns the number of rows written. Used to gather several
    candidate continuations for one verification pass (a token tree)."""
    key = tokens[:length]
    top = min(max_n, length)
    hashes = _suffix_hashes(key, top)
    rows = 0
    for n in range(top, min_n - 1, -1):
        slot = _probe(tokens, key, n, hashes[n], slots)
        if slot != EMPTY:
            out[rows, 0] = n
            out[rows, 1] = _first(slot) + 1
            out[rows, 2] = _last(slot) + 1
            rows += 1
    return rows


@njit(cache=True)
def index_rehash(tokens, slots, new_slots):
    """Move every used slot into a larger, empty table. No hash is stored, so each n-gram's is
    recomputed from its tokens (O(n) per slot, once per growth)."""
    size = new_slots.shape[0]
    for j in range(slots.shape[0]):
        slot = slots[j]
        if slot == EMPTY:
            continue
        n, end = _n(slot), _last(slot)
        h = np.uint64(0)
        for k in range(n):
            h = _grow_key(h, tokens[end - k])
        i = _home(h, size)
        while new_slots[i] != EMPTY:
            i += 1
            if i == size:
                i = 0
        new_slots[i] = slot


class NgramIndex:
    """The token stream of one request plus its n-gram table (owns the arrays the kernels use)."""

    def __init__(self, min_n: int, max_n: int, capacity: int = 1024, prefer_recent: bool = True):
        self.min_n, self.max_n, self.prefer_recent = int(min_n), int(max_n), bool(prefer_recent)
        if not 1 <= self.min_n <= self.max_n < (1 << N_BITS):
            raise ValueError(f"need 1 <= min_n <= max_n < {1 << N_BITS} (got {min_n}, {max_n})")
        capacity = max(16, int(capacity))
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.length = 0
        self.slots = np.zeros(table_size(capacity * (self.max_n - self.min_n + 1)), dtype=np.uint64)
        self._used = 0

    def append(self, new_tokens: np.ndarray) -> None:
        """Append tokens (1-D int array) and index the n-grams they complete."""
        new_tokens = np.ascontiguousarray(new_tokens, dtype=np.int32)
        count = new_tokens.shape[0]
        if count == 0:
            return
        if self.length + count > MAX_POSITIONS:
            raise ValueError(f"an n-gram index holds at most {MAX_POSITIONS:,} tokens")
        self.tokens, self.slots, self._used = index_extend(self.tokens, self.slots, self.length, self._used,
                                                           new_tokens, self.min_n, self.max_n)
        self.length += count

    def clear(self) -> None:
        """Forget every token, keeping the arrays (their memory already mapped)."""
        self.slots.fill(0)
        self.length = self._used = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the token stream and the table."""
        return self.tokens.nbytes + self.slots.nbytes

    def longest_match(self) -> tuple[int, int]:
        """``(match_len, continuation_start)`` for the current suffix; ``(0, -1)`` if none."""
        return self.longest_match_occurrences()[:2]

    def longest_match_occurrences(self) -> tuple[int, int, int]:
        """``(match_len, continuation_start, other_start)``: :meth:`longest_match` and where the
        other kept occurrence (earliest or latest) of that suffix continues, equal to
        ``continuation_start`` where it occurred once; ``(0, -1, -1)`` if none."""
        if self.length == 0:
            return 0, -1, -1
        n, start, other = index_longest_match(self.tokens, self.length, self.min_n, self.max_n,
                                              self.prefer_recent, self.slots)
        return int(n), int(start), int(other)

    def find(self, key: np.ndarray) -> tuple[int, int]:
        """``(n, continuation_start)`` for the longest suffix of ``key`` (1-D ints) that occurs
        in this stream (n in [min_n, max_n]); ``(0, -1)`` if none."""
        key = np.ascontiguousarray(key, dtype=np.int32)
        if self.length == 0 or key.shape[0] == 0:
            return 0, -1
        n, start, _ = index_find(self.tokens, key, self.min_n, self.max_n, self.prefer_recent, self.slots)
        return int(n), int(start)

    def matches(self) -> np.ndarray:
        """(m, 3) int64 rows ``(n, earliest_start, latest_start)``, one per matching suffix
        length n, longest first (m = 0 when nothing matches)."""
        out = np.zeros((self.max_n - self.min_n + 1, 3), dtype=np.int64)
        if self.length == 0:
            return out[:0]
        rows = index_matches(self.tokens, self.length, self.min_n, self.max_n, self.slots, out)
        return out[:rows]


@njit(cache=True)
def table_size(entries):
    """Slots that hold ``entries`` n-grams at MAX_LOAD."""
    return max(16, int(entries / MAX_LOAD) + 1)


def warm_up() -> None:
    """Run every kernel once so the first real request pays no JIT (or cache-load) time."""
    index = NgramIndex(1, 3, capacity=4)
    index.append(np.array([1, 2, 3, 1, 2], dtype=np.int32))
    index.append(np.arange(40, dtype=np.int32))  # forces a table rehash
    index.longest_match()
    index.matches()
    index.find(np.array([1, 2], dtype=np.int32))
