"""The n-gram speculator and its per-request session (start -> propose/extend -> done).

    spec = NgramSpeculator(max_n=4)
    session = spec.start(prompt_ids)       # index the prompt
    draft = session.propose()              # Draft: tokens copied from after an earlier match
    ...verify draft with the target model...
    session.extend(emitted_tokens)         # accepted draft tokens + the target's own token

``generate(ngram_speculator=spec)`` drives exactly this API; so do the trace replayer and any
other decode loop. A speculator holds settings only; all per-request state lives in sessions,
so one speculator can serve many calls (its ``last_stats`` describe the latest generate call).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .config import SpeculatorConfig
from .index import NgramIndex, warm_up


@dataclass(frozen=True)
class Draft:
    """Tokens proposed for one verification pass.

    ``tokens``: 1-D int32 array of k proposed tokens (k may be 0: take a plain step).
    ``parents``: None for a plain chain (token i follows token i-1). Reserved for token trees,
    where ``parents[i]`` is the index of the token that token i follows (-1: the last emitted).
    ``match_len``/``source_start``: the suffix match that produced the draft and where in the
    token stream the copied continuation starts (-1 when there was none).
    """

    tokens: np.ndarray
    parents: np.ndarray | None = None
    match_len: int = 0
    source_start: int = -1

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


_NO_TOKENS = np.zeros(0, dtype=np.int32)
_NO_TOKENS.flags.writeable = False


class SpeculationSession:
    """Drafting state of one request: the token stream (prompt + emitted tokens) and its index."""

    def __init__(self, config: SpeculatorConfig, prompt_ids, capacity: int = 0):
        prompt = _as_token_array(prompt_ids)
        self.config = config
        self.index = NgramIndex(
            config.min_n,
            config.max_n,
            capacity=max(capacity, prompt.shape[0] + 256),
            prefer_recent=config.match == "recent",
        )
        self.index.append(prompt)

    @property
    def tokens(self) -> np.ndarray:
        """Read-only view of the stream so far (prompt followed by every extended token)."""
        view = self.index.tokens[: self.index.length]
        view.flags.writeable = False
        return view

    def propose(self, max_tokens: int | None = None) -> Draft:
        """Draft up to ``max_tokens`` (default: the config's limit) tokens to verify next."""
        match_len, start = self.index.longest_match()
        if match_len == 0:
            return Draft(_NO_TOKENS)
        limit = self.config.draft_limit(match_len)
        if max_tokens is not None:
            limit = min(limit, max_tokens)
        if limit <= 0:
            return Draft(_NO_TOKENS, match_len=match_len, source_start=start)
        stop = min(start + limit, self.index.length)
        return Draft(self.index.tokens[start:stop].copy(), match_len=match_len, source_start=start)

    def extend(self, accepted_tokens) -> None:
        """Append tokens the target emitted (accepted draft tokens plus its own next token)."""
        self.index.append(_as_token_array(accepted_tokens))


class NgramSpeculator:
    """Prompt-lookup drafter: proposes continuations copied from earlier in the same text.

    ``NgramSpeculator()`` uses the defaults of :class:`SpeculatorConfig`; pass a config, or its
    fields as keyword arguments (``NgramSpeculator(max_n=3)``). Construction compiles (or loads
    from Numba's on-disk cache) and warms the index kernels, so no request pays the JIT.
    After each ``generate(..., ngram_speculator=spec)`` call, ``spec.last_stats`` holds that
    call's :class:`~ngramspec.metrics.DecodeStats`.
    """

    def __init__(self, config: SpeculatorConfig | None = None, **settings):
        if config is None:
            config = SpeculatorConfig(**settings)
        elif not isinstance(config, SpeculatorConfig):
            raise TypeError(f"config must be a SpeculatorConfig, got {type(config).__name__}.")
        elif settings:
            config = dataclasses.replace(config, **settings)
        self.config = config
        self.last_stats = None
        warm_up()

    def start(self, prompt_ids, capacity: int = 0) -> SpeculationSession:
        """Begin a request: index ``prompt_ids`` (1-D ints). ``capacity`` pre-sizes the index
        for the expected total length (prompt + new tokens); it grows on demand anyway."""
        return SpeculationSession(self.config, prompt_ids, capacity)

    def __repr__(self) -> str:
        return f"NgramSpeculator({self.config})"


def _as_token_array(ids) -> np.ndarray:
    if hasattr(ids, "detach"):  # torch tensor, possibly on an accelerator
        ids = ids.detach().to("cpu").numpy()
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D sequence of token ids, got shape {array.shape}.")
    if array.size and (array.dtype.kind not in "iu"):
        raise TypeError(f"token ids must be integers, got dtype {array.dtype}.")
    return np.ascontiguousarray(array, dtype=np.int32)
