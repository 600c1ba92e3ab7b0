"""`python -m eval drafter`: the drafter's own cost per decode step at growing context lengths.

Times ``propose()`` + ``extend()`` of one session over a stream of random tokens whose tail
repeats earlier text (so lookups hit and drafts are non-empty), after indexing ``context``
tokens. The index makes both O(max_n) per token, so the time should not grow with context.

``--memory``: each context in a fresh process, its peak memory per token of context too. The
peak is the process's peak RSS (VmHWM, reset through /proc/self/clear_refs once the kernels are
loaded) minus its RSS then: it counts the prompt as the caller holds it (int32, 4 bytes a token),
everything ``start()`` allocates (temporaries included) and the timed steps. Three ways to reach
the context: ``prompt`` (start with it and a capacity, as transformers' loop passes one),
``bare`` (start with it, no capacity: as vLLM's rows arrive) and ``grown`` (extended 64 tokens
at a time from a short prompt, as a long generation grows). ``--against DIR`` runs the same
measurement on another checkout (e.g. ``git archive`` of the old code) in alternating rounds
(each side first in every other one); each side reports its best round.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ngramspec import NgramSpeculator, SpeculatorConfig
from ngramspec.draft.config import parse_config

from .options import add_options, ints

MODES = ("prompt", "bare", "grown")


def drafter_us_per_step(config: SpeculatorConfig, context: int, steps: int = 2000, seed: int = 0) -> float:
    """Median microseconds of one propose() + extend(2 tokens) after ``context`` tokens."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 49_152, size=context).astype(np.int32)
    speculator = NgramSpeculator(config)
    return _time_steps(speculator, speculator.start(stream, capacity=context + 2 * steps + 16), stream, steps)


def _time_steps(speculator, session, stream, steps: int) -> float:
    if speculator.cost_model is not None:  # as in a running decoder: one-token forwards timed here
        context = stream.shape[0]
        for length in range(context, context + 2 * steps + 512, 256):
            for _ in range(3):
                speculator.cost_model.observe(1, length, 0.05)
    tail = stream[-2 * steps :] if stream.shape[0] >= 2 * steps else np.resize(stream, 2 * steps)
    times, drafted = [], 0
    for step in range(steps):
        start = time.perf_counter()
        drafted += len(session.propose())
        session.extend(tail[2 * step : 2 * step + 2])
        times.append(time.perf_counter() - start)
    if drafted == 0:
        raise RuntimeError("the benchmark stream produced no drafts; it would not time a real lookup")
    return statistics.median(times) * 1e6


def _status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(settings: str, context: int, steps: int, mode: str) -> dict:
    """Peak bytes per token and step time of one session reaching ``context`` tokens (``mode``,
    see the module doc), in this process: call it in a fresh one (:func:`measure_in`)."""
    config = parse_config(settings)
    speculator = NgramSpeculator(config)
    _time_steps(speculator, speculator.start(np.arange(4096, dtype=np.int32) % 97), np.arange(64, dtype=np.int32), 64)
    rng = np.random.default_rng(0)
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    base = _status("VmRSS")
    stream = rng.integers(0, 49_152, size=context, dtype=np.int32)
    if mode == "grown":
        session = speculator.start(stream[:64])
        for at in range(64, context, 64):
            session.extend(stream[at : at + 64])
    else:
        session = speculator.start(stream, capacity=context + 2 * steps + 16 if mode == "prompt" else 0)
    us = _time_steps(speculator, session, stream, steps)
    return {"bytes_per_token": (_status("VmHWM") - base) / context, "us_per_step": us}


def measure_in(tree: str, settings: str, context: int, steps: int, mode: str) -> dict:
    """:func:`measure` in a fresh interpreter that imports ngramspec from ``tree``."""
    here = str(Path(__file__).resolve().parent.parent)
    # The tree's ngramspec is imported first, so this checkout's eval (the measurement) uses it.
    code = (f"import sys; sys.path.insert(0, {tree!r}); import ngramspec; sys.path.insert(0, {here!r}); "
            "from eval.drafter_cost import _measure_main; _measure_main()")
    out = subprocess.run([sys.executable, "-c", code, settings, str(context), str(steps), mode],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure_main() -> None:
    settings, context, steps, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    print(json.dumps(measure(settings, context, steps, mode)))


def add_arguments(parser) -> None:
    parser.add_argument("--contexts", type=ints, default=None,
                        help="comma-separated context lengths (default 1000,16000,128000; with --memory 1000000)")
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per context")
    parser.add_argument("--memory", action="store_true", help="peak bytes per token too, each run in a fresh process")
    parser.add_argument("--modes", default="prompt,bare,grown", help="with --memory: how the context is reached")
    parser.add_argument("--against", default=None, help="with --memory: another checkout's root, run alternately")
    parser.add_argument("--rounds", type=int, default=2, help="with --memory: rounds per side (best one reported)")
    add_options(parser, "settings")


def main(args) -> int:
    config = parse_config(args.settings or "")
    if not args.memory:
        print(f"drafter cost per step (propose + extend, median of {args.steps}); {config}")
        for context in args.contexts or [1000, 16000, 128000]:
            print(f"  context {context:>7,} tokens: {drafter_us_per_step(config, context, args.steps):6.2f} us")
        return 0
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"this": here} | ({"against": str(Path(args.against).resolve())} if args.against else {})
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(modes) - set(MODES):
        raise ValueError(f"unknown modes {sorted(set(modes) - set(MODES))}; known: {', '.join(MODES)}")
    print(f"peak RSS per token of context (prompt array included) and step time (propose + extend, median of "
          f"{args.steps}), best of {args.rounds} alternating rounds; {config}")
    for context in args.contexts or [1_000_000]:
        for mode in modes:
            best = {name: {"bytes_per_token": float("inf"), "us_per_step": float("inf")} for name in trees}
            for round_ in range(args.rounds):
                for name, tree in list(trees.items())[:: -1 if round_ % 2 else 1]:  # each side first in turn
                    got = measure_in(tree, args.settings or "", context, args.steps, mode)
                    best[name] = {k: min(v, got[k]) for k, v in best[name].items()}
            line = "   ".join(f"{name}: {b['bytes_per_token']:6.1f} B/token {b['us_per_step']:6.2f} us"
                               for name, b in best.items())
            print(f"  context {context:>9,} {mode:>6}: {line}")
            if args.against:
                this, other = best["this"], best["against"]
                print(f"  {'':>17} this / against: memory {this['bytes_per_token'] / other['bytes_per_token']:.3f}, "
                      f"step {this['us_per_step'] / other['us_per_step']:.3f}")
    return 0
