"""One request's drafting, :class:`SpeculationSession` (start -> propose/extend -> finish): one
slot of the drafting engine (:mod:`ngramspec.draft.sessions`), with the speculator's cost model
sizing its drafts."""

from __future__ import annotations

import numpy as np

from .candidates import found_rows
from .config import SpeculatorConfig
from .index import MAX_POSITIONS
from .proposal import Draft, as_token_array
from .sessions import (
    ACTIVE,
    CURSOR,
    LENGTH,
    LOST_AT,
    LOST_SOURCE,
    PENDING,
    VERIFIED,
    SessionTable,
    extend_slot,
    propose_slot,
    slot_index,
)
from .sizing import LossBudget
from .tuning import fixed_cost_model

_NO_TOKENS = np.zeros(0, dtype=np.int32)
_NO_TOKENS.flags.writeable = False


class SpeculationSession:
    """Drafting state of one request: its token stream (prompt + emitted tokens), index, copy
    cursor, acceptance evidence and learned edits, in a one-slot
    :class:`~ngramspec.draft.sessions.SessionTable` (where drafts come from: that module's doc).
    ``history``, ``pool`` and ``cost_model`` are the speculator's, shared by its sessions."""

    def __init__(self, config: SpeculatorConfig, prompt_ids, capacity: int = 0, history=None, cost_model=None,
                 pool=None):
        prompt = as_token_array(prompt_ids)
        self.config = config
        self._table = SessionTable(config, history, slots=1, pool=pool)
        self._slot = self._table.new(prompt.shape[0], capacity)
        self._arrays = slot_index(self._table.indexes, self._slot)  # its (stream, table), as the kernels take them
        self.prompt_length = int(prompt.shape[0])
        # Costs at this request's context: the speculator's model (as measured so far), else the
        # fixed curve of this config (verify_cost, or the CPU one at 400 tokens of context).
        self._cost_model = fixed_cost_model(config) if cost_model is None else cost_model
        width = max(config.max_draft_tokens, config.max_tree_tokens) + config.draft_tuning.edit_span
        self._out, self._branch, self._scratch = (np.zeros(width, dtype=np.int32) for _ in range(3))
        self._parents = np.zeros(width, dtype=np.int32)
        self._estimates = np.zeros(width)
        self._found = np.empty((found_rows(config.min_n, config.max_n), 4), dtype=np.int64)  # propose_slot's work
        # The loss bound (sizing.LossBudget): with payoff sizing, drafts are cut to what this
        # request can afford to lose; each step is settled against the cost table it was cut by.
        self._budget = LossBudget(config.max_loss, config.draft_tuning.first_risk) \
            if config.payoff_sizing and config.max_loss is not None else None
        self._step_costs, self._proposed = None, 0
        self._extend(prompt)

    @property
    def length(self) -> int:
        """Tokens in the stream so far."""
        return int(self._table.state[self._slot, LENGTH])

    @property
    def tokens(self) -> np.ndarray:
        """Read-only view of the stream so far (prompt followed by every extended token)."""
        view = self._table.tokens(self._slot)
        view.flags.writeable = False
        return view

    def propose(self, max_tokens: int | None = None, sized: bool = True, tree: bool = True) -> Draft:
        """Draft up to ``max_tokens`` (default: the config's limit) tokens to verify next.
        ``sized=False`` skips payoff sizing (a batch loop sizes one length for all rows with
        :func:`~ngramspec.draft.tuning.batch_draft_length` and reports what it verified to
        :meth:`extend`). ``tree=False``: a plain chain even when ``tree_branches > 1`` (for loops
        or caches that cannot verify trees)."""
        c = self.config
        limit = c.max_draft_tokens if max_tokens is None else min(c.max_draft_tokens, max_tokens)
        wanted = c.tree_branches if tree else 1
        sized = sized and c.payoff_sizing
        length = self.length
        costs = self._cost_model.table(length, c.max_draft_tokens + 1) if sized else _NO_COSTS
        wide = self._cost_model.table(length, max(c.max_tree_tokens, c.max_draft_tokens) + 1) \
            if wanted > 1 or self._budget is not None else _NO_COSTS  # q up to any tree's tokens + 1
        tree_costs = wide if wanted > 1 else _NO_COSTS
        if self._budget is not None:
            limit = min(limit, self._budget.cap(wide))
            self._step_costs = wide
        needs_baseline = sized and self._cost_model.needs_baseline(length)
        count, chain, is_tree, match_len, source_start = propose_slot(
            self._slot, max(limit, 0), wanted, sized, needs_baseline, costs, tree_costs, *self._arrays,
            *self._table.arrays()[1:],
            *self._table.history_arrays(), self._table.knob_values, self._out, self._parents, self._estimates,
            self._scratch, self._branch, self._found)
        self._proposed = int(count)
        if count == 0:
            return Draft(_NO_TOKENS, match_len=int(match_len), source_start=int(source_start))
        return Draft(self._out[:count].copy(), self._parents[:count].copy() if is_tree else None,
                     match_len=int(match_len), source_start=int(source_start),
                     acceptance=self._estimates[:chain].copy())

    def extend(self, accepted_tokens, verified: int | None = None) -> None:
        """Append tokens the target emitted (accepted draft tokens plus its own next token).
        ``verified``: how many tokens of the last (chain) draft were actually verified, when
        the loop cut the draft short (default: all of them)."""
        state = self._table.state[self._slot]
        if verified and not state[PENDING]:
            raise ValueError("extend(verified=...) given, but no draft is pending.")
        state[VERIFIED], state[ACTIVE] = (-1 if verified is None else verified), 1
        tokens = as_token_array(accepted_tokens)
        if self._budget is not None and self._step_costs is not None:
            drafted = self._proposed if verified is None else min(verified, self._proposed)
            self._budget.settle(tokens.shape[0], 1 + drafted, self._step_costs)
            self._step_costs, self._proposed = None, 0
        self._extend(tokens)

    def _extend(self, tokens: np.ndarray) -> None:
        if self.length + tokens.shape[0] > MAX_POSITIONS:
            raise ValueError(f"an n-gram index holds at most {MAX_POSITIONS:,} tokens")
        # The slot's stream and table (new arrays where they grew).
        self._arrays = extend_slot(self._slot, tokens, *self._arrays, *self._table.arrays(), self._table.knob_values)

    @property
    def cursor(self) -> int:
        """Stream position of the token expected next while copying, or -1."""
        return int(self._table.state[self._slot, CURSOR])

    @property
    def lost(self) -> tuple[int, int]:
        """(stream length, source position) where the last copy broke, or (-1, -1)."""
        state = self._table.state[self._slot]
        return int(state[LOST_AT]), int(state[LOST_SOURCE])

    @property
    def edits(self) -> dict[tuple, tuple]:
        """The learned edits, oldest first: replaced tokens -> what the output wrote instead."""
        t, sizes, stamps = (a[self._slot] for a in self._table.arrays()[6:9])
        return {tuple(t[e, 0, : sizes[e, 0]].tolist()): tuple(t[e, 1, : sizes[e, 1]].tolist())
                for e in np.argsort(stamps) if stamps[e]}

    def finish(self) -> None:
        """End of the request: its output joins the speculator's history (when enabled).
        Calling it again adds nothing."""
        self._table.finish(self._slot)


def warm_up() -> None:
    """Compile (or load from Numba's cache) the engine's kernels for one slot, so no request pays
    the JIT: a sized tree with edits, then an unsized chain. No history (an NgramIndex from
    Python: the speculator warms it where it has one; the engine's compiled copy of the lookup
    is data-independent) and not vLLM's :func:`~ngramspec.draft.sessions.draft_rows` (~5 s on a
    fresh install: its proposer warms that itself)."""
    config = SpeculatorConfig(min_n=1, max_n=3, tree_branches=2, edit_recurrence=True)
    session = SpeculationSession(config, np.array([1, 2, 3, 4, 1, 2, 5, 1], dtype=np.int32), capacity=64)
    for step in ([2], [9, 4, 1]):
        session.propose()
        session.extend(np.array(step, dtype=np.int32))
    session.propose(sized=False, tree=False)
    session.extend(np.array([2], dtype=np.int32), verified=0)
    session.finish()


_NO_COSTS = np.zeros(1)
