"""What a forward costs here and now: ``cost(tokens, context)`` relative to a one-token forward
at the same context, from a prior measured at a few context lengths and refined online from
the decode loop's own forward timings.

    model = OnlineCost()                         # the prior: this project's CPU grid
    model(12, context=2000)                      # 2.0...: 12 new tokens on 2,000 cached ones
    model.observe(tokens=12, context=2000, seconds=0.081)   # what a forward really took
    model.table(context=2000, max_tokens=13)     # costs[q] for q = 0..13, for draft sizing

Why context: verifying 12 tokens on the development CPU costs 1.60x one token at 400 tokens
of context and 2.03x at 2,000 (attention over the context grows with q). Why online: the curve
differs across machines, devices, dtypes and loads; the loop runs every forward anyway, so
timing them costs nothing (on CUDA, events read a step later: no added sync).

The estimate per half-octave of context: where both the one-token cell and the q-token cell hold at least
``min_samples`` timings (:class:`CostModelTuning`), their ratio of medians (robust: one slow step or a noisy
neighbour moves a median little); else that ratio at the nearest context (within two half-octaves) where both
are measured. Elsewhere the prior, with its excess cost (cost - 1) scaled by how far the measured cells of
that context, or the nearest measured context, are from it. A batch of R rows is measured the same way against
its own plain step (R tokens).

Stale cells heal: a q-token cell is only refreshed by steps that draft q - 1 tokens. If a slow patch (a noisy
neighbour) inflated it, drafting declines and nothing would time it again, while plain steps keep refreshing
the one-token cell at the new speed. So a q-token cell whose newest timing is older than every timing of its
context's (full) one-token cell is dropped: its timings come from another period. The prior then holds until
drafting times that size again, and that first new timing counts at once (one retry, not min_samples, where
drafting really does not pay).

One model may serve several threads (one speculator shared by concurrent ``generate()`` calls): updates take a
lock, and readers iterate over snapshots.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from .curves import CPU_PRIOR, CostPrior
from .steps import EngineSteps


def check_numbers(settings) -> None:
    """Every field of the dataclass ``settings`` holds a number of its declared type: an int
    where it says int, else an int or a float; never a bool (a TypeError names the field)."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        number = (int,) if f.type in ("int", int) else (int, float)
        if not isinstance(value, number) or isinstance(value, bool):
            raise TypeError(f"{f.name} must be {'an int' if number == (int,) else 'a number'}, got {value!r}.")


