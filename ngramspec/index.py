"""Incremental n-gram index over a growing token stream (Numba kernels).

The index answers one question per decode step: *the text ends in some n-gram; where did that
n-gram occur before, and what followed it?* It keeps an open-addressing hash table that maps
every n-gram (n in [min_n, max_n]) to the end position of its earliest and latest occurrence.

An n-gram is inserted only once the token after it exists, so every stored occurrence has a
continuation and the current suffix never matches itself. Appending one token therefore
inserts the ``max_n - min_n + 1`` n-grams that end just before it: O(max_n) hashing plus
O(max_n) token comparisons per probe, independent of how long the text already is (the table
doubles when half full, an amortised O(1)). A query hashes the suffixes ending at the last
token and probes from the longest down: O(max_n^2), also independent of the text length.

Worked example, min_n=1, max_n=3, tokens ``[5 6 7 5 6]`` (positions 0..4)::

    stored (n-gram -> end positions):  (5)->0,3  (6)->1  (7)->2  (5 6)->1  (6 7)->2
                                       (7 5)->3  (5 6 7)->2  (6 7 5)->3
    query: suffix (7 5 6)? absent.  (5 6)? ends at 1 -> continuation starts at 2: [7 5 6]
    result: match_len=2, start=2 (the latest and the earliest occurrence agree here)

Kernels are pure functions over int32/int64 arrays, compiled with ``cache=True`` so a new
process loads them from disk instead of re-running the JIT. Their slow, obviously-correct
reference (a dict of tuples) is ``tests/reference_index.py``; a Hypothesis test
(``tests/test_index.py``) pins every kernel, through :class:`NgramIndex`, to it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EMPTY = 0  # slot_n value of an unused slot (no n-gram has length 0)


@njit(cache=True, inline="always")
def _mix(h, token):
    # splitmix64-style finaliser over (previous hash, token): cheap and well spread.
    z = (h ^ np.uint64(token)) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _same_ngram(tokens, end_a, end_b, n):
    for k in range(n):
        if tokens[end_a - k] != tokens[end_b - k]:
            return False
    return True


@njit(cache=True)
def _insert(tokens, end, n, h, slot_hash, slot_n, slot_first, slot_last):
    """Record that the n-gram ending at ``end`` occurred there. Returns 1 if it used a new slot."""
    mask = slot_hash.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    while True:
        if slot_n[i] == EMPTY:
            slot_hash[i] = h
            slot_n[i] = n
            slot_first[i] = end
            slot_last[i] = end
            return 1
        if slot_hash[i] == h and slot_n[i] == n and _same_ngram(tokens, slot_last[i], end, n):
            slot_last[i] = end
            return 0
        i = (i + 1) & mask


@njit(cache=True)
def index_append(tokens, length, new_tokens, min_n, max_n, slot_hash, slot_n, slot_first, slot_last):
    """Append ``new_tokens`` to ``tokens[:length]`` and index the n-grams they complete.

    ``tokens`` must have room for ``length + len(new_tokens)`` tokens and the table room for
    ``len(new_tokens) * (max_n - min_n + 1)`` new slots below half load (the caller checks).
    Returns the number of slots newly used.
    """
    used = 0
    for t in range(new_tokens.shape[0]):
        pos = length + t
        tokens[pos] = new_tokens[t]
        end = pos - 1  # the n-grams ending here just gained a continuation
        h = np.uint64(0)
        for n in range(1, max_n + 1):
            start = end - n + 1
            if start < 0:
                break
            h = _mix(h, tokens[start])
            if n >= min_n:
                used += _insert(tokens, end, n, h, slot_hash, slot_n, slot_first, slot_last)
    return used


@njit(cache=True)
def _suffix_hashes(key, top):
    """hashes[n] = hash of the last n tokens of ``key``, n = 1..top (built from the end)."""
    hashes = np.empty(top + 1, dtype=np.uint64)
    h = np.uint64(0)
    for n in range(1, top + 1):
        h = _mix(h, key[key.shape[0] - n])
        hashes[n] = h
    return hashes


@njit(cache=True)
def _probe(tokens, key, n, h, slot_hash, slot_n, slot_last):
    """Slot holding the n-gram that ends ``key`` (hash h), or -1 if it never occurred."""
    mask = slot_hash.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    last = key.shape[0] - 1
    while slot_n[i] != EMPTY:
        if slot_hash[i] == h and slot_n[i] == n:
            end = slot_last[i]
            same = True
            for k in range(n):
                if tokens[end - k] != key[last - k]:
                    same = False
                    break
            if same:
                return i
        i = (i + 1) & mask
    return -1


@njit(cache=True)
def index_find(tokens, key, min_n, max_n, prefer_recent, slot_hash, slot_n, slot_first, slot_last):
    """Longest n in [min_n, max_n] whose last n tokens of ``key`` (1-D int32) occurred in the
    indexed stream. Returns ``(n, start)``: the match length and the position where the
    continuation of the chosen earlier occurrence starts; ``(0, -1)`` when none did.
    ``key`` may be the stream itself (see :func:`index_longest_match`) or another request's
    text (a shared history answers such queries in O(max_n^2), whatever its size)."""
    top = min(max_n, key.shape[0])
    hashes = _suffix_hashes(key, top)
    for n in range(top, min_n - 1, -1):
        i = _probe(tokens, key, n, hashes[n], slot_hash, slot_n, slot_last)
        if i >= 0:
            found = slot_last[i] if prefer_recent else slot_first[i]
            return n, found + 1
    return 0, -1


@njit(cache=True)
def index_longest_match(tokens, length, min_n, max_n, prefer_recent, slot_hash, slot_n, slot_first, slot_last):
    """Longest suffix of ``tokens[:length]`` (n in [min_n, max_n]) that occurred earlier.

    Returns ``(n, start)``: the match length and the position where the continuation of the
    chosen earlier occurrence starts (``tokens[start]`` followed the n-gram there);
    ``(0, -1)`` when no suffix of at least ``min_n`` tokens occurred before. (The suffix itself
    is never indexed yet, since its next token does not exist: no self-match.)
    """
    return index_find(tokens, tokens[:length], min_n, max_n, prefer_recent, slot_hash, slot_n, slot_first, slot_last)


@njit(cache=True)
def index_matches(tokens, length, min_n, max_n, slot_hash, slot_n, slot_first, slot_last, out):
    """Every suffix match, longest first: row i of ``out`` gets ``(n, earliest_start,
    latest_start)`` for the i-th matching suffix length n (continuation starts of its earliest
    and latest earlier occurrence). Returns the number of rows written. Used to gather several
    candidate continuations for one verification pass (a token tree)."""
    key = tokens[:length]
    top = min(max_n, length)
    hashes = _suffix_hashes(key, top)
    rows = 0
    for n in range(top, min_n - 1, -1):
        i = _probe(tokens, key, n, hashes[n], slot_hash, slot_n, slot_last)
        if i >= 0:
            out[rows, 0] = n
            out[rows, 1] = slot_first[i] + 1
            out[rows, 2] = slot_last[i] + 1
            rows += 1
    return rows


@njit(cache=True)
def index_rehash(slot_hash, slot_n, slot_first, slot_last, new_hash, new_n, new_first, new_last):
    """Move every used slot into a larger, empty table (same hashes, new positions)."""
    mask = new_hash.shape[0] - 1
    for j in range(slot_hash.shape[0]):
        if slot_n[j] == EMPTY:
            continue
        i = np.int64(slot_hash[j] & np.uint64(mask))
        while new_n[i] != EMPTY:
            i = (i + 1) & mask
        new_hash[i] = slot_hash[j]
        new_n[i] = slot_n[j]
        new_first[i] = slot_first[j]
        new_last[i] = slot_last[j]


class NgramIndex:
    """The token stream of one request plus its n-gram table (owns the arrays the kernels use)."""

    def __init__(self, min_n: int, max_n: int, capacity: int = 1024, prefer_recent: bool = True):
        self.min_n, self.max_n, self.prefer_recent = int(min_n), int(max_n), bool(prefer_recent)
        self.tokens = np.zeros(max(16, int(capacity)), dtype=np.int32)
        self.length = 0
        self._alloc_table(_pow2_at_least(2 * max(16, int(capacity)) * (self.max_n - self.min_n + 1)))
        self._used = 0

    def _alloc_table(self, size: int) -> None:
        self.slot_hash = np.zeros(size, dtype=np.uint64)
        self.slot_n = np.zeros(size, dtype=np.int32)
        self.slot_first = np.zeros(size, dtype=np.int32)
        self.slot_last = np.zeros(size, dtype=np.int32)

    def append(self, new_tokens: np.ndarray) -> None:
        """Append tokens (1-D int array) and index the n-grams they complete."""
        new_tokens = np.ascontiguousarray(new_tokens, dtype=np.int32)
        count = new_tokens.shape[0]
        if count == 0:
            return
        if self.length + count > self.tokens.shape[0]:
            grown = np.zeros(_pow2_at_least(self.length + count) * 2, dtype=np.int32)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        worst = self._used + count * (self.max_n - self.min_n + 1)
        if 2 * worst > self.slot_hash.shape[0]:
            old = (self.slot_hash, self.slot_n, self.slot_first, self.slot_last)
            self._alloc_table(_pow2_at_least(4 * worst))
            index_rehash(*old, self.slot_hash, self.slot_n, self.slot_first, self.slot_last)
        self._used += index_append(
            self.tokens, self.length, new_tokens, self.min_n, self.max_n,
            self.slot_hash, self.slot_n, self.slot_first, self.slot_last,
        )
        self.length += count

    def longest_match(self) -> tuple[int, int]:
        """``(match_len, continuation_start)`` for the current suffix; ``(0, -1)`` if none."""
        if self.length == 0:
            return 0, -1
        n, start = index_longest_match(
            self.tokens, self.length, self.min_n, self.max_n, self.prefer_recent,
            self.slot_hash, self.slot_n, self.slot_first, self.slot_last,
        )
        return int(n), int(start)

    def find(self, key: np.ndarray) -> tuple[int, int]:
        """``(n, continuation_start)`` for the longest suffix of ``key`` (1-D ints) that occurs
        in this stream (n in [min_n, max_n]); ``(0, -1)`` if none."""
        key = np.ascontiguousarray(key, dtype=np.int32)
        if self.length == 0 or key.shape[0] == 0:
            return 0, -1
        n, start = index_find(
            self.tokens, key, self.min_n, self.max_n, self.prefer_recent,
            self.slot_hash, self.slot_n, self.slot_first, self.slot_last,
        )
        return int(n), int(start)

    def matches(self) -> np.ndarray:
        """(m, 3) int64 rows ``(n, earliest_start, latest_start)``, one per matching suffix
        length n, longest first (m = 0 when nothing matches)."""
        out = np.zeros((self.max_n - self.min_n + 1, 3), dtype=np.int64)
        if self.length == 0:
            return out[:0]
        rows = index_matches(
            self.tokens, self.length, self.min_n, self.max_n,
            self.slot_hash, self.slot_n, self.slot_first, self.slot_last, out,
        )
        return out[:rows]


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


def warm_up() -> None:
    """Run every kernel once so the first real request pays no JIT (or cache-load) time."""
    index = NgramIndex(1, 3, capacity=4)
    index.append(np.array([1, 2, 3, 1, 2], dtype=np.int32))
    index.append(np.arange(40, dtype=np.int32))  # forces a table rehash
    index.longest_match()
    index.matches()
    index.find(np.array([1, 2], dtype=np.int32))
