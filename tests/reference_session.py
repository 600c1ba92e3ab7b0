"""The pure-Python drafting session (test-only): the oracle the one drafting engine is pinned to.

:class:`ReferenceSession` does, in plain Python over an :class:`~ngramspec.draft.index.NgramIndex`,
what one slot of :class:`~ngramspec.draft.sessions.SessionTable` does in compiled code: start ->
propose/extend -> finish, with the copy cursor, the index, fuzzy re-alignment (rapidfuzz's
Levenshtein), the shared history, learned edits, token trees and payoff sizing.
``tests/test_sessions.py`` drives both through the same steps with Hypothesis and asserts equal
drafts, trees, acceptance estimates and cursor state; ``eval/target.py`` prototypes its
target-aware leads over it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rapidfuzz.distance import Levenshtein

from ngramspec.draft.acceptance import (
    CONTESTED,
    HISTORY,
    OWN,
    fade,
    learn,
    match_length,
    new_evidence,
    position_acceptance,
)
from ngramspec.draft.config import SpeculatorConfig
from ngramspec.draft.history import SEPARATOR
from ngramspec.draft.index import NgramIndex
from ngramspec.draft.proposal import Draft, as_token_array
from ngramspec.draft.sizing import draft_lengths
from ngramspec.draft.tuning import fixed_cost_model
from ngramspec.draft.walk import accepted_length


@dataclass(frozen=True)
class Candidate:
    """One possible continuation: ``source[start:]``."""

    start: int
    match_len: int
    source: np.ndarray  # the stream itself, or the shared history's tokens
    own: bool = True  # drawn from this request's stream (copies may run into the suffix)
    contested: bool = False  # an index match whose earliest and latest occurrences continue differently


_NO_TOKENS = np.zeros(0, dtype=np.int32)
_NO_TOKENS.flags.writeable = False


class ReferenceSession:
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
        prompt = as_token_array(prompt_ids)
        self.config = config
        self._tuning = config.draft_tuning
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
        # bucket, and the speculator's pool of the same (ngramspec.draft.acceptance).
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
        # The loss bound (ngramspec.draft.sizing.LossBudget): credit in plain steps, and the
        # (cost table, tokens drafted) of the step awaiting its verdict.
        self._credit = config.draft_tuning.first_risk + (config.max_loss or 0.0)
        self._unsettled = None

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
        if self.config.payoff_sizing and self.config.max_loss is not None:  # what it can afford to lose
            c = self.config
            costs = self._cost_model.table(self.index.length, max(c.max_tree_tokens, c.max_draft_tokens) + 1)
            affordable = [k for k in range(len(costs) - 1) if costs[k + 1] / costs[1] - 1.0 <= self._credit]
            limit = min(limit, max(affordable, default=0))
            self._unsettled = (costs, 0)
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
        position_acceptance(self._evidence, self._pool, self.config.acceptance_prior, source, match, acceptance,
                            self._tuning.request_weight, self._tuning.pool_prior_weight,
                            self._tuning.calibration_weight)
        if sized and self.config.payoff_sizing:
            limit = self._best_length(source, match, acceptance)
        if limit <= 0:  # a match, but drafting would not pay: a plain step ("declined")
            return Draft(_NO_TOKENS, match_len=first.match_len, source_start=first.start)
        tokens, acceptance = tokens[:limit], acceptance[:limit]
        parents = None
        if len(candidates) > 1:
            tokens, parents = self._tree(tokens, candidates[1:], limit)
        branch_starts = tuple(c.start for c in candidates if c.own)
        self._pending = (tokens[: len(acceptance)], source, match, branch_starts, edited)  # the chain
        if self._unsettled is not None:
            self._unsettled = (self._unsettled[0], len(tokens))
        return Draft(tokens, parents, match_len=first.match_len, source_start=first.start, acceptance=acceptance)

    def _candidates(self, wanted: int) -> list[Candidate]:
        """Up to ``wanted`` distinct continuations, best first (order: class docstring). With
        one wanted (a chain), the search stops at the first source that applies."""
        stream, length = self.index.tokens, self.index.length
        found: list[Candidate] = []
        if self.config.copy_cursor and 0 <= self._cursor < length:
            found.append(Candidate(self._cursor, self.config.max_n, stream))
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
        if self.config.fuzzy_resync and not found and longest < self._tuning.fuzzy_below_n:
            start = self._realign()
            if start >= 0:
                found.append(Candidate(start, 0, stream))
        for n, earliest, latest in matches:
            contested = bool(stream[earliest] != stream[latest])
            found.append(Candidate(latest if recent else earliest, n, stream, contested=contested))
            if earliest != latest and wanted > 1:
                found.append(Candidate(earliest if recent else latest, n, stream, contested=contested))
        if self._history is not None and longest < self.config.max_n:
            # Earlier outputs win where they match a longer context than this request's own
            # text does (a longer match predicts better: on dialogue summaries the shared
            # phrasing of earlier answers); otherwise they are one more branch.
            n, start = self._history.find(stream[max(0, length - self.config.max_n) : length])
            if n > longest:
                found.insert(following, Candidate(start, n, self._history.tokens, own=False))
            elif n:
                found.append(Candidate(start, n, self._history.tokens, own=False))
        unique, seen = [], set()
        for c in found:
            if (c.own, c.start) not in seen:
                seen.add((c.own, c.start))
                unique.append(c)
                if len(unique) == wanted:
                    break
        return unique

    def _continuation(self, c: Candidate, limit: int) -> tuple[np.ndarray, tuple | None]:
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
        if lost_at < 0 or lost_at == self._edit_break or not 0 < old_length - lost_at <= self._tuning.edit_span:
            return
        if not 0 <= source - lost_source <= self._tuning.edit_span or source > self.prompt_length:
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
            if len(self._edits) > self._tuning.max_edits:  # the oldest goes
                self._edits.pop(next(iter(self._edits)))

    def _tree(self, chain: np.ndarray, others: list[Candidate], limit: int):
        """Merge other candidates' continuations into a trie rooted at the last token.
        Extra branches only take positions that cost at most ``tree_cost_slack`` more than
        verifying the chain alone (on a GPU, many; on a small CPU, a few or none)."""
        budget = len(chain)
        cost = self._cost_table(max(self.config.max_tree_tokens, len(chain)) + 1)  # the sizing's own costs
        ceiling = cost[len(chain) + 1] * (1 + self._tuning.tree_cost_slack)
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
                children[(parent, t)] = len(tokens) - 1
                parent = len(tokens) - 1
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
        if lost_at < 0 or since > self._tuning.fuzzy_window or lost_source <= 0:
            return -1
        stream = self.index.tokens
        last = stream[length - 1]
        width = min(self._tuning.fuzzy_context, length)
        emitted = stream[length - width : length].tolist()
        expected = lost_source + since  # where a same-length substitution would resume
        best, best_key = -1, None
        for c in range(max(1, lost_source - 2), min(expected + self._tuning.fuzzy_ahead, lost_at)):
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
        :func:`ngramspec.draft.sizing.draft_lengths`)."""
        limit = acceptance.shape[0]
        costs = self._cost_table(self.config.max_draft_tokens + 1)
        lengths, best = draft_lengths(acceptance[None, :], np.array([limit], dtype=np.int64),
                                      np.ascontiguousarray(costs[1 : limit + 2], dtype=np.float64), False)
        best_k = int(lengths[0])
        if best_k == 0:  # not drafting: let old evidence fade so such drafts are retried
            fade(self._evidence, source, match, self.config.acceptance_memory)
        elif best < self._tuning.explore_below and self._cost_model.needs_baseline(self.index.length):
            return 0  # a plain step times the one-token forward here, so costs become measured
        return best_k

    def extend(self, accepted_tokens, verified: int | None = None) -> None:
        """Append tokens the target emitted (accepted draft tokens plus its own next token).
        ``verified``: how many tokens of the last (chain) draft were actually verified, when
        the loop cut the draft short (default: all of them)."""
        tokens = as_token_array(accepted_tokens)
        if self._unsettled is not None:
            costs, drafted = self._unsettled
            q = 1 + (drafted if verified is None else min(verified, drafted))
            self._credit += self.config.max_loss + len(tokens) - costs[q] / costs[1]
            self._unsettled = None
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
            learn(self._evidence, self._pool, source, match, kept, len(draft), self._tuning.pool_window)
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
