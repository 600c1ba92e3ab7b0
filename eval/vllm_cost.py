"""Measure vLLM's step-cost curve: time of one engine step over N scheduled tokens, relative
to a one-token step (ngramspec.vllm.VLLM_CPU_PRIOR comes from this).

    .venv-vllm/bin/python -m eval vllm-cost [--rows 1,4,16] [--context 500,2000] [--model DIR] [--out cost.json]

A stand-in drafter (``FixedDrafts``) proposes random tokens (all rejected, so every step emits
one token per row and the context grows alike for every length) with lengths cycling through
a schedule, and times the interval between its calls: one whole engine step (forward,
sampling, verification, scheduling). Median per total token count N = rows x (1 + draft).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .options import add_options, int_list, ints

DRAFT_SCHEDULE = (0, 1, 2, 3, 5, 7, 11, 15, 23, 31)
LOG_ENV = "NGRAMSPEC_COST_LOG"
SCHEDULE_ENV = "NGRAMSPEC_COST_DRAFTS"


class FixedDrafts:
    """vLLM custom_class drafter: random drafts, lengths cycling through a schedule."""

    def __init__(self, vllm_config):
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.schedule = tuple(int(k) for k in os.environ[SCHEDULE_ENV].split(","))
        self.vocab = vllm_config.model_config.get_vocab_size()
        self.rng = np.random.default_rng(0)
        self.step, self.last, self.last_tokens = 0, None, 0
        self.samples: dict[int, list[float]] = {}
        self.path = os.environ[LOG_ENV]

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        now = time.perf_counter()
        live = [i for i, s in enumerate(sampled_token_ids) if s]
        # Only steps where every row decodes (no prefill in flight) are attributed.
        if self.last is not None and len(live) == len(sampled_token_ids) and self.last_tokens:
            self.samples.setdefault(self.last_tokens, []).append(now - self.last)
        k = min(self.schedule[self.step % len(self.schedule)], self.k)
        self.step += 1
        drafts = [self.rng.integers(0, self.vocab, k).tolist() if s else [] for s in sampled_token_ids]
        full = len(live) == len(sampled_token_ids)
        self.last_tokens = len(live) * (1 + k) if full else 0
        if self.step % 16 == 0:
            Path(self.path).write_text(json.dumps(self.samples))
        self.last = time.perf_counter()
        return drafts


def measure(model: str, rows: int, context: int, new_tokens: int, drafts=DRAFT_SCHEDULE) -> dict[int, float]:
    from vllm import LLM, SamplingParams

    log = Path(tempfile.mkdtemp()) / "cost.json"
    os.environ[LOG_ENV] = str(log)
    os.environ[SCHEDULE_ENV] = ",".join(map(str, drafts))
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=context + new_tokens + 64,
              max_num_seqs=max(rows, 1),
              speculative_config={"method": "custom_class", "model": "eval.vllm_cost.FixedDrafts",
                                  "num_speculative_tokens": max(drafts)})
    rng = np.random.default_rng(1)
    prompts = [{"prompt_token_ids": rng.integers(100, 40000, context).tolist()} for _ in range(rows)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
    time.sleep(0.5)
    samples = json.loads(log.read_text())
    del llm
    return {int(n): statistics.median(t) for n, t in samples.items() if len(t) >= 3}


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=ints, default="1,4,16", help="concurrent requests per run (comma-separated)")
    parser.add_argument("--context", type=ints, default="500,2000",
                        help="prompt tokens per request (comma-separated: one curve per context and row count)")
    add_options(parser, "max_new_tokens", "model", "out",
                max_new_tokens={"default": 160, "help": "tokens generated per request (default %(default)s)"},
                model={"help": "'default' (the default model's folder) or a model folder"},
                out={"help": "write the curves as JSON here (what NGRAMSPEC_VLLM_COST reads)"})
    parser.add_argument("--drafts", type=int_list(0), default=",".join(map(str, DRAFT_SCHEDULE)),
                        help="draft lengths cycled through, step by step")


def main(args) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's CPU default reserves most of RAM
    from ngramspec.models import default_model_dir

    here = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    model = str(default_model_dir()) if args.model == "default" else args.model
    curves = []  # CostPrior's ((rows, context, ((tokens, cost), ...)), ...)
    print("context rows  N  relative cost (to one request's one-token step at that context)")
    for context in args.context:
        by_rows = {rows: measure(model, rows, context, args.max_new_tokens, args.drafts) for rows in args.rows}
        # Each context's costs are relative to its own plain one-request step: what sizing reads
        # is a step's cost relative to a plain step of the same rows at the same context.
        base = by_rows[min(by_rows)][min(by_rows[min(by_rows)])]
        print(f"one-token step of one request at {context} tokens of context: {base * 1e3:.1f} ms")
        for rows, medians in by_rows.items():
            points = sorted((n, round(t / base, 3)) for n, t in medians.items())
            curves.append([rows, context, points])
            for n, c in points:
                print(f"{context:7d} {rows:4d} {n:4d}  {c:.3f}")
    if args.out:
        arguments = {k: v for k, v in vars(args).items() if k not in ("run", "command_line")}
        Path(args.out).write_text(json.dumps({"curves": curves, "args": arguments, "command": args.command_line},
                                             indent=1))
    return 0
