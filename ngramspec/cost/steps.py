"""What an engine step costs (vLLM): one step over all rows' tokens, flattened, learned from
the engine's own steps. A mixin of :class:`~ngramspec.cost.costmodel.OnlineCost`, which holds
the prior it scales.

A step's total rarely repeats (every row drafts its own length), so cells keyed by token count
would never fill. Each timed step instead joins the window of its row count's half-octave and
its context's octave as (x, seconds), x being the prior's excess cost of its total (prior - 1).
Context has its own windows because the plain step's time a grows with it: one line through
steps of a 300-token and a 3,000-token request (one request at a time, a few dozen steps each)
would measure their difference, not the drafts' cost; for the same reason a step's seconds
are divided by the prior's plain step of its row count (a window spans a half-octave of them).
A robust line through the window (Theil-Sen: the median of pairwise slopes b, then the median
intercept a, the plain step's time) gives the excess scale b / a. A load that slows every step
alike scales a and b alike and leaves it unchanged; the window keeps the newest steps, so a
changed machine or load is learned within step_window steps. A window with no line yet borrows
the nearest one's: the same context with other row counts, then the nearest contexts (up to
step_context_reach octaves away). Where no line is measured yet, one step in explore_every is
sized optimistically (:class:`~ngramspec.cost.costmodel.CostModelTuning`).

An engine calls :meth:`EngineSteps.observe_step` and :meth:`EngineSteps.step_costs` every step,
between its forwards, so both are cheap there: a step is noted as it comes (~0.4 us) and filed
into its window when a line is next fitted; the costs are the last call's until that fit is
due or the rows, draft room or context half-octave change.

    model = OnlineCost()
    model.observe_step(tokens=40, context=600, rows=16, seconds=0.052)  # a step that verified 24 drafts
    model.step_costs(rows=16, positions=256, context=600, step=7)       # costs[m]: m draft tokens
"""

from __future__ import annotations

from collections import deque
from itertools import chain

import numpy as np

from .fit import line_scale