@dataclass(frozen=True)
class CostModelTuning:
    """How :class:`OnlineCost` learns from timings (``SpeculatorConfig.cost_tuning``; on a
    command line ``cost_tuning.window=20``). The defaults were chosen on the 2-core CPU.

    Attributes:
        window: forward timings kept per cell (row count, context half-octave, tokens): the
            newest, so the estimate follows a changing load.
        min_samples: timings a cell needs before its median counts (a cell re-timed after it
            went stale counts from its first).
        same_load: a neighbouring context's cells speak for this one only where both plain
            steps ran within this factor of each other's speed (a context the request left
            during a slow patch is never re-timed).
        step_window: engine steps (vLLM) kept per window of row count and context octave, so a
            changed machine or load is learned within this many steps.
        step_refit: timed steps between refits of a window's line once one is measured (a fit
            over a full window costs ~60 us; half the default window is renewed between fits).
        min_steps: steps a window needs before a line is fitted through it, and the refit
            interval while none is measured.
        min_spread: least spread in x (the prior's excess cost, max - min) that measures a slope.
        step_context_reach: octaves of context a window with no line of its own looks across
            to borrow the nearest one's.
        explore_every: where no line is measured yet, one engine step in this many is sized as
            if extra positions were cheap (a prior that makes drafts look dear would keep every
            step plain and never learn otherwise).
        explore_scale: what such a step takes extra positions to cost, as a fraction of the
            prior's excess.
    """

    window: int = 15
    min_samples: int = 3
    same_load: float = 1.5
    step_window: int = 128
    step_refit: int = 64
    min_steps: int = 8
    min_spread: float = 0.05
    step_context_reach: int = 4
    explore_every: int = 4
    explore_scale: float = 0.25

    def __post_init__(self) -> None:
        check_numbers(self)
        for name in ("window", "min_samples", "step_window", "step_refit", "explore_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.min_samples > self.window:
            raise ValueError(f"min_samples ({self.min_samples}) must be <= window ({self.window}): a cell never "
                             "holds more timings than its window.")
        if self.min_steps < 2 or self.min_steps > self.step_window:
            raise ValueError(f"min_steps must be >= 2 (a line needs two points) and <= step_window "
                             f"({self.step_window}), got {self.min_steps}.")
        if not self.same_load >= 1.0:
            raise ValueError(f"same_load must be >= 1 (a ratio of speeds), got {self.same_load}.")
        if not self.min_spread >= 0.0 or self.step_context_reach < 0:
            raise ValueError(f"min_spread and step_context_reach must be >= 0, got {self.min_spread} and "
                             f"{self.step_context_reach}.")
        if not 0.0 <= self.explore_scale <= 1.0:
            raise ValueError(f"explore_scale must be in [0, 1], got {self.explore_scale}.")


class OnlineCost(EngineSteps):
    """``cost(tokens, context, rows)``: one forward over ``tokens`` new tokens of ``rows`` rows
    (each with ``context`` cached tokens, on average) relative to a plain step of the same rows
    (``rows`` tokens): the prior, refined by observed forward times (module doc). A row alone:
    relative to a one-token forward. Each row count learns from its own forwards (a batch's
    plain steps are its baseline), so batched sizing is measured too, not only the prior.
    ``tuning``: how it learns (:class:`CostModelTuning`; default: its defaults). An engine's
    steps, all rows together: :class:`~ngramspec.cost.steps.EngineSteps`."""

    def __init__(self, prior: CostPrior | None = None, learn: bool = True, tuning: CostModelTuning | None = None):
        self.prior = CPU_PRIOR if prior is None else prior
        self.tuning = CostModelTuning() if tuning is None else tuning
        # learn=False: a fixed curve (``verify_cost=...``) that timings never move, read the same way
        self.learn = learn
        self._lock = threading.Lock()
        self._prior_tables: dict[tuple[int, int], np.ndarray] = {}  # (rows, half-octave) -> prior by tokens
        # (rows, bucket, tokens) -> (observation number, seconds) of its newest forwards
        self._cells: dict[tuple[int, int, int], deque] = {}
        self._retimed: set[tuple[int, int, int]] = set()  # cells dropped as stale: one new timing counts
        self._tables: dict[tuple, tuple[int, np.ndarray]] = {}
        self._scales: dict[tuple[int, int], tuple[int, float]] = {}
        self._lines: dict[tuple[int, int], tuple[int, tuple[float, float] | None]] = {}
        self._start_steps()  # engine steps (steps.EngineSteps)
        self.observations = 0

    @staticmethod
    @lru_cache(maxsize=4096)
    def bucket(context: int) -> int:
        """Half-octaves of context: 362-511 tokens share one, 512-723 the next, ..."""
        return int(2 * math.log2(max(context, 64)))

    def observe(self, tokens: int, context: int, seconds: float, rows: int = 1) -> None:
        """One forward over ``tokens`` new tokens of ``rows`` rows on ``context`` cached ones
        (per row) took ``seconds``."""
        if tokens <= 0 or rows <= 0 or not seconds > 0 or not self.learn:
            return
        key = (int(rows), self.bucket(context), int(tokens))
        with self._lock:
            self.observations += 1
            cell = self._cells.get(key)
            if cell is None:
                cell = self._cells[key] = deque(maxlen=self.tuning.window)
            cell.append((self.observations, float(seconds)))
            if key in self._retimed:  # a size re-timed after a drop: its news counts at once
                if len(cell) >= self.tuning.min_samples:
                    self._retimed.discard(key)
                self._tables.clear()
                self._scales.clear()
                self._lines.clear()

    def plain_seconds(self, context: int) -> float | None:  # a plain step's median time here (None: too few)
        return self._median(1, self.bucket(context), 1)

    def needs_baseline(self, context: int, rows: int = 1) -> bool:
        """Too few plain-step timings of ``rows`` rows at this context to measure relative
        costs here (never, where the model does not learn)."""
        if not self.learn:
            return False
        key = (rows, self.bucket(context), rows)
        with self._lock:  # what _median would find, without taking the median (a plain cell is never stale)
            cell = self._cells.get(key)
            return cell is None or len(cell) < (1 if key in self._retimed else self.tuning.min_samples)

    def _median(self, rows: int, bucket: int, tokens: int) -> float | None:
        key, base = (rows, bucket, tokens), (rows, bucket, rows)
        with self._lock:
            cell = self._cells.get(key)
            timings = list(cell) if cell is not None else []
            plain = self._cells.get(base) if tokens != rows else None
            if timings and plain is not None and len(plain) == self.tuning.window and timings[-1][0] < plain[0][0]:
                del self._cells[key]  # stale (module doc): the prior holds again
                self._retimed.add(key)
                self._tables.clear()  # cached costs and scales may have used it
                self._scales.clear()
                self._lines.clear()
                timings = []
            needed = 1 if key in self._retimed else self.tuning.min_samples
        return statistics.median(s for _, s in timings) if timings and len(timings) >= needed else None

    def _current(self, rows: int, bucket: int, other: int) -> bool:
        """May a neighbouring context's cells speak for this one? Only where both plain steps
        ran at a similar speed (within same_load): a context the request left during a slow
        patch is never re-timed, so its ratio must not outlive the patch here."""
        here, there = self._median(rows, bucket, rows), self._median(rows, other, rows)
        return here is None or there is None or 1 / self.tuning.same_load <= there / here <= self.tuning.same_load

    @staticmethod
    def context_of(bucket: int) -> int:
        """The middle of a half-octave of context (in log), where its prior is read."""
        return int(2 ** (bucket / 2 + 0.25))

    def _prior(self, tokens, context: int, rows: int):
        """The prior relative to a plain step of ``rows`` rows at this context's half-octave, for
        an int or an int array of token counts; read from a table per (rows, half-octave), built
        once (an engine asks every step, and a table's read is ~100x cheaper than the curves')."""
        key = (rows, self.bucket(context))
        table = self._prior_tables.get(key)
        top = tokens if isinstance(tokens, int) else int(tokens.max()) if tokens.size else 0
        if table is None or top >= table.shape[0]:
            size = max(top + 1, 17 * rows + 1, 0 if table is None else 2 * table.shape[0])
            table = np.asarray(self.prior.relative(np.arange(size), self.context_of(key[1]), rows), dtype=np.float64)
            if len(self._prior_tables) >= 1024:
                self._prior_tables.clear()
            self._prior_tables[key] = table
        return table[tokens]

    def _excess_scale(self, rows: int, bucket: int) -> float:
        """How the measured excess cost (cost - 1) compares with the prior's, at this context
        or the nearest measured one (median over the measured token counts), for this row
        count, else for one row; 1 when unknown. Recomputed after 8 new timings (a batch asks
        for many token counts per step)."""
        cached = self._scales.get((rows, bucket))
        if cached is None or self.observations - cached[0] >= 8:
            scale = self._measure_excess_scale(rows, bucket)
            if scale is None and rows != 1:
                scale = self._measure_excess_scale(1, bucket)
            cached = self._scales[(rows, bucket)] = (self.observations, 1.0 if scale is None else scale)
        return cached[1]

    def _measured(self, rows: int, bucket: int):
        """For this context, then the nearest ones that may speak for it (``_current``), each
        with a measured plain step: (its half-octave, [(tokens, measured cost)] of its measured
        draft sizes)."""
        for distance in (0, 1, -1, 2, -2):
            b = bucket + distance
            plain = self._median(rows, b, rows)
            if plain is None or (b != bucket and not self._current(rows, bucket, b)):
                continue
            with self._lock:
                keys = list(self._cells)  # another thread may add cells meanwhile
            points = []
            for cell_rows, cell_bucket, tokens in keys:
                if cell_rows == rows and cell_bucket == b and tokens != rows:
                    measured = self._median(rows, b, tokens)
                    if measured is not None:
                        points.append((tokens, measured / plain))
            yield b, points

    def _measure_excess_scale(self, rows: int, bucket: int) -> float | None:
        for b, points in self._measured(rows, bucket):
            ratios = []
            for tokens, cost in points:
                prior_excess = self._prior(tokens, self.context_of(b), rows) - 1
                if prior_excess > 0.02:
                    ratios.append(max(cost - 1, 0.0) / prior_excess)
            if ratios:
                return statistics.median(ratios)
        return None

    def __call__(self, tokens: int, context: int, rows: int = 1) -> float:
        if tokens <= 0:
            return 0.0
        bucket = self.bucket(context)
        for distance in (0, 1, -1, 2, -2):  # measured here, else at the nearest measured context
            b = bucket + distance
            plain, here = self._median(rows, b, rows), self._median(rows, b, tokens)
            if plain is not None and here is not None and (distance == 0 or self._current(rows, bucket, b)):
                return here / plain
        line = self._line(rows, bucket)
        if line is not None:
            return max(1.0, line[0] + line[1] * tokens)
        return 1 + (float(self._prior(tokens, context, rows)) - 1) * self._excess_scale(rows, bucket)

    def _line(self, rows: int, bucket: int) -> tuple[float, float] | None:
        """Where two or more draft sizes are measured at this context (or the nearest measured
        one): the Theil-Sen line cost = a + b tokens through them (b >= 0), for the sizes
        between and beyond. It replaces the prior's shape, which is a few isolated
        measurements (at 8,000 tokens the prior jumps 2.2x -> 4.1x from 5 to 6 tokens, where
        forwards timed inside decoding at 5,900 tokens rose smoothly, 1.8x at 3 to 2.6x at 16;
        scaling that jump by the measured small sizes priced 6 tokens at 8-10x). Recomputed
        after 8 new timings; (a, b) or None."""
        cached = self._lines.get((rows, bucket))
        if cached is not None and self.observations - cached[0] < 8:
            return cached[1]
        line = None
        for _, points in self._measured(rows, bucket):
            if len(points) >= 2:
                slopes = [(c2 - c1) / (q2 - q1) for i, (q1, c1) in enumerate(points) for q2, c2 in points[i + 1 :]]
                slope = max(statistics.median(slopes), 0.0)
                line = (statistics.median(c - slope * q for q, c in points), slope)
                break
        self._lines[(rows, bucket)] = (self.observations, line)
        return line

    def timed_context(self, rows: int = 1) -> int | None:
        """The context (the middle of its half-octave) where most of the kept forward timings of
        ``rows`` rows fall; None where none was timed. A cost read far from it is the prior's."""
        counts: dict[int, int] = {}
        with self._lock:
            for (cell_rows, bucket, _), cell in self._cells.items():
                if cell_rows == rows:
                    counts[bucket] = counts.get(bucket, 0) + len(cell)
        return self.context_of(max(counts, key=counts.__getitem__)) if counts else None

    def table(self, context: int, max_tokens: int) -> np.ndarray:
        """``costs[q]`` for q = 0..max_tokens at this context, one row; recomputed when this
        context's half-octave changes or 8 more timings came in (draft sizing asks every step)."""
        key = (self.bucket(context), max_tokens)
        cached = self._tables.get(key)
        if cached is not None and self.observations - cached[0] < 8:
            return cached[1]
        table = np.array([self(q, context) for q in range(max_tokens + 1)])
        self._tables[key] = (self.observations, table)
        return table
