"""What a draft is: :class:`Draft`, the tokens one verify pass checks, and the token ids a
session accepts (:func:`as_token_array`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Draft:
    """Tokens proposed for one verification pass.

    ``tokens``: 1-D int32 array of k proposed tokens (k may be 0: take a plain step).
    ``parents``: None for a plain chain (token i follows token i-1); for a token tree
    (``tree_branches > 1``), ``parents[i]`` is the index of the token that token i follows
    (-1: the last emitted token), parents before children.
    ``match_len``/``source_start``: the suffix match that produced the draft and where in the
    token stream the copied continuation starts (-1 when there was none).
    ``acceptance``: (k,) float64, the session's estimate that each drafted token of the chain
    (a tree: its first branch) is accepted given the one before it was
    (:mod:`ngramspec.draft.acceptance`); batch loops size a shared draft length from it. Empty when
    nothing was drafted; positions without an estimate count as 0.
    """

    tokens: np.ndarray
    parents: np.ndarray | None = None
    match_len: int = 0
    source_start: int = -1
    acceptance: np.ndarray = dataclasses.field(default_factory=lambda: _NO_ESTIMATES)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


_NO_ESTIMATES = np.zeros(0)
_NO_ESTIMATES.flags.writeable = False


def as_token_array(ids) -> np.ndarray:
    """1-D token ids (a list, numpy array or torch tensor, on any device) as a contiguous int32 array."""
    if hasattr(ids, "detach"):  # torch tensor, possibly on an accelerator
        ids = ids.detach().to("cpu").numpy()
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D sequence of token ids, got shape {array.shape}.")
    if array.size and (array.dtype.kind not in "iu"):
        raise TypeError(f"token ids must be integers, got dtype {array.dtype}.")
    return np.ascontiguousarray(array, dtype=np.int32)