class EngineSteps:
    """Engine steps' cost, learned (the module doc). Expects ``bucket``, ``_prior``, ``tuning``,
    ``learn`` and ``_lock`` from :class:`~ngramspec.cost.costmodel.OnlineCost`."""

    def _start_steps(self) -> None:
        self._noted: list[tuple[int, int, int, float]] = []  # steps not yet filed: (tokens, context, rows, seconds)
        self._steps: dict[tuple[int, int], deque] = {}  # engine steps: _step_key -> (x, seconds)
        self._step_scales: dict[tuple[int, int], tuple[int, float | None]] = {}  # _step_key -> (at, scale)
        self._step_tables: dict[tuple, np.ndarray] = {}  # (rows, positions, bucket, scale) -> costs
        self._plain_steps: dict[tuple[int, int], float] = {}  # (rows, bucket) -> _plain_step
        # the last step_costs answer that holds until a refit: ((rows, positions, bucket), due, measured, costs)
        self._step_memo: tuple = ((), 0, False, None)
        self.steps_observed = 0

    def observe_step(self, tokens: int, context: int, rows: int, seconds: float) -> None:
        """One engine step over ``tokens`` scheduled tokens (every row's last token and draft)
        of ``rows`` rows with ``context`` tokens each on average took ``seconds``. Called by
        the engine's one thread."""
        if rows <= 0 or tokens < rows or not seconds > 0 or not self.learn:
            return
        self._noted.append((tokens, context, rows, float(seconds)))
        self.steps_observed += 1
        if len(self._noted) >= self.tuning.step_window:  # no fit asked for a while: bound what waits
            self._file_steps()

    def _file_steps(self) -> None:
        """Every noted step joins its window as (the prior's excess for its total, seconds per
        the prior's plain step of its rows, :meth:`_plain_step`), in the order they came: one
        prior read per run of steps with the same row count and context half-octave (an
        engine's steps come in long runs)."""
        noted, self._noted = self._noted, []
        start = 0
        while start < len(noted):
            rows, context = noted[start][2], noted[start][1]
            bucket, end = self.bucket(context), start + 1
            while end < len(noted) and noted[end][2] == rows and self.bucket(noted[end][1]) == bucket:
                end += 1
            run = noted[start:end]
            excess = self._prior(np.array([step[0] for step in run]), context, rows) - 1
            plain = self._plain_step(rows, bucket)
            key = (self.bucket(64 * rows), bucket // 2)  # _step_key
            with self._lock:
                window = self._steps.get(key)
                if window is None:
                    window = self._steps[key] = deque(maxlen=self.tuning.step_window)
                window.extend(zip(excess.tolist(), [step[3] / plain for step in run]))
            start = end

    def _plain_step(self, rows: int, bucket: int) -> float:
        """The prior's plain step of ``rows`` rows at context half-octave ``bucket``, in one-row
        steps: a window's steps are in these units, since its half-octave of row counts holds
        plain steps that differ by more than a short draft costs (rows 8 to 11 as requests
        drain, a step each), which a line through their seconds would take for the drafts'."""
        plain = self._plain_steps.get((rows, bucket))
        if plain is None:
            if len(self._plain_steps) >= 1024:
                self._plain_steps.clear()
            plain = self._plain_steps[(rows, bucket)] = float(self.prior.cost(rows, self.context_of(bucket), rows))
        return plain

    def step_windows(self) -> list[tuple[int, int]]:
        """Every window a step joined, as (row count's half-octave of 64 * rows, context's octave)."""
        self._file_steps()
        with self._lock:
            return list(self._steps)

    def _step_key(self, rows: int, context: int) -> tuple[int, int]:
        """(row count's half-octave, context's octave): the window a step joins."""
        return self.bucket(64 * rows), self.bucket(context) // 2

    def step_scale(self, rows: int, context: int = 512) -> float | None:
        """How the measured excess cost of a step of ``rows`` rows with ``context`` tokens each compares with
        the prior's (1: as the prior says), from its window or the nearest one that measures it; None where none
        does. Refitted after step_refit more timed steps (a fit over a full window costs ~0.04 ms), or min_steps
        while none is measured in the first step_refit steps."""
        return self._step_fit(rows, context)[0]

    def _step_fit(self, rows: int, context: int) -> tuple[float | None, int]:
        """(step_scale, the steps_observed count at which it is refitted)."""
        key = self._step_key(rows, context)
        cached = self._step_scales.get(key)
        if cached is None or self.steps_observed >= self._refit_at(*cached):
            self._file_steps()
            cached = self._step_scales[key] = (self.steps_observed, self._fit_near(key))
        return cached[1], self._refit_at(*cached)

    def _refit_at(self, fitted_at: int, scale: float | None) -> int:
        """Every min_steps steps while nothing is measured in the first step_refit steps, then
        every step_refit (a window of steps that all drafted alike measures no slope, and
        refitting it every few steps would cost more than the drafting)."""
        soon = scale is None and fitted_at + self.tuning.min_steps < self.tuning.step_refit
        return fitted_at + (self.tuning.min_steps if soon else self.tuning.step_refit)

    def _fit_near(self, key: tuple[int, int]) -> float | None:
        """The line of window ``key``, or of the nearest one that measures it (module doc)."""
        reach = range(self.tuning.step_context_reach + 1)
        for near in ((key[0] + r, key[1] + sign * c) for c in reach for sign in (1, -1)[: 1 + (c > 0)]
                     for r in (0, -1, 1, -2, 2)):
            with self._lock:
                window = self._steps.get(near, ())
                if len(window) < self.tuning.min_steps:
                    continue
                points = np.fromiter(chain.from_iterable(window), dtype=np.float64, count=2 * len(window))
            x, seconds = points.reshape(-1, 2).T.copy()  # contiguous rows: the types line_scale is compiled for
            fitted = line_scale(x, seconds, self.tuning.min_steps, self.tuning.min_spread)
            if fitted >= 0:
                return fitted
        return None

    def step_costs(self, rows: int, positions: int, context: int, step: int) -> np.ndarray:
        """``costs[m]`` for m = 0..positions: a step over ``rows`` rows' last tokens and m draft
        tokens (every total one step could schedule, priced at once), relative to a plain step
        of ``rows`` rows. ``step``: the caller's step number (exploration, below). The same
        array until the scale is refitted, or an exploring step, or the rows, positions or
        context half-octave change (an engine asks every step: ~0.2 us then)."""
        bucket, every = self.bucket(context), self.tuning.explore_every
        exploring = step % every == every - 1  # where nothing is measured yet: an optimistic try
        asked, due, measured, costs = self._step_memo
        if asked == (rows, positions, bucket) and self.steps_observed < due and (measured or not exploring):
            return costs
        scale, due = self._step_fit(rows, context)
        measured = scale is not None
        if not measured:  # nothing measured here yet: the prior, and every few steps an optimistic try
            scale = self.tuning.explore_scale if exploring else 1.0
        key = (rows, positions, bucket, scale)
        costs = self._step_tables.get(key)
        if costs is None:
            costs = 1 + (self._prior(rows + np.arange(positions + 1), context, rows) - 1) * scale
            if len(self._step_tables) >= 64:
                self._step_tables.clear()
            self._step_tables[key] = costs
        if measured or not exploring:
            self._step_memo = ((rows, positions, bucket), due, measured, costs)
        return costs
