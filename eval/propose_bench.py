"""`python -m eval propose-bench`: drafting time per vLLM engine step, ngramspec's ``Proposer``
against vLLM's own n-gram proposer, on the same rows, outside the engine.

Rows are the greedy traces' prompt + output (``../shared/traces``), each advancing 2 tokens per
step as in a decode where drafts are partly accepted; ``propose()`` is timed for every step
and the median and mean after the warm-up steps are reported (the first steps build
ngramspec's sessions: a new request's text is indexed once; the mean also counts ngramspec's
occasional refit of the step cost). vLLM's proposer runs where vLLM is installed
(``.venv-vllm``); elsewhere only ngramspec is timed.

ngramspec learns what extra draft positions cost from the time between two ``propose()``
calls, which in an engine is the engine step. Outside an engine that gap is the harness's own
few microseconds, the same whatever was drafted, and it would learn that positions cost
nothing (a scale of ~0.003-0.08) and draft more than any engine would let it. So by default
(``--engine-step-ms 10``) the proposer's clock also counts an engine step between its calls,
priced by its own prior for the rows and draft tokens of that step: it learns the prior's
scale (~1), as in an engine the prior describes. ``--engine-step-ms 0``: no engine time.

    .venv-vllm/bin/python -m eval propose-bench --rows 1,16,64,256
    .venv-vllm/bin/python -m eval propose-bench --row-tokens 1500   # rows as long as 1.5k-token documents
    .venv-vllm/bin/python -m eval propose-bench --turnover 30       # requests come and go, as on a server
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .options import add_options, ints

MAX_MODEL_LEN = 8192
ADVANCE = 2  # tokens each row emits per step


def load_rows(path: Path) -> list[np.ndarray]:
    with open(path, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return [np.array(r["prompt_ids"] + r["output_ids"], dtype=np.int32) for r in records]


def vllm_config(k: int, rows: int, min_n: int, max_n: int):
    """The fields both proposers read (a real VllmConfig needs a model)."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, prompt_lookup_min=min_n, prompt_lookup_max=max_n),
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        scheduler_config=SimpleNamespace(max_num_seqs=max(rows, 1)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )


class EngineClock:
    """A clock for ngramspec's Proposer that also counts an engine step between its calls:
    ``plain_seconds`` times the proposer's prior for that step's rows and scheduled tokens."""

    def __init__(self, proposer, plain_seconds: float):
        self.proposer, self.plain_seconds, self.offset = proposer, plain_seconds, 0.0
        proposer.clock = self

    def __call__(self) -> float:
        return time.perf_counter() + self.offset

    def step(self, drafts: list[list[int]], context: int) -> None:
        """The engine verifies ``drafts`` (one per row) at ``context`` tokens a row."""
        rows = len(drafts)
        tokens = rows + sum(map(len, drafts))
        self.offset += self.plain_seconds * self.proposer.prior.relative(tokens, context, rows)


