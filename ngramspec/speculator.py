"""The n-gram speculator and its per-request session (start -> propose/extend -> done).

    spec = NgramSpeculator(max_n=4)
    session = spec.start(prompt_ids)       # index the prompt
    draft = session.propose()              # Draft: tokens copied from after an earlier match
    ...verify draft with the target model...
    session.extend(emitted_tokens)         # accepted draft tokens + the target's own token

``generate(ngram_speculator=spec)`` drives exactly this API; so do the trace replayer and any
other decode loop. A speculator holds settings, the acceptance evidence pooled over its
requests (so a request starts from what earlier ones showed, :mod:`ngramspec.acceptance`) and
its cost model; per-request state lives in sessions, so one speculator can serve many calls
(its ``last_stats`` describe the latest generate call).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from rapidfuzz.distance import Levenshtein

from .acceptance import CONTESTED, HISTORY, OWN, fade, learn, match_length, new_evidence, position_acceptance
from .acceptance import warm_up as warm_up_acceptance
from .config import SpeculatorConfig
from .costmodel import OnlineCost
from .costs import DEFAULT_CPU_CURVE, CostPrior
from .history import SEPARATOR, History
from .index import NgramIndex, warm_up
from .sizing import draft_lengths
from .sizing import warm_up as warm_up_sizing
from .verify import accepted_length


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
    (:mod:`ngramspec.acceptance`); batch loops size a shared draft length from it. Empty when
    nothing was drafted; positions without an estimate count as 0.
    """

    tokens: np.ndarray
    parents: np.ndarray | None = None
    match_len: int = 0
    source_start: int = -1
    acceptance: np.ndarray = dataclasses.field(default_factory=lambda: _NO_ESTIMATES)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


# Fuzzy re-alignment: tried for up to FUZZY_WINDOW tokens after a copy broke, comparing the
# last FUZZY_CONTEXT tokens, searching up to FUZZY_AHEAD tokens past the expected place;
# it outranks index matches shorter than FUZZY_BELOW_N tokens.
FUZZY_WINDOW = 12
FUZZY_CONTEXT = 6
FUZZY_AHEAD = 16
FUZZY_BELOW_N = 3
# Edit recurrence: an edit spans at most EDIT_SPAN tokens; a session remembers MAX_EDITS.
EDIT_SPAN = 8
MAX_EDITS = 8
# Tree branches may add positions while the forward costs at most this much more than the chain.
TREE_COST_SLACK = 0.1
# With a cost model that has not yet timed a one-token forward at this context, a draft whose
# expected gain over a plain step is below this factor gives way to a plain step: the gain is
# uncertain (the relative costs are the prior's), and the step measures them. Surer drafts go on.
EXPLORE_BELOW = 2.0

_NO_TOKENS = np.zeros(0, dtype=np.int32)
_NO_TOKENS.flags.writeable = False
_NO_ESTIMATES = np.zeros(0)
_NO_ESTIMATES.flags.writeable = False


@dataclass(frozen=True)
class _Candidate:
    """One possible continuation: ``source[start:]``."""

    start: int
    match_len: int
    source: np.ndarray  # the stream itself, or the shared history's tokens
    own: bool = True  # drawn from this request's stream (copies may run into the suffix)
    contested: bool = False  # an index match whose earliest and latest occurrences continue differently


