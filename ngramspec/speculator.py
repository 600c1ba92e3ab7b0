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
    ``acceptance``: the session's estimate that a drafted token is accepted given the one before
    it was (after matches of this length); batch loops size a shared draft length from it.
    """

    tokens: np.ndarray
    parents: np.ndarray | None = None
    match_len: int = 0
    source_start: int = -1
    acceptance: float = 0.0

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
        # Payoff sizing: per match length n, accepted draft tokens and rejections seen so far.
        # A drafted token is accepted with probability r = accepted / (accepted + rejected),
        # given the one before it was (a geometric run; fully accepted drafts are censored).
        self._costs = config.verify_costs()
        self._accepted = np.zeros(config.max_n + 1)
        self._rejected = np.zeros(config.max_n + 1)
        self._pending: tuple[np.ndarray, int] | None = None  # last draft and its match length

    @property
    def tokens(self) -> np.ndarray:
        """Read-only view of the stream so far (prompt followed by every extended token)."""
        view = self.index.tokens[: self.index.length]
        view.flags.writeable = False
        return view

    def propose(self, max_tokens: int | None = None, sized: bool = True) -> Draft:
        """Draft up to ``max_tokens`` (default: the config's limit) tokens to verify next.
        ``sized=False`` skips payoff sizing (a batch loop sizes one length for all rows with
        :func:`batch_draft_length` and reports what it verified to :meth:`extend`)."""
        self._pending = None
        match_len, start = self.index.longest_match()
        if match_len == 0:
            return Draft(_NO_TOKENS)
        limit = self.config.max_draft_tokens
        if max_tokens is not None:
            limit = min(limit, max_tokens)
        acceptance = self._acceptance(match_len)
        if sized and self.config.payoff_sizing and limit > 0:
            limit = self._best_length(match_len, acceptance, limit)
        if limit <= 0:
            return Draft(_NO_TOKENS, match_len=match_len, source_start=start, acceptance=acceptance)
        # The copied span may run into the suffix itself (start + limit > length): the text
        # is then periodic with period length - start, and the draft continues the period
        # (a run "a b a b a" drafts "b a b a ..."), which np.resize does by repetition.
        tokens = np.resize(self.index.tokens[start : self.index.length], limit).astype(np.int32, copy=False)
        self._pending = (tokens, match_len)
        return Draft(tokens, match_len=match_len, source_start=start, acceptance=acceptance)

    def _acceptance(self, match_len: int) -> float:
        """Posterior mean acceptance after matches of this length (prior weighs 2 drafts)."""
        weight = 2.0
        accepted = self._accepted[match_len] + weight * self.config.acceptance_prior
        return float(accepted / (accepted + self._rejected[match_len] + weight * (1 - self.config.acceptance_prior)))

    def _best_length(self, match_len: int, r: float, limit: int) -> int:
        """Draft length in [0, limit] maximising expected emitted tokens per unit verify cost:
        (1 + r + r^2 + ... + r^k) / cost(k + 1), where a plain step scores 1 / cost(1) = 1."""
        best_k, best, expected, p = 0, 1.0, 1.0, 1.0
        for k in range(1, limit + 1):
            p *= r
            expected += p
            value = expected / self._costs[k + 1]
            if value > best:
                best_k, best = k, value
        if best_k == 0:  # not drafting: let old evidence fade so this match length is retried
            self._accepted[match_len] *= self.config.acceptance_memory
            self._rejected[match_len] *= self.config.acceptance_memory
        return best_k

    def extend(self, accepted_tokens, verified: int | None = None) -> None:
        """Append tokens the target emitted (accepted draft tokens plus its own next token).
        ``verified``: how many tokens of the last draft were actually verified, when the loop
        cut the draft short (default: all of them)."""
        tokens = _as_token_array(accepted_tokens)
        if self._pending is not None:
            # Learn from the last draft: how many of its tokens the target kept.
            draft, match_len = self._pending
            if verified is not None:
                draft = draft[:verified]
                if verified == 0:  # not verified at all: let old evidence fade, as sizing does
                    self._accepted[match_len] *= self.config.acceptance_memory
                    self._rejected[match_len] *= self.config.acceptance_memory
            n = min(len(draft), len(tokens))
            mismatch = np.flatnonzero(draft[:n] != tokens[:n])
            kept = int(mismatch[0]) if mismatch.size else n
            self._accepted[match_len] += kept
            self._rejected[match_len] += kept < len(draft)
            self._pending = None
        elif verified:
            raise ValueError("extend(verified=...) given, but no draft is pending.")
        self.index.append(tokens)


def batch_draft_length(drafts: list[Draft], cost=None) -> int:
    """One draft length K for a batch verified in one forward of shape (rows, K + 1).

    Every row pays for K + 1 positions whatever its own draft, so K is chosen for the batch:
    maximise expected emitted tokens per unit cost, sum_b E_b(min(K, k_b)) / cost(rows * (K+1)),
    against plain decoding's rows / cost(rows), where E_b(k) = 1 + r_b + ... + r_b^k (r_b the
    row's acceptance estimate) and ``cost(n)`` is the relative cost of one forward over n
    tokens. Returns 0 (a plain batched step) when no K pays: on a device that is already busy
    with a large batch, each extra position costs nearly a token's full price, so speculation
    switches itself off and comes back when rows show long, reliable matches. ``cost=None``
    (payoff sizing off): the longest draft of any row.
    """
    rows = len(drafts)
    longest = max((len(d) for d in drafts), default=0)
    if rows == 0 or longest == 0 or cost is None:  # cost None: no sizing, draft all there is
        return longest
    expected = np.ones(rows)  # E_b(min(K, k_b)) for the current K
    power = np.ones(rows)
    acceptance = np.array([d.acceptance for d in drafts])
    lengths = np.array([len(d) for d in drafts])
    best_k, best = 0, rows / cost(rows)
    for k in range(1, longest + 1):
        power = np.where(lengths >= k, power * acceptance, 0.0)
        expected += power
        value = expected.sum() / cost(rows * (k + 1))
        if value > best:
            best_k, best = k, value
    return best_k


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
