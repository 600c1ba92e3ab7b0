"""Cross-request history (opt-in): earlier outputs that later requests of one speculator may
draft from, so a batch job over similar documents drafts from its own earlier answers."""

from __future__ import annotations

import numpy as np

from .index import NgramIndex

SEPARATOR = -1  # between outputs: no model emits it, so no n-gram spans two outputs


class History:
    """A bounded, evicting n-gram index over earlier outputs. When adding an output would
    overflow ``config.history_tokens``, the older half is dropped, or more where the new output
    needs the room (the index is rebuilt from what is kept: an amortised O(1) per stored
    token). It never holds more than ``history_tokens`` tokens, and never grows its arrays."""

    def __init__(self, config):
        self.config = config
        self.capacity = config.history_tokens
        self.index = NgramIndex(config.min_n, config.max_n, capacity=self.capacity + 64)
        # Write every page of the arrays now (~1 ms per 100k tokens of capacity): the OS maps a
        # new array's pages at their first write, ~1 us a page, which the first outputs added
        # would pay instead (~60 us each, mid-serving, where ~6 us is the rest of an add).
        self.index.tokens.fill(0)
        self.index.slots.fill(0)

    def _rebuild(self, tokens: np.ndarray) -> None:
        """Keep only ``tokens`` (a copy: they may be the index's own), in the same arrays."""
        tokens = tokens.copy()
        self.index.clear()
        if tokens.size:
            self.index.append(tokens)

    @property
    def tokens(self) -> np.ndarray:
        return self.index.tokens

    def add(self, output) -> None:
        """Store one request's output (its newest ``capacity - 1`` tokens at most)."""
        output = np.asarray(output, dtype=np.int32)
        output = output[max(0, output.size - (self.capacity - 1)) :]  # with its separator, it fits
        if self.index.length + output.size + 1 > self.capacity:
            # Keep the newer half of what is stored, or less: the new output must fit too.
            keep = max(0, min(self.capacity // 2, self.capacity - output.size - 1, self.index.length))
            kept = self.index.tokens[self.index.length - keep : self.index.length]
            self._rebuild(kept)
        self.index.append(np.concatenate([output, np.array([SEPARATOR], dtype=np.int32)]))

    def find(self, suffix: np.ndarray) -> tuple[int, int]:
        """Longest tail of ``suffix`` seen in the history and where its continuation starts;
        ``(0, -1)`` when none (or when the continuation would be a separator)."""
        n, start = self.index.find(suffix)
        if n and (start >= self.index.length or self.index.tokens[start] == SEPARATOR):
            return 0, -1
        return n, start