class SpeculationSession:
    """Drafting state of one request: the token stream (prompt + emitted tokens) and its index.

    Where a draft comes from, in order of preference (each behind a config switch):

    1. the **copy cursor**: while the output keeps copying one earlier span, the next tokens of
       that span (the cursor follows every emitted token and breaks on the first that differs);
    2. the **index**: the longest earlier occurrence of the text's suffix (n in [min_n, max_n]);
    3. **fuzzy re-alignment**: right after the copy broke (the model changed a word), the place
       in the copied span that best aligns with what was emitted since (Levenshtein over tokens,
       by rapidfuzz), so copying resumes before min_n exact tokens match again;
    4. the speculator's **history** of earlier outputs, when its match is longer than the
       index's (none counts as 0).

    With ``edit_recurrence``, a copy from the prompt applies the edits this request has made to
    it so far (what the output wrote in place of a prompt span before copying resumed).

    With ``tree_branches > 1`` the other candidates join the first as branches of a token tree.
    """

    def __init__(self, config: SpeculatorConfig, prompt_ids, capacity: int = 0, history=None, cost_model=None,
                 pool=None):
        prompt = _as_token_array(prompt_ids)
        self.config = config
        self.index = NgramIndex(
            config.min_n,
            config.max_n,
            capacity=max(capacity, prompt.shape[0] + 256),
            prefer_recent=config.match == "recent",
        )
        self.index.append(prompt)
        self.prompt_length = int(prompt.shape[0])
        self._history = history
        # Payoff sizing: this request's accepted and rejected draft positions per match-length
        # bucket, and the speculator's pool of the same (ngramspec.acceptance).
        # Costs at this request's context: the speculator's model (as measured so far), else the
        # fixed curve of this config (verify_cost, or the CPU one at 400 tokens of context).
        self._cost_model = fixed_cost_model(config) if cost_model is None else cost_model
        self._evidence = new_evidence()
        self._pool = new_evidence() if pool is None else pool
        # (chain tokens, their source and the match they continue, own-stream branch starts, edit applied)
        self._pending = None
        self._cursor = -1  # stream position of the token expected next while copying, or -1
        self._lost = (-1, -1)  # (stream length, source position) where the last copy broke
        self._edits: dict[tuple, tuple] = {}  # replaced prompt tokens -> what the output wrote instead
        self._edit_break = -1  # the break (stream length) an edit was last learned from
        self._finished = False

    @property
    def tokens(self) -> np.ndarray:
        """Read-only view of the stream so far (prompt followed by every extended token)."""
        view = self.index.tokens[: self.index.length]
        view.flags.writeable = False
        return view

    def propose(self, max_tokens: int | None = None, sized: bool = True, tree: bool = True) -> Draft:
        """Draft up to ``max_tokens`` (default: the config's limit) tokens to verify next.
        ``sized=False`` skips payoff sizing (a batch loop sizes one length for all rows with
        :func:`batch_draft_length` and reports what it verified to :meth:`extend`).
        ``tree=False``: a plain chain even when ``tree_branches > 1`` (for loops or caches
        that cannot verify trees)."""
        self._pending = None
        limit = self.config.max_draft_tokens
        if max_tokens is not None:
            limit = min(limit, max_tokens)
        if limit <= 0:  # no room left for a draft (the last token): nothing to decide
            return Draft(_NO_TOKENS)
        candidates = self._candidates(self.config.tree_branches if tree else 1)
        if not candidates:
            return Draft(_NO_TOKENS)
        first = candidates[0]
        tokens, edited = self._continuation(first, limit)
        match = match_length(self.index.tokens, self.index.length, first.start) if first.own else first.match_len
        source = HISTORY if not first.own else CONTESTED if first.contested else OWN
        acceptance = np.zeros(len(tokens))
        position_acceptance(self._evidence, self._pool, self.config.acceptance_prior, source, match, acceptance)
        if sized and self.config.payoff_sizing:
            limit = self._best_length(source, match, acceptance)
        if limit <= 0:  # a match, but drafting would not pay: a plain step ("declined")
            return Draft(_NO_TOKENS, match_len=first.match_len, source_start=first.start)
        tokens, acceptance = tokens[:limit], acceptance[:limit]
        parents = None
        if len(candidates) > 1:
            tokens, parents = self._tree(tokens, candidates[1:], limit)
        branch_starts = tuple(c.start for c in candidates if c.own)
        self._pending = (tokens[: limit], source, match, branch_starts, edited)
        return Draft(tokens, parents, match_len=first.match_len, source_start=first.start, acceptance=acceptance)

    def _candidates(self, wanted: int) -> list[_Candidate]:
        """Up to ``wanted`` distinct continuations, best first (order: class docstring). With
        one wanted (a chain), the search stops at the first source that applies."""
        stream, length = self.index.tokens, self.index.length
        found: list[_Candidate] = []
        if self.config.copy_cursor and 0 <= self._cursor < length:
            found.append(_Candidate(self._cursor, self.config.max_n, stream))
            if wanted == 1:
                return found
        following = len(found)  # the copy cursor stays first
        recent = self.config.match == "recent"
        if wanted == 1:
            n, start, other = self.index.longest_match_occurrences()
            matches = [(n, other, start) if recent else (n, start, other)] if n else []
        else:
            matches = self.index.matches().tolist()
        longest = matches[0][0] if matches else 0
        if self.config.fuzzy_resync and not found and longest < FUZZY_BELOW_N:
            start = self._realign()
            if start >= 0:
                found.append(_Candidate(start, 0, stream))
        for n, earliest, latest in matches:
            contested = bool(stream[earliest] != stream[latest])
            found.append(_Candidate(latest if recent else earliest, n, stream, contested=contested))
            if earliest != latest and wanted > 1:
                found.append(_Candidate(earliest if recent else latest, n, stream, contested=contested))
        if self._history is not None and longest < self.config.max_n:
            # Earlier outputs win where they match a longer context than this request's own
            # text does (a longer match predicts better: on dialogue summaries the shared
            # phrasing of earlier answers); otherwise they are one more branch.
            n, start = self._history.find(stream[max(0, length - self.config.max_n) : length])
            if n > longest:
                found.insert(following, _Candidate(start, n, self._history.tokens, own=False))
            elif n:
                found.append(_Candidate(start, n, self._history.tokens, own=False))
        unique, seen = [], set()
        for c in found:
            if (c.own, c.start) not in seen:
                seen.add((c.own, c.start))
                unique.append(c)
                if len(unique) == wanted:
                    break
        return unique

    def _continuation(self, c: _Candidate, limit: int) -> tuple[np.ndarray, tuple | None]:
        """Up to ``limit`` tokens copied from ``c``, and the first learned edit applied to them
        as (what it replaces, its draft position), or None."""
        if c.own:
            # The copied span may run into the suffix itself (start + limit > length): the text
            # is then periodic with period length - start, and the draft continues the period
            # (a run "a b a b a" drafts "b a b a ..."), which np.resize does by repetition.
            if c.start + limit <= self.index.length:  # a copy, not a view: drafts must not alias the stream
                copied = self.index.tokens[c.start : c.start + limit].copy()
            else:
                copied = np.resize(self.index.tokens[c.start : self.index.length], limit).astype(np.int32, copy=False)
            if self._edits and c.start < self.prompt_length:
                return self._apply_edits(copied, limit)
            return copied, None
        copied = np.ascontiguousarray(c.source[c.start : c.start + limit], dtype=np.int32)
        end = np.flatnonzero(copied == SEPARATOR)  # a history copy stops where its output ended
        return (copied[: end[0]] if end.size else copied), None

    def _apply_edits(self, copied: np.ndarray, limit: int) -> tuple[np.ndarray, tuple | None]:
        """Edits recur: where copied prompt text holds a span the output has replaced before (a
        rename, a spelling fix), draft the replacement instead. Returns the draft and the first
        edit applied as (replaced span, draft position), or None."""
        tokens, out, j, first = copied.tolist(), [], 0, None
        while j < len(tokens) and len(out) < limit:
            for before, after in self._edits.items():
                if tuple(tokens[j : j + len(before)]) == before:
                    if first is None:
                        first = (before, len(out))
                    out.extend(after)
                    j += len(before)
                    break
            else:
                out.append(tokens[j])
                j += 1
        if first is None:
            return copied, None
        return np.array(out[:limit], dtype=np.int32), first

    def _learn_edit(self, old_length: int, source: int) -> None:
        """The copy resumed at prompt position ``source`` (the text up to ``old_length``
        emitted) after it broke: what the output wrote in place of the prompt's tokens is an
        edit that may recur."""
        lost_at, lost_source = self._lost
        if lost_at < 0 or lost_at == self._edit_break or not 0 < old_length - lost_at <= EDIT_SPAN:
            return
        if not 0 <= source - lost_source <= EDIT_SPAN or source > self.prompt_length:
            return
        stream = self.index.tokens
        before = stream[lost_source:source].tolist()
        after = stream[lost_at:old_length].tolist()
        while before and after and before[-1] == after[-1]:
            before.pop()
            after.pop()
        while before and after and before[0] == after[0]:
            before.pop(0)
            after.pop(0)
        if before and before != after:
            self._edit_break = lost_at
            self._edits.pop(tuple(before), None)  # re-learned: it becomes the newest
            self._edits[tuple(before)] = tuple(after)
            if len(self._edits) > MAX_EDITS:  # the oldest goes
                self._edits.pop(next(iter(self._edits)))

    def _tree(self, chain: np.ndarray, others: list[_Candidate], limit: int):
        """Merge other candidates' continuations into a trie rooted at the last token.
        Extra branches only take positions that cost at most ``tree_cost_slack`` more than
        verifying the chain alone (on a GPU, many; on a small CPU, a few or none)."""
        budget = len(chain)
        cost = self._cost_table(max(self.config.max_tree_tokens, len(chain)) + 1)  # the sizing's own costs
        ceiling = cost[len(chain) + 1] * (1 + TREE_COST_SLACK)
        while budget < self.config.max_tree_tokens and cost[budget + 2] <= ceiling:
            budget += 1
        if budget == len(chain):
            return chain, None
        tokens, parents = list(chain), list(range(-1, len(chain) - 1))
        children = {(p, int(t)): i for i, (p, t) in enumerate(zip(parents, tokens))}
        for c in others:
            parent = -1
            for t in self._continuation(c, limit)[0].tolist():
                if (parent, t) in children:
                    parent = children[(parent, t)]
                    continue
                if len(tokens) >= budget:
                    break
                tokens.append(t)
                parents.append(parent)
                parent = children[(parent, t)] = len(tokens) - 1
        if len(tokens) == len(chain):
            return chain, None
        return np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32)

    def _realign(self) -> int:
        """Where to resume copying after the copy broke ``since`` tokens ago (the model changed
        a word): among the places c in the copied text, from just before the break to a little
        past it, that follow an occurrence of the last emitted token, the one whose preceding
        tokens best align with the last tokens emitted (normalised token Levenshtein
        similarity, rapidfuzz); ties go to the place a same-length edit would reach. An
        insertion resumes at the break, a substitution or deletion past it. -1: none."""
        lost_at, lost_source = self._lost
        length = self.index.length
        since = length - lost_at
        if lost_at < 0 or since > FUZZY_WINDOW or lost_source <= 0:
            return -1
        stream = self.index.tokens
        last = stream[length - 1]
        width = min(FUZZY_CONTEXT, length)
        emitted = stream[length - width : length].tolist()
        expected = lost_source + since  # where a same-length substitution would resume
        best, best_key = -1, None
        for c in range(max(1, lost_source - 2), min(expected + FUZZY_AHEAD, lost_at)):
            if stream[c - 1] != last:
                continue
            w = min(width, c)
            key = (-Levenshtein.normalized_similarity(emitted[-w:], stream[c - w : c].tolist()), abs(c - expected))
            if best_key is None or key < best_key:
                best, best_key = c, key
        return best

    def _cost_table(self, max_tokens: int) -> np.ndarray:
        """costs[q], q = 0..max_tokens: a forward over q tokens at this request's context, by the
        cost model (as measured so far, where it learns)."""
        return self._cost_model.table(self.index.length, max_tokens)

    def _best_length(self, source: int, match: int, acceptance: np.ndarray) -> int:
        """Draft length in [0, len(acceptance)] maximising expected emitted tokens per unit
        verify cost, (1 + g_1 + ... + g_k) / cost(k + 1) with g_j the product of the first j
        estimates, where a plain step scores 1 / cost(1) = 1 (the sizing rule for one row,
        :func:`ngramspec.sizing.draft_lengths`)."""
        limit = acceptance.shape[0]
        costs = self._cost_table(self.config.max_draft_tokens + 1)
        lengths, best = draft_lengths(acceptance[None, :], np.array([limit], dtype=np.int64),
                                      np.ascontiguousarray(costs[1 : limit + 2], dtype=np.float64), False)
        best_k = int(lengths[0])
        if best_k == 0:  # not drafting: let old evidence fade so such drafts are retried
            fade(self._evidence, source, match, self.config.acceptance_memory)
        elif best < EXPLORE_BELOW and self._cost_model.needs_baseline(self.index.length):
            return 0  # a plain step times the one-token forward here, so costs become measured
        return best_k

    def extend(self, accepted_tokens, verified: int | None = None) -> None:
        """Append tokens the target emitted (accepted draft tokens plus its own next token).
        ``verified``: how many tokens of the last (chain) draft were actually verified, when
        the loop cut the draft short (default: all of them)."""
        tokens = _as_token_array(accepted_tokens)
        branch_starts: tuple = ()
        if self._pending is not None:
            # Learn from the last draft: how many tokens of its first chain the target kept.
            draft, source, match, branch_starts, edited = self._pending
            if verified is not None:
                draft = draft[:verified]
                if verified == 0:  # not verified at all: let old evidence fade, as sizing does
                    fade(self._evidence, source, match, self.config.acceptance_memory)
            kept = accepted_length(draft, None, tokens)
            if edited is not None and kept == edited[1] < len(draft):
                self._edits.pop(edited[0], None)  # the target refused the edit here: forget it
            learn(self._evidence, self._pool, source, match, kept, len(draft))
            self._pending = None
        elif verified:
            raise ValueError("extend(verified=...) given, but no draft is pending.")
        old_length = self.index.length
        self.index.append(tokens)
        if self.config.edit_recurrence and branch_starts and tokens.size >= 2:
            source = branch_starts[0]  # where the chain was copied from
            if np.array_equal(self.index.tokens[source : source + 2], tokens[:2]):  # the copy resumed
                self._learn_edit(old_length, source)
        self._follow_copy(old_length, tokens, branch_starts)

    def _follow_copy(self, old_length: int, tokens: np.ndarray, branch_starts: tuple) -> None:
        """Move the copy cursor over the new tokens: it survives if some source it could be
        following (the cursor, or a drafted branch) predicted every one of them."""
        if not tokens.size:
            return
        stream = self.index.tokens
        sources = ((self._cursor,) if self._cursor >= 0 else ()) + branch_starts
        best_src, best_m = -1, -1
        for src in sources:
            m = 0
            while m < tokens.size and stream[src + m] == tokens[m]:
                m += 1
            if m == tokens.size:
                self._cursor = src + m
                return
            if m > best_m:
                best_src, best_m = src, m
        self._cursor = -1
        if best_src >= 0:  # the copy broke here: remember where, for re-alignment
            self._lost = (old_length + best_m, best_src + best_m)

    def finish(self) -> None:
        """End of the request: its output joins the speculator's history (when enabled).
        Calling it again adds nothing."""
        if self._history is not None and not self._finished and self.index.length > self.prompt_length:
            self._history.add(self.index.tokens[self.prompt_length : self.index.length])
        self._finished = True


