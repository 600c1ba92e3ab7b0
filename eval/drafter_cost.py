"""`python -m eval drafter`: the drafter's own cost per decode step at growing context lengths.

Times ``propose()`` + ``extend()`` of one session over a stream of random tokens whose tail
repeats earlier text (so lookups hit and drafts are non-empty), after indexing ``context``
tokens. The index makes both O(max_n) per token, so the time should not grow with context.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ngramspec import NgramSpeculator, SpeculatorConfig
from ngramspec.draft.config import parse_config

from .options import add_options, ints


def drafter_us_per_step(config: SpeculatorConfig, context: int, steps: int = 2000, seed: int = 0) -> float:
    """Median microseconds of one propose() + extend(2 tokens) after ``context`` tokens."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 49_152, size=context).astype(np.int32)
    speculator = NgramSpeculator(config)
    if speculator.cost_model is not None:  # as in a running decoder: one-token forwards timed here
        for length in range(context, context + 2 * steps + 512, 256):
            for _ in range(3):
                speculator.cost_model.observe(1, length, 0.05)
    session = speculator.start(stream, capacity=context + 2 * steps + 16)
    tail = stream[-2 * steps :] if context >= 2 * steps else np.resize(stream, 2 * steps)
    times, drafted = [], 0
    for step in range(steps):
        start = time.perf_counter()
        drafted += len(session.propose())
        session.extend(tail[2 * step : 2 * step + 2])
        times.append(time.perf_counter() - start)
    if drafted == 0:
        raise RuntimeError("the benchmark stream produced no drafts; it would not time a real lookup")
    return statistics.median(times) * 1e6


def add_arguments(parser) -> None:
    parser.add_argument("--contexts", type=ints, default="1000,16000,128000", help="comma-separated context lengths")
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per context")
    add_options(parser, "settings")


def main(args) -> int:
    config = parse_config(args.settings or "")
    print(f"drafter cost per step (propose + extend, median of {args.steps}); {config}")
    for context in args.contexts:
        print(f"  context {context:>7,} tokens: {drafter_us_per_step(config, context, args.steps):6.2f} us")
    return 0
