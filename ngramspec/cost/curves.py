"""Verify-cost curves: what one forward over q tokens costs, relative to a one-token forward.

    curve = CostCurve(((1, 1.0), (8, 1.5)))        # or CostCurve.parse("1:1.0,8:1.5")
    curve(4)                                       # 1.21...: linear between measured points
    spec = NgramSpeculator.for_model(model)        # measures (~10-30 s) or loads the cached curve

Draft sizing needs cost(q). It depends on the model, the device, the dtype, the torch version
and (on CPU) the thread count: a 2-core CPU pays ~1.4-1.9x for 2-16 tokens, a data-centre GPU
nearly nothing until its matrix units fill. A measured curve is cached under
``cache_dir()/costs`` keyed by all of these, and measured again when older than
``max_age_days`` or when any key part changed.

torch is imported inside the measuring functions only: config.py imports :class:`CostCurve`,
and a settings object should not need the deep-learning stack.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import platform
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..util.files import write_atomic

QS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)


@dataclass(frozen=True)
class CostCurve:
    """``cost(q)``: one forward over q tokens relative to one token, from measured
    ``points = ((q, cost), ...)`` (starting at q = 1, q strictly increasing, costs positive).

    Read by :func:`along`: linear between points, in proportion to q past the last. ``cost(0)``
    is 0 (no forward). One curve of a :class:`CostPrior` (which is what sizes drafts).
    """

    points: tuple

    def __post_init__(self) -> None:
        try:
            points = tuple((int(q), float(c)) for q, c in self.points)
        except (TypeError, ValueError):
            raise ValueError(f"verify_cost must be ((q, cost), ...) pairs, got {self.points!r}.") from None
        if not points or points[0][0] != 1 or any(b[0] <= a[0] for a, b in zip(points, points[1:])):
            raise ValueError(
                "verify_cost must start at q=1 and list strictly increasing q, e.g. ((1, 1.0), (8, 1.5))."
            )
        if any(c <= 0 for _, c in points):
            raise ValueError("verify_cost values must be positive.")
        object.__setattr__(self, "points", points)
        # Split once here: the speculator asks for costs on every decode step.
        object.__setattr__(self, "_qs", tuple(q for q, _ in points))
        object.__setattr__(self, "_costs", tuple(c for _, c in points))

    def __call__(self, q: int) -> float:
        return float(along(self._qs, self._costs, q))

    @classmethod
    def parse(cls, text: str) -> CostCurve:
        """``"1:1.0,4:1.4,8:1.5"`` (q:cost pairs, as the command lines take them) -> a curve."""
        try:
            points = tuple((int(q), float(c)) for q, c in (pair.split(":") for pair in text.split(",")))
        except ValueError:
            raise ValueError(f"verify_cost must look like '1:1.0,4:1.4,8:1.5', got {text!r}") from None
        return cls(points)

    def text(self) -> str:
        """The inverse of :meth:`parse`."""
        return ",".join(f"{q}:{c:g}" for q, c in self.points)


def along(qs, costs, tokens):
    """One measured curve (``qs`` strictly increasing, ``costs`` at them) read at ``tokens`` (an
    int or an int array): linear between points, flat below the first, 0 at 0 (no forward), and
    past the last in proportion to tokens, the last point's cost per token: beyond the measured
    range the forward is compute-bound, and a batch costed as rows x positions tokens reaches
    far past any one-row measurement."""
    t = np.asarray(tokens, dtype=np.float64)
    cost = np.where(t > qs[-1], costs[-1] * t / qs[-1], np.interp(t, qs, costs))
    return np.where(t <= 0, 0.0, cost)


@dataclass(frozen=True)
class CostPrior:
    """What one forward (or one vLLM engine step) costs before any is timed, from curves
    measured at a few row counts and context lengths: ``curves = ((rows, context, ((tokens,
    cost), ...)), ...)``, tokens counting every row's new tokens together, costs relative to a
    one-token forward of one row. :class:`~ngramspec.cost.costmodel.OnlineCost` refines it with the
    forwards it times; it is the one description of cost every engine reads.

        prior = CostPrior(((1, 400, ((1, 1.0), (16, 2.0))), (1, 4000, ((1, 1.0), (16, 4.0)))))
        prior.relative(16, context=1265)           # 3.0: halfway in log(context)
        prior.relative(8, context=400, rows=4)     # 4 rows x 2 positions vs 4 rows x 1

    Along tokens, :func:`along`. Across the contexts measured at one row count: linear in
    log(context), the nearest curve outside. Across row counts: linear in rows, continuing the
    last two counts' difference above the largest. Where one row count is measured, R rows of
    q positions cost as R x q tokens of it (a padded batch is one matrix product).
    """

    curves: tuple

    def __post_init__(self) -> None:
        try:
            curves = tuple(sorted((int(r), int(c), tuple((int(n), float(v)) for n, v in points))
                                  for r, c, points in self.curves))
        except (TypeError, ValueError):
            raise ValueError("CostPrior curves must be ((rows, context, ((tokens, cost), ...)), ...), "
                             f"got {self.curves!r}.") from None
        for rows, context, points in curves:
            if rows < 1 or context < 1 or len(points) < 2 or any(b[0] <= a[0] for a, b in zip(points, points[1:])) \
                    or points[0][0] < 1 or any(v <= 0 for _, v in points):
                raise ValueError("each CostPrior curve needs rows >= 1, context >= 1 and two or more (tokens, cost) "
                                 f"points, tokens strictly increasing from 1 or more, costs positive: got {points!r}.")
        object.__setattr__(self, "curves", curves)
        counts = sorted({r for r, _, _ in curves})
        by_rows = []  # per row count: (log contexts, [(qs, costs)]), contexts increasing
        for count in counts:
            mine = [(c, p) for r, c, p in curves if r == count]
            arrays = [(np.array([n for n, _ in p], dtype=np.float64), np.array([v for _, v in p])) for _, p in mine]
            by_rows.append((np.log([c for c, _ in mine]), arrays))
        object.__setattr__(self, "_counts", counts)
        object.__setattr__(self, "_by_rows", by_rows)

    @classmethod
    def fixed(cls, points) -> CostPrior:
        """One curve, ``((q, cost), ...)`` from q = 1, for every context (``verify_cost``)."""
        return cls(((1, 1, CostCurve(points).points),))

    @classmethod
    def from_file(cls, path) -> CostPrior:
        """The JSON ``python -m eval.vllm_cost --out PATH`` writes: ``{"curves": {rows: [[tokens,
        cost], ...]}}`` (one context), or ``{"curves": [[rows, context, [[tokens, cost], ...]], ...]}``."""
        with open(path, encoding="utf-8") as handle:
            curves = json.load(handle)["curves"]
        if isinstance(curves, dict):
            curves = [(rows, 1, points) for rows, points in curves.items()]
        return cls(tuple((rows, context, tuple(map(tuple, points))) for rows, context, points in curves))

    def to_json(self) -> str:
        """What :meth:`from_file` reads."""
        return json.dumps({"curves": [[r, c, [list(p) for p in points]] for r, c, points in self.curves]})

    def scaled(self, factor: float) -> CostPrior:
        """A prior wrong by ``factor``: every curve's excess over its own plain step (the cost
        of ``rows`` tokens at that row count) times ``factor``, so :meth:`relative`, what
        sizing reads, is off by that factor at every measured row count. (Scaling the excess
        over one row's one-token step instead left 16 rows only ~1.3x off at 2x.)"""
        curves = []
        for r, c, points in self.curves:
            qs, costs = zip(*points)
            plain = float(along(np.array(qs, dtype=np.float64), np.array(costs), r))
            curves.append((r, c, tuple((n, max(plain + factor * (v - plain), 1e-3)) for n, v in points)))
        return CostPrior(tuple(curves))

    def cost(self, tokens, context: int, rows: int = 1):
        """A forward over ``tokens`` (int or array) of ``rows`` rows with ``context`` tokens each,
        relative to a one-token forward of one row."""
        counts = self._counts
        if len(counts) == 1 or rows <= counts[0]:
            return self._at(0, tokens, context)
        upper = min(bisect.bisect_left(counts, rows), len(counts) - 1)
        low, high = self._at(upper - 1, tokens, context), self._at(upper, tokens, context)
        return low + (rows - counts[upper - 1]) / (counts[upper] - counts[upper - 1]) * (high - low)

    def _at(self, i: int, tokens, context: int):
        contexts, curves = self._by_rows[i]
        where = math.log(max(context, 1))
        j = int(np.searchsorted(contexts, where))
        if j == 0 or j == len(contexts):  # outside the measured contexts: the nearest holds
            return along(*curves[min(j, len(curves) - 1)], tokens)
        w = (where - contexts[j - 1]) / (contexts[j] - contexts[j - 1])
        return (1 - w) * along(*curves[j - 1], tokens) + w * along(*curves[j], tokens)

    def relative(self, tokens, context: int, rows: int = 1):
        """A forward over ``tokens`` (int or array) relative to a plain step of the same rows
        (``rows`` tokens) at the same context, never below it where ``tokens >= rows`` (a
        measured curve may dip at a few tokens); 0 at 0 tokens."""
        t, rows = np.asarray(tokens), max(rows, 1)  # (a step of no rows prices as one row)
        cost = self.cost(t, context, rows) / float(self.cost(rows, context, rows))
        cost = np.where(t >= rows, np.maximum(cost, 1.0), cost)
        return float(cost) if cost.ndim == 0 else cost


# SmolLM2-135M-Instruct, fp32, torch 2.13 with 2 threads on an idle 2-core AVX-512 CPU, 400
# tokens of context, median of 15 (eval/cost_curve.py measures it for any model and device).
# Small matrix products (q = 2, 3) are the least efficient on this BLAS, so a 5-token verify is
# cheaper than a 3-token one. Points from 24 tokens on (median of 9, same setup) cost a batch's
# rows x positions together. The speculator's default (SpeculatorConfig.verify_cost).
DEFAULT_CPU_CURVE = CostCurve((
    (1, 1.0), (2, 1.6), (3, 1.85), (4, 1.43), (5, 1.3), (6, 1.41), (8, 1.4), (10, 1.57), (12, 1.53),
    (16, 1.6), (24, 1.94), (32, 2.22), (48, 2.78), (64, 3.25), (96, 4.06), (128, 5.08),
))

# An earlier, steeper measurement (same model, torch 2 threads, idle 2-core CPU, 400-1500
# tokens of context; GUIDE.md section 4): extra positions cost more. Replay uses it when given
# no curve, so drafters are also judged where long drafts do not come cheap.
STEEP_CPU_CURVE = CostCurve(((1, 1.0), (2, 1.1), (3, 1.17), (4, 1.6), (8, 1.94), (11, 2.3), (16, 2.45), (32, 2.9)))


# The prior of OnlineCost(): SmolLM2-135M-Instruct, fp32, torch 2.13, 2 threads, idle 2-core CPU.
# 400 tokens: the default curve (it agrees with forwards timed inside real decoding, q=13 1.63x
# in eval/results/insitu_cost). 2,000 and 8,000: `python -m eval.cost_curve --context N --qs
# 1,2,3,4,5,6,8,10,12,16,24,32 --repeats 9` (one-token forward 48.9 ms and 102.7 ms). At 8,000
# the attention kernel's cost jumps from q = 6 on. Isolated measurements vary by 20-40% from run
# to run (the same command gave 2.19x at q=12 and 400 tokens): the online timings decide.
CPU_PRIOR = CostPrior((
    (1, 400, DEFAULT_CPU_CURVE.points),
    (1, 2000, ((1, 1.0), (2, 1.29), (3, 1.38), (4, 1.63), (5, 1.71), (6, 1.76), (8, 1.93), (10, 2.1), (12, 2.17),
               (16, 2.16), (24, 2.38), (32, 2.65))),
    (1, 8000, ((1, 1.0), (2, 1.55), (3, 1.68), (4, 1.86), (5, 2.25), (6, 4.1), (8, 3.81), (10, 3.96), (12, 4.03),
               (16, 3.76), (24, 4.55), (32, 4.26))),
))


def measure_cost_curve(model, context: int = 400, qs=QS, repeats: int = 9) -> dict[int, float]:
    """Median time of a forward over q random tokens on top of ``context`` cached tokens,
    relative to q = 1, interleaving all q so drift hits them alike. Returns {q: ratio} plus
    {0: seconds of one one-token forward}."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    cache = DynamicCache(config=model.config)
    times: dict[int, list[float]] = {q: [] for q in qs}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        model(input_ids=torch.randint(0, vocab, (1, context), device=device), cache=cache, logits_to_keep=1)
        for rep in range(repeats + 2):
            for q in qs:
                ids = torch.randint(0, vocab, (1, q), device=device)
                sync()
                start = time.perf_counter()
                model(input_ids=ids, cache=cache, logits_to_keep=q).logits.argmax(-1).tolist()
                elapsed = time.perf_counter() - start
                cache.crop(-q)
                if rep >= 2:  # the first two rounds warm up kernels and allocators
                    times[q].append(elapsed)
    base = statistics.median(times[1])
    curve = {q: statistics.median(t) / base for q, t in times.items()}
    curve[1] = 1.0
    return curve | {0: base}


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.machine()} {platform.processor() or 'cpu'} x{torch.get_num_threads()} threads"


def cost_key(model) -> dict:
    import torch

    parameter = next(model.parameters())
    return {
        "model": str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
        "layers": getattr(model.config, "num_hidden_layers", None),
        "hidden": getattr(model.config, "hidden_size", None),
        "device": device_name(parameter.device),
        "dtype": str(parameter.dtype),
        "torch": torch.__version__,
    }


def cached_cost_curve(model, max_age_days: float = 30.0, refresh: bool = False) -> tuple:
    """``((q, cost), ...)`` for ``SpeculatorConfig.verify_cost``: from the cache when fresh,
    else measured now and cached."""
    from ..util.files import cache_dir

    key = cost_key(model)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = cache_dir() / "costs" / f"{digest}.json"
    if path.is_file() and not refresh:
        try:
            saved = json.loads(path.read_text())
            if saved.get("key") == key and time.time() - saved["measured_at"] < max_age_days * 86400:
                return tuple((int(q), float(c)) for q, c in saved["curve"])
        except (ValueError, KeyError, OSError):
            pass  # unreadable: measure again
    curve = measure_cost_curve(model)
    base = curve.pop(0)
    points = tuple(sorted((int(q), round(float(c), 3)) for q, c in curve.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"key": key, "measured_at": time.time(), "one_token_seconds": base,
                                   "curve": points}, indent=1))
    return points