def fixed_cost_model(config: SpeculatorConfig) -> OnlineCost:
    """The cost model of a fixed curve, which timings never move: ``verify_cost``, or where it
    is None the CPU curve at 400 tokens of context (a session started without a speculator)."""
    return OnlineCost(CostPrior.fixed(config.verify_cost or DEFAULT_CPU_CURVE.points), learn=False)


def batch_draft_length(drafts: list[Draft], cost=None, explore: bool = False) -> int:
    """One draft length K for a batch verified in one forward of shape (rows, K + 1): the
    sizing rule, padded (:func:`ngramspec.sizing.draft_lengths`), with ``cost(n)`` the cost of
    one forward over n tokens of these rows relative to their plain step. Every row pays for
    K + 1 positions whatever its own draft, so on a device already busy with a large batch no
    K pays (0: a plain batched step) until rows show long, reliable matches. ``explore``: a
    plain step's timing is missing, so a marginal K (under EXPLORE_BELOW expected tokens per
    row and unit cost) gives way to a plain step that measures it. ``cost=None`` (payoff
    sizing off): the longest draft of any row."""
    rows = len(drafts)
    limits = np.array([len(d) for d in drafts], dtype=np.int64)
    longest = int(limits.max(initial=0))
    if rows == 0 or longest == 0 or cost is None:  # cost None: no sizing, draft all there is
        return longest
    acceptance = np.zeros((rows, longest))  # (rows, K): positions without an estimate count as 0
    for b, d in enumerate(drafts):
        estimates = np.asarray(d.acceptance, dtype=np.float64)
        if estimates.ndim == 0:  # one rate for every position
            acceptance[b, : len(d)] = estimates
        else:
            estimates = estimates[: len(d)]
            acceptance[b, : estimates.shape[0]] = estimates
    step_costs = np.array([cost(rows * (k + 1)) for k in range(longest + 1)], dtype=np.float64)
    lengths, value = draft_lengths(acceptance, limits, step_costs, True)
    if explore and value < EXPLORE_BELOW * rows:
        return 0
    return int(lengths.max())


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
        self.last_stats = None  # DecodeStats of the latest generate() call (a batch: all rows)
        self.last_row_stats: list = []  # one DecodeStats per row of that call
        self.history = History(config) if config.history_tokens > 0 else None
        # One cost model per speculator (a model on a device), shared by its calls; with
        # verify_cost=None it starts from the CPU prior and learns from their forward timings.
        self.cost_model = OnlineCost() if config.verify_cost is None else fixed_cost_model(config)
        # Acceptance evidence pooled over this speculator's requests (ngramspec.acceptance).
        self.pool = new_evidence()
        warm_up()
        warm_up_sizing()
        warm_up_acceptance()

    @classmethod
    def for_model(cls, model, max_age_days: float = 30.0, **settings) -> NgramSpeculator:
        """A speculator whose draft sizing uses ``model``'s own verify-cost curve on its device,
        measured once (tens of seconds) and cached per model, device, dtype and torch version
        (see :mod:`ngramspec.costs`); ``settings`` as for the constructor."""
        from .costs import cached_cost_curve

        return cls(verify_cost=cached_cost_curve(model, max_age_days), **settings)

    def start(self, prompt_ids, capacity: int = 0) -> SpeculationSession:
        """Begin a request: index ``prompt_ids`` (1-D ints). ``capacity`` pre-sizes the index
        for the expected total length (prompt + new tokens); it grows on demand anyway.
        Call ``session.finish()`` at the end so the output joins the history (if enabled)."""
        return SpeculationSession(self.config, prompt_ids, capacity, history=self.history, cost_model=self.cost_model,
                                  pool=self.pool)

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