def time_steps(proposers: list, texts: list[np.ndarray], steps: int, warmup: int, turnover: int = 0,
               pool: list[np.ndarray] = (), engine: EngineClock | None = None) -> list[tuple[float, float]]:
    """Median and mean milliseconds of each ``propose(sampled, num_tokens, token_ids)`` per step
    after ``warmup`` steps, every row advancing ADVANCE tokens per step (the mean counts the
    occasional dearer step too, e.g. a refit of the step cost). With ``turnover`` T, each row's
    request finishes every T steps (rows staggered) and a new one from ``pool`` takes the row,
    as on a server. The proposers take turns within each step (the first alternating), so a
    slow patch of the machine falls on both alike. ``engine``: the first proposer's clock,
    which counts the engine step that verifies its drafts (outside the timed calls)."""
    rows = len(texts)
    token_ids = np.zeros((rows, MAX_MODEL_LEN), dtype=np.int32)
    lengths = np.zeros(rows, dtype=np.int32)

    def start(i: int, text: np.ndarray, steps_left: int) -> None:  # row i's text, ADVANCE * steps_left to go
        token_ids[i] = 0
        token_ids[i, : text.size] = text
        lengths[i] = text.size - ADVANCE * steps_left

    for i, text in enumerate(texts):
        start(i, text, steps + warmup)
    arrivals = 0
    times: list[list[float]] = [[] for _ in proposers]
    for step in range(steps + warmup):
        for i in range(rows) if turnover and step else ():
            if (step + i * turnover // rows) % turnover == 0:
                start(i, pool[arrivals % len(pool)], turnover + 1)
                arrivals += 1
        lengths += ADVANCE
        sampled = [token_ids[i, n - ADVANCE : n].tolist() for i, n in enumerate(lengths)]
        for which in (range(len(proposers)) if step % 2 == 0 else reversed(range(len(proposers)))):
            begun = time.perf_counter()
            drafts = proposers[which](sampled, lengths.copy(), token_ids)
            if step >= warmup:
                times[which].append(time.perf_counter() - begun)
            if which == 0 and engine is not None:
                engine.step(drafts, int(lengths.mean()))
    return [(1e3 * statistics.median(t), 1e3 * statistics.fmean(t)) for t in times]


def joined(pool: list[np.ndarray], tokens: int) -> list[np.ndarray]:
    """Rows of exactly ``tokens`` tokens, each joining consecutive traces (from a rotating
    start, so rows differ)."""
    rows = []
    for first in range(len(pool)):
        parts, size, i = [], 0, first
        while size < tokens:
            parts.append(pool[i % len(pool)])
            size += parts[-1].size
            i += 1
        rows.append(np.concatenate(parts)[:tokens])
    return rows


def add_arguments(parser) -> None:
    add_options(parser, "traces")
    parser.add_argument("--rows", type=ints, default="1,16,64,256", help="batch sizes (comma-separated)")
    parser.add_argument("--k", type=int, default=16, help="num_speculative_tokens (default 16)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per batch size (default 100)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--row-tokens", type=int, default=0,
                        help="make every row this long by joining consecutive traces (default 0: one trace per "
                             "row, ~470 tokens); vLLM's proposer rescans each row's text every step")
    parser.add_argument("--turnover", type=int, default=0,
                        help="every row's request is replaced by a new one every this many steps, rows "
                             "staggered (default 0: the same requests throughout)")
    parser.add_argument("--engine-step-ms", type=float, default=10.0,
                        help="a plain engine step's time that ngramspec's clock counts between its calls, each "
                             "step priced by its prior for the drafts it verifies, so the step cost it learns is "
                             "an engine's (default 10; 0: only the harness's own time passes between calls, "
                             "and it learns that draft positions cost nothing)")


def main(args) -> int:
    if not 0 <= args.turnover <= args.steps:
        raise ValueError(f"--turnover must be in [0, --steps={args.steps}]")
    if not args.engine_step_ms >= 0:
        raise ValueError(f"--engine-step-ms must be >= 0, got {args.engine_step_ms}")
    if args.row_tokens < 0 or args.row_tokens > MAX_MODEL_LEN:
        raise ValueError(f"--row-tokens must be in [0, {MAX_MODEL_LEN}]")

    from ngramspec.vllm import Proposer

    try:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer
    except ImportError:
        NgramProposer = None
    need = ADVANCE * (args.steps + args.warmup) + 64
    pool = [t for t in load_rows(args.traces) if need <= t.size <= MAX_MODEL_LEN]
    if args.row_tokens:
        pool = joined(pool, max(args.row_tokens, need))
    print(f"{len(pool)} traces of {need}+ tokens (mean {np.mean([t.size for t in pool]):.0f}); k={args.k}, "
          f"{ADVANCE} tokens per row per step, median and mean of {args.steps} steps (ms per engine step)"
          + (f"; each request replaced by a new one every {args.turnover} steps" if args.turnover else "")
          + (f"; an engine step of {args.engine_step_ms:g} ms (plain) priced by the prior between ngramspec's calls"
             if args.engine_step_ms else "; no engine time between calls"))
    print("| rows | median: vLLM ngram | ngramspec | ratio | mean: vLLM ngram | ngramspec | ratio |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        texts = [pool[i % len(pool)] for i in range(rows)]
        ours = Proposer(vllm_config(args.k, rows, 1, 6))
        engine = EngineClock(ours, args.engine_step_ms / 1e3) if args.engine_step_ms else None
        proposers = [ours.propose]
        if NgramProposer is not None:
            theirs = NgramProposer(vllm_config(args.k, rows, 1, 6))
            proposers.append(lambda s, n, t, theirs=theirs: theirs.propose(args.k, s, n, t))
        ms, *peer = time_steps(proposers, texts, args.steps, args.warmup, args.turnover, pool[rows:] + pool, engine)
        peer = peer[0] if peer else None
        cells = []
        for at in (0, 1):  # median, mean
            cells += [f"{peer[at]:.3f}" if peer else "-", f"{ms[at]:.3f}", f"{ms[at] / peer[at]:.2f}x" if peer else "-"]
        print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)
    return 0
