"""The Numba index must answer exactly like its pure-Python reference on any token stream."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngramspec.draft.index import NgramIndex

from reference_index import ReferenceNgramIndex


@settings(max_examples=300, deadline=None)
@given(
    min_n=st.integers(1, 4),
    extra_n=st.integers(0, 4),
    prefer_recent=st.booleans(),
    vocab=st.integers(1, 6),
    chunks=st.lists(st.lists(st.integers(0, 5), max_size=7), min_size=1, max_size=25),
    capacity=st.integers(1, 64),
    key=st.lists(st.integers(0, 5), min_size=1, max_size=8),
)
def test_index_matches_reference(min_n, extra_n, prefer_recent, vocab, chunks, capacity, key):
    fast = NgramIndex(min_n, min_n + extra_n, capacity=capacity, prefer_recent=prefer_recent)
    slow = ReferenceNgramIndex(min_n, min_n + extra_n, prefer_recent=prefer_recent)
    for chunk in chunks:
        tokens = np.array([t % vocab for t in chunk], dtype=np.int32)
        fast.append(tokens)
        slow.append(tokens)
        assert fast.longest_match() == slow.longest_match()
        assert fast.longest_match_occurrences() == slow.longest_match_occurrences()
        assert fast.matches().tolist() == slow.matches().tolist()
        query = np.array([t % vocab for t in key], dtype=np.int32)
        assert fast.find(query) == slow.find(query)  # another sequence's suffix (history lookups)
    assert fast.tokens[: fast.length].tolist() == slow.tokens


def test_worked_example_from_docstring():
    index = NgramIndex(1, 3)
    index.append(np.array([5, 6, 7, 5, 6], dtype=np.int32))
    assert index.longest_match() == (2, 2)
    # every matching suffix length: (n, earliest continuation, latest continuation)
    assert index.matches().tolist() == [[2, 2, 2], [1, 2, 2]]
    index.append(np.array([7, 5], dtype=np.int32))  # [5 6 7 5 6 7 5]: (7 5) ended at 3 and 6
    assert index.matches().tolist() == [[3, 4, 4], [2, 4, 4], [1, 1, 4]]


def test_recent_and_earliest_differ():
    # "1 2" occurs at 0 and 3; the suffix "... 1 2" continues with 3 (earliest) or 4 (recent).
    stream = np.array([1, 2, 3, 1, 2, 4, 1, 2], dtype=np.int32)
    recent, earliest = NgramIndex(1, 2, prefer_recent=True), NgramIndex(1, 2, prefer_recent=False)
    recent.append(stream)
    earliest.append(stream)
    assert recent.longest_match() == (2, 5)
    assert earliest.longest_match() == (2, 2)


def test_no_match_and_min_n():
    index = NgramIndex(2, 3)
    index.append(np.array([1, 2, 3, 1], dtype=np.int32))  # suffix "1" repeats, but min_n=2
    assert index.longest_match() == (0, -1)
    assert NgramIndex(1, 3).longest_match() == (0, -1)  # empty stream


@pytest.mark.parametrize("length", [1_000, 100_000])
def test_long_streams_grow_and_still_match(length):
    rng = np.random.default_rng(length)
    index = NgramIndex(1, 4, capacity=16)
    stream = rng.integers(0, 50_000, size=length).astype(np.int32)
    index.append(stream)
    index.append(stream[100:104])  # the 4-gram at 100..103 recurs: continuation at 104
    assert index.longest_match() == (4, 104)


@pytest.mark.parametrize("sized", ["capacity", "at once", "grown"])
def test_memory_per_token_is_bounded(sized):
    """Random text is the worst case for memory (nothing recurs): its n-grams longer than the
    shortest get no slot (they occurred once, where the shortest did), so it takes ~1 slot a
    token: at most 24 bytes per token whether it came at once or grew a few hundred tokens at a
    time. An index given a capacity holds any text of that size without growing (up to one slot
    per n-gram size a token, 80 bytes a token here)."""
    stream = np.random.default_rng(1).integers(0, 49_152, size=200_000).astype(np.int32)
    index = NgramIndex(1, 6, capacity=stream.size if sized == "capacity" else 16)
    arrays = index.tokens.ctypes.data, index.slots.ctypes.data
    for chunk in np.array_split(stream, 500 if sized == "grown" else 1):
        index.append(chunk)
    assert index.length == stream.size
    assert index.nbytes <= (80 if sized == "capacity" else 24) * stream.size, index.nbytes / stream.size
    if sized == "capacity":
        assert (index.tokens.ctypes.data, index.slots.ctypes.data) == arrays
    index.append(stream[5_000:5_006])  # still answers: the 6-gram recurs
    assert index.longest_match() == (6, 5_006)


def test_a_single_occurrence_answers_for_its_longer_ngrams():
    """(3 4) occurred once, so (2 3 4) and (1 2 3 4) have no slot of their own; a suffix ending
    in them still matches them, up to max_n, and a differing token before stops the match. When
    (3 4) recurs, the 3-gram at its first occurrence gets its slot and keeps both ends."""
    index = NgramIndex(2, 4)
    index.append(np.array([1, 2, 3, 4, 5, 1, 2, 3, 4], dtype=np.int32))  # (3 4) recurs at the end
    # (1 2) (2 3) (3 4) (4 5) (5 1); (1 2) recurred: (5 1 2); (2 3) recurred: (1 2 3) where it
    # first ended (promoted, then found again), then (5 1 2 3). Every n-gram would be 15 slots.
    assert index._used == 8
    assert index.matches().tolist() == [[4, 4, 4], [3, 4, 4], [2, 4, 4]]
    index.append(np.array([9], dtype=np.int32))  # (3 4) ends at 3 and at 8 now
    index.append(np.array([7, 3, 4], dtype=np.int32))
    assert index.matches().tolist() == [[2, 4, 9]]  # (9 7 3 4) and (7 3 4) never occurred before


def test_positions_past_the_limit_are_refused(monkeypatch):
    from ngramspec.draft import index as index_module

    monkeypatch.setattr(index_module, "MAX_POSITIONS", 40)
    index = NgramIndex(1, 3)
    index.append(np.arange(40, dtype=np.int32))
    with pytest.raises(ValueError, match="at most 40 tokens"):
        index.append(np.array([1], dtype=np.int32))
    assert index.length == 40  # unchanged
