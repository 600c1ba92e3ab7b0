"""`python -m eval vllm-sim`: vLLM's engine loop at C requests at once, offline, over recorded
greedy traces: every drafter on the same rows and the same step cost, deterministic, in seconds.

    .venv-vllm/bin/python -m eval vllm-sim --concurrency 16 --max-new-tokens 96 --prior-scale 2

Greedy output does not depend on the drafts, so verifying a row's draft is a longest common
prefix with its trace. Each step: (1) every running row verifies the draft proposed for it
and emits the kept tokens plus the target's own; (2) the step is priced by a true cost,
``truth.cost(scheduled tokens, mean context, rows)`` (default: the vLLM CPU engine's measured
:data:`~ngramspec.vllm.VLLM_CPU_PRIOR`), in units of a one-token step of one request; (3)
finished rows leave (the last row moves into the gap, as vLLM condenses its batch) and queued
requests take free rows (their prefill emits their first token and is not priced: the same
for every drafter); (4) the drafter proposes for every row. ngramspec runs as vLLM runs it, its
``Proposer`` on the persistent batch's arrays, with a clock that advances by the true cost,
so its step-cost learning sees what an engine would show it; ``--prior-scale S`` starts it from
a prior whose excess cost is S times the built-in one's, and ``--truth-scale T`` prices steps by
the built-in cost with its excess T times as large (a machine where drafted positions cost more:
the prior is then T / S times too cheap). The peers draft per request: vLLM's ``ngram``
rule (its defaults: n=5 only, k=5) and SuffixDecoding with a global cache (vLLM's ``suffix``, k=24).
Methods are named as everywhere (eval/methods.py): greedy (no drafting), hf-pld, ngram[:settings],
suffix[:settings], ngramspec[:settings].

Reported per drafter: output tokens per unit of step cost, its ratio to greedy (no drafting),
MAT (new tokens per row-step), drafts, drafted and accepted tokens.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .methods import SIMULATED, parse_method
from .options import add_options, ints, methods_of

UNIT_SECONDS = 0.01  # a one-token step of one request, on the simulated clock


class SessionRows:
    """Per-request sessions of a replay drafter (``start(prompt)`` -> ``propose`` / ``extend``)
    behind the row interface the loop drives."""

    def __init__(self, drafter, k: int):
        self.drafter, self.k, self.sessions = drafter, k, {}

    def admit(self, request: int, prompt) -> None:
        self.sessions[request] = self.drafter.start(prompt)

    def propose(self, rows: list[dict]) -> list[list[int]]:
        drafts = []
        for row in rows:
            session = self.sessions[row["request"]]
            session.extend(row["sampled"])
            room = min(self.k, len(row["output"]) - row["done"] - 1)
            draft = session.propose(max_tokens=room) if room > 0 else []
            drafts.append([int(t) for t in getattr(draft, "tokens", draft)][:max(room, 0)])
        return drafts

    def leave(self, request: int) -> None:
        finish = getattr(self.sessions.pop(request), "finish", None)
        if finish is not None:
            finish()


class ProposerRows:
    """ngramspec's vLLM ``Proposer`` on the persistent batch's own arrays."""

    def __init__(self, k: int, concurrency: int, max_len: int, clock, settings: str = ""):
        from ngramspec.vllm import Proposer

        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                                 model_config=SimpleNamespace(max_model_len=max_len),
                                 scheduler_config=SimpleNamespace(max_num_seqs=concurrency))
        self.proposer = Proposer(config, settings=settings)
        self.proposer.clock = clock
        self.k = k

    def admit(self, request: int, prompt) -> None:
        pass

    def propose(self, rows: list[dict], count, tokens) -> list[list[int]]:
        drafts = self.proposer.propose([row["sampled"] for row in rows], count, tokens)
        return [d[: max(min(self.k, len(row["output"]) - row["done"] - 1), 0)] for d, row in zip(drafts, rows)]

    def leave(self, request: int) -> None:
        pass


def simulate(traces: list[dict], method, concurrency: int, truth, prior_scale: float | None = None) -> dict:
    """One drafter (a method, text or parsed) over ``traces`` (each ``prompt_ids``,
    ``output_ids``), ``concurrency`` rows at a time; totals of the run."""
    method = parse_method(method, SIMULATED) if isinstance(method, str) else method
    max_len = max(len(t["prompt_ids"]) + len(t["output_ids"]) for t in traces) + 64
    tokens = np.zeros((concurrency, max_len), dtype=np.int32)  # the persistent batch
    count = np.zeros(concurrency, dtype=np.int32)
    now = [0.0]
    if method.kind == "ngramspec":
        from ngramspec.vllm import COST_FILE_ENV, VLLM_CPU_PRIOR

        saved = os.environ.pop(COST_FILE_ENV, None)
        try:
            if prior_scale is not None:  # a prior wrong on purpose: the engine's steps must correct it
                path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ngramspec-sim-prior-{os.getpid()}.json"
                path.write_text(VLLM_CPU_PRIOR.scaled(prior_scale).to_json())
                os.environ[COST_FILE_ENV] = str(path)
            drafter = ProposerRows(24, concurrency, max_len, lambda: now[0], method.settings)
        finally:
            os.environ.pop(COST_FILE_ENV, None)
            if saved is not None:
                os.environ[COST_FILE_ENV] = saved
    elif method.kind == "greedy":
        drafter = None
    else:
        from .drafters import make_drafter

        drafter = SessionRows(make_drafter(method), 24)
    queue = deque(enumerate(traces))
    rows: list[dict] = []
    totals = {"tokens": 0, "cost": 0.0, "steps": 0, "row_steps": 0, "drafts": 0, "drafted": 0, "accepted": 0}
    while queue or rows:
        # 3. Free rows take queued requests; a prefill emits the first token, unpriced.
        while queue and len(rows) < concurrency:
            request, trace = queue.popleft()
            prompt = np.asarray(trace["prompt_ids"], dtype=np.int32)
            output = np.asarray(trace["output_ids"], dtype=np.int32)
            i = len(rows)
            tokens[i, : len(prompt)], tokens[i, len(prompt)] = prompt, output[0]
            count[i] = len(prompt) + 1
            rows.append({"request": request, "output": output, "done": 1, "sampled": [int(output[0])], "draft": []})
            totals["tokens"] += 1
            if drafter is not None:
                drafter.admit(request, prompt)
        # 4. Drafts for every row.
        if isinstance(drafter, ProposerRows):
            drafts = drafter.propose(rows, count.copy(), tokens)
        elif drafter is not None:
            drafts = drafter.propose(rows)
        else:
            drafts = [[] for _ in rows]
        # 1-2. One engine step verifies every row's draft and is priced by the truth.
        scheduled = sum(1 + len(d) for d in drafts)
        context = float(np.mean(count[: len(rows)]))
        cost = float(truth.cost(scheduled, context, len(rows)))
        now[0] += cost * UNIT_SECONDS
        totals["cost"] += cost
        totals["steps"] += 1
        for i, (row, draft) in enumerate(zip(rows, drafts)):
            target = row["output"][row["done"] :]
            kept = 0
            while kept < len(draft) and kept < len(target) - 1 and draft[kept] == target[kept]:
                kept += 1
            emitted = target[: kept + 1]
            tokens[i, count[i] : count[i] + len(emitted)] = emitted
            count[i] += len(emitted)
            row["done"] += len(emitted)
            row["sampled"] = emitted.tolist()
            totals["tokens"] += len(emitted)
            totals["row_steps"] += 1
            totals["drafts"] += bool(draft)
            totals["drafted"] += len(draft)
            totals["accepted"] += kept
        for i in reversed(range(len(rows))):  # finished rows leave; the last row fills the gap
            if rows[i]["done"] >= len(rows[i]["output"]):
                if drafter is not None:
                    drafter.leave(rows[i]["request"])
                last = len(rows) - 1
                if i != last:
                    tokens[i], count[i], rows[i] = tokens[last], count[last], rows[last]
                rows.pop()
    return totals


def add_arguments(parser) -> None:
    add_options(parser, "traces", "limit", "max_new_tokens", "methods", "out",
                limit={"default": None, "help": "first N traces (default: all)"},
                max_new_tokens={"default": 96, "help": "each trace's output cut to this many tokens (default 96)"},
                methods={"default": "greedy,ngram,suffix,ngramspec", "type": methods_of(SIMULATED),
                         "help": "comma-separated, of greedy, hf-pld, ngram[:settings], suffix[:settings], "
                                 "ngramspec[:settings] (suffix needs .venv-vllm)"},
                out={"help": "write the totals here (JSON)"})
    parser.add_argument("--concurrency", type=ints, default="16", help="comma-separated request counts run at once")
    parser.add_argument("--prior-scale", type=float, default=None,
                        help="start ngramspec from the built-in step cost with its excess scaled by this")
    parser.add_argument("--truth-scale", type=float, default=1.0,
                        help="price steps by the built-in step cost with its excess scaled by this (a machine "
                             "where drafted positions cost S times more; default 1)")


def main(args) -> int:
    if args.truth_scale <= 0 or (args.prior_scale is not None and args.prior_scale <= 0):
        raise ValueError("--truth-scale and --prior-scale must be positive")
    if args.max_new_tokens < 2:
        raise ValueError("--max-new-tokens must be 2 or more")
    from ngramspec.vllm import VLLM_CPU_PRIOR

    with open(args.traces, encoding="utf-8") as handle:
        traces = [json.loads(line) for line in handle if line.strip()][: args.limit]
    traces = [dict(t, output_ids=t["output_ids"][: args.max_new_tokens]) for t in traces if len(t["output_ids"]) >= 2]
    truth = VLLM_CPU_PRIOR.scaled(args.truth_scale) if args.truth_scale != 1 else VLLM_CPU_PRIOR
    results = []
    print(f"{len(traces)} traces, outputs cut to {args.max_new_tokens} tokens, step cost: the vLLM CPU engine's"
          + (f" with its excess x{args.truth_scale:g}" if args.truth_scale != 1 else ""))
    print("| concurrency | method | tokens per unit cost | vs greedy | MAT | drafts | drafted | accepted |")
    print("|---|---|---|---|---|---|---|---|")
    for concurrency in args.concurrency:
        base = None
        for method in args.methods:
            t = simulate(traces, method, concurrency, truth, args.prior_scale)
            speed = t["tokens"] / t["cost"]
            base = speed if method.kind == "greedy" else base
            ratio = f"{speed / base:.3f}x" if base else "-"
            print(f"| {concurrency} | {method} | {speed:.4f} | {ratio} | {1 + t['accepted'] / t['row_steps']:.2f} | "
                  f"{t['drafts']} | {t['drafted']} | {t['accepted']} |", flush=True)
            results.append(dict(t, concurrency=concurrency, method=method.name))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0
