"""Incremental n-gram index over a growing token stream (Numba kernels).

The index answers one question per decode step: *the text ends in some n-gram; where did that
n-gram occur before, and what followed it?* It keeps an open-addressing hash table that maps
n-grams (n in [min_n, max_n]) to the end position of their earliest and latest occurrence.

An n-gram is inserted only once the token after it exists, so every stored occurrence has a
continuation and the current suffix never matches itself. Only n-grams whose one-shorter suffix
recurred get a slot (and every min_n-gram): where a suffix occurred once, any longer n-gram
ending in it occurred there or nowhere, which comparing the tokens before that one occurrence
tells (:func:`_longer_at`). When such a suffix recurs, the longer n-gram at its first occurrence
gets its slot (a *promotion*). Appending one token probes from the shortest n-gram ending before
it up, and stops at the first new one: O(max_n) probes and hashing, independent of how long
the text already is (the table grows 1.5x past 70% load, an amortised O(1)). A query probes the
suffixes from the shortest up and stops at the first absent or single one: O(max_n^2).

Memory: one 8-byte slot per stored n-gram at up to 70% load, plus 4 bytes per token. Text
stores ~1.05 n-grams per token where it never repeats (random tokens), 1.3-1.6 on the shared
documents with min_n=1, max_n=6 (it was max_n - min_n + 1 = 6 before promotions): 18-21 bytes
per token of random text, 25-40 at peak (a session's table starts sized for its prompt; a growth
holds the old array and the new one at once). Peak RSS per token and step time: ``python -m eval
drafter --memory``.

Worked example, min_n=1, max_n=3, tokens ``[5 6 7 5 6]`` (positions 0..4)::

    stored (n-gram -> end positions):  (5)->0,3  (6)->1  (7)->2  (7 5)->3
      (7 5) since (5) recurred; not (5 6), (6 7), (5 6 7): (6) and (7) occurred once
    query: suffix (6)? ends at 1, once: compare backwards, tokens[0] = 5 matches: (5 6) ends at
           1 too; tokens[-1] does not exist: stop.
           the longest, (5 6), ended at 1 -> continuation starts at 2: [7 5 6]
    result: match_len=2, start=2 (the latest and the earliest occurrence agree here)

Kernels are pure functions over int32/int64 arrays, compiled with ``cache=True`` so a new
process loads them from disk instead of re-running the JIT. Their slow, obviously-correct
reference (a dict of every n-gram's tuple) is ``tests/reference_index.py``; a Hypothesis test
(``tests/test_index.py``) pins every kernel, through :class:`NgramIndex`, to it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# One table slot is one uint64: n (7 bits; 0 = empty) | first end position (28 bits) | last end
# position (28 bits). No hash is stored: a probe compares the stored n and then the tokens
# themselves (at the slot's last occurrence), which also rules out hash collisions. 8 bytes a
# slot at a load of at most MAX_LOAD keep the table at 11.4-18 bytes per stored n-gram (grown
# 1.5x past it, _grown_table).
EMPTY = np.uint64(0)
N_BITS, POS_BITS = 7, 28
N_MASK, POS_MASK = np.uint64((1 << N_BITS) - 1), np.uint64((1 << POS_BITS) - 1)
MAX_POSITIONS = 1 << POS_BITS  # tokens one index can hold (268M)
MAX_LOAD = 0.7  # linear probing: ~2 slots read per hit, ~6 per miss, in one or two cache lines
GROWTH = 1.5
HEADROOM = 32  # past what a long append needs: 1/32 of it more, and ROOM tokens (_grown)
ROOM = 256


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
    """Record that the n-gram ending at ``end`` occurred there. Returns EMPTY if it took a new
    slot, else its slot as it was (its earlier occurrences)."""
    size = slots.shape[0]
    i = _home(h, size)
    while True:
        slot = slots[i]
        if slot == EMPTY:
            slots[i] = _pack(n, end, end)
            return EMPTY
        if _n(slot) == n and _same_ngram(tokens, _last(slot), tokens, end, n):
            slots[i] = _pack(n, _first(slot), end)
            return slot
        i += 1
        if i == size:
            i = 0


@njit(cache=True, inline="always")
def _key_at(tokens, end, n):
    """The key of the n-gram ending at ``end``, grown from its last token back (as appends do)."""
    h = np.uint64(0)
    for k in range(n):
        h = _grow_key(h, tokens[end - k])
    return h


@njit(cache=True)
def index_append(tokens, length, new_tokens, done, min_n, max_n, slots, used):
    """Append ``new_tokens[done:]`` at ``tokens[length + done:]`` (room for all of them) and
    index the n-grams they complete, while the table keeps room below MAX_LOAD for the most one
    token can add (one slot per n). ``used``: slots in use. Returns ``(appended, used)``: how
    many of ``new_tokens`` are appended now, and the slots in use."""
    room = MAX_LOAD * slots.shape[0] - (max_n - min_n + 1)
    for t in range(done, new_tokens.shape[0]):
        if used > room:
            return t, used
        pos = length + t
        tokens[pos] = new_tokens[t]
        end = pos - 1  # the n-grams ending here just gained a continuation
        h = np.uint64(0)
        for n in range(1, max_n + 1):
            start = end - n + 1
            if start < 0:
                break
            h = _grow_key(h, tokens[start])
            if n < min_n:
                continue
            before = _insert(tokens, end, n, h, slots)
            if before == EMPTY:  # new: so is every longer n-gram ending here, and they stay implicit
                used += 1
                break
            once = _last(before)
            if _first(before) == once and n < max_n and once >= n:
                # Its only earlier occurrence, ending at `once`, stops being single: the n+1-gram
                # ending there, implicit so far (absent from the table), gets its slot.
                _insert(tokens, once, n + 1, _key_at(tokens, once, n + 1), slots)
                used += 1
    return new_tokens.shape[0], used


@njit(cache=True, inline="always")  # a body, not a call, in every row of a step (sessions.extend_slot)
def index_extend(tokens, slots, length, used, new_tokens, min_n, max_n):
    """:func:`index_append` of every token of ``new_tokens``, first growing the stream to fit
    (:func:`_grown`), and the table whenever it has no room left (:func:`_grown_table`).
    ``used``: slots in use. Returns ``(tokens, slots, used)``: the arrays, new ones where they
    grew, and the slots now in use."""
    count = new_tokens.shape[0]
    if length + count > MAX_POSITIONS:
        raise ValueError("an n-gram index holds at most 268,435,456 tokens")
    if length + count > tokens.shape[0]:
        grown = np.zeros(min(_grown(tokens.shape[0], length + count, ROOM), MAX_POSITIONS), dtype=np.int32)
        for i in range(length):  # not a slice assignment, whose shape-check path compiles for ~1.5 s
            grown[i] = tokens[i]
        tokens = grown
    done, used = index_append(tokens, length, new_tokens, 0, min_n, max_n, slots, used)
    while done < count:
        grown_slots = np.zeros(_grown_table(slots.shape[0], used, length + done, count - done, max_n - min_n + 1),
                               dtype=np.uint64)
        index_rehash(tokens, slots, grown_slots)
        slots = grown_slots
        done, used = index_append(tokens, length, new_tokens, done, min_n, max_n, slots, used)
    return tokens, slots, used


@njit(cache=True)
def _grown_table(size, used, indexed, remaining, per_token):
    """The new size of a full table (``size`` slots, ``used`` by ``indexed`` tokens, with
    ``remaining`` tokens of an append to go): GROWTH times it, or what the rest of a long append
    needs at the slots per token seen so far (with :func:`_grown`'s headroom), at most 4x at once
    (an early rate may be off; the next growth sees a later one)."""
    needed = used + int(remaining * used / max(indexed, 1))
    return max(int(GROWTH * size), min(table_size(_grown(0, needed, ROOM * per_token)), 4 * size))


@njit(cache=True)
def _grown(size, needed, room):
    """The new size of an array of ``size`` that must hold ``needed``: GROWTH times the old size
    (an amortised O(1) per token while a text grows a few tokens at a time), or, where a long
    append outgrows that, what it needs plus 1/HEADROOM of it and ``room`` (so a prompt indexed
    at once decodes HEADROOM-th of its length, at least ROOM tokens, before the first rehash,
    and costs ~3% over its size, where GROWTH would cost 50%)."""
    return max(int(GROWTH * size), needed + needed // HEADROOM + room)


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
    occurred once); ``(0, -1, -1)`` when none did. ``key`` may be the stream itself (never
    matching itself: its last n-grams are not indexed until the next token exists) or another
    request's text (a shared history answers such queries in O(max_n^2), whatever its size).
    The suffixes are probed from the shortest up, each hash extending the last, until one never
    occurred (nor did any longer one) or occurred once (longer ones: :func:`_longer_at`)."""
    last = key.shape[0] - 1
    top = min(max_n, key.shape[0])
    h, best, best_n = np.uint64(0), EMPTY, 0
    for n in range(1, top + 1):
        h = _grow_key(h, key[last - n + 1])
        if n < min_n:
            continue
        slot = _probe(tokens, key, n, h, slots)
        if slot == EMPTY:
            break
        best, best_n = slot, n
        if _first(slot) == _last(slot):  # it occurred once: longer ones there or nowhere
            best_n = _longer_at(tokens, _last(slot), key, n, top)
            break
    if best_n == 0:
        return 0, -1, -1
    if prefer_recent:
        return best_n, _last(best) + 1, _first(best) + 1
    return best_n, _first(best) + 1, _last(best) + 1


@njit(cache=True, inline="always")
def _longer_at(tokens, end, key, n, top):
    """How far (up to ``top``) ``key``'s suffix goes on matching backwards from ``end``, where its
    n-gram occurred once: the longer ones are not stored, and occurred there or nowhere."""
    last = key.shape[0] - 1
    while n < top and end >= n and tokens[end - n] == key[last - n]:
        n += 1
    return n


@njit(cache=True)
def index_matches(tokens, length, min_n, max_n, slots, out):
    """Every suffix match, longest first: row i of ``out`` gets ``(n, earliest_start,
    latest_start)`` for the i-th matching suffix length n (continuation starts of its earliest
    and latest earlier occurrence). Returns the number of rows written. Used to gather several
    candidate continuations for one verification pass (a token tree)."""
    key = tokens[:length]
    top = min(max_n, length)
    h, rows = np.uint64(0), 0
    for n in range(1, top + 1):  # shortest first (as index_find), then reversed
        h = _grow_key(h, key[length - n])
        if n < min_n:
            continue
        slot = _probe(tokens, key, n, h, slots)
        if slot == EMPTY:
            break
        first, latest = _first(slot), _last(slot)
        longest = _longer_at(tokens, latest, key, n, top) if first == latest else n
        for m in range(n, longest + 1):
            out[rows, 0], out[rows, 1], out[rows, 2] = m, first + 1, latest + 1
            rows += 1
        if first == latest:  # the longer ones are not stored (_longer_at)
            break
    for i in range(rows // 2):
        for k in range(3):
            out[i, k], out[rows - 1 - i, k] = out[rows - 1 - i, k], out[i, k]
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
        i = _home(_key_at(tokens, _last(slot), _n(slot)), size)
        while new_slots[i] != EMPTY:
            i += 1
            if i == size:
                i = 0
        new_slots[i] = slot


class NgramIndex:
    """The token stream of one request plus its n-gram table (owns the arrays the kernels use),
    both sized for ``capacity`` tokens of any text at once (never growing below it)."""

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
        n, start, other = index_find(self.tokens, self.tokens[: self.length], self.min_n, self.max_n,
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
