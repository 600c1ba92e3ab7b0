"""Slow, obviously-correct reference of ngramspec's Numba n-gram index (test-only).

Every kernel in ``ngramspec/draft/index.py`` answers through :class:`~ngramspec.draft.index.NgramIndex`;
this twin answers the same questions with a dict from n-gram tuples to their first and last
end positions, and ``test_index.py`` pins the two together with Hypothesis.
"""

from __future__ import annotations

import numpy as np


class ReferenceNgramIndex:
    """Same API as :class:`ngramspec.draft.index.NgramIndex` (append, longest_match, find, matches)."""

    def __init__(self, min_n: int, max_n: int, prefer_recent: bool = True):
        self.min_n, self.max_n, self.prefer_recent = min_n, max_n, prefer_recent
        self.tokens: list[int] = []
        self.occurrences: dict[tuple[int, ...], list[int]] = {}  # n-gram -> [first_end, last_end]

    def append(self, new_tokens) -> None:
        for token in new_tokens:
            self.tokens.append(int(token))
            end = len(self.tokens) - 2
            for n in range(self.min_n, self.max_n + 1):
                if end - n + 1 < 0:
                    break
                key = tuple(self.tokens[end - n + 1 : end + 1])
                if key in self.occurrences:
                    self.occurrences[key][1] = end
                else:
                    self.occurrences[key] = [end, end]

    def longest_match(self) -> tuple[int, int]:
        return self.longest_match_occurrences()[:2]

    def longest_match_occurrences(self) -> tuple[int, int, int]:
        for n in range(min(self.max_n, len(self.tokens)), self.min_n - 1, -1):
            key = tuple(self.tokens[len(self.tokens) - n :])
            if key in self.occurrences:
                first, last = self.occurrences[key]
                chosen, other = (last, first) if self.prefer_recent else (first, last)
                return n, chosen + 1, other + 1
        return 0, -1, -1

    def find(self, key) -> tuple[int, int]:
        key = [int(t) for t in key]
        for n in range(min(self.max_n, len(key)), self.min_n - 1, -1):
            if tuple(key[len(key) - n :]) in self.occurrences:
                first, last = self.occurrences[tuple(key[len(key) - n :])]
                return n, (last if self.prefer_recent else first) + 1
        return 0, -1

    def matches(self) -> np.ndarray:
        rows = []
        for n in range(min(self.max_n, len(self.tokens)), self.min_n - 1, -1):
            key = tuple(self.tokens[len(self.tokens) - n :])
            if key in self.occurrences:
                first, last = self.occurrences[key]
                rows.append((n, first + 1, last + 1))
        return np.array(rows, dtype=np.int64).reshape(-1, 3)
