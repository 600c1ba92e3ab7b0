"""ngramspec inside vLLM: a drafter for vLLM's ``custom_class`` plug-in point (vLLM >= 0.32).

    LLM(model, speculative_config={"method": "custom_class",
                                   "model": "ngramspec.vllm.Proposer",
                                   "num_speculative_tokens": 16})

    vllm serve MODEL --speculative-config \
        '{"method": "custom_class", "model": "ngramspec.vllm.Proposer", "num_speculative_tokens": 16}'

vLLM builds ``Proposer(vllm_config)``, calls ``load_model()`` (nothing to load) and then, after
every engine step, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``: row i of
the persistent batch holds ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` (prompt + every token
emitted so far, this step's included) and ``sampled_token_ids[i]`` the tokens it emitted this
step (empty while its prompt is still being prefilled). It returns one draft per row; lengths
may differ; ``[]`` is a plain step. vLLM verifies every draft in its next forward, exactly.

The proposer sees rows, not request ids, and rows move when requests finish, are preempted or
the batch is condensed. :class:`RowSessions` maps rows to ngramspec sessions (slots of one
:class:`~ngramspec.draft.sessions.SessionTable`) with O(1) spot checks per row (never by reading the
whole context), so a step costs O(new tokens). The usual step (the same rows as the last
one, each still holding its slot) is one compiled call, :func:`propose_rows`: every row's
checks, extend and draft, and the sizing of all drafts together; only steps where rows came,
went or moved match rows to slots in Python first.

Settings: ``num_speculative_tokens`` is the longest draft; every other
:class:`~ngramspec.SpeculatorConfig` field comes from the environment variable
``NGRAMSPEC_SETTINGS`` (``"max_n=8,history_tokens=0"``), read by every worker process (vLLM
validates ``speculative_config`` keys, so they cannot go there). Here ``history_tokens``
defaults to 100,000: requests draft from earlier requests' outputs too. Draft lengths are set
per request from its acceptance and the engine's step cost, for all rows of a step together
(:func:`ngramspec.draft.sizing.draft_lengths`, flattened). The step cost is learned where the engine
runs: the time from the end of one ``propose()`` to the start of the next is one engine step
over a known number of scheduled tokens and rows, and
:meth:`~ngramspec.cost.steps.EngineSteps.observe_step` fits how much dearer (or cheaper) extra
positions are than the prior (a :class:`~ngramspec.cost.curves.CostPrior`) says. The prior is this project's CPU
measurement, or ``verify_cost=...`` in the settings, or a file measured with ``python -m
eval.vllm_cost --out cost.json`` and named by ``NGRAMSPEC_VLLM_COST``; none is required.
"""


from __future__ import annotations

import json
import logging
import os
import time

import numpy as np

from ..cost.costmodel import OnlineCost
from ..cost.fit import line_scale
from ..draft import compiling
from ..draft.compiling import entry_point
from ..draft.sessions import row_buffers
from ..draft.speculator import NgramSpeculator
from .kernels import OFFSETS, ROWS, propose_rows
from .rows import HEAD, RowSessions
from .settings import STATS_EVERY, STATS_FILE_ENV, max_num_seqs, speculator_config, step_prior

logger = logging.getLogger(__name__)


def _every_row_sampled(sampled_token_ids) -> bool:
    """Whether every row emitted tokens. vLLM passes lists, true where not empty: one C-level
    pass, ~3x cheaper than asking each its length. Rows of another type (the first row's
    decides: arrays, tuples) are asked their length."""
    try:
        return all(sampled_token_ids) if type(sampled_token_ids[0]) is list else all(map(len, sampled_token_ids))
    except IndexError:  # no rows
        return True


