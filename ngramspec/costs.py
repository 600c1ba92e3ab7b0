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

import hashlib
import json
import platform
import statistics
import time
from dataclasses import dataclass

import numpy as np

from .files import write_atomic

QS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)


@dataclass(frozen=True)
class CostCurve:
    """``cost(q)``: one forward over q tokens relative to one token, from measured
    ``points = ((q, cost), ...)`` (starting at q = 1, q strictly increasing, costs positive).

    Linear between points. Past the last point the cost grows in proportion to q, the last
    point's cost per token: beyond the measured range the forward is compute-bound, and a batch
    costed as rows x positions tokens reaches far past any single-row measurement. ``cost(0)``
    is 0 (no forward).
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
        if q <= 0:
            return 0.0
        last_q, last_cost = self.points[-1]
        if q > last_q:
            return last_cost * q / last_q
        return float(np.interp(q, self._qs, self._costs))

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
    from .models import cache_dir

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