class Proposer:
    """vLLM ``custom_class`` drafter backed by ngramspec sessions (see the module docstring)."""

    clock = staticmethod(time.perf_counter)  # tests put a fake clock here
    usual_step = True  # False: every step matches rows to slots in Python first (tests compare both)

    def __init__(self, vllm_config, settings: str | None = None):
        spec = vllm_config.speculative_config
        self.max_draft = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        config = speculator_config(self.max_draft, settings)
        device = getattr(getattr(vllm_config, "device_config", None), "device_type", "cpu")
        self.prior = step_prior(config, device)
        self.cost = OnlineCost(prior=self.prior, tuning=config.cost_tuning)
        self.speculator = NgramSpeculator(config)
        self.sessions = RowSessions(self.speculator, max_idle=max(64, 2 * max_num_seqs(vllm_config)))
        self._allocate(max(max_num_seqs(vllm_config), 1))
        self.steps = 0
        self.drafted_tokens = 0
        self._stats_path = os.environ.get(STATS_FILE_ENV, "")
        self.failures = 0  # steps that raised: drafting restarted, the engine kept going
        self._failed_in_a_row = 0
        self._paused = 0  # steps left to skip after repeated failures
        self._last_end: float | None = None  # when the previous propose() returned
        self.propose_seconds = 0.0  # time spent inside propose(), all steps together
        self._last_drafted = 0  # draft tokens it proposed, all rows together
        self._context = 0  # the last step's tokens per row, on average
        # propose_rows' settings beyond the drafting engine's knobs, packed (each argument of a
        # compiled call costs ~0.1 us to pass)
        self._settings = np.array([config.payoff_sizing, self.max_draft, self.max_model_len], dtype=np.int64)
        self._ones = np.ones(0, dtype=np.int64)  # every row sampled something (the usual step)
        compiling.wait()  # an engine step calls the kernels directly: they must be ready before the first
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile (or load from Numba's cache) every kernel a step calls, on a scratch row and
        scratch sessions, so that no engine step pays the JIT: a new row, then the same row."""
        saved = dict(vars(self))  # every attribute as it is: the scratch steps leave no trace
        pool = self.speculator.pool.copy()  # nor any evidence in the speculator's pool
        try:
            self.sessions, self.cost = RowSessions(self.speculator), OnlineCost(self.prior, tuning=self.cost.tuning)
            row = np.tile(np.arange(HEAD, dtype=np.int32), 4)[None, :]
            for end in (3 * HEAD, 3 * HEAD + 2):
                self._propose([[1]], np.array([end]), row)
            # What RowSessions.step does when a request leaves: its stream read (its output
            # joins the history) and, later, its slot freed.
            table = self.sessions.table
            table.tokens(0)
            table.release(0)
            line_scale(np.arange(8.0), np.arange(8.0), 8, 0.05)  # OnlineCost.step_scale
        finally:
            vars(self).clear()
            vars(self).update(saved)
            self.speculator.pool[...] = pool

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: drafts come from the requests' own text."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        """One draft per row (``[]``: a plain step). A drafting error never takes the engine
        down: it is logged, every session is dropped (rows rebuild theirs from their text) and
        this step drafts nothing; drafts only ever cost time, never correctness."""
        if self._paused:  # backing off after repeated failures: plain steps, no re-indexing
            self._paused -= 1
            self._last_end = None
            return [[] for _ in sampled_token_ids]
        try:
            drafts = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            self._failed_in_a_row = 0
            return drafts
        except Exception:
            self.failures += 1
            self._failed_in_a_row += 1
            # Each restart re-indexes every row's whole text: after the first failure in a row,
            # pause 2, 4, 8, ... (at most 1024) steps before the next try.
            self._paused = min(2 ** (self._failed_in_a_row - 1), 1024) if self._failed_in_a_row > 1 else 0
            logger.exception("ngramspec drafting failed (%d so far, %d in a row); its sessions restart%s",
                             self.failures, self._failed_in_a_row,
                             f" after {self._paused} plain steps" if self._paused else "")
            self.sessions = RowSessions(self.speculator, self.sessions.max_idle, self.sessions.max_idle_tokens)
            self._last_end = None
            return [[] for _ in sampled_token_ids]

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[list[int]]:
        started = self.clock()
        count = len(sampled_token_ids)
        # 1. Each row's tokens so far, and whether it decodes (a row prefilling sampled nothing).
        if _every_row_sampled(sampled_token_ids):  # every row decodes (the usual step)
            if self._ones.shape[0] < count:
                self._ones = np.ones(2 * count, dtype=np.int64)
            sampled = self._ones[:count]  # (count,): only "sampled anything" matters
        else:
            sampled = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=count)  # (count,)
        ends = np.ascontiguousarray(num_tokens_no_spec, dtype=np.int32)  # (>= count,): vLLM's own array, as is
        token_ids = np.ascontiguousarray(token_ids_cpu)  # (>= count, max_model_len) int32, as is
        if ends.shape[0] < count or token_ids.shape[0] < count:
            raise ValueError(f"num_tokens_no_spec ({ends.shape[0]}) and token_ids_cpu ({token_ids.shape[0]}) "
                             f"have fewer rows than sampled_token_ids ({count})")
        sessions = self.sessions
        if self._work.shape[1] <= count:  # buffers for every row of a step, grown as batches grow
            self._allocate(max(count, 2 * self._work.shape[1]))
        # 2. The usual step: the same rows as the last one, each holding its slot (spot-checked),
        #    drafted and sized in one compiled call.
        expected = sessions.active.shape[0]
        live, matched, continued, context, drafted = self._run(token_ids, ends, sampled, expected, True, 0)
        if matched:
            sessions.same_rows(continued)
        else:  # 3. Rows came, went or moved (rare): match them to slots here, then draft the
            #    rows not drafted yet (the first ``drafted`` are: they kept their slots), then
            #    the slots no row took retire.
            rows = self._work[ROWS, :live].copy()
            sessions.step(token_ids, rows, ends[rows])
            live, _, _, context, _ = self._run(token_ids, ends, sampled, live, False, drafted)
            sessions.retire()
            self._fixed = (None,)  # the history may have grown: the next step reads it anew
        self._context = context
        # 4. The engine step that just ran, timed from the end of the last propose(): learned
        #    where it ran exactly this step's rows, all decoding, over each row's last token
        #    and the draft proposed for it (no prefill chunk, no row that came or went: their
        #    tokens are unknown).
        if self._last_end is not None and live == count > 0 and sessions.continued == count:
            self.cost.observe_step(count + self._last_drafted, context, count, started - self._last_end)
        # 5. Every row's draft, in row order (rows that do not decode: none).
        offsets = self._work[OFFSETS, : count + 1].tolist()
        kept = self._kept[: offsets[-1]].tolist()
        drafts = [kept[start:end] for start, end in zip(offsets, offsets[1:])]
        self._last_drafted = len(kept)
        self.steps += 1
        self.drafted_tokens += len(kept)
        if self._stats_path and self.steps % STATS_EVERY == 0:
            self.write_stats(self._stats_path)
        self._last_end = self.clock()
        self.propose_seconds += self._last_end - started
        return drafts

    def write_stats(self, path: str) -> None:
        """Steps, drafted tokens, failures, the time propose() takes per step and the learned
        excess-cost scale of the engine's steps (1: as the prior says; None: not measured) per
        row count and context seen (``"ROWSxCONTEXT"``, each the middle of its half-octave and
        octave), as JSON."""
        from ..util.files import write_atomic

        seen = sorted((max(OnlineCost.context_of(r) // 64, 1), OnlineCost.context_of(2 * c))
                      for r, c in self.cost.step_windows())
        stats = {"steps": self.steps, "drafted_tokens": self.drafted_tokens, "failures": self.failures,
                 "propose_ms_per_step": round(1e3 * self.propose_seconds / max(self.steps, 1), 4),
                 "steps_timed": self.cost.steps_observed,
                 "step_scale": {f"{r}x{c}": self.cost.step_scale(r, c) for r, c in seen}}
        write_atomic(path, json.dumps(stats))

    def _run(self, token_ids, ends, sampled, expected: int, check: bool, first: int):
        """:func:`propose_rows` over this step's rows (``expected`` of them), sized by the step
        cost of that many rows. With ``check``, a step whose rows did not all keep their slots
        returns unmatched (as every such step does where ``usual_step`` is off). Rows before
        ``first`` are not drafted again: the unmatched call before drafted them."""
        sessions = self.sessions
        if self._fixed[0] is not sessions.rows:  # rows matched in Python (a new array), or new buffers
            table = sessions.table
            self._fixed = (sessions.rows, *table.arrays(), *table.history_arrays(), table.knob_values,
                           self._settings, self._work, self._drafts, self._acceptance, self._kept, self._buffers)
        step_costs = self.cost.step_costs(expected, expected * self.max_draft, self._context, self.steps)
        stamp = sessions.steps + 1 if check else sessions.steps  # RowSessions.step has stamped the others
        args = (token_ids, ends, sampled, expected if self.usual_step or not check else -1, check, stamp, first,
                step_costs, *self._fixed)
        # The compiled entry point for these types, looked up (~0.17 ms: numba.typeof is ~6 us an
        # array) where vLLM's arrays come with other types than the last step's: every other
        # argument is this proposer's own, of one type each whatever its rows.
        types = (token_ids.dtype, token_ids.ndim, ends.ndim)
        if types != self._types:
            self._types, self._entry = types, entry_point(propose_rows, args)
        return self._entry(*args)

    def _allocate(self, rows: int) -> None:
        # propose_rows' arguments that stay the same between usual steps, rebuilt whenever
        # RowSessions.step matched rows (it changes the table and history only then, and
        # replaces its rows)
        self._fixed: tuple = (None,)
        self._types: tuple = ()  # vLLM's arrays' types that _entry was looked up for
        self._entry = None  # propose_rows' compiled entry point
        self._work = np.zeros((5, rows + 1), dtype=np.int64)  # ROWS, SLOTS, LIMITS, LENGTHS (sized), OFFSETS
        self._drafts = np.zeros((rows, self.sessions.table.pending.shape[1]), dtype=np.int32)  # unsized
        self._acceptance = np.zeros(self._drafts.shape)  # each unsized draft position's estimate
        self._kept = np.zeros(rows * self._drafts.shape[1], dtype=np.int32)  # every sized draft, in row order
        table = self.sessions.table  # each row's work arrays (sessions.row_buffers), passed in to be borrowed
        self._buffers = row_buffers(self._drafts, table.edit_tokens, table.knob_values)
